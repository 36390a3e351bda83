"""Stage 1 of the pipeline, ingest: an episode's :class:`Store` (the system with every session
ingested and the recorder that watched it), built fresh (:class:`FreshStores`) or reused by ingest
key (:class:`CachedStores` over a :class:`StoreCache`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from optloop.datasets import Episode
from optloop.lm.accounting import collect_calls
from optloop.tracing.graph import ExecutionGraph
from optloop.tracing.recorder import Recorder

if TYPE_CHECKING:
    from optloop.lm import OptloopLM
    from systems.base import MemorySystem


@dataclass
class Store:
    """An episode ingested into a live system; ``recorder`` watched it (``None``: not recorded).

    ``lock`` is held while a question runs on the system (its modules and knobs are set for that
    question), or while an episode's questions run at once (all of one candidate), so threads may
    share a store.
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


def ingest(
    system: MemorySystem, episode: Episode, *, record: bool = True, dataset_uri: str = ""
) -> Store:
    """Ingest every session of ``episode`` into ``system``.

    Recorded: session by session under a :class:`Recorder`. Not recorded: one ``system.ingest``
    call with every session. On any failure the system is closed and the exception re-raised,
    carrying the graph recorded so far as ``partial_graph`` (when recorded).
    """
    started = time.perf_counter()
    recorder = None
    # this episode's calls only, whatever other threads call meanwhile
    with collect_calls() as calls:
        try:
            if record:
                with Recorder(system, episode, dataset=dataset_uri) as recorder:
                    recorder.ingest(episode.sessions)
            else:
                system.ingest(episode.sessions)
        except BaseException as exc:
            system.close()
            # what ran before the fault, the failed call marked: for the fault graph
            if recorder is not None:
                exc.partial_graph = recorder.graph  # type: ignore[attr-defined]
            raise
    return Store(system, recorder, len(calls), ingest_s=time.perf_counter() - started)


class EpisodeStores(Protocol):
    """Where :func:`run_episode` gets an episode's store."""

    @property
    def shared(self) -> bool:
        """Whether stores outlive the episode (then questions record on copies of the store's
        graph)."""

    def open(self, episode: Episode) -> tuple[Store, bool]:
        """The episode's store, and whether it was reused. An ingestion failure raises
        (see :func:`ingest`)."""

    def release(self, store: Store) -> None:
        """The episode is done with ``store``."""


class FreshStores:
    """A new system per episode (``make(episode)``), ingested, closed after the episode's
    questions."""

    shared = False

    def __init__(
        self,
        make: Callable[[Episode], MemorySystem],
        lm: OptloopLM,
        *,
        record: bool = True,
        dataset_uri: str = "",
    ):
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
    """One key's place in a :class:`StoreCache`: its store once built (``ready``), and who holds
    it.

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
    that build. A store opened with ``pin=True`` is in use until :meth:`release`: when it leaves
    the cache meanwhile it is closed on release, never under the episode using it. A store opened
    without a pin (a DSPy program's question) is closed on eviction once no question runs on it
    (its ``lock``).

    Which keys are reused, and which stores leave, follows from the order of the *decisions* alone.
    Parallel episodes open in any order, so :meth:`plan` takes a run's decisions up front, in
    episode order, exactly as one :meth:`open` after another would: reuse, eviction and ingestion
    counts are then the serial run's for any number of threads. (Only an ingestion that fails is
    different: in the serial run it never entered the cache, in a plan its place was already
    taken.)
    """

    def __init__(self, max_live: int = 8):
        self.max_live = max_live
        self._live: OrderedDict[Hashable, _Live] = OrderedDict()
        self._entries: dict[int, _Live] = {}  # id(store) -> its entry, for release
        self._retired: list[
            _Live
        ] = []  # evicted while in use or being built: closed when let go, or by close()
        self._lock = threading.Lock()

    def open(
        self,
        key: Hashable,
        build: Callable[[], Store],
        *,
        pin: bool = False,
        plan: StorePlan | None = None,
    ) -> tuple[Store, bool]:
        """The store under ``key`` (``True``: reused), else ``build()``'s, kept under ``key``.

        ``pin``: the caller :meth:`release` s it when done. ``plan``: use the decision :meth:`plan`
        took for ``key`` (a key the plan does not hold is decided now)."""
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
            # the build this opener waited for failed: build anew, as the serial run would
            if entry.failed:
                self._let_go(entry)
                plan = None
                continue
            assert entry.store is not None
            if not pin:
                with self._lock:
                    # an evicted one stays in _retired: its caller is about to use it
                    entry.users -= 1
            return entry.store, reused

    @contextlib.contextmanager
    def plan(self, keys: Sequence[Hashable]) -> Iterator[StorePlan]:
        """Decide now, in this order, which of ``keys`` will be reused and which built (and what
        they evict), as opening them one after another would; pass the plan to :meth:`open`. Each
        decision pins its store until the episode that takes it releases it; the ones no episode
        took (the run stopped) are dropped on leaving the block."""
        plan, closing = StorePlan(), list[Store]()
        with self._lock:
            for key in keys:
                plan.decisions.setdefault(key, []).append(self._decide(key, closing))
        self._close(closing)
        try:
            yield plan
        finally:
            for key, left in plan.decisions.items():
                for entry, reused in left:
                    # never built: out, and nobody waits for it
                    if not reused and entry.store is None:
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
            stores = [
                e.store for e in (*self._live.values(), *self._retired) if e.store is not None
            ]
            self._live.clear()
            self._retired.clear()
            self._entries.clear()
        for store in stores:
            store.close()

    # --- under the hood -------------------------------------------------------------------

    def _decide(self, key: Hashable, closing: list[Store]) -> tuple[_Live, bool]:
        """(``key``'s entry, reused), claimed for one user; a new key's entry goes in, the least
        recently used beyond ``max_live`` out (to ``closing`` when nobody holds them). Under the
        lock."""
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
        """``key``'s entry has no store and will get none: out of the cache, its waiters told to
        build anew."""
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
    """Stores kept for reuse: ``open(episode)`` returns ``(store, reused)`` (e.g.
    ``Evaluator.store`` for one candidate), ``release(store)`` says the episode is done with it
    (e.g. :meth:`StoreCache.release`). They are shared, so questions never record on the store's
    own graph."""

    shared = True

    def __init__(
        self,
        open: Callable[[Episode], tuple[Store, bool]],  # noqa: A002 - the protocol's name
        release: Callable[[Store], None] | None = None,
    ):
        self._open = open
        self._release = release

    def open(self, episode: Episode) -> tuple[Store, bool]:
        return self._open(episode)

    def release(self, store: Store) -> None:
        if self._release is not None:
            self._release(store)
