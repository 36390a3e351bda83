"""One evaluation at ``--concurrency`` 1 and 4 is the same evaluation.

Each system (md_flat; mem0 in the thread pool; graphiti, each episode's event loop on a thread of
the pool) runs the same three evaluations at N = 1 and at N = 4 against :class:`KeyedEndpoint`, a
loopback endpoint whose answers, latencies and faults are fixed by the request (so at N = 4 calls
finish out of order, and the first asking of some requests fails with HTTP 500, cured by the retry:
those episodes' graphs are saved). Four episodes and ``max_live=3`` stores: the first evaluation
builds every store and evicts one, the second (another answer prompt, the same ingest key) rebuilds
them in turn, the third (its last two episodes) reuses two. Compared: the Evaluation objects (all
but their seconds), the saved graphs (all but their timings), the LM cache's keys, every call
record and the accounting by prompt site.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from optloop.datasets import Dataset, load_dataset
from optloop.embed import get_embedder
from optloop.errors import EndpointDownError
from optloop.lm import LMSettings, OptloopLM
from optloop.loop.candidate import SiteState
from optloop.loop.evaluate import Evaluator
from optloop.testing.loopback import closed_port_url
from tests._oracle import KeyedEndpoint, gold_answers, without_clock

DATASET = "builtin:tiny"


@pytest.fixture(scope="module")
def embedder():
    return get_embedder("local")


def run(system: str, n: int, root: Path, endpoint: KeyedEndpoint, embedder: Any) -> dict[str, Any]:
    """The three evaluations at concurrency ``n``, and everything they leave behind."""
    dataset = load_dataset(DATASET)
    lm = endpoint.lm(n, root / "cache.sqlite", max_retries=2)
    evaluator = Evaluator(system, lm, root / "work", embedder=embedder, max_live=3)
    try:
        baseline = evaluator.baseline()
        state = baseline.sites["answer"]
        variant = baseline.model_copy(
            update={
                "sites": {
                    **baseline.sites,
                    "answer": SiteState(
                        instructions=state.instructions + " Answer in as few words as you can.",
                        demos=state.demos,
                    ),
                },
                "origin": "variant",
            }
        )
        tail = Dataset(name="tail", uri=DATASET, episodes=dataset.episodes[2:])
        evaluations = [
            evaluator.evaluate(baseline, dataset),
            evaluator.evaluate(variant, dataset),
            evaluator.evaluate(variant, tail),
        ]
    finally:
        evaluator.close()
    graphs = {
        str(Path(p).relative_to(root / "work")): without_clock(json.loads(Path(p).read_text()))
        for e in evaluations
        for p in e.fault_graphs
    }
    with sqlite3.connect(root / "cache.sqlite") as db:
        keys = sorted(row[0] for row in db.execute("SELECT key FROM responses"))
    records = Counter(
        (r.site, r.key, r.cached, r.attempts, tuple(r.faults), r.error)
        for r in lm.accounting.records
    )
    by_site = {
        site: (u.calls, u.model_calls, u.cache_hits, u.errors, u.retries, u.faults, u.tokens)
        for site, u in lm.accounting.by_site().items()
    }
    return {
        "evaluations": [
            e.model_dump(
                exclude={
                    "seconds": True,
                    "lm_seconds": True,
                    "replayed_seconds": True,
                    "fault_graphs": True,
                    "sites": {"__all__": {"seconds"}},  # each site's model seconds
                }
            )
            for e in evaluations
        ],
        "graphs": graphs,
        "keys": keys,
        "records": records,
        "by_site": by_site,
    }


@pytest.fixture(scope="module", params=["md_flat", "mem0", "graphiti"])
def runs(request, tmp_path_factory, embedder) -> dict[Any, Any]:
    gold = gold_answers(load_dataset(DATASET).episodes)
    out: dict[Any, Any] = {"system": request.param}
    with KeyedEndpoint(gold, latency_s=0.03, fault_every=5) as endpoint:
        for n in (1, 4):
            endpoint.forget()  # the same faults for each run
            out[n] = run(
                request.param,
                n,
                tmp_path_factory.mktemp(f"{request.param}-n{n}"),
                endpoint,
                embedder,
            )
    return out


def test_the_evaluations_are_the_same_at_n1_and_n4(runs):
    one, four = runs[1]["evaluations"], runs[4]["evaluations"]
    assert [(e["stores_built"], e["stores_reused"]) for e in one] == [
        (4, 0),
        (4, 0),
        (0, 2),
    ]  # the plan did its job
    assert runs["system"] == "graphiti" or any(o["passed"] for e in one for o in e["outcomes"])
    assert any(o["attribution"] for e in one for o in e["outcomes"])  # failures were attributed
    assert four == one  # outcomes in order, attributions, calls, tokens, reuse, faults


def test_the_saved_graphs_are_the_same_at_n1_and_n4(runs):
    assert runs[1]["graphs"], "no fault graph was saved: the endpoint's faults hit nothing"
    assert runs[4]["graphs"] == runs[1]["graphs"]


def test_the_lm_cache_and_every_call_record_are_the_same_at_n1_and_n4(runs):
    assert runs[4]["keys"] == runs[1]["keys"]
    assert runs[4]["records"] == runs[1]["records"]
    faults = sum(count for (_, _, _, _, faults, _), count in runs[1]["records"].items() if faults)
    assert faults > 0


def test_accounting_by_prompt_site_is_the_same_at_n1_and_n4(runs):
    """Each call is charged to the site of the task that made it, not to whatever site another
    thread has."""
    assert set(runs[1]["by_site"]) >= {"answer"} and None not in runs[1]["by_site"]
    assert runs[4]["by_site"] == runs[1]["by_site"]


def test_a_dead_endpoint_still_stops_an_evaluation_at_n4(tmp_path, embedder):
    lm = OptloopLM(
        LMSettings.from_spec(
            "openai:test", base_url=closed_port_url(), cache=False, max_retries=0, concurrency=4
        )
    )
    evaluator = Evaluator("md_flat", lm, tmp_path, embedder=embedder)
    try:
        with pytest.raises(EndpointDownError, match="cannot reach LM endpoint"):
            evaluator.evaluate(evaluator.baseline(), load_dataset(DATASET))
    finally:
        evaluator.close()
    assert len(lm.accounting.records) <= 4  # the episodes under way when it went down, no more


# --- a batch: several candidates at once, each on its own stores ---------------------------------


def _variants(evaluator: Evaluator) -> list[Any]:
    """The baseline and two answer prompts of it (the same ingest key: shared stores would
    serialize them)."""
    baseline = evaluator.baseline()
    state = baseline.sites["answer"]
    return [
        baseline,
        *(
            baseline.model_copy(
                update={
                    "sites": {
                        **baseline.sites,
                        "answer": SiteState(
                            instructions=state.instructions + extra, demos=state.demos
                        ),
                    },
                    "origin": f"variant {i}",
                }
            )
            for i, extra in enumerate((" Answer in as few words as you can.", " Be brief."))
        ),
    ]


@pytest.mark.parametrize("system", ["md_flat", "mem0"])
def test_a_batch_gives_each_candidate_the_evaluation_it_gets_alone(system, tmp_path, embedder):
    dataset = load_dataset(DATASET)
    gold = gold_answers(dataset.episodes)
    outcomes = {}
    with KeyedEndpoint(gold, latency_s=0.03) as endpoint:
        for how in ("alone", "batch"):
            lm = endpoint.lm(4, tmp_path / how / "cache.sqlite")
            evaluator = Evaluator(system, lm, tmp_path / how / "work", embedder=embedder)
            try:
                candidates = _variants(evaluator)
                evaluations = (
                    [evaluator.evaluate(c, dataset) for c in candidates]
                    if how == "alone"
                    else evaluator.evaluate_many(candidates, dataset)
                )
            finally:
                evaluator.close()
            # the outcomes: which stores were built or reused (and their ingestion calls) are the
            # batch's own
            outcomes[how] = [e.model_dump(include={"candidate", "outcomes"}) for e in evaluations]
            if how == "batch":  # each candidate of the batch built its own stores
                assert [e.stores_built for e in evaluations] == [len(dataset.episodes)] * 3
                assert len(
                    {p.name for p in (tmp_path / how / "work" / "stores").glob("*/*")}
                ) == 3 * len(dataset.episodes)
    assert outcomes["batch"] == outcomes["alone"]
