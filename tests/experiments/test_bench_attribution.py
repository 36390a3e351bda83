"""``python -m experiments.bench.attribution``: fault selection fails fast; no LM is loaded
here."""

from __future__ import annotations

import pytest

from experiments.bench.attribution import select_faults
from optloop.errors import ConfigError
from optloop.faults.catalogue import CATALOGUE


def test_select_faults_by_name_or_by_the_batch_that_added_them():
    assert select_faults(None) is None and select_faults("") is None
    assert select_faults("top-k-1, answer-unknown") == ["top-k-1", "answer-unknown"]
    new = select_faults("preregistered")
    assert new == [f.name for f in CATALOGUE if f.added == "preregistered"] and len(new) >= 5
    assert select_faults("preregistered,top-k-1") == [*new, "top-k-1"]
    with pytest.raises(ConfigError, match="no-such-fault"):
        select_faults("top-k-1,no-such-fault")
