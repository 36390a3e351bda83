"""Load limits: ``--rpm`` / ``--tpm`` token buckets, the ``--concurrency`` cap, ``Retry-After``,
backoff.

One :class:`Throttle` per endpoint and limits, shared process-wide (:func:`shared_throttle`):
every thread and asyncio task of the process, and every LM built on the same endpoint with
the same limits (the system's LM, the proposer, their copies), draws from the same buckets
and the same pool of in-flight slots.

:class:`TokenBucket` lets a caller go into debt: :meth:`TokenBucket.reserve` takes what a
call needs at once, under a lock, and returns how long the caller must wait before its
share has refilled. Callers are served in the order they reserved (no starvation), a call
larger than the bucket is never stuck (it waits its share of the rate), and waiting happens
outside the lock, with ``time.sleep`` in a thread or ``await asyncio.sleep`` in a task
(:meth:`TokenBucket.acquire`, :meth:`TokenBucket.acquire_async`). The buckets hold one
second of the rate (a burst of ``rpm / 60`` requests, ``tpm / 60`` tokens): a provider that
enforces a per-minute limit over shorter windows sees an even rate, not a minute's burst.

Tokens for ``--tpm`` are estimated before the call as a provider counts them (prompt
characters / 4, plus ``max_tokens``) and reconciled after it with the usage the endpoint
reports (:meth:`Throttle.settle`).

This module uses only the standard library and tenacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import math
import random
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from tenacity import RetryCallState, wait_exponential

# A Retry-After honoured on a fault other than 429 (a 503 from an overloaded server) is capped
# here.
MAX_FAULT_RETRY_AFTER_S = 60.0


class TokenBucket:
    """A thread-safe token bucket that refills at ``rate`` per second up to ``capacity``; debt
    allowed."""

    def __init__(self, rate: float, capacity: float, *, clock: Any = time.monotonic):
        if rate <= 0 or capacity <= 0:
            raise ValueError("a token bucket needs a positive rate and capacity")
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._level = capacity
        self._stamp = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
        self._stamp = now

    def reserve(self, amount: float) -> float:
        """Take ``amount`` now; returns the seconds to wait before using it (0 when the bucket had
        it)."""
        with self._lock:
            self._refill()
            self._level -= amount
            return max(0.0, -self._level / self.rate)

    def adjust(self, delta: float) -> None:
        """Give back (``delta > 0``) or take more (``delta < 0``) after the fact."""
        with self._lock:
            self._refill()
            self._level = min(self.capacity, self._level + delta)

    def acquire(self, amount: float = 1.0) -> float:
        """Reserve and sleep in this thread; returns the seconds waited."""
        wait = self.reserve(amount)
        if wait > 0:
            time.sleep(wait)
        return wait

    async def acquire_async(self, amount: float = 1.0) -> float:
        """Reserve and sleep in this task (the event loop keeps running); returns the seconds
        waited."""
        wait = self.reserve(amount)
        if wait > 0:
            await asyncio.sleep(wait)
        return wait


def estimate_tokens(
    messages: list[dict[str, Any]], schema: dict[str, Any] | None, max_tokens: int
) -> int:
    """What a provider counts against a tokens-per-minute limit before the answer: ~4 characters a
    token, plus max_tokens."""
    chars = sum(
        len(m.get("content") or "")
        if isinstance(m.get("content"), str)
        else len(json.dumps(m.get("content")))
        for m in messages
    )
    if schema:
        chars += len(json.dumps(schema))
    return math.ceil(chars / 4) + max_tokens


class Throttle:
    """The ``--rpm`` and ``--tpm`` buckets and the ``--concurrency`` cap of one endpoint, for the
    whole process."""

    def __init__(self, *, rpm: float | None, tpm: int | None, concurrency: int):
        self.requests = TokenBucket(rpm / 60, max(1.0, rpm / 60)) if rpm else None
        self.tokens = TokenBucket(tpm / 60, max(1.0, tpm / 60)) if tpm else None
        self.concurrency = concurrency
        self._slots = threading.BoundedSemaphore(concurrency)

    @contextlib.contextmanager
    def attempt(self, estimated_tokens: int) -> Iterator[list[float]]:
        """One attempt: wait for its request and tokens, then for a free slot, hold the slot while
        it runs.

        Yields a one-item list holding the seconds waited
        (for :class:`~optloop.lm.accounting.CallRecord`).
        """
        started = time.perf_counter()
        waits = [0.0]
        if self.requests is not None:
            self.requests.acquire(1)
        if self.tokens is not None:
            self.tokens.acquire(estimated_tokens)
        with self._slots:
            waits[0] = time.perf_counter() - started
            yield waits

    def settle(self, estimated_tokens: int, used_tokens: int | None) -> None:
        """Reconcile the ``--tpm`` estimate with what the endpoint says the call used (None: keep
        the estimate)."""
        if self.tokens is not None and used_tokens is not None:
            self.tokens.adjust(estimated_tokens - used_tokens)


_THROTTLES: dict[tuple[Any, ...], Throttle] = {}
_THROTTLES_LOCK = threading.Lock()


def shared_throttle(
    endpoint: str, *, rpm: float | None, tpm: int | None, concurrency: int
) -> Throttle:
    """The process's one :class:`Throttle` for ``endpoint`` (a backend identity) under these
    limits."""
    key = (endpoint, rpm, tpm, concurrency)
    with _THROTTLES_LOCK:
        if key not in _THROTTLES:
            _THROTTLES[key] = Throttle(rpm=rpm, tpm=tpm, concurrency=concurrency)
        return _THROTTLES[key]


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: datetime | None = None
) -> float | None:
    """Seconds a ``Retry-After`` (delta-seconds or an HTTP date) or ``retry-after-ms`` header asks
    to wait; None if absent.

    ``retry-after-ms`` (OpenAI's, more precise) wins; a date in the past means 0; an unparseable
    value means absent.
    """
    if not headers:
        return None
    lower = {k.lower(): v for k, v in headers.items()}
    if (ms := lower.get("retry-after-ms")) is not None:
        try:
            value = float(ms) / 1000
            if math.isfinite(value) and value >= 0:
                return value
        except ValueError:
            pass
    raw = lower.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
        return value if math.isfinite(value) and value >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _attempt(n: int) -> RetryCallState:
    """The ``n``-th attempt as tenacity's waits see it (they read only ``attempt_number``)."""
    return cast(RetryCallState, SimpleNamespace(attempt_number=n))


@dataclass
class Backoff:
    """How long to sleep before the next attempt: jittered exponential backoff, or what the server
    asked.

    * an HTTP 429 with ``Retry-After``: that long, plus up to 10 % (at most 1 s) of jitter so the
      threads a storm hit together do not come back together; from a call's
      ``HONOURED_FREELY + 1``-th 429 on, at least the backoff below (counted from there), so a
      server that keeps saying ``Retry-After: 0`` is not hammered and the call's sleeps do
      reach its wait budget;
    * an HTTP 429 without it: full-jitter exponential on the call's count of 429s,
      ``uniform(0, min(60, 2 ** (n - 1)))`` seconds;
    * any other transient fault: full-jitter exponential on its count,
      ``uniform(0, min(8, 0.5 * 2 ** (n - 1)))``, or the server's ``Retry-After`` when that is
      longer (capped at :data:`MAX_FAULT_RETRY_AFTER_S`).

    The exponential ceilings are tenacity's ``wait_exponential``; the jitter is drawn from ``rng``
    (tenacity's ``wait_random_exponential`` would draw from the global ``random``).
    """

    rng: random.Random

    def __post_init__(self) -> None:
        self._rate_limited = wait_exponential(multiplier=1, max=60)
        self._faults = wait_exponential(multiplier=0.5, max=8)
        self._lock = threading.Lock()

    def _uniform(self, low: float, high: float) -> float:
        with self._lock:  # random.Random is not documented as thread-safe
            return self.rng.uniform(low, high)

    HONOURED_FREELY = 5

    def rate_limited(self, n: int, retry_after: float | None) -> float:
        """The sleep after a call's ``n``-th HTTP 429 (1-based)."""
        if retry_after is None:
            return self._uniform(0, self._rate_limited(_attempt(max(1, n))))
        wait = retry_after + self._uniform(0, min(1.0, 0.1 * retry_after))
        if n > self.HONOURED_FREELY:
            floor = self._rate_limited(_attempt(n - self.HONOURED_FREELY))
            wait = max(wait, self._uniform(0, floor))
        return wait

    def fault(self, n: int, retry_after: float | None) -> float:
        wait = self._uniform(0, self._faults(_attempt(max(1, n))))
        if retry_after is not None:
            wait = max(wait, min(retry_after, MAX_FAULT_RETRY_AFTER_S))
        return wait
