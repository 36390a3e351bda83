"""experiments.provenance: what a results file says about the command that made it."""

from __future__ import annotations

import pytest

from experiments.provenance import flag_of

COMMAND = (
    "python -m optloop.run --system mem0 --dataset 'locomo:data/locomo.json?sessions=8' "
    "--lm=local:qwen2.5-coder-0.5b --budget 3 --query-rewrite"
)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--system", "mem0"),
        ("--dataset", "locomo:data/locomo.json?sessions=8"),
        ("--lm", "local:qwen2.5-coder-0.5b"),
        ("--budget", "3"),
        ("--optimizer", None),
        ("--query-rewrite", None),
    ],
)
def test_a_flag_is_read_in_either_form_and_is_none_when_absent_or_valueless(flag, value):
    assert flag_of(COMMAND, flag) == value
