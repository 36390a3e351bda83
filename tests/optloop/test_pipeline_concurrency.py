"""Concurrency in the one episode pipeline (``optloop.pipeline``): workers, the store cache,
private stores.

The evaluator's N = 1 vs N = 4 identity test is
``tests/optloop/loop/test_evaluate_concurrency.py``.
"""

from __future__ import annotations

import contextvars
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from optloop.attribution import default_judges
from optloop.datasets import load_dataset
from optloop.lm import Accounting, LMSettings, OptloopLM
from optloop.pipeline import (
    Attributor,
    FreshStores,
    Store,
    StoreCache,
    Workers,
    concurrency,
    run_episodes,
)
from systems import get_system
from tests._oracle import KeyedEndpoint, gold_answers, without_clock
from tests.optloop.test_pipeline import EchoSystem

SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


@pytest.fixture(scope="module")
def embedder():
    from optloop.embed import get_embedder

    return get_embedder("local")


def test_concurrency_is_the_lms_own_setting():
    assert (
        concurrency(
            OptloopLM(LMSettings.from_spec("openai:m", base_url="http://x/v1", concurrency=5))
        )
        == 5
    )
    assert (
        concurrency(SimpleNamespace(accounting=Accounting())) == 1
    )  # a scripted LM without settings


def test_workers_return_results_in_item_order_in_the_callers_context():
    SEEN.set("caller")

    def slow(i: int) -> tuple[int, str]:
        time.sleep(0.05 * (5 - i))  # the first items finish last
        return i, SEEN.get()

    with Workers(5) as workers:
        assert workers.tasks(slow, range(5)) == [(i, "caller") for i in range(5)]


def test_the_first_failure_in_item_order_is_raised_and_what_had_not_started_never_starts():
    started: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        time.sleep(0.05)
        if i in (1, 2):
            raise ValueError(f"item {i}")
        return i

    with Workers(2) as workers, pytest.raises(ValueError, match="item 1"):
        workers.tasks(work, range(10))
    assert max(started) < 5  # the rest were cancelled once item 1 failed


def test_an_interrupted_run_does_not_wait_for_calls_in_flight():
    """SIGINT (or SIGTERM, which optloop.run turns into the same) while the caller waits for
    results: the calls in flight are left to their daemon threads, which leave with the process."""
    release = threading.Event()
    main = threading.main_thread().ident
    previous = signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # Python's own, whatever ran before
    try:
        threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
        started = time.perf_counter()
        with pytest.raises(KeyboardInterrupt), Workers(2) as workers:
            list(workers.episodes(lambda i: release.wait(30) or i, range(4)))
        assert time.perf_counter() - started < 5
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)


def stores_of(built: list[str], lm: SimpleNamespace, root: Path):
    def build(name: str, delay: float = 0.0):
        def make() -> Store:
            time.sleep(delay)
            built.append(name)
            return Store(EchoSystem(lm, root / name), None)

        return make

    return build


def test_a_plan_makes_the_serial_runs_decisions_whatever_order_the_episodes_open_in(tmp_path):
    lm, built = SimpleNamespace(accounting=Accounting()), []
    build = stores_of(built, lm, tmp_path)
    EchoSystem.closed.clear()
    cache = StoreCache(max_live=2)
    with cache.plan(list("abcd")) as plan:  # serially: a, b built; c evicts a; d evicts b
        opened = {}

        def open_(key: str) -> None:
            opened[key] = cache.open(key, build(key), pin=True, plan=plan)

        threads = [
            threading.Thread(target=open_, args=(key,)) for key in "dcba"
        ]  # opened in reverse
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert (
            EchoSystem.closed == []
        )  # a and b left the cache, but their episodes still hold them
        for key in "abcd":
            assert opened[key][1] is False
            cache.release(opened[key][0])
    assert sorted(built) == list("abcd") and sorted(EchoSystem.closed) == [
        str(tmp_path / k) for k in "ab"
    ]
    with cache.plan(
        ["c", "a", "d"]
    ) as plan:  # c reused; a built (evicts d); d built again (evicts c)
        reused = [cache.open(key, build(key), plan=plan)[1] for key in ("c", "a", "d")]
    assert reused == [True, False, False]
    cache.close()


def test_two_openers_of_one_key_build_it_once_and_a_failed_build_is_built_again(tmp_path):
    lm, built = SimpleNamespace(accounting=Accounting()), []
    build = stores_of(built, lm, tmp_path)
    cache = StoreCache()
    with Workers(2) as workers:
        results = workers.tasks(lambda _: cache.open("k", build("k", delay=0.2)), range(2))
    assert built == ["k"] and sorted(reused for _, reused in results) == [False, True]
    assert results[0][0] is results[1][0]

    def failing() -> Store:
        time.sleep(0.2)
        raise RuntimeError("ingestion broke")

    def second() -> tuple[Store, bool]:
        time.sleep(0.05)  # arrives while the first build runs, waits for it, then builds itself
        return cache.open("f", build("f"))

    with Workers(2) as workers:
        with pytest.raises(RuntimeError, match="ingestion broke"):
            workers.tasks(lambda i: cache.open("f", failing) if i == 0 else second(), range(2))
    assert cache.open("f", build("f"))[1] is True and built == ["k", "f"]
    cache.close()


def test_a_private_store_records_the_same_graph_at_n1_and_n4(tmp_path, embedder):
    """At N = 1 a private store's questions record on the ingestion's recorder; at N = 4 on copies
    folded in question order. The graphs, outcomes and attributions are the same."""
    dataset = load_dataset("builtin:tiny")
    system = get_system("md_flat")
    attributor = Attributor(default_judges(embedder), embedder)
    runs = {}
    with KeyedEndpoint(gold_answers(dataset.episodes), latency_s=0.02) as endpoint:
        for n in (1, 4):
            lm = endpoint.lm(n, tmp_path / f"n{n}.sqlite")
            stores = FreshStores(
                lambda episode, n=n: system(
                    lm, tmp_path / f"n{n}" / episode.id, embedder=embedder
                ),
                lm,
            )
            results = list(run_episodes(dataset.episodes, stores, lm=lm, attributor=attributor))
            runs[n] = (
                [[o.model_dump() for o in r.outcomes] for r in results],
                [without_clock(r.graph.to_json()) for r in results],
                [(r.ingest_calls, r.answer_calls, r.attribution_calls) for r in results],
            )
    assert any(o["attribution"] for outcomes in runs[1][0] for o in outcomes)
    assert runs[4] == runs[1]
