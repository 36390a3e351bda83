"""The prompt site and the call collectors are per thread and per task, not per process.

A fake backend holds every call until both threads (or tasks) are inside one, so the
calls overlap for certain; each caller must still see only its own site and records.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

from optloop.lm import Backend, CallRecord, LMSettings, OptloopLM, Request, collect_calls, current_site, prompt_site


class MeetingBackend(Backend):
    """Answers each request with its last message, once ``parties`` calls are in flight together."""

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
        return {"id": "x", "model": "fake", "object": "chat.completion", "created": 0,
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def meeting_lm(parties: int) -> OptloopLM:
    lm = OptloopLM(LMSettings.from_spec("openai:fake", base_url="http://127.0.0.1:9/v1", cache=False))
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
    """The same, through DSPy (``lm(...)`` -> engine), each thread in a copy of the caller's context."""
    lm = meeting_lm(2)
    out: dict[str, Any] = {}

    def work(site: str) -> None:
        with prompt_site(site), collect_calls() as mine:
            out[site] = (lm(f"q from {site}"), [r.site for r in mine])

    with prompt_site("outer"):  # a worker started under copy_context().run inherits this, then overrides it
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(work, s)) for s in ("a", "b")]
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
    lm = OptloopLM(LMSettings.from_spec("openai:fake", base_url="http://127.0.0.1:9/v1", cache=False))

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
