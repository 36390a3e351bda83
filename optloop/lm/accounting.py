"""Who spent what: the prompt site in effect, one :class:`CallRecord` per request, totals.

Both the prompt site (:func:`prompt_site`) and the call collectors (:func:`collect_calls`)
live in :class:`contextvars.ContextVar` slots, so they are per thread and per asyncio
task, not per process: two threads (or two tasks) that ask the same LM at the same time
each charge their calls to their own site and each collect only their own records.
A new ``threading.Thread`` starts with an empty context (Python's rule): a worker that
should inherit the caller's site runs under ``contextvars.copy_context().run``.
``asyncio`` tasks, ``asyncio.to_thread`` and ``loop.call_soon_threadsafe`` copy the
context for you.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from types import EllipsisType

_CURRENT_SITE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "optloop_prompt_site", default=None
)
_COLLECTORS: contextvars.ContextVar[tuple[list[CallRecord], ...]] = contextvars.ContextVar(
    "optloop_call_collectors", default=()
)


@contextlib.contextmanager
def prompt_site(name: str | None) -> Iterator[None]:
    """Charge every LM call made inside this block (in this thread or task) to prompt site
    ``name``."""
    token = _CURRENT_SITE.set(name)
    try:
        yield
    finally:
        _CURRENT_SITE.reset(token)


def current_site() -> str | None:
    return _CURRENT_SITE.get()


@contextlib.contextmanager
def collect_calls() -> Iterator[list[CallRecord]]:
    """The :class:`CallRecord` of every LM call made inside this block by this thread or task.

    A recorder that wants the calls one prompt-site call made (its attempts, faults and
    error) uses this instead of ``accounting.mark()``/``since()``: those index a log
    that concurrent threads append to, so a mark taken in one thread also sees the
    other threads' calls. Blocks nest; a record goes to every enclosing collector.
    """
    records, token = start_collecting()
    try:
        yield records
    finally:
        stop_collecting(token)


def start_collecting() -> tuple[list[CallRecord], contextvars.Token]:
    """:func:`collect_calls` for callers that start and stop in two calls (a DSPy callback's
    ``on_module_start``/``on_module_end``, which DSPy runs in the caller's thread or task).
    Pass the token to :func:`stop_collecting` in the same context."""
    records: list[CallRecord] = []
    return records, _COLLECTORS.set((*_COLLECTORS.get(), records))


def stop_collecting(token: contextvars.Token) -> None:
    _COLLECTORS.reset(token)


@dataclass
class CallRecord:
    """One request to the LM layer. ``cached`` calls did not touch the model.

    ``attempts`` counts the tries made (1 = no retry); ``faults`` names each failed
    try, in order (``HTTP 503``, ``timeout``, ``body not JSON``). A record without
    ``error`` and with faults is a call a retry cured; with ``error``, every one of
    its attempts failed and the fault surfaced to the caller. ``queued_s`` is the part
    of ``seconds`` spent waiting for the machine's llama.cpp slot (other processes'
    model calls, see :mod:`optloop.lm.machine`).

    Load (:mod:`optloop.lm.limits`): ``retries_429`` counts the attempts the endpoint
    refused with HTTP 429 (they are in ``attempts``, not in ``faults``: a rate limit is the
    endpoint pacing us, not failing), ``rate_limited_s`` the seconds slept on them,
    ``throttled_s`` the seconds this process held the call back itself (``--rpm``,
    ``--tpm``, ``--concurrency``). All three are parts of ``seconds``.

    ``cost_usd``: dollars at the model's price (:mod:`optloop.lm.pricing`); 0.0 for a
    cache hit of a priced model (nothing was spent), None when the model has no price.

    ``replayed_s``: for a cache hit, the seconds the model took when it computed the response
    (None: not a hit, or a response stored without them), so a run replayed from the cache can
    still project the time of the calls it will compute.

    ``truncated``: the answer stopped at ``max_tokens`` (``finish_reason`` ``length``), or a
    decoding bound closed its JSON (a string of ``--lm-max-chars`` characters, an answer asked
    again under tighter bounds: :func:`optloop.lm.requests.asked_until_whole`): text cut where
    the limit fell (the proposal gate refuses such a proposal, :mod:`optloop.loop.proposals.gate`).

    ``reused_prompt_tokens``: of ``prompt_tokens``, those the model did not compute because its
    cache held them (a llama.cpp context's shared prefix with its previous call, a server's
    ``prompt_tokens_details.cached_tokens``); 0 when the backend does not say.
    """

    site: str | None
    model: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    cached: bool
    attempts: int = 1
    schema: bool = False
    error: str | None = None
    key: str = ""
    faults: list[str] = field(default_factory=list)
    queued_s: float = 0.0
    retries_429: int = 0
    rate_limited_s: float = 0.0
    throttled_s: float = 0.0
    cost_usd: float | None = None
    replayed_s: float | None = None
    truncated: bool = False
    reused_prompt_tokens: int = 0


@dataclass
class Usage:
    """Totals over call records (:meth:`Accounting.totals`, :meth:`Accounting.by_site`,
    :meth:`Usage.of`).

    ``cost_usd`` is the dollars of the priced records (None when none was priced: a model
    without a price reports tokens only); ``unpriced_calls`` counts the model calls it
    leaves out. The sum is exact (fractions), so it does not depend on the order in which
    concurrent calls were recorded.
    """

    calls: int = 0
    model_calls: int = 0
    cache_hits: int = 0
    errors: int = 0
    retries: int = 0
    faults: int = 0  # failed attempts (what a flaky endpoint did to us); HTTP 429 is not one
    cured: int = 0  # failed attempts of calls that a retry then completed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reused_prompt_tokens: int = 0  # of ``prompt_tokens``: held by the model's cache, not computed
    truncated: int = 0  # model calls whose answer was cut where a limit fell
    seconds: float = 0.0
    queued_s: float = 0.0  # of ``seconds``: waiting for another process's model call
    retries_429: int = 0  # attempts refused with HTTP 429 (rate limited) and asked again
    rate_limited_s: float = 0.0  # of ``seconds``: sleeping on HTTP 429 (Retry-After or backoff)
    throttled_s: float = 0.0  # of ``seconds``: held back by --rpm / --tpm / --concurrency
    unpriced_calls: int = 0  # model calls without a price (not in ``cost_usd``)
    # cache hits whose response kept the seconds it took to compute, those seconds, their tokens
    replayed_calls: int = 0
    replayed_seconds: float = 0.0
    replayed_tokens: int = 0
    _cost: Fraction | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, records: Iterable[CallRecord]) -> Usage:
        """The totals of ``records`` (e.g. what :func:`collect_calls` gathered for one task)."""
        usage = cls()
        for rec in records:
            usage.add(rec)
        return usage

    def add(self, rec: CallRecord) -> None:
        self.calls += 1
        self.cache_hits += rec.cached
        self.model_calls += not rec.cached
        self.errors += rec.error is not None
        self.retries += max(rec.attempts - 1, 0)
        self.faults += len(rec.faults)
        self.cured += len(rec.faults) if rec.error is None else 0
        if not rec.cached:  # tokens and seconds the model actually spent
            self.prompt_tokens += rec.prompt_tokens
            self.completion_tokens += rec.completion_tokens
            self.reused_prompt_tokens += rec.reused_prompt_tokens
            self.truncated += rec.truncated
        self.seconds += rec.seconds
        self.queued_s += rec.queued_s
        self.retries_429 += rec.retries_429
        self.rate_limited_s += rec.rate_limited_s
        self.throttled_s += rec.throttled_s
        if rec.cached and rec.replayed_s is not None:
            self.replayed_calls += 1
            self.replayed_seconds += rec.replayed_s
            self.replayed_tokens += rec.prompt_tokens + rec.completion_tokens
        if rec.cost_usd is not None:
            self._cost = (self._cost or Fraction(0)) + Fraction(rec.cost_usd)
        elif not rec.cached:
            self.unpriced_calls += 1

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_usd(self) -> float | None:
        return None if self._cost is None else float(self._cost)

    def as_dict(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {
            k: v for k, v in asdict(self).items() if not k.startswith("_")
        }
        return {**out, "tokens": self.tokens, "cost_usd": self.cost_usd}


def usage_by_site(records: Iterable[CallRecord]) -> dict[str | None, Usage]:
    """Totals of ``records`` per prompt site (``None``: calls made outside any)."""
    out: dict[str | None, Usage] = {}
    for rec in records:
        out.setdefault(rec.site, Usage()).add(rec)
    return out


@dataclass
class Accounting:
    """Thread-safe log of :class:`CallRecord`; totals overall or per prompt site."""

    records: list[CallRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self.records.append(record)
        for collector in _COLLECTORS.get():
            collector.append(record)

    def totals(self, site: str | None | EllipsisType = ..., since: int = 0) -> Usage:
        """Totals over records ``since`` an index (see :meth:`mark`), optionally for one site."""
        usage = Usage()
        with self._lock:
            records = self.records[since:]
        for rec in records:
            if site is ... or rec.site == site:
                usage.add(rec)
        return usage

    def by_site(self, since: int = 0) -> dict[str | None, Usage]:
        with self._lock:
            records = self.records[since:]
        return usage_by_site(records)

    def mark(self) -> int:
        """An index to pass as ``since`` to measure one stretch of work (of every thread:
        see :func:`collect_calls`)."""
        with self._lock:
            return len(self.records)

    def since(self, mark: int = 0) -> list[CallRecord]:
        """The records added after :meth:`mark` returned ``mark``."""
        with self._lock:
            return self.records[mark:]
