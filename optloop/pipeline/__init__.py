"""The one episode pipeline: ingest (or reuse the store) → answer → score → record the graph →
attribute.

Every consumer of a memory system runs its episodes through :func:`run_episode` (or
:func:`run_episodes`, ``--concurrency`` at a time) and differs from the others only in its
arguments: the stores (:class:`FreshStores`, or :class:`CachedStores` reused by ingest key),
whether the system is recorded and its failures attributed (:class:`Attributor`), what an LM fault
does, which graphs are kept.

The contract: at any concurrency ``N`` (:func:`concurrency`, the LM's own ``--concurrency``; work
on :class:`Workers`' daemon threads, each task in a copy of its submitter's context) the results
are the serial run's: outcomes, graphs and attributions in episode and question order, the first
error in that order raised, a store's own graph never changed by its questions. The sessions of an
episode always go in order. ``docs/architecture.md`` ("The one episode pipeline",
"Concurrency") has the callers, the stages and how each level runs in parallel.
"""

from optloop.pipeline._episode import (
    Attributor,
    EpisodeResult,
    QuestionOutcome,
    answer,
    failed_outcome,
    judge,
    run_episode,
    run_episodes,
)
from optloop.pipeline._stores import (
    CachedStores,
    EpisodeStores,
    FreshStores,
    Store,
    StoreCache,
    StorePlan,
    ingest,
)
from optloop.pipeline._workers import Workers, concurrency, in_order

__all__ = [
    "Attributor",
    "CachedStores",
    "EpisodeResult",
    "EpisodeStores",
    "FreshStores",
    "QuestionOutcome",
    "Store",
    "StoreCache",
    "StorePlan",
    "Workers",
    "answer",
    "concurrency",
    "failed_outcome",
    "in_order",
    "ingest",
    "judge",
    "run_episode",
    "run_episodes",
]
