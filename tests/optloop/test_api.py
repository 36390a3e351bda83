"""``optloop.optimize``: the keyword arguments become the command's flags (no run is made)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("control, flagged", [(True, False), (False, True)])
def test_control_false_runs_without_the_trivial_instruction_control(monkeypatch, control, flagged):
    import optloop
    import optloop.run
    from optloop.run_args import build_parser

    seen: list[list[str]] = []
    monkeypatch.setattr(optloop.run, "execute", lambda argv: seen.append(list(argv)) or "done")
    assert optloop.optimize(system="md_flat", optimizer="edit", control=control) == "done"
    assert ("--no-control" in seen[0]) is flagged
    assert build_parser().parse_args(seen[0]).control is control
