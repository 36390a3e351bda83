"""The real evaluator on a scripted endpoint: stores are reused by ingest key (a changed ingest
prompt never reuses a store, an unchanged one always does) and a raced dev evaluation stops early
against a better best, its outcomes in the split's order."""

from __future__ import annotations

import json

from optloop.datasets import load_dataset
from optloop.embed import get_embedder
from optloop.lm import LMSettings, OptloopLM
from optloop.loop.candidate import SiteState
from optloop.loop.evaluate import Evaluator
from optloop.loop.racing import Against
from optloop.testing.scripted import ScriptedOpenAIServer


def scripted_lm(url: str) -> OptloopLM:
    return OptloopLM(LMSettings.from_spec("openai:test", base_url=url, max_retries=0, cache=False))


def respond(body: dict) -> tuple[str, str]:
    """md_flat's curate step keeps one fact; every answer is 'no idea'."""
    text = body["messages"][0]["content"]
    if "`facts`" in text:
        return "ok", json.dumps({"facts": ["a fact"]})
    return "ok", json.dumps({"answer": "no idea"})


def test_a_changed_ingest_prompt_never_reuses_stores_and_an_unchanged_one_always_does(tmp_path):
    # more episodes than the fewest stores kept live (8): a split's stores all stay live
    dataset = load_dataset("synthetic:recall?seed=0&episodes=10")
    with ScriptedOpenAIServer([("respond", respond)]) as server:
        evaluator = Evaluator(
            "md_flat", scripted_lm(server.base_url), tmp_path, embedder=get_embedder("local")
        )
        try:
            base = evaluator.baseline()
            answer_only = base.model_copy(
                update={"sites": {**base.sites, "answer": SiteState(instructions="Answer.")}}
            )
            curate = next(n for n, stage in evaluator.stages.items() if stage == "ingest")
            new_ingest = base.model_copy(
                update={"sites": {**base.sites, curate: SiteState(instructions="Keep facts.")}}
            )
            first = evaluator.evaluate(base, dataset)
            answered = evaluator.evaluate(answer_only, dataset)
            ingested = evaluator.evaluate(new_ingest, dataset)
            again = evaluator.evaluate(base, dataset)
        finally:
            evaluator.close()
    episodes = len(dataset.episodes)
    assert (first.stores_built, first.stores_reused) == (episodes, 0)
    assert (answered.stores_built, answered.stores_reused, answered.ingest_calls) == (
        0,
        episodes,
        0,
    )
    assert (ingested.stores_built, ingested.stores_reused) == (episodes, 0)
    assert ingested.ingest_calls > 0
    assert (again.stores_built, again.stores_reused) == (0, episodes)


def test_a_raced_evaluation_stops_early_against_a_better_best(tmp_path):
    dataset = load_dataset("synthetic:recall?seed=0&episodes=12")
    with ScriptedOpenAIServer([("respond", respond)]) as server:
        evaluator = Evaluator(
            "rag_bm25", scripted_lm(server.base_url), tmp_path, embedder=get_embedder("local")
        )
        try:
            full = evaluator.evaluate(evaluator.baseline(), dataset)
            best = [o.model_copy(update={"passed": True}) for o in full.outcomes]
            raced = evaluator.evaluate(
                evaluator.baseline(), dataset, against=Against(best, "trial 1", seed=0)
            )
            equal = evaluator.evaluate(
                evaluator.baseline(), dataset, against=Against(full.outcomes, "trial 1", seed=0)
            )
        finally:
            evaluator.close()
    assert full.stopped is None and full.accuracy == 0.0
    assert raced.stopped is not None and raced.stopped.of == full.n
    assert raced.n == raced.stopped.questions < full.n
    assert raced.llm_calls < full.llm_calls
    order = [(o.episode_id, o.question_id) for o in full.outcomes]
    answered = [(o.episode_id, o.question_id) for o in raced.outcomes]
    assert answered == [k for k in order if k in set(answered)]  # the split's order
    assert equal.stopped is None and equal.n == full.n
