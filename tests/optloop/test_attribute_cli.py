"""``python -m optloop.attribute``: bad input fails before any work; a real run leaves reports and traces."""

from __future__ import annotations

import json

import pytest

from optloop.attribute import main
from optloop.cli import run_cli


@pytest.mark.parametrize("argv, needle", [
    (["--system", "nope"], "unknown system"),
    (["--dataset", "memfail:nope"], "nope"),
    (["--system", "rag_bm25,long_context"], "--faults planted"),
    (["--faults", "planted", "--fault", "no-such-fault"], "unknown fault"),
])
def test_bad_input_is_one_line_and_writes_nothing(argv, needle, capsys, isolated_state):
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err
    assert not (isolated_state / "attribution").exists()


def test_list_faults_names_at_least_eight_across_stages(capsys):
    assert run_cli(main, ["--list-faults"]) == 0
    from optloop.attribution.faults import CATALOGUE

    assert len(CATALOGUE) >= 8
    assert {f.error_type.value for f in CATALOGUE} == {"ExtractionError", "UpdateError", "DeletionError",
                                                       "RetrievalError", "ResponseError"}
    assert {"mem0", "graphiti", "rag_bm25"} <= {s for f in CATALOGUE for s in f.systems}


@pytest.mark.integration
def test_attribute_run_writes_reports_and_mlflow_traces_with_operation_spans(tmp_path, isolated_state):
    out = tmp_path / "out"
    assert run_cli(main, ["--system", "rag_bm25", "--dataset", "builtin:tiny?limit=2", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["questions"] == 5 and report["failures"] == report["questions"] - report["correct"]
    assert len(report["attributions"]) == report["failures"]
    assert (out / "report.md").read_text().startswith("# Attribution: rag_bm25")
    assert sorted(p.name for p in (out / "graphs").iterdir()) == ["tiny-food.json", "tiny-pet.json"]
    if report["failures"]:
        import mlflow

        from optloop import tracking

        tracking.configure()
        traces = mlflow.search_traces(locations=[tracking.experiment("optloop-attribution-rag_bm25")],
                                      return_type="list")
        assert len(traces) == report["failures"]
        spans = traces[0].data.spans
        root = [s for s in spans if s.parent_id is None]
        assert len(root) == 1 and root[0].name.startswith("question ")
        assert any(s.name.startswith("retrieve") for s in spans) and any(s.name.startswith("answer") for s in spans)


@pytest.mark.integration
def test_planted_faults_report_has_accuracy_fields(tmp_path):
    out = tmp_path / "planted.json"
    assert run_cli(main, ["--system", "rag_bm25", "--dataset", "builtin:tiny?limit=1", "--faults", "planted",
                          "--fault", "answer-unknown", "--fault", "top-k-1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {"site_accuracy", "type_accuracy", "n"} <= set(report)
    assert report["n"] == len(report["cases"])
    for case in report["cases"]:
        assert case["true_target"] in ("answer", "knob:top_k")


def test_planted_report_with_no_induced_failure_says_so_and_scores_every_caused_failure(tmp_path, monkeypatch):
    """``--faults planted`` end to end with the harness and the LM faked (issue 21's mem0 example: 0 induced
    failures, 4 set aside): nothing-to-score instead of 0.000, the all-failures figure, the set-aside
    failures with their reasons, the denominators; in the text, the JSON and the markdown."""
    from rich.console import Console

    import optloop.attribute as cli
    from optloop.lm import Accounting
    from tests.optloop.attribution.test_planted_report import issue_run

    class FakeLM:
        accounting = Accounting()

    recorded = Console(record=True, width=250)
    monkeypatch.setattr(cli, "console", recorded)
    monkeypatch.setattr(cli, "lm_from_args", lambda *args, **kwargs: FakeLM())
    monkeypatch.setattr(cli, "run_planted", lambda *args, **kwargs: issue_run())
    out, md = tmp_path / "planted.json", tmp_path / "planted.md"
    assert run_cli(main, ["--system", "rag_bm25", "--faults", "planted", "--json", str(out),
                          "--markdown", str(md)]) == 0
    text = recorded.export_text()
    assert "site accuracy, induced failures only: nothing to score (0 induced failures)" in text
    assert "site accuracy, every failure a fault caused: 0.250 [" in text and "0.000, type accuracy" not in text
    report = json.loads(out.read_text())
    assert (report["n"], report["site_accuracy"], report["type_accuracy"]) == (0, None, None)
    assert report["n"] == len(report["cases"]) and len(report["set_aside_cases"]) == 4
    assert report["induced"]["site"]["note"] == "nothing to score (0 induced failures)"
    assert report["all_failures"]["n"] == 4 and report["all_failures"]["site"]["k"] == 1
    assert {c["set_aside"] for c in report["set_aside_cases"]} == {"unsound_clean_pass", "evidence_reached_answer"}
    assert all(c["why_set_aside"] and c["attribution"]["error_type"] for c in report["set_aside_cases"])
    assert report["denominators"][0]["passed_clean"] == 3 and report["denominators"][0]["small_sample"]
    assert report["by_fault"]["mem0/top-k-1"]["caused"] == 2
    assert "nothing to score (0 induced failures)" in md.read_text()


def test_list_faults_shows_which_faults_were_added_for_issue_21(capsys, monkeypatch):
    from rich.console import Console

    import optloop.attribute as cli

    recorded = Console(record=True, width=300)
    monkeypatch.setattr(cli, "console", recorded)
    assert run_cli(main, ["--list-faults"]) == 0
    rows = [line for line in recorded.export_text().splitlines() if "issue-21" in line]
    assert len(rows) >= 5 and any("store-loses-alternate-writes" in row for row in rows)
