"""``python -m optloop attribute``: bad input fails before any work; a real run leaves reports and
traces."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from optloop.cli.attribute import main
from optloop.cli.command import run_cli
from optloop.datasets import load_dataset
from optloop.testing.scripted import ScriptedOpenAIServer


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--system", "nope"], "unknown system"),
        (["--dataset", "memfail:nope"], "nope"),
        (["--system", "rag_bm25,long_context"], "--faults planted"),
        (["--faults", "planted", "--fault", "no-such-fault"], "unknown fault"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(argv, needle, capsys, isolated_state):
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err
    assert not (isolated_state / "attribution").exists()


def test_list_faults_prints_every_fault_of_the_catalogue_across_stages(capsys, monkeypatch):
    import optloop.cli.attribute as cli

    monkeypatch.setattr(cli.console, "width", 300)  # no fault name wrapped inside its cell
    assert run_cli(main, ["--list-faults"]) == 0
    from optloop.faults.catalogue import CATALOGUE

    printed = capsys.readouterr().out
    assert [f.name for f in CATALOGUE if f.name not in printed] == []
    assert {f.error_type.value for f in CATALOGUE} == {
        "ExtractionError",
        "UpdateError",
        "DeletionError",
        "RetrievalError",
        "ResponseError",
        "ContaminationError",
    }
    assert {"mem0", "graphiti", "rag_bm25"} <= {s for f in CATALOGUE for s in f.systems}


def _answers(
    reply: Callable[[str], str],
) -> tuple[str, Callable[[dict[str, Any]], tuple[str, Any]]]:
    """A scripted endpoint's behaviour: every chat request answered ``{"answer": reply(user
    message)}`` (rag_bm25 sends the LM nothing but its answer-site calls)."""

    def respond(body: dict[str, Any]) -> tuple[str, Any]:
        user = next((m["content"] for m in reversed(body["messages"]) if m["role"] == "user"), "")
        return "ok", json.dumps({"answer": reply(str(user))})

    return "respond", respond


def _lm_flags(server: ScriptedOpenAIServer) -> list[str]:
    return ["--lm", "openai:scripted", "--lm-base-url", server.base_url, "--no-cache"]


def test_attribute_run_writes_reports_and_mlflow_traces_with_operation_spans(
    tmp_path, isolated_state, capsys
):
    """An endpoint that never knows the answer: every question fails, so every failure must be
    attributed, kept as a graph and mirrored as an MLflow trace whose spans are the operations.
    Without a terminal it says so as it goes, one line per episode, and keeps a log beside the
    reports."""
    out = tmp_path / "out"
    with ScriptedOpenAIServer([_answers(lambda user: "I don't know")]) as server:
        code = run_cli(
            main,
            [
                "--system",
                "rag_bm25",
                "--dataset",
                "builtin:tiny?limit=2",
                "--out",
                str(out),
                *_lm_flags(server),
            ],
        )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["questions"] == 5 and report["correct"] == 0 and report["failures"] == 5
    printed = capsys.readouterr().out.splitlines()
    episodes = [line for line in printed if re.match(r"^\[\d+ s\] episode \d/2 ", line)]
    assert len(episodes) == 2 and "episode 1/2 tiny-" in episodes[0]
    assert episodes[1].endswith(": 0/5 correct so far, 5 failures attributed")  # done: no ETA
    title = (
        "rag_bm25 on builtin:tiny?limit=2: 5 failures of 5 questions, attributed (error type by "
        "site)"
    )
    assert title in printed  # the table's title whole, on a line of its own
    logged = [line.split(" ", 2)[2] for line in (out / "run.log").read_text().splitlines()]
    assert logged[0].startswith("optloop attribute: rag_bm25 on builtin:tiny?limit=2: 2 episodes")
    assert [line.split("] ", 1)[1] for line in episodes] == [
        line for line in logged if line.startswith("episode ")
    ]
    assert title in logged and logged[-1].startswith("reports in ")
    assert len(report["attributions"]) == report["failures"]
    assert (out / "report.md").read_text().startswith("# Attribution: rag_bm25")
    assert sorted(p.name for p in (out / "graphs").iterdir()) == [
        "tiny-food.json",
        "tiny-pet.json",
    ]
    import mlflow

    from optloop.services import tracking

    tracking.configure()
    traces = mlflow.search_traces(
        locations=[tracking.experiment("optloop-attribution-rag_bm25")], return_type="list"
    )
    assert len(traces) == report["failures"]
    for trace in traces:
        spans = trace.data.spans
        root = [s for s in spans if s.parent_id is None]
        assert len(root) == 1 and root[0].name.startswith("question ")
        assert any(s.name.startswith("retrieve") for s in spans) and any(
            s.name.startswith("answer") for s in spans
        )


def test_the_python_api_reports_each_episode_to_its_progress_callback(isolated_state):
    import optloop
    from optloop.analysis import EpisodeDone

    seen: list[EpisodeDone] = []
    with ScriptedOpenAIServer([_answers(lambda user: "I don't know")]) as server:
        report = optloop.attribute(
            "rag_bm25",
            "builtin:tiny?limit=2",
            "openai:scripted",
            lm_base_url=server.base_url,
            progress=seen.append,
        )
    assert [(d.done, d.total) for d in seen] == [(1, 2), (2, 2)]
    assert sorted(d.episode for d in seen) == ["tiny-food", "tiny-pet"]
    assert (seen[-1].questions, seen[-1].correct, seen[-1].failures) == (
        report.questions,
        report.correct,
        report.failures,
    )
    assert seen[0].eta_s is not None and seen[-1].eta_s is None
    assert seen[0].seconds <= seen[1].seconds


def test_planted_faults_report_has_accuracy_fields(tmp_path):
    """An endpoint that answers right whenever the retrieved memories hold the gold answer: the
    clean run passes, so the planted ``answer-unknown`` fault induces failures, and each must be
    scored."""
    golds = [q.gold for e in load_dataset("builtin:tiny?limit=1").episodes for q in e.questions]

    def reply(user: str) -> str:
        memories = user.lower()
        return next(
            (g for g in golds if all(p.strip().lower() in memories for p in g.split(","))),
            "I don't know",
        )

    out = tmp_path / "planted.json"
    with ScriptedOpenAIServer([_answers(reply)]) as server:
        code = run_cli(
            main,
            [
                "--system",
                "rag_bm25",
                "--dataset",
                "builtin:tiny?limit=1",
                "--faults",
                "planted",
                "--fault",
                "answer-unknown",
                "--fault",
                "top-k-1",
                "--json",
                str(out),
                *_lm_flags(server),
            ],
        )
    assert code == 0
    report = json.loads(out.read_text())
    assert {"site_accuracy", "type_accuracy", "n"} <= set(report)
    cases = report["cases"]
    assert report["n"] == len(cases)
    assert [c for c in cases if c["true_target"] == "answer"], (
        cases
    )  # the answer fault induced failures
    for case in cases:
        assert case["true_target"] in ("answer", "knob:top_k")
    assert 0.0 <= report["site_accuracy"] <= 1.0 and 0.0 <= report["type_accuracy"] <= 1.0


def test_planted_report_with_no_induced_failure_says_so_and_scores_every_caused_failure(
    tmp_path, monkeypatch
):
    """``--faults planted`` end to end with the harness and the LM faked (the mem0 example: 0
    induced failures, 4 set aside): nothing-to-score instead of 0.000, the all-failures figure, the
    set-aside failures with their reasons, the denominators; in the text, the JSON and the
    markdown."""
    from rich.console import Console

    import optloop.analysis.planted as planted
    import optloop.cli.attribute as cli
    from optloop.lm import Accounting
    from tests.optloop.faults.test_planted_report import issue_run

    class FakeLM:
        accounting = Accounting()

        def check_endpoint(self) -> list[str]:  # the embedded model's: nothing to check
            return []

    recorded = Console(record=True, width=250)
    monkeypatch.setattr(cli, "console", recorded)
    monkeypatch.setattr(cli, "lm_from_args", lambda *args, **kwargs: FakeLM())
    monkeypatch.setattr(planted, "run_planted", lambda *args, **kwargs: issue_run())
    out, md = tmp_path / "planted.json", tmp_path / "planted.md"
    assert (
        run_cli(
            main,
            [
                "--system",
                "rag_bm25",
                "--faults",
                "planted",
                "--json",
                str(out),
                "--markdown",
                str(md),
            ],
        )
        == 0
    )
    text = recorded.export_text()
    assert "site accuracy, induced failures only: nothing to score (0 induced failures)" in text
    assert (
        "site accuracy, every failure a fault caused: 0.250 [" in text
        and "0.000, type accuracy" not in text
    )
    report = json.loads(out.read_text())
    assert (report["n"], report["site_accuracy"], report["type_accuracy"]) == (0, None, None)
    assert report["n"] == len(report["cases"]) and len(report["set_aside_cases"]) == 4
    assert report["induced"]["site"]["note"] == "nothing to score (0 induced failures)"
    assert report["all_failures"]["n"] == 4 and report["all_failures"]["site"]["k"] == 1
    assert {c["set_aside"] for c in report["set_aside_cases"]} == {
        "unsound_clean_pass",
        "evidence_reached_answer",
    }
    assert all(
        c["why_set_aside"] and c["attribution"]["error_type"] for c in report["set_aside_cases"]
    )
    assert (
        report["denominators"][0]["passed_clean"] == 3
        and report["denominators"][0]["small_sample"]
    )
    assert report["by_fault"]["mem0/top-k-1"]["caused"] == 2
    assert "nothing to score (0 induced failures)" in md.read_text()


def test_list_faults_shows_which_faults_were_preregistered(capsys, monkeypatch):
    from rich.console import Console

    import optloop.cli.attribute as cli

    recorded = Console(record=True, width=300)
    monkeypatch.setattr(cli, "console", recorded)
    assert run_cli(main, ["--list-faults"]) == 0
    rows = [line for line in recorded.export_text().splitlines() if "preregistered" in line]
    assert len(rows) >= 5 and any("store-loses-alternate-writes" in row for row in rows)
