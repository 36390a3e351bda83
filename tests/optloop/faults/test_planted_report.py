"""The planted harness reported whole: every failure a fault caused is attributed and
reported next to the induced-only figure, set-aside failures say why, empty samples say there is
nothing to score, denominators and small samples are reported, rates carry seeded 95% intervals.

Fixture runs (hand-built :class:`PlantedRun`) pin the figures and their rendering; one run of the
real harness on MD-flat with a scripted LM (no model loaded) pins how failures are classified.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dspy
import pytest
from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.utils import DummyLM
from rich.console import Console

from optloop.attribution.taxonomy import Attribution, ErrorType
from optloop.cli.attribute import render_planted, render_planted_markdown
from optloop.datasets import Dataset, Question
from optloop.faults.planted import (
    EVIDENCE_REACHED,
    SET_ASIDE_REASONS,
    UNSOUND_CLEAN,
    Case,
    CleanBaseline,
    FaultTally,
    PlantedRun,
    run_planted,
)
from optloop.faults.planted_report import MIN_SAMPLE, format_rate, rate, summarize
from optloop.lm import Accounting
from optloop.stats import bootstrap_mean
from tests.optloop.faults.test_faults import HashEmbedder
from tests.optloop.tracing.test_recorder import EPISODE as RECORDER_EPISODE

TINY = "builtin:tiny"


def case(
    fault: str,
    qid: str,
    *,
    blamed: str,
    blamed_type: ErrorType,
    target: str,
    true_type: ErrorType,
    set_aside: str | None = None,
    system: str = "mem0",
    dataset: str = TINY,
    episode: str = "tiny-pet",
) -> Case:
    attribution = Attribution(
        question_id=qid,
        question=f"question {qid}?",
        gold="gold",
        prediction="wrong",
        error_type=blamed_type,
        target=blamed,
        explanation="...",
    )
    return Case(
        system,
        fault,
        episode,
        attribution,
        target,
        true_type,
        0.002,
        0,
        dataset=dataset,
        question_id=qid,
        set_aside=set_aside,
    )


def tally(
    fault: str,
    caused: int,
    *,
    system: str = "mem0",
    dataset: str = TINY,
    episode: str = "tiny-pet",
    passed_clean: int = 3,
    target: str = "answer",
    true_type: str = "ResponseError",
    added: str = "original",
) -> FaultTally:
    return FaultTally(
        system, dataset, episode, fault, target, true_type, added, 5, passed_clean, caused
    )


def answer_named(qid: str) -> Case:
    """An ``answer-unknown`` failure the walk blames on the answer site, as planted."""
    return case(
        "answer-unknown",
        qid,
        blamed="answer",
        blamed_type=ErrorType.RESPONSE,
        target="answer",
        true_type=ErrorType.RESPONSE,
    )


def unsound_clean(qid: str) -> Case:
    """An ``answer-unknown`` failure blamed on extraction and set aside: an unsound clean pass."""
    return case(
        "answer-unknown",
        qid,
        blamed="mem0.extract",
        blamed_type=ErrorType.EXTRACTION,
        target="answer",
        true_type=ErrorType.RESPONSE,
        set_aside=UNSOUND_CLEAN,
    )


def top_k_reached(qid: str, *, named: bool) -> Case:
    """A ``top-k-1`` failure set aside (the evidence reached the answer), blamed on the top_k knob
    (``named``) or on the answer site."""
    return case(
        "top-k-1",
        qid,
        blamed="knob:top_k" if named else "answer",
        blamed_type=ErrorType.RETRIEVAL if named else ErrorType.RESPONSE,
        target="knob:top_k",
        true_type=ErrorType.RETRIEVAL,
        set_aside=EVIDENCE_REACHED,
    )


def top_k_tally() -> FaultTally:
    return tally("top-k-1", 2, target="knob:top_k", true_type="RetrievalError")


def issue_run() -> PlantedRun:
    """mem0 on builtin:tiny with no induced failure and four set aside."""
    cases = [
        unsound_clean("q1"),
        top_k_reached("q2", named=False),
        top_k_reached("q3", named=True),
        case(
            "store-deletes-old",
            "q2",
            blamed="answer",
            blamed_type=ErrorType.RESPONSE,
            target="library:mem0.store",
            true_type=ErrorType.DELETION,
            set_aside=EVIDENCE_REACHED,
        ),
    ]
    baselines = [
        CleanBaseline("mem0", TINY, "tiny-pet", 3, 2, 1),
        CleanBaseline("mem0", TINY, "tiny-food", 2, 1, 1),
    ]
    tallies = [
        tally("answer-unknown", 1),
        top_k_tally(),
        tally("store-deletes-old", 1, target="library:mem0.store", true_type="DeletionError"),
        tally(
            "threshold-strict",
            0,
            target="knob:threshold",
            true_type="RetrievalError",
            added="preregistered",
        ),
    ]
    return PlantedRun(cases, baselines, tallies)


def mixed_run() -> PlantedRun:
    """Two induced failures (both named right), three set aside (one named right)."""
    cases = [
        answer_named("q1"),
        answer_named("q2"),
        unsound_clean("q3"),
        top_k_reached("q1", named=True),
        top_k_reached("q2", named=False),
    ]
    return PlantedRun(
        cases,
        [CleanBaseline("mem0", TINY, "tiny-pet", 5, 3, 2)],
        [tally("answer-unknown", 3), top_k_tally()],
    )


def text(report: dict[str, Any]) -> str:
    console = Console(record=True, width=250)
    console.print(render_planted(report))
    return console.export_text()


# --- rates ---------------------------------------------------------------------------------------


def test_an_empty_sample_has_nothing_to_score_and_no_number():
    r = rate([], what="induced failures")
    assert (r["n"], r["estimate"], r["low"], r["high"]) == (0, None, None, None)
    assert format_rate(r) == "nothing to score (0 induced failures)"
    assert format_rate(r, compact=True) == "nothing to score"


def test_a_rate_has_a_seeded_bootstrap_interval_and_flags_a_small_sample():
    values = [True, True, False, True]
    r = rate(values, what="x", seed=3)
    interval = bootstrap_mean([1.0, 1.0, 0.0, 1.0], seed=3)
    assert (r["estimate"], r["low"], r["high"], r["k"], r["n"]) == (
        0.75,
        interval.low,
        interval.high,
        3,
        4,
    )
    assert rate(values, what="x", seed=3) == r  # the same seed, the same interval
    assert r["small_sample"] and r["note"] == f"too small to support a figure (n=4 < {MIN_SAMPLE})"
    assert format_rate(r) == f"0.750 [{interval.low:.3f}, {interval.high:.3f}] (n=4); {r['note']}"
    assert format_rate(r, compact=True) == f"3/4 0.75 [{interval.low:.2f}, {interval.high:.2f}]*"
    big = rate([True] * 7 + [False] * 3, what="x")
    assert not big["small_sample"] and big["note"] == "" and not format_rate(big).endswith(")*")
    assert format_rate(big).startswith("0.700 [") and format_rate(big).endswith("(n=10)")


# --- the summary ---------------------------------------------------------------------------------


def test_no_induced_failure_scores_nothing_but_every_caused_failure_is_scored():
    s = summarize(issue_run())
    assert (s["n"], s["site_accuracy"], s["type_accuracy"]) == (
        0,
        None,
        None,
    )  # the induced-only figure, as before
    assert s["induced"]["site"]["note"] == "nothing to score (0 induced failures)"
    every = s["all_failures"]
    assert every["n"] == 4 and every["site"]["k"] == 1 and every["site_accuracy"] == 0.25
    assert every["type"]["k"] == 1 and every["site"]["small_sample"]
    assert s["collateral"] == 4 and len(issue_run().collateral) == 4


def test_all_failures_accuracy_stands_next_to_the_induced_one():
    s = summarize(mixed_run())
    assert (s["n"], s["site_accuracy"], s["type_accuracy"]) == (2, 1.0, 1.0)
    assert (s["induced"]["site"]["k"], s["induced"]["site"]["n"]) == (2, 2)
    assert (s["all_failures"]["site"]["k"], s["all_failures"]["n"]) == (3, 5)
    assert s["all_failures"]["site_accuracy"] == pytest.approx(0.6)
    assert s["all_failures"]["site"]["low"] <= 0.6 <= s["all_failures"]["site"]["high"]
    top_k = s["by_fault"]["mem0/top-k-1"]
    assert (top_k["n"], top_k["caused"], top_k["induced"]["n"], top_k["all"]["n"]) == (0, 2, 0, 2)
    assert top_k["site_accuracy"] is None and top_k["all"]["site_accuracy"] == 0.5
    assert top_k["set_aside"] == {UNSOUND_CLEAN: 0, EVIDENCE_REACHED: 2}
    assert (
        s["by_type"]["RetrievalError"]["all"]["n"] == 2 and s["by_type"]["ResponseError"]["n"] == 2
    )


def test_set_aside_failures_are_counted_by_reason_and_keep_their_attribution():
    run = mixed_run()
    s = summarize(run)
    by_reason = s["set_aside"]["by_reason"]
    assert s["set_aside"]["n"] == 3
    assert (by_reason[UNSOUND_CLEAN]["n"], by_reason[EVIDENCE_REACHED]["n"]) == (1, 2)
    assert (
        by_reason[EVIDENCE_REACHED]["site"]["k"] == 1
    )  # top-k-1/q1 was named right although set aside
    assert by_reason[UNSOUND_CLEAN]["description"] == SET_ASIDE_REASONS[UNSOUND_CLEAN]
    record = run.set_aside[0].to_json()
    assert record["set_aside"] == UNSOUND_CLEAN and record["why_set_aside"].startswith(
        "the clean pass was unsound"
    )
    assert (
        record["attribution"]["target"] == "mem0.extract"
        and not record["site_ok"]
        and not record["induced"]
    )
    assert run.induced[0].to_json()["why_set_aside"] == ""


def test_denominators_per_system_and_dataset_and_failures_caused_per_fault():
    run = issue_run()
    run += PlantedRun(
        [
            case(
                "answer-unknown",
                "q9",
                blamed="answer",
                blamed_type=ErrorType.RESPONSE,
                target="answer",
                true_type=ErrorType.RESPONSE,
                system="rag_bm25",
                dataset="synthetic:suite",
            )
        ],
        [CleanBaseline("rag_bm25", "synthetic:suite", f"e{i}", 19, 4, 3) for i in range(3)],
        [
            tally(
                "answer-unknown", 1, system="rag_bm25", dataset="synthetic:suite", passed_clean=12
            )
        ],
    )
    s = summarize(run)
    assert s["denominators"] == [
        {
            "system": "mem0",
            "dataset": TINY,
            "episodes": 2,
            "questions": 5,
            "passed_clean": 3,
            "sound_clean": 2,
            "failures_caused": 4,
            "small_sample": True,
            "note": f"3 clean pass(es) < {MIN_SAMPLE}: too small to support a figure",
        },
        {
            "system": "rag_bm25",
            "dataset": "synthetic:suite",
            "episodes": 3,
            "questions": 57,
            "passed_clean": 12,
            "sound_clean": 9,
            "failures_caused": 1,
            "small_sample": False,
            "note": "",
        },
    ]
    # A fault that caused nothing is still a row, with its denominator.
    strict = s["by_fault"]["mem0/threshold-strict"]
    assert (strict["caused"], strict["passed_clean"], strict["added"]) == (0, 3, "preregistered")
    assert strict["all"]["site"]["note"] == "nothing to score (0 failures caused)"
    assert s["by_fault"]["rag_bm25/answer-unknown"]["passed_clean"] == 12
    assert len(s["tallies"]) == 5 and s["systems_covered"] == ["mem0", "rag_bm25"]


# --- the rendering -------------------------------------------------------------------------------


def report_of(run: PlantedRun) -> dict[str, Any]:
    return {
        **summarize(run),
        "systems": ["mem0"],
        "dataset": TINY,
        "cases": [c.to_json() for c in run.induced],
        "set_aside_cases": [c.to_json() for c in run.set_aside],
    }


def test_the_text_report_says_nothing_to_score_instead_of_zero():
    out = text(report_of(issue_run()))
    lines = out.splitlines()
    induced_site = next(
        line for line in lines if line.startswith("site accuracy, induced failures only")
    )
    assert (
        induced_site
        == "site accuracy, induced failures only: nothing to score (0 induced failures)"
    )
    assert "type accuracy, induced failures only: nothing to score (0 induced failures)" in out
    every = next(
        line for line in lines if line.startswith("site accuracy, every failure a fault caused")
    )
    assert "(n=4); too small to support a figure (n=4 < 10)" in every and every.split(": ")[
        1
    ].startswith("0.250 [")
    assert "0.000, type accuracy" not in out and "site accuracy 0.000" not in out
    assert "mem0 on builtin:tiny: 3 clean pass(es) < 10: too small to support a figure" in out
    assert "set aside from the induced figure: 4 (1 because the clean pass was unsound" in out
    assert "3 because the evidence still reached the answer" in out


def test_the_text_report_shows_denominators_faults_and_each_set_aside_failure():
    out = text(report_of(issue_run()))
    assert (
        "clean runs (the denominators)" in out
        and "failures set aside from the induced figure" in out
    )
    den = next(
        line
        for line in out.splitlines()
        if "tiny-pet" not in line
        and "builtin:tiny" in line
        and "too small" in line
        and "│" in line
    )
    assert [c.strip() for c in den.split("│")[1:-1]][:7] == ["mem0", TINY, "2", "5", "3", "2", "4"]
    strict = next(line for line in out.splitlines() if "mem0/threshold-strict (new)" in line)
    assert strict.count("nothing to score") == 4
    aside = [line for line in out.splitlines() if "tiny-pet/q" in line]
    assert len(aside) == 4 and sum(EVIDENCE_REACHED in line for line in aside) == 3
    assert any(
        "answer ResponseError" in line
        and "mem0.extract ExtractionError" in line
        and UNSOUND_CLEAN in line
        for line in aside
    )
    assert "* marks n < 10, too small to support a figure" in out


def test_the_markdown_report_carries_the_same_figures():
    md = render_planted_markdown(report_of(mixed_run()))
    assert md.startswith("# Planted faults on builtin:tiny")
    assert "- site accuracy, induced failures only: 1.000 [1.000, 1.000] (n=2); too small" in md
    assert "- site accuracy, every failure a fault caused: 0.600 [" in md
    assert "| mem0/top-k-1 | 3 | 2 | 0 | 0 / 2 | nothing to score | 1/2 0.50 [" in md
    assert f"- `{EVIDENCE_REACHED}`: {SET_ASIDE_REASONS[EVIDENCE_REACHED]}" in md
    assert md.count("| mem0/") >= 2 + 3  # two fault rows, three set-aside rows


def test_a_report_over_several_datasets_names_them_all():
    report = {**report_of(mixed_run()), "datasets": [TINY, "synthetic:suite?seed=0"]}
    report.pop("dataset")
    assert render_planted_markdown(report).startswith(
        "# Planted faults on builtin:tiny, synthetic:suite?seed=0"
    )


# --- the harness itself, on MD-flat with a scripted LM -------------------------------------------


class FunctionLM(DummyLM):
    """A ``DummyLM`` whose reply is ``respond(last message)``: the answer can depend on the
    memories shown."""

    def __init__(self, respond: Any):
        super().__init__({}, adapter=dspy.JSONAdapter())
        self.accounting = Accounting()
        owner = self

        class Engine(DummyEngine):
            def _complete_messages(self, messages: list[dict[str, str]]) -> Any:
                owner.answers = {"": respond(messages[-1]["content"])}
                return super()._complete_messages(messages)

        self._engine_spec = Engine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)


def respond(content: str) -> dict[str, Any]:
    if "Session s1" in content:
        return {"facts": ["User's dog is named Biscuit.", "User lives in Denver."]}
    if "Session s2" in content:
        return {"facts": ["User's dog is named Biscuit.", "User lives in Austin."]}
    if "dog's name" in content:
        return {"answer": "Biscuit" if "Biscuit" in content else "I don't know"}
    if "Which city" in content:  # this model needs both facts in front of it to answer
        return {
            "answer": "Austin" if "Austin" in content and "Biscuit" in content else "I don't know"
        }
    return {"answer": "red"}  # the car: a lucky guess, nothing in memory says so


# The recorder tests' two-session episode, plus a question nothing in memory answers (a lucky
# guess).
EPISODE = RECORDER_EPISODE.model_copy(
    update={
        "questions": [
            *RECORDER_EPISODE.questions,
            Question(
                id="q3",
                question="What colour is my car?",
                gold="red",
                evidence_ids=["s1:t1"],
                task_type="exact_recall",
                scorer="contains",
            ),
        ]
    }
)


def test_the_harness_attributes_every_caused_failure_and_says_why_it_set_some_aside(
    tmp_path: Path,
):
    dataset = Dataset(name="planted-fixture", uri="test:planted", episodes=[EPISODE])
    run = run_planted(
        ["md_flat"],
        dataset,
        FunctionLM(respond),
        tmp_path,
        embedder=HashEmbedder(),
        fault_names=["answer-unknown", "mdflat-curate-forgets"],
    )
    assert [(b.questions, b.passed, b.sound) for b in run.baselines] == [
        (3, 3, 2)
    ]  # q3 passed by luck
    assert {t.fault: (t.caused, t.failed_both, t.ran) for t in run.tallies} == {
        "answer-unknown": (3, 0, True),
        "mdflat-curate-forgets": (2, 0, True),
    }
    got = {
        (c.fault, c.question_id): (c.set_aside, c.attribution.error_type, c.attribution.target)
        for c in run.cases
    }
    assert got == {
        ("answer-unknown", "q1"): (None, ErrorType.RESPONSE, "answer"),
        ("answer-unknown", "q2"): (None, ErrorType.RESPONSE, "answer"),
        # set aside (the clean pass was a guess) and attributed anyway: the walk finds no memory of
        # a car
        ("answer-unknown", "q3"): (UNSOUND_CLEAN, ErrorType.EXTRACTION, "md_flat.curate"),
        ("mdflat-curate-forgets", "q1"): (None, ErrorType.DELETION, "md_flat.curate"),
        # the fault took the dog, the city still reached the answer, which failed: set aside,
        # attributed anyway
        ("mdflat-curate-forgets", "q2"): (EVIDENCE_REACHED, ErrorType.RESPONSE, "answer"),
    }
    assert all(c.dataset == "test:planted" and c.llm_calls == 0 for c in run.cases)
    s = summarize(run)
    assert (s["n"], s["site_accuracy"]) == (3, 1.0)
    assert (
        s["all_failures"]["n"],
        s["all_failures"]["site"]["k"],
        s["all_failures"]["type"]["k"],
    ) == (5, 3, 3)
    assert s["denominators"][0]["passed_clean"] == 3 and s["denominators"][0]["small_sample"]


def test_a_system_that_passes_nothing_clean_runs_no_fault_and_says_so(tmp_path: Path):
    dataset = Dataset(name="planted-fixture", uri="test:planted", episodes=[EPISODE])
    run = run_planted(
        ["md_flat"],
        dataset,
        FunctionLM(lambda content: {"facts": [], "answer": "no idea"}),
        tmp_path,
        embedder=HashEmbedder(),
        fault_names=["answer-unknown"],
    )
    assert run.cases == [] and [(b.passed, b.sound) for b in run.baselines] == [(0, 0)]
    assert [(t.fault, t.ran, t.caused) for t in run.tallies] == [("answer-unknown", False, 0)]
    report = report_of(run)
    out = text(report)
    assert (
        "site accuracy, every failure a fault caused: nothing to score (0 failures caused)" in out
    )
    assert "attribution: no failure attributed" in out
    assert "md_flat on test:planted: 0 clean pass(es) < 10: too small to support a figure" in out


def test_the_new_faults_figures_stand_apart_from_the_original_ones():
    run = issue_run()
    run.cases.append(
        case(
            "threshold-strict",
            "q1",
            blamed="knob:threshold",
            blamed_type=ErrorType.RETRIEVAL,
            target="knob:threshold",
            true_type=ErrorType.RETRIEVAL,
        )
    )
    s = summarize(run)
    assert set(s["by_added"]) == {"original", "preregistered"}
    assert (s["by_added"]["original"]["caused"], s["by_added"]["original"]["n"]) == (4, 0)
    assert (
        s["by_added"]["preregistered"]["caused"],
        s["by_added"]["preregistered"]["site_accuracy"],
    ) == (1, 1.0)
    assert s["by_added"]["preregistered"]["passed_clean"] == 3
    row = next(
        line for line in text(report_of(run)).splitlines() if "faults added: preregistered" in line
    )
    assert "1/1 1.00 [1.00, 1.00]*" in row


def test_planted_faults_at_concurrency_4_give_the_serial_harness_results(tmp_path: Path):
    """Episodes in parallel (each its clean run, then its fault runs) against an endpoint whose
    answers are fixed by the request: the same baselines, tallies and cases, in the same order, as
    one at a time."""
    from optloop.datasets import load_dataset
    from tests._oracle import KeyedEndpoint, gold_answers

    dataset = load_dataset("builtin:tiny")
    runs, lines = {}, {}
    with KeyedEndpoint(gold_answers(dataset.episodes), latency_s=0.01) as endpoint:
        for n in (1, 4):
            lm = endpoint.lm(n, tmp_path / f"n{n}.sqlite")
            lines[n] = []
            run = run_planted(
                ["md_flat"],
                dataset,
                lm,
                tmp_path / f"n{n}",
                embedder=HashEmbedder(),
                fault_names=["answer-unknown", "mdflat-curate-forgets"],
                progress=lines[n].append,
            )
            runs[n] = (
                run.baselines,
                run.tallies,
                [
                    (
                        c.fault,
                        c.episode,
                        c.question_id,
                        c.set_aside,
                        c.attribution.model_dump(),
                        c.llm_calls,
                    )
                    for c in run.cases
                ],
            )
    assert runs[1][2] and runs[4] == runs[1]
    assert lines[4] == lines[1]  # said in episode order
