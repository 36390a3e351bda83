"""The LM layer under concurrency: sites and collectors per thread and task; cache, records and
totals as serial.

A fake backend holds every call until both threads (or tasks) are inside one, so the
calls overlap for certain; each caller must still see only its own site and records.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from optloop.lm import (
    Backend,
    CallRecord,
    LMSettings,
    OptloopLM,
    Request,
    collect_calls,
    current_site,
    prompt_site,
)
from optloop.loop.cost import site_costs, site_metrics
from optloop.testing.scripted import InFlight, ScriptedOpenAIServer


class MeetingBackend(Backend):
    """Answers each request with its last message, once ``parties`` calls are in flight
    together."""

    def __init__(self, parties: int):
        self.barrier = threading.Barrier(parties, timeout=20)
        self.sites_seen: list[str | None] = []

    @property
    def identity(self) -> str:
        return "fake:meeting"

    def complete(self, request: Request) -> dict[str, Any]:
        self.barrier.wait()  # both callers are inside a call now
        self.sites_seen.append(current_site())
        content = request.messages[-1]["content"]
        return {
            "id": "x",
            "model": "fake",
            "object": "chat.completion",
            "created": 0,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }


def meeting_lm(parties: int) -> OptloopLM:
    lm = OptloopLM(
        LMSettings.from_spec("openai:fake", base_url="http://127.0.0.1:9/v1", cache=False)
    )
    lm.optloop_engine.backend = MeetingBackend(parties)
    return lm


def test_two_threads_each_charge_their_own_site_and_collect_their_own_calls():
    lm = meeting_lm(2)
    collected: dict[str, list[CallRecord]] = {}
    errors: list[BaseException] = []

    def work(site: str) -> None:
        try:
            with prompt_site(site), collect_calls() as mine:
                for i in range(3):
                    assert lm.text(f"{site}-{i}") == f"{site}-{i}"
                    assert current_site() == site
            collected[site] = mine
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(site,)) for site in ("mem0.extract", "answer")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    for site in ("mem0.extract", "answer"):
        assert [r.site for r in collected[site]] == [site] * 3
    assert sorted(r.site for r in lm.accounting.records) == ["answer"] * 3 + ["mem0.extract"] * 3
    assert sorted(lm.backend.sites_seen) == sorted(r.site for r in lm.accounting.records)
    assert current_site() is None  # nothing leaked into the main thread


def test_two_dspy_threads_through_the_engine_keep_their_sites():
    """The same, through DSPy (``lm(...)`` -> engine), each thread in a copy of the caller's
    context."""
    lm = meeting_lm(2)
    out: dict[str, Any] = {}

    def work(site: str) -> None:
        with prompt_site(site), collect_calls() as mine:
            out[site] = (lm(f"q from {site}"), [r.site for r in mine])

    with prompt_site(
        "outer"
    ):  # a worker started under copy_context().run inherits this, then overrides it
        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(work, s))
            for s in ("a", "b")
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert out == {"a": (["q from a"], ["a"]), "b": (["q from b"], ["b"])}


def test_two_asyncio_tasks_keep_their_sites():
    lm = meeting_lm(2)

    async def ask(site: str) -> tuple[list[str], list[str | None]]:
        with prompt_site(site), collect_calls() as mine:
            answer = await lm.acall(f"q from {site}")
        return answer, [r.site for r in mine]

    async def both():
        return await asyncio.gather(ask("a"), ask("b"))

    assert asyncio.run(both()) == [(["q from a"], ["a"]), (["q from b"], ["b"])]


def test_collectors_nest_and_do_not_see_calls_made_before_them():
    lm = OptloopLM(
        LMSettings.from_spec("openai:fake", base_url="http://127.0.0.1:9/v1", cache=False)
    )

    class Echo(MeetingBackend):
        def __init__(self):
            super().__init__(1)

    lm.optloop_engine.backend = Echo()
    lm.text("before")
    with collect_calls() as outer:
        lm.text("one")
        with collect_calls() as inner:
            lm.text("two")
    assert len(outer) == 2 and len(inner) == 1 and len(lm.accounting.records) == 3


def test_a_callback_pair_collects_the_calls_between_its_two_halves_in_its_own_thread():
    """What a DSPy callback does: start in on_module_start, stop in on_module_end, same thread."""
    from optloop.lm import start_collecting, stop_collecting

    lm = meeting_lm(2)
    seen: dict[str, list[str]] = {}

    def work(site: str) -> None:
        records, token = start_collecting()
        with prompt_site(site):
            lm.text(site)
        stop_collecting(token)
        lm.text("after")  # not collected
        seen[site] = [r.site for r in records]

    threads = [threading.Thread(target=work, args=(site,)) for site in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert seen == {"a": ["a"], "b": ["b"]}


# --- many threads and tasks against one endpoint: the same cache, records and totals as one caller
# ---

SITES = ("mem0.extract", "mem0.update", "answer", "judge")
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def workload() -> list[tuple[str, str, bool]]:
    """(site, prompt, wants JSON): 48 distinct calls, each asked twice, the second time out of
    order."""
    distinct = [(SITES[i % 4], f"question {i}", i % 3 == 0) for i in range(48)]
    return distinct + distinct[::-1]


class AnsweringEndpoint(ScriptedOpenAIServer):
    """Answers each prompt from its text alone; refuses the first request of every prompt with a
    429.

    One endpoint serves the runs compared (the cache key holds its URL); :meth:`reset` between
    them.
    """

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.seen_lock = threading.Lock()
        super().__init__([("respond", self.respond)])

    def reset(self) -> None:
        with self.seen_lock:
            self.seen.clear()
        self.requests.clear()

    def respond(self, body: dict[str, Any]) -> tuple[str, Any]:
        prompt = body["messages"][-1]["content"]
        with self.seen_lock:
            first = prompt not in self.seen
            self.seen.add(prompt)
        if first:
            return "status", (429, {"retry-after": "0"})
        if body.get("response_format"):
            return "ok", json.dumps({"answer": prompt.upper()})
        return "ok", prompt[::-1]


def ask(lm: OptloopLM, site: str, prompt: str, wants_json: bool) -> str:
    with prompt_site(site):
        if wants_json:
            return json.dumps(lm.json(prompt, SCHEMA))
        return lm.text(prompt)


async def ask_async(lm: OptloopLM, site: str, prompt: str, wants_json: bool) -> str:
    with prompt_site(site):
        fmt = (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
            if wants_json
            else None
        )
        out = await lm.acall(messages=[{"role": "user", "content": prompt}], response_format=fmt)
        return out[0]


def snapshot(lm: OptloopLM, cache_path: Path) -> dict[str, Any]:
    """Everything that must not depend on the concurrency: cache rows, records (as a multiset),
    totals."""
    rows = sqlite3.connect(cache_path).execute("SELECT key, response FROM responses").fetchall()
    records = sorted(
        (
            r.site,
            r.key,
            r.cached,
            r.attempts,
            r.retries_429,
            r.prompt_tokens,
            r.completion_tokens,
            r.cost_usd,
            r.schema,
            r.error,
            tuple(r.faults),
        )
        for r in lm.accounting.records
    )
    timing = {"seconds", "queued_s", "rate_limited_s", "throttled_s", "replayed_seconds"}

    def counts(usage: Any) -> dict[str, Any]:
        return {k: v for k, v in usage.as_dict().items() if k not in timing}

    return {
        "cache": dict(rows),
        "records": records,
        "totals": counts(lm.accounting.totals()),
        "by_site": {site: counts(u) for site, u in lm.accounting.by_site().items()},
        "cost": site_metrics(site_costs(lm.accounting.by_site())),
    }


def fresh_lm(url: str, cache_path: Path, concurrency: int) -> OptloopLM:
    return OptloopLM(
        LMSettings.from_spec(
            "openai:gpt-4o-mini",
            base_url=url,
            cache_path=cache_path,
            concurrency=concurrency,
            max_retries=0,
        )
    )


def run_threads(
    server: AnsweringEndpoint, cache_path: Path, threads: int
) -> tuple[list[str], dict[str, Any], int]:
    server.reset()
    lm = fresh_lm(server.base_url, cache_path, concurrency=max(threads, 1))
    if threads == 1:
        answers = [ask(lm, *call) for call in workload()]
    else:
        with ThreadPoolExecutor(threads) as pool:
            answers = list(pool.map(lambda call: ask(lm, *call), workload()))
    return answers, snapshot(lm, cache_path), len(server.requests)


def test_sixteen_threads_leave_the_same_cache_records_and_totals_as_one(tmp_path):
    with AnsweringEndpoint() as server:
        serial = run_threads(server, tmp_path / "serial.sqlite", 1)
        parallel = run_threads(server, tmp_path / "parallel.sqlite", 16)
    assert parallel[0] == serial[0]  # the same answers, in the order asked
    assert parallel[1] == serial[1]
    assert (
        serial[2] == parallel[2] == 96
    )  # 48 distinct calls, each refused once: duplicates never reach the model
    totals = serial[1]["totals"]
    assert (
        totals["calls"],
        totals["model_calls"],
        totals["cache_hits"],
        totals["retries_429"],
    ) == (96, 48, 48, 48)
    assert totals["cost_usd"] > 0 and set(serial[1]["by_site"]) == set(SITES)


def test_asyncio_tasks_leave_the_same_cache_records_and_totals_as_one_task(tmp_path):
    def run(
        server: AnsweringEndpoint, name: str, together: bool
    ) -> tuple[list[str], dict[str, Any]]:
        server.reset()
        lm = fresh_lm(server.base_url, tmp_path / f"{name}.sqlite", concurrency=16)

        async def main() -> list[str]:
            if together:
                return list(await asyncio.gather(*(ask_async(lm, *call) for call in workload())))
            return [await ask_async(lm, *call) for call in workload()]

        return asyncio.run(main()), snapshot(lm, tmp_path / f"{name}.sqlite")

    with AnsweringEndpoint() as server:
        one_by_one, gathered = run(server, "serial", False), run(server, "gathered", True)
    assert gathered == one_by_one
    assert (
        one_by_one[1]["totals"]["model_calls"] == 48
        and one_by_one[1]["totals"]["retries_429"] == 48
    )


def test_async_calls_are_not_capped_by_asyncios_default_thread_pool():
    """asyncio.to_thread would run 6 calls at a time on a 2-core machine; the engine's own pool
    runs --concurrency."""
    slow = InFlight(0.3)
    with ScriptedOpenAIServer([("respond", slow)]) as server:
        lm = OptloopLM(
            LMSettings.from_spec("openai:m", base_url=server.base_url, cache=False, concurrency=12)
        )

        async def main() -> None:
            await asyncio.gather(*(lm.acall(f"q{i}") for i in range(24)))

        asyncio.run(main())
    assert slow.peak == 12


def test_the_cache_takes_writes_and_reads_from_many_threads(tmp_path):
    from optloop.lm import LMCache

    cache = LMCache(tmp_path / "c.sqlite")

    def work(worker: int) -> None:
        for i in range(50):
            cache.put(f"{worker}-{i}", {"n": i, "w": worker})
            assert cache.get(f"{worker}-{i}") == {"n": i, "w": worker}

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert len(cache) == 400 and LMCache(tmp_path / "c.sqlite").get("7-49") == {"n": 49, "w": 7}


def test_blocking_work_of_an_async_library_runs_on_the_lms_pool_with_the_tasks_site():
    """graphiti's sites run DSPy programs in threads: ``lm.to_thread`` gives them the LM's pool and
    the task's site."""
    lm = meeting_lm(3)  # all three calls must be in flight together

    def site_program(prompt: str) -> tuple[str, str | None]:
        return lm.text(prompt), current_site()

    async def one(site: str) -> tuple[str, str | None]:
        with prompt_site(site):
            return await lm.to_thread(site_program, f"from {site}")

    async def main() -> list[tuple[str, str | None]]:
        return list(await asyncio.gather(*(one(s) for s in ("a", "b", "c"))))

    assert asyncio.run(main()) == [("from a", "a"), ("from b", "b"), ("from c", "c")]
    assert sorted(r.site for r in lm.accounting.records) == ["a", "b", "c"]
