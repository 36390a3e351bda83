"""Evaluation under LM faults: the question or episode fails and the fault is recorded; past the
share of failed calls an evaluation may have (``optloop.failures``), it raises instead of reporting
figures.

(An *unreachable* endpoint stops the evaluation instead: see tests/optloop/test_reliability.py.)
"""

from __future__ import annotations

import json

from optloop.datasets import load_dataset
from optloop.embed import get_embedder
from optloop.lm import LMSettings, OptloopLM
from optloop.loop.evaluate import Evaluator
from optloop.testing.scripted import ScriptedOpenAIServer


def broken_lm(url: str) -> OptloopLM:
    return OptloopLM(LMSettings.from_spec("openai:test", base_url=url, max_retries=0, cache=False))


def test_faults_in_ingestion_and_answering_become_failed_questions(tmp_path):
    dataset = load_dataset("builtin:tiny?limit=1")
    with ScriptedOpenAIServer(
        [("status", 500)]
    ) as server:  # answers, but every answer is an error
        for system in (
            "md_flat",
            "rag_bm25",
        ):  # md_flat fails in ingestion, rag_bm25 (no ingest LLM) in answering
            evaluator = Evaluator(
                system,
                broken_lm(server.base_url),
                tmp_path / system,
                embedder=get_embedder("local"),
                allowed_failed_share=1.0,
            )
            try:
                ev = evaluator.evaluate(evaluator.baseline(), dataset)
            finally:
                evaluator.close()
            assert (
                ev.n == len(dataset.episodes[0].questions)
                and ev.errors == ev.n
                and ev.accuracy == 0.0
            )
            assert all(o.error and not o.passed and "HTTP 500" in o.error for o in ev.outcomes)
            assert ("ingestion" in ev.outcomes[0].error) == (system == "md_flat")
            assert (
                ev.lm_failed_calls == ev.lm_attempt_faults == (1 if system == "md_flat" else ev.n)
            )


def test_failed_calls_past_the_threshold_stop_the_evaluation_with_the_first_failure(tmp_path):
    import pytest

    from optloop.errors import CallsFailedError

    dataset = load_dataset("builtin:tiny?limit=1")
    with ScriptedOpenAIServer([("status", 500)]) as server:
        evaluator = Evaluator(
            "rag_bm25", broken_lm(server.base_url), tmp_path, embedder=get_embedder("local")
        )
        try:
            with pytest.raises(
                CallsFailedError,
                match="LM calls failed after their retries in the dev evaluation "
                "of candidate baseline, more than 5%.*HTTP 500",
            ) as info:
                evaluator.evaluate(evaluator.baseline(), dataset)
        finally:
            evaluator.close()
    assert info.value.exit_code == 4


def test_query_site_gives_the_system_its_rewrite_site_and_every_question_is_rewritten(tmp_path):
    """``Evaluator(query_site=True)`` (``optloop.run --query-rewrite``): the baseline has a
    ``retrieve.query`` site, and each question costs a rewrite request before its answer request,
    on the stores it builds too."""

    def asks_query(body):
        return "`query`" in body["messages"][0]["content"]

    def respond(body):
        return "ok", json.dumps(
            {"query": "dog name city"} if asks_query(body) else {"answer": "Biscuit, Austin"}
        )

    dataset = load_dataset("builtin:tiny?limit=1")
    with ScriptedOpenAIServer([("respond", respond)]) as server:
        evaluator = Evaluator(
            "rag_bm25",
            broken_lm(server.base_url),
            tmp_path,
            embedder=get_embedder("local"),
            query_site=True,
        )
        try:
            baseline = evaluator.baseline()
            ev = evaluator.evaluate(baseline, dataset)
        finally:
            evaluator.close()
        asked = [asks_query(r["body"]) for r in server.requests]
    assert sorted(baseline.sites) == ["answer", "retrieve.query"]
    assert ev.n == 2 and ev.accuracy == 1.0 and ev.errors == 0
    assert sum(asked) == ev.n and len(asked) == 2 * ev.n  # a rewrite and an answer per question
