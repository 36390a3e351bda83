"""The one episode pipeline: ingest (or reuse the store) → answer → score → record the graph → attribute.

Every consumer of a memory system runs its episodes through :func:`run_episode`:

====================================== ===========================================================
caller                                 how it runs the pipeline
====================================== ===========================================================
``Evaluator.evaluate`` (the loop)      cached stores (:class:`CachedStores`), one candidate's modules
                                       and knobs applied before each question, LM faults fail the
                                       question, graphs saved only when a fault hit the episode
``optloop.attribute.attribute_dataset`` fresh stores, recorded, every failure attributed (the LLM
                                       agent refines the ambiguous ones), every graph saved
``attribution.faults.run_planted``     fresh stores with a planted fault, recorded, the failures of
                                       clean passes attributed (``Attributor.select``)
``experiments.bench._common``          fresh stores, not recorded, not attributed: the system alone,
                                       timed per stage
====================================== ===========================================================

The stages, in order:

1. **ingest**: an :class:`EpisodeStores` gives the episode's :class:`Store` (the system with every
   session ingested, and the recorder that watched it), built or reused.
2. **answer**: each question is retrieved and answered (:func:`answer`). On a *private* store the
   questions go on recording on the ingestion's recorder: one graph for the episode. On a *shared*
   store (kept for reuse by other candidates) each question records on its own copy of the
   ingestion graph, folded into an episode graph, so the store's own graph never changes.
3. **score**: :func:`judge` scores the prediction with the question's own scorer.
4. **record the graph**: the episode graph is saved by the caller's ``save_graph`` when it asks.
5. **attribute**: each failure is attributed on its final graph (the question's own copy, or the
   episode graph once every question is asked) by an :class:`Attributor`.

Concurrency (episodes in parallel) belongs here, behind :func:`run_episode`. See
``docs/architecture.md`` for where this sits in the whole data flow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, Field

from optloop.attribution import Attribution, attribute
from optloop.datasets import Episode, Question, passed, score
from optloop.errors import EndpointDownError, LMError, LMUnreachableError
from optloop.tracing.graph import ExecutionGraph
from optloop.tracing.recorder import Recorder

if TYPE_CHECKING:
    from optloop.attribution.agent import AttributionAgent
    from optloop.attribution.judges import JudgeChain
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM
    from systems.base import MemorySystem

logger = logging.getLogger(__name__)


class QuestionOutcome(BaseModel):
    """One question of one episode: the prediction, its score, and why it failed."""

    episode_id: str
    question_id: str
    task_type: str
    question: str
    gold: str
    prediction: str
    score: float
    passed: bool
    attribution: Attribution | None = None
    error: str | None = Field(None, description="the LM fault that stopped this question (it counts as failed)")


# --- stage 1: ingest ----------------------------------------------------------------------


@dataclass
class Store:
    """An episode ingested into a live system; ``recorder`` watched it (``None``: not recorded).

    ``lock`` is held while a question runs on the system (its modules and knobs are set for that
    question), so threads may share a store.
    """

    system: MemorySystem
    recorder: Recorder | None
    llm_calls: int = 0
    setup_s: float = 0.0
    ingest_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def graph(self) -> ExecutionGraph | None:
        """The execution graph so far (ingestion, and the questions asked on a private store)."""
        return None if self.recorder is None else self.recorder.graph

    def close(self) -> None:
        self.system.close()


def ingest(system: MemorySystem, episode: Episode, lm: OptloopLM, *, record: bool = True,
           dataset_uri: str = "") -> Store:
    """Ingest every session of ``episode`` into ``system``.

    Recorded: session by session under a :class:`Recorder`. Not recorded: one ``system.ingest`` call
    with every session. On any failure the system is closed and the exception re-raised, carrying the
    graph recorded so far as ``partial_graph`` (when recorded).
    """
    mark, started = lm.accounting.mark(), time.perf_counter()
    recorder = None
    try:
        if record:
            with Recorder(system, episode, dataset=dataset_uri) as recorder:
                recorder.ingest(episode.sessions)
        else:
            system.ingest(episode.sessions)
    except BaseException as exc:
        system.close()
        if recorder is not None:  # what ran before the fault, the failed call marked: for the fault graph
            exc.partial_graph = recorder.graph  # type: ignore[attr-defined]
        raise
    return Store(system, recorder, lm.accounting.totals(since=mark).calls, ingest_s=time.perf_counter() - started)


class EpisodeStores(Protocol):
    """Where :func:`run_episode` gets an episode's store."""

    @property
    def shared(self) -> bool:
        """Whether stores outlive the episode (then questions record on copies of the store's graph)."""

    def open(self, episode: Episode) -> tuple[Store, bool]:
        """The episode's store, and whether it was reused. An ingestion failure raises (see :func:`ingest`)."""

    def release(self, store: Store) -> None:
        """The episode is done with ``store``."""


