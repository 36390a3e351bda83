"""The longest chain of sequential requests in an evaluation: the floor under its time that no
``--concurrency`` lowers.

The sessions of one episode are ingested in order (memory is stateful) and a question's requests
follow its episode's ingestion, so the longest episode's ingestion (its sessions x the requests
one session takes) plus one question's requests is a chain: an evaluation takes
``max(requests x latency / --concurrency, chain x latency)`` (:func:`evaluation_seconds`).
``optloop.run`` measures the requests per session and per question on the baseline's dev
evaluation and takes the longest episode of the dev and the test split (:func:`measured_chains`);
the ``--estimate`` model (:mod:`optloop.loop.spending.estimate`) floors each part's time with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.state import Checkpoint


class Chains(BaseModel):
    """The longest chain of sequential requests in one evaluation of the dev and of the test split:
    its longest episode's ingestion (sessions x requests a session, one session after another) and
    then one question's requests. However high ``--concurrency``, an evaluation takes at least that
    chain x latency."""

    dev: float = Field(ge=0, description="requests of the dev split's longest chain")
    test: float = Field(ge=0, description="requests of the test split's longest chain")


def chain_requests(sessions: float, session_requests: float, question_requests: float) -> float:
    """Sequential requests of an episode of ``sessions``: ingested one session after another, then
    a question."""
    return sessions * session_requests + question_requests


def evaluation_seconds(
    requests: float, latency_s: float, concurrency: int, chain: float | None = None
) -> float:
    """LM seconds of one evaluation of ``requests``: ``concurrency`` always in flight, but no less
    than its longest ``chain`` of sequential requests (none: no floor)."""
    return max(requests / max(concurrency, 1), chain or 0.0) * latency_s


def measured_chains(ckpt: Checkpoint, dev: Dataset, test: Dataset) -> Chains | None:
    """The dev and test splits' longest chains, at the requests per session and per question that
    ``ckpt``'s baseline dev evaluation (of ``dev``) measured: its ingestion requests over the
    sessions of the stores it built (a reused store ingested nothing: those taken as the built
    share of the split's sessions), its other requests over the split's questions. ``None`` when it
    built no store (nothing measured the ingestion) or ``dev`` has no question."""
    measured = ckpt.baseline_dev
    assert measured is not None, "the chains need the baseline"
    sessions = sum(len(e.sessions) for e in dev.episodes)
    questions = sum(len(e.questions) for e in dev.episodes)
    if not measured.stores_built or not sessions or not questions:
        return None
    stores = measured.stores_built + measured.stores_reused
    per_session = measured.ingest_calls / (sessions * measured.stores_built / stores)
    per_question = (measured.llm_calls - measured.ingest_calls) / questions

    def longest(split: Dataset) -> float:
        return max(
            (chain_requests(len(e.sessions), per_session, per_question) for e in split.episodes),
            default=0.0,
        )

    return Chains(dev=longest(dev), test=longest(test))


__all__ = ["Chains", "chain_requests", "evaluation_seconds", "measured_chains"]
