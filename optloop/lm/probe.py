"""``--concurrency auto``: how many requests an endpoint serves at once, measured at start-up.

A server that answers one request at a time (llama.cpp's Python server, Ollama with
``OLLAMA_NUM_PARALLEL=1``, one vLLM replica at its batch limit) keeps the others waiting
inside their HTTP request, where the request timeout runs: at ``--concurrency 8`` the eighth
request of a burst waits for seven answers before its own starts. The probe sends one short
request alone (twice, after one to warm the server; the faster counts), then :data:`BURST` at once,
and compares:

    slots ~= BURST x (one request's latency) / (the burst's slowest latency)

A server that serves them all at once finishes the burst in about one latency (slots ~= BURST),
one that serves one at a time in BURST latencies (slots ~= 1). Fewer than 1.5 slots gives
concurrency 1; fewer than 60 % of the burst gives that many; more keeps the default. A server
that answers the probe in under :data:`UNMEASURABLE_S` is too fast for queueing to cost a
timeout, and keeps the default too. The probe's calls are not cached or accounted.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from optloop.lm.requests import Request

if TYPE_CHECKING:
    from optloop.lm.backends import Backend

logger = logging.getLogger(__name__)

CONCURRENCY_PROBE = "optloop concurrency probe: say ok."
"""The probe's message (a test server recognizes it by this text)."""
BURST = 4
UNMEASURABLE_S = 0.02


@dataclass(frozen=True)
class Detected:
    """What the probe found: the concurrency to use, and the line that says why."""

    concurrency: int
    line: str


def _request(i: int) -> Request:
    # A distinct message per request: a server with a prompt cache must not answer the burst from
    # it.
    return Request(
        messages=[{"role": "user", "content": f"{CONCURRENCY_PROBE} ({i})"}],
        schema=None,
        json_mode=False,
        temperature=0.0,
        max_tokens=8,
        seed=0,
    )


def _timed(backend: Backend, i: int) -> float:
    started = time.perf_counter()
    backend.complete(_request(i))
    return time.perf_counter() - started


def detect_concurrency(backend: Backend, default: int) -> Detected:
    """The concurrency that fits ``backend``'s endpoint (see the module docstring); raises what a
    call raises."""
    where = backend.where()
    _timed(backend, 0)  # warm-up: a first request may load the model
    # The faster of two: a request slowed by something else on the machine must not pass for the
    # server's own latency (a serial server once read as 2.4 slots from one slow single request).
    single = min(_timed(backend, 1), _timed(backend, 2))
    with ThreadPoolExecutor(BURST) as pool:
        slowest = max(pool.map(lambda i: _timed(backend, i), range(3, 3 + BURST)))
    if single < UNMEASURABLE_S:
        return Detected(
            default,
            f"LM endpoint {where}: --concurrency {default} (auto: it answers in "
            f"{single * 1000:.0f} ms, too fast for queueing to matter)",
        )
    slots = BURST * single / max(slowest, 1e-9)
    measured = f"one request {single:.2f} s, {BURST} at once {slowest:.2f} s"
    if slots < 1.5:
        return Detected(
            1,
            f"LM endpoint {where}: --concurrency 1 (auto: it answers one request at a time: "
            f"{measured})",
        )
    if slots < 0.6 * BURST:
        n = max(1, round(slots))
        return Detected(
            n,
            f"LM endpoint {where}: --concurrency {n} (auto: it answers about {slots:.1f} "
            f"requests at a time: {measured})",
        )
    return Detected(
        default,
        f"LM endpoint {where}: --concurrency {default} (auto: it answers requests "
        f"side by side: {measured})",
    )
