"""``python -m optloop attribute --from-traces meme:<dir>``: offline, no LM made, reports and
graphs written."""

from __future__ import annotations

import json

import pytest

from optloop.cli.attribute import main
from optloop.cli.command import run_cli
from optloop.tracing.graph import ExecutionGraph
from tests._meme_fixture import FIXTURE


def test_from_traces_attributes_every_failed_probe_without_an_lm(tmp_path, monkeypatch):
    import optloop.lm

    def no_lm(*args, **kwargs):
        raise AssertionError("an LM was made")

    monkeypatch.setattr(optloop.lm.OptloopLM, "__init__", no_lm)
    out = tmp_path / "out"
    assert (
        run_cli(main, ["--from-traces", f"meme:{FIXTURE}", "--out", str(out), "--lexical-only"])
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert (report["probes"], report["failures"], report["llm_calls"]) == (8, 7, 0)
    assert report["systems"] == ["flat", "chunks"] and report["judges"] == "lexical"
    assert {a["question_id"] for a in report["attributions"]} == {
        "fx_001-before:deletion",
        "fx_001-after:tracking",
        "fx_001-after:deletion",
        "fx_001-after:cascade",
    }
    types = {
        (a["system"], a["question_id"]): a["attribution"]["error_type"]
        for a in report["attributions"]
    }
    assert types["flat", "fx_001-after:tracking"] == "DeletionError"
    assert types["chunks", "fx_001-after:tracking"] == "RetrievalError"
    graph = ExecutionGraph.load(out / "graphs" / "flat" / "fx_001-after.json")
    assert graph.system == "flat" and len(graph.question_ops("fx_001-after:deletion")) == 2
    assert (out / "report.md").read_text().startswith("# Attribution of published traces")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--from-traces", "locomo:x"], "expected meme:<dir>"),
        (["--from-traces", "meme:/no/such/dir"], "not found"),
        (["--from-traces", f"meme:{FIXTURE}", "--agent"], "drop --agent"),
    ],
)
def test_bad_from_traces_input_is_one_line(argv, needle, capsys, tmp_path):
    assert run_cli(main, [*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err
    assert not (tmp_path / "out").exists()
