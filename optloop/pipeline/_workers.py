"""The pools the pipeline runs on (:class:`Workers`) at ``--concurrency`` N > 1, and N itself
(:func:`concurrency`): see :mod:`optloop.pipeline` for what runs where."""

from __future__ import annotations

import contextvars
import functools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, wait
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], R]) -> Future[R]:
        """``call()`` on a thread of the pool; once the pool is closed (an interrupted run's
        episodes still asking for questions) the future comes back cancelled."""
        future: Future[R] = Future()
        with self._lock:
            if self._closed:
                future.cancel()
                return future
            self._queue.put((future, call))
            if len(self._threads) < self.n:  # one more thread per call, up to n
                thread = threading.Thread(
                    target=self._serve, name=f"{self.name}-{len(self._threads)}", daemon=True
                )
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
    """``fn(item)`` for every item on ``pool``, each in a copy of the caller's context; the results
    in the items' order (not the order they finish), each as soon as it and those before it are
    done.

    The first exception (in the items' order) is raised once the calls before it are done; the
    calls not yet started are cancelled and, for an ordinary exception, the running ones waited
    for, so none outlives the caller's use of what they share (a store, a graph). An interrupt
    (``KeyboardInterrupt``, the iteration abandoned) waits for nothing.
    """
    futures: list[Future[R]] = [
        pool.submit(functools.partial(contextvars.copy_context().run, fn, item)) for item in items
    ]
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
    """The threads one run's episodes, questions and attributions go on at ``N > 1``: a context
    manager.

    Two pools of up to ``n`` threads: one runs whole episodes, the other their questions and
    attributions. An episode waits for its questions; questions wait for nothing but the LM. On one
    pool, ``n`` episodes waiting for questions queued behind them would hold every thread; on two,
    a question always finds one. The LM's throttle, not the thread count, bounds the requests in
    flight.
    """

    def __init__(self, n: int):
        self.n = n
        self._episodes = _Pool(n, "optloop-episode")
        self._tasks = _Pool(n, "optloop-task")

    def episodes(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``fn`` over episodes (or anything that asks for questions on :meth:`tasks`), in order:
        see :func:`in_order`."""
        return in_order(self._episodes, fn, items)

    def tasks(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``fn`` over questions or attributions (calls that start nothing on these pools), in
        order."""
        return list(in_order(self._tasks, fn, items))

    def close(self) -> None:
        self._episodes.close()
        self._tasks.close()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