class FreshStores:
    """A new system per episode (``make(episode)``), ingested, closed after the episode's questions."""

    shared = False

    def __init__(self, make: Callable[[Episode], MemorySystem], lm: OptloopLM, *, record: bool = True,
                 dataset_uri: str = ""):
        self.make = make
        self.lm = lm
        self.record = record
        self.dataset_uri = dataset_uri

    def open(self, episode: Episode) -> tuple[Store, bool]:
        started = time.perf_counter()
        system = self.make(episode)
        setup_s = time.perf_counter() - started
        store = ingest(system, episode, self.lm, record=self.record, dataset_uri=self.dataset_uri)
        store.setup_s = setup_s
        return store, False

    def release(self, store: Store) -> None:
        store.close()


class StoreCache:
    """Live stores by key, the least recently used closed beyond ``max_live``."""

    def __init__(self, max_live: int = 8):
        self.max_live = max_live
        self._stores: OrderedDict[Hashable, Store] = OrderedDict()
        self._lock = threading.RLock()  # threads open stores one at a time: a store is built once

    def open(self, key: Hashable, build: Callable[[], Store]) -> tuple[Store, bool]:
        """The store under ``key`` (``True``: reused), else ``build()``'s, kept under ``key``."""
        with self._lock:
            if key in self._stores:
                self._stores.move_to_end(key)
                return self._stores[key], True
            store = build()
            self._stores[key] = store
            while len(self._stores) > self.max_live:
                _, old = self._stores.popitem(last=False)
                with old.lock:  # not while a question runs on it
                    old.close()
            return store, False

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()


class CachedStores:
    """Stores kept for reuse: ``open(episode)`` returns ``(store, reused)`` (e.g. ``Evaluator.store`` for one
    candidate). They are shared, so questions never record on the store's own graph."""

    shared = True

    def __init__(self, open: Callable[[Episode], tuple[Store, bool]]):  # noqa: A002 - the protocol's name
        self._open = open

    def open(self, episode: Episode) -> tuple[Store, bool]:
        return self._open(episode)

    def release(self, store: Store) -> None:
        pass


# --- stages 2 to 5: answer, score, attribute ----------------------------------------------


def answer(store: Store, question: Question, *, shared: bool, prepare: Callable[[MemorySystem], None] | None = None,
           into: ExecutionGraph | None = None) -> tuple[str, ExecutionGraph | None]:
    """Retrieve and answer ``question`` on ``store``: (prediction, the graph that recorded it).

    ``prepare(system)`` runs first (a candidate's modules and knobs). Recorded on a ``shared`` store, the
    question records on its own copy of the store's graph, which is returned and, when ``into`` is given,
    folded into it (the failed call too, when an LM fault stops the question). On a private store it
    records on the store's recorder (the returned graph is the episode's, still growing). Not recorded:
    ``system.answer(question, system.retrieve(question))`` and no graph.
    """
    system = store.system
    with store.lock:
        if prepare is not None:
            prepare(system)
        if store.recorder is None:
            return system.answer(question.question, system.retrieve(question.question)), None
        if not shared:
            with store.recorder as recorder:
                return recorder.ask(question), recorder.graph
        assert store.graph is not None
        with Recorder.resume(system, store.graph) as recorder:
            try:
                prediction = recorder.ask(question)
            finally:
                if into is not None:
                    into.absorb(recorder.graph, since=len(store.graph.operations))
        return prediction, recorder.graph


@dataclass
class Attributor:
    """Stage 5: attributes a failure on its graph.

    ``select(question, prediction, graph)`` (optional) says which failures to attribute; ``agent``
    (optional) re-examines the ones the deterministic walk marks ambiguous.
    """

    judges: JudgeChain
    embedder: Embedder | None = None
    agent: AttributionAgent | None = None
    select: Callable[[Question, str, ExecutionGraph], bool] | None = None

    def wants(self, question: Question, prediction: str, graph: ExecutionGraph) -> bool:
        return self.select is None or self.select(question, prediction, graph)

    def __call__(self, graph: ExecutionGraph, question: Question, prediction: str) -> Attribution:
        return attribute(graph, question, prediction, self.judges, embedder=self.embedder)

    def refine(self, graph: ExecutionGraph, episode: Episode, attributions: list[Attribution]) -> list[Attribution]:
        """``attributions`` with the ambiguous ones refined by the agent (unchanged without one)."""
        if self.agent is None:
            return attributions
        from optloop.attribution.agent import refine_ambiguous

        return refine_ambiguous(self.agent, graph, {q.id: q for q in episode.questions}, attributions,
                                embedder=self.embedder)


