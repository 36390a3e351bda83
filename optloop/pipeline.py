"""The one episode pipeline: ingest (or reuse the store) → answer → score → record the graph → attribute.

Every consumer of a memory system runs its episodes through :func:`run_episode` (or :func:`run_episodes`,
``--concurrency`` at a time):

====================================== ===========================================================
caller                                 how it runs the pipeline
====================================== ===========================================================
``Evaluator.evaluate`` (the loop)      cached stores (:class:`CachedStores`), one candidate's modules
                                       and knobs applied before each question, LM faults fail the
                                       question, graphs saved only when a fault hit the episode
``optloop.attribute.attribute_dataset`` fresh stores, recorded, every failure attributed (the LLM
                                       agent refines the ambiguous ones), every graph saved
``attribution.planted.run_planted``    fresh stores with a planted fault, recorded, the failures of
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

Concurrency lives here too. ``N`` is the LM's own ``--concurrency`` (``lm.settings.concurrency``,
:func:`concurrency`: 1 on the embedded model, 8 on an endpoint); there is no second knob. At ``N = 1``
everything runs one after another on the caller's thread, as it always did. At ``N > 1``
(:class:`Workers`: two pools of up to ``N`` daemon threads, every task in a copy of its submitter's
context, so the prompt site, the active recorder and the LM call collectors follow it):

* the episodes of a split run ``N`` at a time (:func:`run_episodes`), each in its own store;
* the questions of an episode run ``N`` at a time once its ingestion is done (the sessions of an
  episode always go in order: memory is stateful), then its attributions, ``N`` at a time too;
* the results are the serial run's, whatever ``N``: outcomes, graphs and attributions are put together
  in episode and question order, never in the order they finish, and the first error in that order is
  the one raised. Every question records on its own copy of the ingestion graph
  (:meth:`Recorder.resume`) and the copies are folded into the episode graph in question order, which
  is the graph the serial run records (on a private store the serial run records on the ingestion's
  recorder itself; ``tests/optloop/test_pipeline_concurrency.py`` compares the two). The store's lock
  is held for all of an episode's questions, and ``prepare`` runs once for them: they ask one candidate.
  The LM calls of an episode, a question or an attribution are counted by the LM layer's collectors
  (:func:`~optloop.lm.collect_calls`, context variables), not by marks in the log every thread writes.
  A shared :class:`StoreCache` decides reuse in episode order (:meth:`StoreCache.plan`). Systems whose
  memory ids are uuid4s (mem0, graphiti) name memories differently in any two runs, at one ``N`` or two.

graphiti goes through the same pools (chosen over its native async API end to end): each
``GraphitiSystem`` drives its own event loop on its own thread, as at ``N = 1``, and the calls graphiti
makes at once inside one ``add_episode`` (its ``semaphore_gather``) run on the LM's threads
(``lm.to_thread``). The one limit shared by every episode is the LM's throttle (``--concurrency``
requests in flight, ``--rpm``, ``--tpm``), which every request of the process passes, whichever thread or
event loop makes it. So an episode runs exactly the code it runs at ``N = 1`` (the same requests, the
same cache keys); one event loop for every episode would need an async pipeline and recorder beside
the synchronous ones every other system uses, for no more requests in flight than the throttle allows.

An interrupt (SIGTERM, Ctrl-C) reaches the caller's thread while it waits for results: what has not
started is cancelled, and the calls in flight are left to their daemon threads, which leave with the
process (a ``ThreadPoolExecutor``'s would be waited for, on a hanging endpoint for its timeouts).

See ``docs/architecture.md`` for where this sits in the whole data flow.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, Field

from optloop.attribution import Attribution, attribute
from optloop.datasets import Episode, Question, passed, score
from optloop.errors import EndpointDownError, LMError, LMUnreachableError
from optloop.lm.accounting import collect_calls
from optloop.tracing.graph import ExecutionGraph
from optloop.tracing.recorder import Recorder

if TYPE_CHECKING:
    from optloop.attribution.agent import AttributionAgent
    from optloop.attribution.judges import JudgeChain
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM
    from systems.base import MemorySystem

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


# --- concurrency ---------------------------------------------------------------------------


def concurrency(lm: Any) -> int:
    """How many episodes, questions and attributions run at once: the LM's ``--concurrency``
    (``OPTLOOP_CONCURRENCY``; 1 on the embedded model, 8 on an endpoint). An LM without settings
    (a test's scripted LM) runs everything in turn."""
    settings = getattr(lm, "settings", None)
    return max(1, int(getattr(settings, "concurrency", None) or 1))


class _Pool:
    """Up to ``n`` daemon threads running submitted calls, as :class:`concurrent.futures.Future` s.

    Not a ``ThreadPoolExecutor``: its threads are joined when the interpreter exits, so after an
    interrupt (SIGTERM, Ctrl-C) the process would wait for every LM call in flight to end (on a
    hanging endpoint, its timeouts). Daemon threads leave with the process, as the serial run's one
    call, interrupted, does.
    """

    def __init__(self, n: int, name: str):
        self.n, self.name = n, name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], R]) -> Future[R]:
        """``call()`` on a thread of the pool; once the pool is closed (an interrupted run's episodes still
        asking for questions) the future comes back cancelled."""
        future: Future[R] = Future()
        with self._lock:
            if self._closed:
                future.cancel()
                return future
            self._queue.put((future, call))
            if len(self._threads) < self.n:  # one more thread per call, up to n
                thread = threading.Thread(target=self._serve, name=f"{self.name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(result)

    def close(self) -> None:
        """Let the threads end once the calls queued before this are done or cancelled."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)


def in_order(pool: _Pool, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
    """``fn(item)`` for every item on ``pool``, each in a copy of the caller's context; the results in
    the items' order (not the order they finish), each as soon as it and those before it are done.

    The first exception (in the items' order) is raised once the calls before it are done; the calls
    not yet started are cancelled and, for an ordinary exception, the running ones waited for, so none
    outlives the caller's use of what they share (a store, a graph). An interrupt (``KeyboardInterrupt``,
    the iteration abandoned) waits for nothing.
    """
    futures: list[Future[R]] = [pool.submit(functools.partial(contextvars.copy_context().run, fn, item))
                                for item in items]
    try:
        for future in futures:
            yield future.result()
    except BaseException as exc:
        for future in futures:
            future.cancel()
        if isinstance(exc, Exception):
            wait(futures)
        raise


class Workers:
    """The threads one run's episodes, questions and attributions go on at ``N > 1``: a context manager.

    Two pools of up to ``n`` threads: one runs whole episodes, the other their questions and
    attributions. An episode waits for its questions; questions wait for nothing but the LM. On one
    pool, ``n`` episodes waiting for questions queued behind them would hold every thread; on two, a
    question always finds one. The LM's throttle, not the thread count, bounds the requests in flight.
    """

    def __init__(self, n: int):
        self.n = n
        self._episodes = _Pool(n, "optloop-episode")
        self._tasks = _Pool(n, "optloop-task")

    def episodes(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``fn`` over episodes (or anything that asks for questions on :meth:`tasks`), in order: see :func:`in_order`."""
        return in_order(self._episodes, fn, items)

    def tasks(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``fn`` over questions or attributions (calls that start nothing on these pools), in order."""
        return list(in_order(self._tasks, fn, items))

    def close(self) -> None:
        self._episodes.close()
        self._tasks.close()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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
    question), or while an episode's questions run at once (all of one candidate), so threads may share
    a store.
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


def ingest(system: MemorySystem, episode: Episode, *, record: bool = True,
           dataset_uri: str = "") -> Store:
    """Ingest every session of ``episode`` into ``system``.

    Recorded: session by session under a :class:`Recorder`. Not recorded: one ``system.ingest`` call
    with every session. On any failure the system is closed and the exception re-raised, carrying the
    graph recorded so far as ``partial_graph`` (when recorded).
    """
    started = time.perf_counter()
    recorder = None
    with collect_calls() as calls:  # this episode's calls only, whatever other threads call meanwhile
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
    return Store(system, recorder, len(calls), ingest_s=time.perf_counter() - started)


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
        store = ingest(system, episode, record=self.record, dataset_uri=self.dataset_uri)
        store.setup_s = setup_s
        return store, False

    def release(self, store: Store) -> None:
        store.close()


@dataclass(eq=False)
class _Live:
    """One key's place in a :class:`StoreCache`: its store once built (``ready``), and who holds it.

    ``users``: episodes that opened it pinned and have not released it, plus an opener building or
    waiting for it. ``evicted``: it left the cache; it is closed once ``users`` is 0.
    """

    store: Store | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    failed: bool = False
    users: int = 0
    evicted: bool = False


@dataclass
class StorePlan:
    """The decisions :meth:`StoreCache.plan` took, per key in order: (its entry, reused)."""

    decisions: dict[Hashable, list[tuple[_Live, bool]]] = field(default_factory=dict)

    def take(self, key: Hashable) -> tuple[_Live, bool] | None:
        left = self.decisions.get(key)
        return left.pop(0) if left else None


class StoreCache:
    """Live stores by key, the least recently used closed beyond ``max_live``; thread-safe.

    Episodes that run at once (see the module docstring) share it: a store is built outside the
    cache's lock, so several keys build at once, and a second opener of a key being built waits for
    that build. A store opened with ``pin=True`` is in use until :meth:`release`: when it leaves the cache
    meanwhile it is closed on release, never under the episode using it. A store opened without a pin
    (a DSPy program's question) is closed on eviction once no question runs on it (its ``lock``).

    Which keys are reused, and which stores leave, follows from the order of the *decisions* alone.
    Parallel episodes open in any order, so :meth:`plan` takes a run's decisions up front, in episode
    order, exactly as one :meth:`open` after another would: reuse, eviction and ingestion counts are
    then the serial run's for any number of threads. (Only an ingestion that fails is different: in
    the serial run it never entered the cache, in a plan its place was already taken.)
    """

    def __init__(self, max_live: int = 8):
        self.max_live = max_live
        self._live: OrderedDict[Hashable, _Live] = OrderedDict()
        self._entries: dict[int, _Live] = {}  # id(store) -> its entry, for release
        self._retired: list[_Live] = []  # evicted while in use or being built: closed when let go, or by close()
        self._lock = threading.Lock()

    def open(self, key: Hashable, build: Callable[[], Store], *, pin: bool = False,
             plan: StorePlan | None = None) -> tuple[Store, bool]:
        """The store under ``key`` (``True``: reused), else ``build()``'s, kept under ``key``.

        ``pin``: the caller :meth:`release` s it when done. ``plan``: use the decision :meth:`plan` took
        for ``key`` (a key the plan does not hold is decided now)."""
        while True:
            closing: list[Store] = []
            with self._lock:
                decided = plan.take(key) if plan is not None else None
                if decided is None:
                    entry, reused = self._decide(key, closing)
                else:
                    entry, reused = decided
            self._close(closing)
            if reused:
                entry.ready.wait()
            else:
                try:
                    self._build(key, entry, build)
                except BaseException:
                    self._let_go(entry)
                    raise
            if entry.failed:  # the build this opener waited for failed: build anew, as the serial run would
                self._let_go(entry)
                plan = None
                continue
            assert entry.store is not None
            if not pin:
                with self._lock:
                    entry.users -= 1  # an evicted one stays in _retired: its caller is about to use it
            return entry.store, reused

    @contextlib.contextmanager
    def plan(self, keys: Sequence[Hashable]) -> Iterator[StorePlan]:
        """Decide now, in this order, which of ``keys`` will be reused and which built (and what they
        evict), as opening them one after another would; pass the plan to :meth:`open`. Each decision
        pins its store until the episode that takes it releases it; the ones no episode took (the run
        stopped) are dropped on leaving the block."""
        plan, closing = StorePlan(), []
        with self._lock:
            for key in keys:
                plan.decisions.setdefault(key, []).append(self._decide(key, closing))
        self._close(closing)
        try:
            yield plan
        finally:
            for key, left in plan.decisions.items():
                for entry, reused in left:
                    if not reused and entry.store is None:  # never built: out, and nobody waits for it
                        self._drop(key, entry)
                    self._let_go(entry)

    def release(self, store: Store) -> None:
        """A pinned opener is done with ``store``: closed now if it left the cache meanwhile."""
        with self._lock:
            entry = self._entries.get(id(store))
        if entry is not None:
            self._let_go(entry)

    def close(self) -> None:
        with self._lock:
            stores = [e.store for e in (*self._live.values(), *self._retired) if e.store is not None]
            self._live.clear()
            self._retired.clear()
            self._entries.clear()
        for store in stores:
            store.close()

    # --- under the hood -------------------------------------------------------------------

    def _decide(self, key: Hashable, closing: list[Store]) -> tuple[_Live, bool]:
        """(``key``'s entry, reused), claimed for one user; a new key's entry goes in, the least recently
        used beyond ``max_live`` out (to ``closing`` when nobody holds them). Under the lock."""
        entry = self._live.get(key)
        reused = entry is not None
        if entry is None:
            entry = self._live[key] = _Live()
            while len(self._live) > self.max_live:
                _, old = self._live.popitem(last=False)
                old.evicted = True
                if old.users == 0 and old.store is not None:
                    self._entries.pop(id(old.store), None)
                    closing.append(old.store)
                else:
                    self._retired.append(old)
        else:
            self._live.move_to_end(key)
        entry.users += 1
        return entry, reused

    def _build(self, key: Hashable, entry: _Live, build: Callable[[], Store]) -> None:
        try:
            store = build()
        except BaseException:
            self._drop(key, entry)
            raise
        with self._lock:
            entry.store = store
            self._entries[id(store)] = entry
        entry.ready.set()

    def _drop(self, key: Hashable, entry: _Live) -> None:
        """``key``'s entry has no store and will get none: out of the cache, its waiters told to build anew."""
        with self._lock:
            if self._live.get(key) is entry:
                del self._live[key]
        entry.failed = True
        entry.ready.set()

    def _let_go(self, entry: _Live) -> None:
        """One user fewer; an evicted entry nobody holds any more is closed."""
        with self._lock:
            entry.users -= 1
            if not (entry.evicted and entry.users == 0 and entry in self._retired):
                return
            self._retired.remove(entry)
            store = entry.store
            if store is not None:
                self._entries.pop(id(store), None)
        if store is not None:
            self._close([store])

    @staticmethod
    def _close(stores: Iterable[Store]) -> None:
        for store in stores:
            with store.lock:  # not while a question runs on it
                store.close()


class CachedStores:
    """Stores kept for reuse: ``open(episode)`` returns ``(store, reused)`` (e.g. ``Evaluator.store`` for one
    candidate), ``release(store)`` says the episode is done with it (e.g. :meth:`StoreCache.release`). They
    are shared, so questions never record on the store's own graph."""

    shared = True

    def __init__(self, open: Callable[[Episode], tuple[Store, bool]],  # noqa: A002 - the protocol's name
                 release: Callable[[Store], None] | None = None):
        self._open = open
        self._release = release

    def open(self, episode: Episode) -> tuple[Store, bool]:
        return self._open(episode)

    def release(self, store: Store) -> None:
        if self._release is not None:
            self._release(store)


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
    with store.lock:
        if prepare is not None:
            prepare(store.system)
        if store.recorder is not None and not shared:
            with store.recorder as recorder:
                return recorder.ask(question), recorder.graph
        asked = _ask(store, question)
        if into is not None and asked.graph is not None:
            assert store.graph is not None
            into.absorb(asked.graph, since=len(store.graph.operations))
        return asked.result()


@dataclass
class _Asked:
    """One question retrieved and answered (:func:`_ask`): its prediction or the exception that stopped it,
    the copy of the store's graph it recorded on (``None``: not recorded), and the LM calls it made."""

    question: Question
    prediction: str = ""
    graph: ExecutionGraph | None = None
    error: BaseException | None = None
    calls: int = 0

    def result(self) -> tuple[str, ExecutionGraph | None]:
        if self.error is not None:
            raise self.error
        return self.prediction, self.graph


def _ask(store: Store, question: Question) -> _Asked:
    """``question`` on ``store``, recorded on a copy of the store's graph (when recorded), which comes back
    with the failed call when a fault stops the question; the caller holds the store's lock. It never
    raises: the exception comes back in :class:`_Asked`, so a caller of several questions at once can
    fold them (and raise) in question order."""
    asked = _Asked(question)
    system = store.system
    with collect_calls() as calls:
        try:
            if store.recorder is None:
                asked.prediction = system.answer(question.question, system.retrieve(question.question))
            else:
                assert store.graph is not None
                with Recorder.resume(system, store.graph) as recorder:
                    asked.graph = recorder.graph
                    asked.prediction = recorder.ask(question)
        except BaseException as exc:  # noqa: BLE001 - handed back, re-raised by the caller
            asked.error = exc
    asked.calls = len(calls)
    return asked


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
                on_question: Callable[[], None] | None = None, workers: Workers | None = None) -> EpisodeResult:
    """Run ``episode`` through every stage (see the module docstring); its questions, or ``questions``.

    ``on_lm_error="fail"``: an LM fault that outlasts the LM layer's retries fails the question it hit
    (during ingestion: every question of the episode) and the episode goes on; an unreachable endpoint
    raises :class:`~optloop.errors.EndpointDownError` instead. ``"raise"``: any fault propagates.

    ``save_graph(graph) -> path`` saves the episode graph: with ``keep="all"`` once the episode is done,
    with ``keep="faulted"`` only when an LM attempt failed during it (saved even when the fault then
    stops the episode; the partial graph when ingestion failed). ``label`` is written to the graph's
    ``meta["evaluation"]`` (with ``store_reused`` and ``first_op``) on a shared store. ``where`` ends
    the warnings about failed questions; ``on_question()`` runs after each question asked (on a worker
    thread at ``N > 1``).

    At ``N > 1`` (:func:`concurrency`) the questions, then the attributions, run at once on ``workers``
    (:func:`run_episodes` lends its own; without, the episode makes its own); at ``N = 1`` one after
    another on this thread.
    """
    result = EpisodeResult(episode)
    asked = list(episode.questions if questions is None else questions)
    with contextlib.ExitStack() as stack:
        if workers is None and (n := concurrency(lm)) > 1:
            workers = stack.enter_context(Workers(n))
        calls = stack.enter_context(collect_calls())  # this episode's LM calls (did a fault hit it?)
        try:
            store, reused = stores.open(episode)
        except LMError as exc:  # ingestion hit an LM fault
            if on_lm_error == "raise":
                raise
            return _ingestion_failed(result, exc, asked, save_graph, where)
        result.store_reused = reused
        result.ingest_calls = 0 if reused else store.llm_calls
        result.setup_s, result.ingest_s = (0.0, 0.0) if reused else (store.setup_s, store.ingest_s)
        result.graph = _episode_graph(store, shared=stores.shared, reused=reused, label=label)
        done = False
        try:
            try:
                if workers is None:
                    pending = _ask_all(result, store, asked, stores.shared, attributor, prepare, on_lm_error, where,
                                       on_question)
                else:
                    pending = _ask_parallel(result, store, asked, stores.shared, attributor, prepare, on_lm_error,
                                            where, on_question, workers)
            finally:
                stores.release(store)
            if pending:  # attributed on the episode graph, now final
                assert result.graph is not None
                _attribute(result, [(outcome, question, result.graph) for outcome, question in pending], attributor,
                           workers)
            if attributor is not None:
                _refine(result, attributor)
            done = True
        finally:
            faulted = any(record.faults for record in calls)
            if save_graph is not None and result.graph is not None and ((done and keep == "all") or faulted):
                result.graph_path = save_graph(result.graph)
    return result


def run_episodes(episodes: Sequence[Episode], stores: EpisodeStores, *, lm: OptloopLM,
                 save_graph: Callable[[ExecutionGraph, Episode], str] | None = None,
                 **options: Any) -> Iterator[EpisodeResult]:
    """:func:`run_episode` for each of ``episodes``: at ``N > 1`` (:func:`concurrency`) ``N`` at a time, their
    questions and attributions on shared :class:`Workers`. The results come in episode order, each as
    soon as it and those before it are done, so a caller reports and folds them as the serial run does.
    ``save_graph(graph, episode) -> path``; ``options`` are :func:`run_episode`'s.
    """

    def one(episode: Episode, workers: Workers | None = None) -> EpisodeResult:
        saver = None if save_graph is None else (lambda graph: save_graph(graph, episode))
        return run_episode(episode, stores, lm=lm, save_graph=saver, workers=workers, **options)

    n = concurrency(lm)
    if n == 1:
        for episode in episodes:
            yield one(episode)
        return
    with Workers(n) as workers:
        yield from workers.episodes(functools.partial(one, workers=workers), episodes)


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
             attributor: Attributor | None, prepare: Callable[[MemorySystem], None] | None,
             on_lm_error: str, where: str,
             on_question: Callable[[], None] | None) -> list[tuple[QuestionOutcome, Question]]:
    """Stages 2 and 3 for every question, one after another, and 5 for those recorded on a graph of their own
    (final at once); returns the failures left to attribute on the episode graph. ``answer_s`` and
    ``answer_calls`` leave the attributions out."""
    started = time.perf_counter()
    pending: list[tuple[QuestionOutcome, Question]] = []
    with collect_calls() as calls:
        for question in asked:
            try:
                prediction, own = answer(store, question, shared=shared, prepare=prepare, into=result.graph)
            except LMError as exc:
                if on_lm_error == "raise":
                    raise
                _fail_question(result, question, exc, where)
            else:
                outcome = judge(result.episode, question, prediction)
                result.outcomes.append(outcome)
                if own is not None and shared:
                    _attribute(result, [(outcome, question, own)], attributor)
                elif own is not None:
                    pending.append((outcome, question))
            if on_question is not None:
                on_question()
    result.answer_s = time.perf_counter() - started - sum(result.attribution_s.values())
    result.answer_calls = len(calls) - sum(result.attribution_calls.values())
    return pending


def _ask_parallel(result: EpisodeResult, store: Store, asked: Sequence[Question], shared: bool,
                  attributor: Attributor | None, prepare: Callable[[MemorySystem], None] | None,
                  on_lm_error: str, where: str, on_question: Callable[[], None] | None,
                  workers: Workers) -> list[tuple[QuestionOutcome, Question]]:
    """:func:`_ask_all` at ``N > 1``: every question at once on ``workers``, each recorded on its own copy of
    the store's graph, then put together in question order (graph, outcomes, the first fault raised) as
    the serial run leaves them; then stage 5, at once, for those final on their own graph. The store's
    lock is held throughout and ``prepare`` runs once: every question asks the same candidate."""
    started = time.perf_counter()
    since = len(store.graph.operations) if store.graph is not None else 0

    def ask(question: Question) -> _Asked:
        done = _ask(store, question)
        if on_question is not None:
            on_question()
        return done

    with store.lock:
        if prepare is not None:
            prepare(store.system)
        answered = workers.tasks(ask, asked)
    result.answer_s = time.perf_counter() - started
    result.answer_calls = sum(done.calls for done in answered)
    own: list[tuple[QuestionOutcome, Question, ExecutionGraph]] = []
    pending: list[tuple[QuestionOutcome, Question]] = []
    for done in answered:
        if done.graph is not None and result.graph is not None:
            result.graph.absorb(done.graph, since=since)  # a private store's graph is result.graph: folded in order
        if done.error is not None:
            if on_lm_error == "raise" or not isinstance(done.error, LMError):
                raise done.error
            _fail_question(result, done.question, done.error, where)
            continue
        outcome = judge(result.episode, done.question, done.prediction)
        result.outcomes.append(outcome)
        if done.graph is not None and shared:
            own.append((outcome, done.question, done.graph))
        elif done.graph is not None:
            pending.append((outcome, done.question))
    _attribute(result, own, attributor, workers)
    return pending


def _fail_question(result: EpisodeResult, question: Question, exc: LMError, where: str) -> None:
    """An LM fault stopped ``question``: failed (or, when the endpoint is unreachable, :class:`EndpointDownError`)."""
    _stop_if_down(exc)
    logger.warning("question %s failed%s: %s", question.id, where, exc)
    result.outcomes.append(failed_outcome(result.episode, question, str(exc)))


def _attribute(result: EpisodeResult, scored: Sequence[tuple[QuestionOutcome, Question, ExecutionGraph]],
               attributor: Attributor | None, workers: Workers | None = None) -> None:
    """Stage 5 for scored questions, each on its final graph: the failures the attributor wants (asked in
    question order) attributed, timed and counted; at once on ``workers`` when given."""
    if attributor is None:
        return
    chosen = [(outcome, question, graph) for outcome, question, graph in scored
              if not outcome.passed and attributor.wants(question, outcome.prediction, graph)]

    def one(item: tuple[QuestionOutcome, Question, ExecutionGraph]) -> tuple[Attribution, float, int]:
        outcome, question, graph = item
        started = time.perf_counter()
        with collect_calls() as calls:
            attribution = attributor(graph, question, outcome.prediction)
        return attribution, time.perf_counter() - started, len(calls)

    done = [one(item) for item in chosen] if workers is None else workers.tasks(one, chosen)
    for (outcome, question, _), (attribution, seconds, calls) in zip(chosen, done, strict=True):
        outcome.attribution = attribution
        result.attribution_s[question.id] = seconds
        result.attribution_calls[question.id] = calls


def _refine(result: EpisodeResult, attributor: Attributor) -> None:
    """The agent's second look at the episode's ambiguous attributions (on the episode graph)."""
    attributed = [o for o in result.outcomes if o.attribution is not None]
    if attributor.agent is None or not attributed or result.graph is None:
        return
    refined = attributor.refine(result.graph, result.episode, [o.attribution for o in attributed])  # type: ignore[misc]
    for outcome, attribution in zip(attributed, refined):
        outcome.attribution = attribution


__all__ = ["Attributor", "CachedStores", "EpisodeResult", "EpisodeStores", "FreshStores", "QuestionOutcome", "Store",
           "StoreCache", "StorePlan", "Workers", "answer", "concurrency", "failed_outcome", "in_order", "ingest", "judge",
           "run_episode", "run_episodes"]
