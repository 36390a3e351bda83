"""The one episode pipeline (``optloop.pipeline``): stores, the answer modes, attribution, graphs
(no model).

A stub system stands in where nothing is recorded; ``rag_bm25`` (no ingest LLM call) on a
scripted endpoint where the graph is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from optloop.attribution import default_judges
from optloop.datasets import Session, load_dataset
from optloop.lm import Accounting, CallRecord, LMSettings, OptloopLM
from optloop.pipeline import (
    Attributor,
    CachedStores,
    FreshStores,
    Store,
    StoreCache,
    ingest,
    run_episode,
)
from optloop.testing.scripted import ScriptedOpenAIServer
from systems import get_system


class EchoSystem:
    """Answers with everything ingested; one fake LM call per session and per answer."""

    closed: list[str] = []

    def __init__(self, lm, run_dir: Path, *, fail_on: str | None = None) -> None:
        self.lm, self.text, self.run_dir, self.fail_on = lm, "", run_dir, fail_on

    def _call(self, site: str) -> None:
        self.lm.accounting.add(
            CallRecord(
                site=site,
                model="stub",
                prompt_tokens=1,
                completion_tokens=1,
                seconds=0.0,
                cached=False,
            )
        )

    def ingest(self, sessions: Sequence[Session]) -> None:
        for session in sessions:
            self.text += " ".join(t.content for t in session.turns) + " "
            self._call("ingest")

    def retrieve(self, question: str) -> list[str]:
        return [self.text]

    def answer(self, question: str, memories: list[str]) -> str:
        if question == self.fail_on:
            raise RuntimeError("the system broke")
        self._call("answer")
        return memories[0]

    def close(self) -> None:
        EchoSystem.closed.append(str(self.run_dir))


def stub_lm() -> SimpleNamespace:
    return SimpleNamespace(accounting=Accounting())


@pytest.fixture(scope="module")
def embedder():
    from optloop.embed import get_embedder

    return get_embedder("local")


def test_an_unrecorded_episode_is_the_system_alone_timed_and_counted_per_stage(tmp_path):
    episode = load_dataset("builtin:tiny?limit=1").episodes[0]
    lm = stub_lm()
    EchoSystem.closed.clear()
    result = run_episode(
        episode, FreshStores(lambda ep: EchoSystem(lm, tmp_path / ep.id), lm, record=False), lm=lm
    )
    assert result.graph is None and result.store_reused is False
    assert result.ingest_calls == len(episode.sessions) and result.answer_calls == len(
        episode.questions
    )
    assert [o.question_id for o in result.outcomes] == [q.id for q in episode.questions]
    assert all(
        o.passed and o.attribution is None for o in result.outcomes
    )  # the answer holds every fact
    assert min(result.setup_s, result.ingest_s, result.answer_s) >= 0
    assert EchoSystem.closed == [
        str(tmp_path / episode.id)
    ]  # a fresh store is closed after its episode


def test_a_fresh_store_is_closed_when_its_episode_fails(tmp_path):
    episode = load_dataset("builtin:tiny?limit=1").episodes[0]
    lm = stub_lm()
    EchoSystem.closed.clear()
    stores = FreshStores(
        lambda ep: EchoSystem(lm, tmp_path, fail_on=episode.questions[0].question),
        lm,
        record=False,
    )
    with pytest.raises(RuntimeError, match="the system broke"):
        run_episode(episode, stores, lm=lm)
    assert EchoSystem.closed == [str(tmp_path)]


def test_the_store_cache_reuses_by_key_and_closes_the_least_recently_used(tmp_path):
    lm, cache, built = stub_lm(), StoreCache(max_live=2), []
    EchoSystem.closed.clear()

    def build(name: str):
        def make() -> Store:
            built.append(name)
            return Store(EchoSystem(lm, tmp_path / name), None)

        return make

    assert cache.open("a", build("a"))[1] is False and cache.open("b", build("b"))[1] is False
    assert cache.open("a", build("a"))[1] is True  # reused, and now the most recent
    cache.open("c", build("c"))
    assert built == ["a", "b", "c"] and EchoSystem.closed == [str(tmp_path / "b")]
    cache.close()
    assert sorted(EchoSystem.closed) == sorted(str(tmp_path / n) for n in "abc")


def scripted_lm(url: str, tmp_path: Path) -> OptloopLM:
    return OptloopLM(
        LMSettings.from_spec(
            "openai:test", base_url=url, max_retries=0, cache_path=tmp_path / "cache.sqlite"
        )
    )


def test_private_and_shared_stores_record_the_same_questions(tmp_path, embedder):
    """A private store records every question on its own graph; a shared one on copies, its graph
    unchanged."""
    episode = load_dataset("builtin:tiny?limit=1").episodes[0]
    with ScriptedOpenAIServer([("ok", json.dumps({"answer": "unknown"}))]) as server:
        lm = scripted_lm(server.base_url, tmp_path)
        system = get_system("rag_bm25")
        attributor = Attributor(default_judges(embedder), embedder)
        saved: list[str] = []

        def saver(name: str):
            def save(graph) -> str:
                saved.append(name)
                return name

            return save

        fresh = run_episode(
            episode,
            FreshStores(lambda ep: system(lm, tmp_path / "fresh", embedder=embedder), lm),
            lm=lm,
            attributor=attributor,
            save_graph=saver("fresh"),
        )
        cache = StoreCache()
        store, _ = cache.open(
            "k", lambda: ingest(system(lm, tmp_path / "shared", embedder=embedder), episode)
        )
        ingest_ops = len(store.graph.operations)
        shared = run_episode(
            episode,
            CachedStores(lambda ep: cache.open("k", lambda: store)),
            lm=lm,
            attributor=attributor,
            label={"split": "dev"},
            keep="faulted",
            save_graph=saver("shared"),
        )
        cache.close()
    assert (
        saved == ["fresh"] and fresh.graph_path == "fresh"
    )  # "faulted" keeps no graph of an episode without a fault
    assert len(store.graph.operations) == ingest_ops  # the shared store's own graph never grows
    assert shared.store_reused is True and shared.graph.meta["evaluation"] == {
        "split": "dev",
        "store_reused": True,
        "first_op": ingest_ops,
    }
    for result in (fresh, shared):
        answers = [op.question_id for op in result.graph.operations if op.site == "answer"]
        assert answers == [q.id for q in episode.questions]
        assert [o.passed for o in result.outcomes] == [o.passed for o in fresh.outcomes]
        failed = [o for o in result.outcomes if not o.passed]
        assert failed and all(o.attribution is not None for o in failed)
        assert set(result.attribution_s) == {o.question_id for o in failed}
    assert [o.attribution.error_type for o in fresh.outcomes if o.attribution] == [
        o.attribution.error_type for o in shared.outcomes if o.attribution
    ]


def test_select_decides_which_failures_are_attributed(tmp_path, embedder):
    episode = load_dataset("builtin:tiny?limit=1").episodes[0]
    with ScriptedOpenAIServer([("ok", json.dumps({"answer": "unknown"}))]) as server:
        lm = scripted_lm(server.base_url, tmp_path)
        system = get_system("rag_bm25")
        seen: list[str] = []
        first = episode.questions[0].id
        attributor = Attributor(
            default_judges(embedder),
            embedder,
            select=lambda q, prediction, graph: seen.append(q.id) or q.id == first,
        )
        result = run_episode(
            episode,
            FreshStores(lambda ep: system(lm, tmp_path, embedder=embedder), lm),
            lm=lm,
            attributor=attributor,
        )
    failed = [o.question_id for o in result.outcomes if not o.passed]
    assert seen == failed  # asked about failures only, in question order
    assert [o.question_id for o in result.outcomes if o.attribution] == [
        q for q in failed if q == first
    ]