def judge(episode: Episode, question: Question, prediction: str) -> QuestionOutcome:
    """Stage 3: the prediction scored by the question's own scorer (not yet attributed)."""
    return QuestionOutcome(episode_id=episode.id, question_id=question.id, task_type=question.task_type,
                           question=question.question, gold=question.gold, prediction=prediction,
                           score=score(question, prediction), passed=passed(question, prediction))


def failed_outcome(episode: Episode, question: Question, error: str) -> QuestionOutcome:
    """A question an LM fault stopped: failed, with the fault as its error."""
    return QuestionOutcome(episode_id=episode.id, question_id=question.id, task_type=question.task_type,
                           question=question.question, gold=question.gold, prediction="", score=0.0,
                           passed=False, error=error[:500])


@dataclass
class EpisodeResult:
    """One episode through the pipeline.

    ``graph``: the episode graph (ingestion, then every question; the partial ingestion graph when
    ingestion failed; ``None`` when not recorded). ``store_reused``: ``None`` when ingestion failed.
    ``ingest_calls``: LLM calls of the ingestion (0 for a reused store). ``attribution_s`` and
    ``attribution_calls``: per attributed question id, the seconds and LLM calls its attribution took
    (the agent's refinement not included).
    """

    episode: Episode
    outcomes: list[QuestionOutcome] = field(default_factory=list)
    graph: ExecutionGraph | None = None
    graph_path: str | None = None
    store_reused: bool | None = None
    ingest_calls: int = 0
    setup_s: float = 0.0
    ingest_s: float = 0.0
    answer_s: float = 0.0
    answer_calls: int = 0
    attribution_s: dict[str, float] = field(default_factory=dict)
    attribution_calls: dict[str, int] = field(default_factory=dict)

    @property
    def predictions(self) -> dict[str, str]:
        return {o.question_id: o.prediction for o in self.outcomes}

    def attributions(self) -> list[Attribution]:
        return [o.attribution for o in self.outcomes if o.attribution is not None]


def _stop_if_down(exc: LMError) -> None:
    if isinstance(exc, LMUnreachableError):
        raise EndpointDownError(str(exc)) from exc


def run_episode(episode: Episode, stores: EpisodeStores, *, lm: OptloopLM, attributor: Attributor | None = None,
                prepare: Callable[[MemorySystem], None] | None = None, questions: Sequence[Question] | None = None,
                on_lm_error: Literal["raise", "fail"] = "raise",
                save_graph: Callable[[ExecutionGraph], str] | None = None, keep: Literal["all", "faulted"] = "all",
                label: Mapping[str, Any] | None = None, where: str = "",
                on_question: Callable[[], None] | None = None) -> EpisodeResult:
    """Run ``episode`` through every stage (see the module docstring); its questions, or ``questions``.

    ``on_lm_error="fail"``: an LM fault that outlasts the LM layer's retries fails the question it hit
    (during ingestion: every question of the episode) and the episode goes on; an unreachable endpoint
    raises :class:`~optloop.errors.EndpointDownError` instead. ``"raise"``: any fault propagates.

    ``save_graph(graph) -> path`` saves the episode graph: with ``keep="all"`` once the episode is done,
    with ``keep="faulted"`` only when an LM attempt failed during it (saved even when the fault then
    stops the episode; the partial graph when ingestion failed). ``label`` is written to the graph's
    ``meta["evaluation"]`` (with ``store_reused`` and ``first_op``) on a shared store. ``where`` ends
    the warnings about failed questions; ``on_question()`` runs after each question asked.
    """
    result = EpisodeResult(episode)
    mark = lm.accounting.mark()
    asked = list(episode.questions if questions is None else questions)
    try:
        store, reused = stores.open(episode)
    except LMError as exc:  # ingestion hit an LM fault
        if on_lm_error == "raise":
            raise
        return _ingestion_failed(result, exc, asked, save_graph, where)
    result.store_reused = reused
    result.ingest_calls = 0 if reused else store.llm_calls
    result.setup_s, result.ingest_s = (0.0, 0.0) if reused else (store.setup_s, store.ingest_s)
    graph = _episode_graph(store, shared=stores.shared, reused=reused, label=label)
    result.graph = graph
    done = False
    try:
        try:
            pending = _ask_all(result, store, asked, stores.shared, attributor, prepare, lm, on_lm_error, where,
                               on_question)
        finally:
            stores.release(store)
        for outcome, question in pending:  # attributed on the episode graph, now final
            assert result.graph is not None
            _attribute(result, outcome, question, result.graph, attributor, lm)
        if attributor is not None:
            _refine(result, attributor)
        done = True
    finally:
        faulted = bool(lm.accounting.totals(since=mark).faults)
        if save_graph is not None and result.graph is not None and ((done and keep == "all") or faulted):
            result.graph_path = save_graph(result.graph)
    return result


