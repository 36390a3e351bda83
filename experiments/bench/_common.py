"""Pieces the memory-system benchmarks share: system names, the LM, one episode's run.

:func:`run_episode` is the loop every benchmark here measures: a fresh system on its
own directory, ingest all of an episode's sessions, then
``system.answer(q, system.retrieve(q))`` for each question, scored by the question's
own scorer, with seconds and LLM calls taken for the ingest and the answer stages. It is
the one episode pipeline (``optloop.pipeline``) without recording or attribution.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optloop import failures, pipeline
from optloop.datasets import Episode, Question
from optloop.embed import Embedder
from optloop.lm import LMSettings, OptloopLM, collect_calls
from optloop.pipeline import FreshStores, Store
from systems import get_system
from systems.base import MemorySystem


def parse_systems(text: str | Sequence[str]) -> list[str]:
    """``"a,b"`` (or a list) -> names; an unknown name raises ConfigError before any work."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    names = [n.strip() for n in parts if n.strip()]
    for name in names:
        get_system(name)
    return names


def bench_lm(
    args: argparse.Namespace, tmp: Path, cache: Path | None = None, *, systems: Sequence[str] = ()
) -> OptloopLM:
    """The LM from the ``add_lm_arguments`` flags, on a fresh cache so every call is real; with
    ``cache``, on that file instead (an earlier run's answers are reused, the new ones added). A
    local model's context window is the largest any of ``systems`` asks for (``local_decoding``)
    unless the flags set it."""
    n_ctx = args.lm_n_ctx or max(
        (get_system(s).local_decoding.get("n_ctx", 0) for s in systems), default=0
    )
    return OptloopLM(
        LMSettings.from_spec(
            args.lm,
            base_url=args.lm_base_url,
            timeout_s=args.lm_timeout,
            max_retries=args.lm_retries,
            n_ctx=n_ctx or None,
            max_array_items=getattr(args, "lm_max_items", None),
            max_string_chars=getattr(args, "lm_max_chars", None),
            cache_path=cache or tmp / "cache.sqlite",
        )
    )


@dataclass
class QuestionResult:
    question: Question
    prediction: str
    passed: bool
    score: float = 0.0


@dataclass
class EpisodeRun:
    """What one episode cost and how its questions went."""

    episode_id: str
    sessions: int
    setup_s: float = 0.0
    ingest_s: float = 0.0
    ingest_calls: int = 0
    answer_s: float = 0.0
    answer_calls: int = 0
    results: list[QuestionResult] = field(default_factory=list)
    # What ``inspect(system)`` said once the questions were answered.
    inspected: dict[str, Any] | None = None

    @property
    def seconds(self) -> float:
        return self.setup_s + self.ingest_s + self.answer_s

    @property
    def calls(self) -> int:
        return self.ingest_calls + self.answer_calls

    @property
    def correct(self) -> int:
        return sum(r.passed for r in self.results)


class _InspectedStores(FreshStores):
    """Fresh stores that let ``inspect`` look at the system after the questions, before it
    closes."""

    def __init__(
        self,
        make: Callable[[Episode], MemorySystem],
        lm: OptloopLM,
        inspect: Callable[[MemorySystem], dict[str, Any]],
    ):
        super().__init__(make, lm, record=False)
        self.inspect = inspect
        self.inspected: dict[str, Any] | None = None

    def release(self, store: Store) -> None:
        try:
            self.inspected = self.inspect(store.system)
        finally:
            super().release(store)


def run_episode(
    system_cls: type[MemorySystem],
    episode: Episode,
    lm: OptloopLM,
    run_dir: Path,
    embedder: Embedder | None = None,
    inspect: Callable[[MemorySystem], dict[str, Any]] | None = None,
) -> EpisodeRun:
    """Fresh ``system_cls`` under ``run_dir``: ingest every session, answer and score every
    question.

    The one episode pipeline (:func:`optloop.pipeline.run_episode`) with nothing recorded or
    attributed, so the figures are the system's own. ``inspect(system)``, when given, runs once
    the questions are answered (before the store closes); it returns the run's ``inspected``.
    Failed LM calls past :data:`optloop.failures.ALLOWED_SHARE` of the episode's raise
    :class:`~optloop.errors.CallsFailedError` (exit 4) instead of a figure.
    """

    def make(_episode: Episode) -> MemorySystem:
        return system_cls(lm, run_dir, embedder=embedder)

    stores = (
        FreshStores(make, lm, record=False)
        if inspect is None
        else _InspectedStores(make, lm, inspect)
    )
    with collect_calls() as calls:
        result = pipeline.run_episode(episode, stores, lm=lm)
    # A library may swallow a failed LLM call (mem0 stores nothing): such an episode is not a
    # measurement.
    failures.check(
        sum(c.error is not None for c in calls),
        len(calls),
        what=f"{getattr(system_cls, 'name', system_cls.__name__)} on episode {episode.id}",
        first=failures.first_error(calls),
    )
    results = [
        QuestionResult(q, o.prediction, o.passed, o.score)
        for q, o in zip(episode.questions, result.outcomes)
    ]
    return EpisodeRun(
        episode_id=episode.id,
        sessions=len(episode.sessions),
        setup_s=result.setup_s,
        ingest_s=result.ingest_s,
        ingest_calls=result.ingest_calls,
        answer_s=result.answer_s,
        answer_calls=result.answer_calls,
        results=results,
        inspected=getattr(stores, "inspected", None),
    )
