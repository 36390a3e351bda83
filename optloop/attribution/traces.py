"""Attribute failures of imported traces offline: no system run, no LLM.

:func:`attribute_traces` takes the runs of :func:`optloop.tracing.meme_traces.import_traces`
and attributes every probe the authors' judge failed with
:func:`optloop.attribution.parts.attribute_parts`, timing each. The judges are
optloop's deterministic chain, lexical then embedding; :class:`~optloop.embed.CachedEmbedder`
embeds each distinct text once across all failures (the same memories are judged again and
again), and :func:`warm_embedder` loads the model before the clock starts. Without an
embedder only the lexical judge runs. :data:`MEME_STAGE` maps optloop's error types to
MEME's ``failure_stage``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from optloop.attribution.parts import attribute_parts
from optloop.attribution.taxonomy import Attribution, ErrorType
from optloop.embed import CachedEmbedder, Embedder

if TYPE_CHECKING:
    from optloop.datasets import Question
    from optloop.datasets.meme_published import Probe
    from optloop.tracing.meme_traces import TraceRun

MEME_STAGE: dict[ErrorType, str | None] = {
    ErrorType.EXTRACTION: "encoding",
    ErrorType.UPDATE: "maintenance",
    ErrorType.DELETION: "maintenance",
    ErrorType.RETRIEVAL: "retrieval",
    ErrorType.CONTAMINATION: "retrieval",
    ErrorType.RESPONSE: "answering",
    ErrorType.UNKNOWN: None,
}


@dataclass
class TracedFailure:
    """One failed probe and optloop's attribution of it."""

    system: str
    episode_id: str
    question: Question
    probe: Probe
    attribution: Attribution
    seconds: float

    @property
    def stage(self) -> str | None:
        """optloop's verdict as a MEME stage."""
        return MEME_STAGE[self.attribution.error_type]

    def to_json(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "episode": self.episode_id,
            "question_id": self.question.id,
            "task_type": self.question.task_type,
            "phase": self.probe.phase,
            "published_task": self.probe.task_type,
            "stage": self.stage,
            "label": self.probe.failure_stage,
            "label_note": self.probe.analysis.get("note"),
            "ms": round(self.seconds * 1000, 3),
            "attribution": self.attribution.model_dump(mode="json"),
        }


def warm_embedder(spec: str | None = None) -> tuple[CachedEmbedder, float]:
    """The configured embedder, cached and loaded; returns it and the seconds loading took."""
    from optloop.embed import get_embedder

    started = time.perf_counter()
    embedder = CachedEmbedder(get_embedder(spec))
    embedder.inner.embed(["warm up"])
    return embedder, time.perf_counter() - started


def attribute_traces(
    runs: Iterable[TraceRun], embedder: Embedder | None = None
) -> list[TracedFailure]:
    """Attribute every failed probe of ``runs``, in order (lexical judge only without
    ``embedder``)."""
    out = []
    for run in runs:
        for question, probe in run.failures():
            started = time.perf_counter()
            attribution = attribute_parts(run.graph, question, probe.answer, embedder)
            out.append(
                TracedFailure(
                    run.system,
                    run.episode.id,
                    question,
                    probe,
                    attribution,
                    time.perf_counter() - started,
                )
            )
    return out


def llm_calls(failures: Iterable[TracedFailure]) -> int:
    """LLM calls the attribution made: LLM-judge calls (the deterministic pass has none)."""
    return sum(f.attribution.judge_calls.get("llm", 0) for f in failures)


__all__ = ["MEME_STAGE", "TracedFailure", "attribute_traces", "llm_calls", "warm_embedder"]