def _ingestion_failed(result: EpisodeResult, exc: LMError, asked: Sequence[Question],
                      save_graph: Callable[[ExecutionGraph], str] | None, where: str) -> EpisodeResult:
    """An LM fault stopped the ingestion: its partial graph saved, then every question failed (or, when the
    endpoint is unreachable, :class:`EndpointDownError`)."""
    result.graph = getattr(exc, "partial_graph", None)
    if result.graph is not None and save_graph is not None:
        result.graph_path = save_graph(result.graph)
    _stop_if_down(exc)
    logger.warning("episode %s: ingestion failed%s: %s", result.episode.id, where, exc)
    result.outcomes = [failed_outcome(result.episode, q, f"ingestion: {exc}") for q in asked]
    return result


def _episode_graph(store: Store, *, shared: bool, reused: bool,
                   label: Mapping[str, Any] | None) -> ExecutionGraph | None:
    """The graph the episode's questions are folded into: the store's own for a private store, a labelled
    copy of it for a shared one."""
    ingestion = store.graph
    if ingestion is None or not shared:
        return ingestion
    graph = ingestion.model_copy(deep=True)
    if label is not None:
        graph.meta["evaluation"] = {**label, "store_reused": reused,
                                    "first_op": len(ingestion.operations) if reused else 0}
    return graph


def _ask_all(result: EpisodeResult, store: Store, asked: Sequence[Question], shared: bool,
             attributor: Attributor | None, prepare: Callable[[MemorySystem], None] | None, lm: OptloopLM,
             on_lm_error: str, where: str,
             on_question: Callable[[], None] | None) -> list[tuple[QuestionOutcome, Question]]:
    """Stages 2 and 3 for every question, and 5 for those recorded on a graph of their own (final at once);
    returns the failures left to attribute on the episode graph. ``answer_s`` and ``answer_calls`` leave
    the attributions out."""
    mark, started = lm.accounting.mark(), time.perf_counter()
    pending: list[tuple[QuestionOutcome, Question]] = []
    for question in asked:
        try:
            prediction, own = answer(store, question, shared=shared, prepare=prepare, into=result.graph)
        except LMError as exc:
            if on_lm_error == "raise":
                raise
            _stop_if_down(exc)
            logger.warning("question %s failed%s: %s", question.id, where, exc)
            result.outcomes.append(failed_outcome(result.episode, question, str(exc)))
        else:
            outcome = judge(result.episode, question, prediction)
            result.outcomes.append(outcome)
            if own is not None and shared:
                _attribute(result, outcome, question, own, attributor, lm)
            elif own is not None:
                pending.append((outcome, question))
        if on_question is not None:
            on_question()
    result.answer_s = time.perf_counter() - started - sum(result.attribution_s.values())
    result.answer_calls = lm.accounting.totals(since=mark).calls - sum(result.attribution_calls.values())
    return pending


def _attribute(result: EpisodeResult, outcome: QuestionOutcome, question: Question, graph: ExecutionGraph,
               attributor: Attributor | None, lm: OptloopLM) -> None:
    """Stage 5 for one scored question: a failure the attributor wants is attributed, timed and counted."""
    if attributor is None or outcome.passed or not attributor.wants(question, outcome.prediction, graph):
        return
    mark, started = lm.accounting.mark(), time.perf_counter()
    outcome.attribution = attributor(graph, question, outcome.prediction)
    result.attribution_s[question.id] = time.perf_counter() - started
    result.attribution_calls[question.id] = lm.accounting.totals(since=mark).calls


def _refine(result: EpisodeResult, attributor: Attributor) -> None:
    """The agent's second look at the episode's ambiguous attributions (on the episode graph)."""
    attributed = [o for o in result.outcomes if o.attribution is not None]
    if attributor.agent is None or not attributed or result.graph is None:
        return
    refined = attributor.refine(result.graph, result.episode, [o.attribution for o in attributed])  # type: ignore[misc]
    for outcome, attribution in zip(attributed, refined):
        outcome.attribution = attribution


__all__ = ["Attributor", "CachedStores", "EpisodeResult", "EpisodeStores", "FreshStores", "QuestionOutcome", "Store",
           "StoreCache", "answer", "failed_outcome", "ingest", "judge", "run_episode"]
