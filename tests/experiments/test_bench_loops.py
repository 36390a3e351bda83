"""The loop bench: each optimizer's ``optloop.run`` in turn on one home, and its table."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from experiments.bench import loops

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
TIERED = RESULTS / "tiered_loop.json"


def test_report_only_writes_the_committed_tiered_table_again(tmp_path):
    out = tmp_path / "tiered_loop.md"
    assert loops.main(["--report-only", "--json", str(TIERED), "--markdown", str(out)]) == 0
    assert out.read_text() == (RESULTS / "tiered_loop.md").read_text()


def test_without_a_system_or_a_report_it_is_refused(tmp_path):
    md = str(tmp_path / "x.md")
    with pytest.raises(SystemExit) as refused:
        loops.main(["--json", str(tmp_path / "x.json"), "--markdown", md])
    assert refused.value.code == 2
    with pytest.raises(SystemExit):
        loops.main(["--report-only", "--json", str(tmp_path / "absent.json"), "--markdown", md])
    assert not (tmp_path / "x.md").exists()


def test_each_optimizer_runs_in_turn_on_one_home_and_a_failed_one_ends_the_table(
    tmp_path, monkeypatch
):
    recorded = json.loads(TIERED.read_text())["runs"]
    calls: list[tuple[list[str], dict[str, str]]] = []

    real_run = subprocess.run

    def fake_run(cmd, **kwargs):
        if "optloop.run" not in cmd:  # git, for the provenance
            return real_run(cmd, **kwargs)
        calls.append((cmd, kwargs["env"]))
        optimizer = cmd[cmd.index("--optimizer") + 1]
        if optimizer == "gepa":
            return subprocess.CompletedProcess(cmd, 75)
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(recorded[optimizer]))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(loops.subprocess, "run", fake_run)
    out, md = tmp_path / "loop.json", tmp_path / "loop.md"
    argv = [
        *("--system", "tiered", "--dataset", "synthetic:recall?seed=0&episodes=40"),
        *("--optimizers", "edit,simba,gepa", "--split", "0.4,0.3,0.3"),
        *("--work", str(tmp_path / "home"), "--json", str(out), "--markdown", str(md)),
    ]
    assert loops.main(argv) == 75  # gepa's exit code, after the table of the two before it
    assert [c[0][c[0].index("--optimizer") + 1] for c in calls] == ["edit", "simba", "gepa"]
    assert {c[1]["OPTLOOP_HOME"] for c in calls} == {str(tmp_path / "home")}
    assert all(["--split", "0.4,0.3,0.3"] == c[0][-2:] and "--new" in c[0] for c in calls)
    results = json.loads(out.read_text())
    assert list(results["runs"]) == ["edit", "simba"]  # gepa failed: not in the table
    assert results["provenance"]["command"].startswith("python -m experiments.bench.loops")
    assert "| edit | 0.208 -> 0.333 |" in md.read_text()
