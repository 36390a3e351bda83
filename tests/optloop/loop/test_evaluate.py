"""Evaluation under LM faults: the question or episode fails, the fault is recorded, nothing raises.

(An *unreachable* endpoint stops the evaluation instead: see tests/optloop/test_reliability.py.)
"""

from __future__ import annotations

from optloop.datasets import load_dataset
from optloop.embed import get_embedder
from optloop.lm import LMSettings, OptloopLM
from optloop.loop.evaluate import Evaluator
from tests._servers import ScriptedOpenAIServer


def broken_lm(url: str) -> OptloopLM:
    return OptloopLM(LMSettings.from_spec("openai:test", base_url=url, max_retries=0, cache=False))


def test_faults_in_ingestion_and_answering_become_failed_questions(tmp_path):
    dataset = load_dataset("builtin:tiny?limit=1")
    with ScriptedOpenAIServer([("status", 500)]) as server:  # answers, but every answer is an error
        for system in ("md_flat", "rag_bm25"):  # md_flat fails in ingestion, rag_bm25 (no ingest LLM) in answering
            evaluator = Evaluator(system, broken_lm(server.base_url), tmp_path / system,
                                  embedder=get_embedder("local"))
            try:
                ev = evaluator.evaluate(evaluator.baseline(), dataset)
            finally:
                evaluator.close()
            assert ev.n == len(dataset.episodes[0].questions) and ev.errors == ev.n and ev.accuracy == 0.0
            assert all(o.error and not o.passed and "HTTP 500" in o.error for o in ev.outcomes)
            assert ("ingestion" in ev.outcomes[0].error) == (system == "md_flat")
            assert ev.lm_failed_calls == ev.lm_attempt_faults == (1 if system == "md_flat" else ev.n)
