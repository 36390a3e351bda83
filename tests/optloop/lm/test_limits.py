"""The load limits' parts on their own: token buckets, Retry-After, backoff, the shared
throttle."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from optloop.lm.limits import (
    Backoff,
    Throttle,
    TokenBucket,
    estimate_tokens,
    parse_retry_after,
    shared_throttle,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_serves_its_burst_then_one_share_of_the_rate_per_caller_in_order():
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, capacity=2.0, clock=clock)  # 120 per minute
    assert [bucket.reserve(1) for _ in range(2)] == [0.0, 0.0]  # the burst
    assert [bucket.reserve(1) for _ in range(3)] == [
        0.5,
        1.0,
        1.5,
    ]  # then queued at the rate, in order
    clock.now = 10.0  # idle for long: refills to capacity, no more
    assert [bucket.reserve(1) for _ in range(3)] == [0.0, 0.0, 0.5]


def test_a_call_larger_than_the_bucket_waits_its_share_and_is_never_stuck():
    clock = FakeClock()
    bucket = TokenBucket(rate=100.0, capacity=100.0, clock=clock)
    assert bucket.reserve(350) == pytest.approx(2.5)
    bucket.adjust(+300)  # the call used 50 tokens, not 350: the rest comes back
    assert bucket.reserve(50) == pytest.approx(0.0)


def test_a_bucket_enforces_its_rate_across_threads():
    bucket = TokenBucket(rate=50.0, capacity=5.0)  # 3000 per minute
    stamps: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            bucket.acquire(1)
            with lock:
                stamps.append(time.monotonic())

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - started
    assert len(stamps) == 40
    # 40 acquisitions from a bucket of 5 refilled at 50/s: at least (40 - 5) / 50 = 0.7 s
    assert elapsed >= 0.65
    for t0 in stamps:  # no window holds more than the burst plus the rate times its length
        in_window = sum(t0 <= t < t0 + 0.2 for t in stamps)
        assert in_window <= 5 + 50 * 0.2 + 1


def test_a_bucket_paces_asyncio_tasks_without_blocking_the_loop():
    bucket = TokenBucket(rate=20.0, capacity=1.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def main() -> float:
        tick = asyncio.create_task(ticker())
        started = time.monotonic()
        await asyncio.gather(*(bucket.acquire_async(1) for _ in range(6)))
        tick.cancel()
        return time.monotonic() - started

    elapsed = asyncio.run(main())
    assert elapsed >= 0.2  # (6 - 1) / 20 s
    assert ticks >= 10  # the loop kept running while the tasks waited


def test_the_throttle_caps_calls_in_flight():
    throttle = Throttle(rpm=None, tpm=None, concurrency=3)
    inside = peak = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal inside, peak
        with throttle.attempt(0):
            with lock:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.05)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak == 3


def test_one_throttle_per_endpoint_and_limits_in_a_process():
    a = shared_throttle("openai:m@http://h/v1", rpm=60, tpm=None, concurrency=8)
    assert shared_throttle("openai:m@http://h/v1", rpm=60, tpm=None, concurrency=8) is a
    assert shared_throttle("openai:m@http://other/v1", rpm=60, tpm=None, concurrency=8) is not a
    assert shared_throttle("openai:m@http://h/v1", rpm=30, tpm=None, concurrency=8) is not a


def test_token_estimates_count_prompt_characters_and_the_answer_budget():
    messages = [{"role": "system", "content": "x" * 40}, {"role": "user", "content": "y" * 40}]
    assert estimate_tokens(messages, None, 100) == 20 + 100
    assert estimate_tokens(messages, {"type": "object"}, 100) > 120


NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),  # not in the RFC, but sent by some servers
        ({"Retry-After": format_datetime(NOW + timedelta(seconds=30), usegmt=True)}, 30.0),
        (
            {"Retry-After": format_datetime(NOW - timedelta(seconds=30), usegmt=True)},
            0.0,
        ),  # a date gone by
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # OpenAI's precise header wins
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-3"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(headers, seconds):
    assert parse_retry_after(headers, now=NOW) == seconds


def test_backoff_honours_retry_after_with_a_little_jitter_and_is_exponential_without():
    backoff = Backoff(random.Random(1))
    waits = [backoff.rate_limited(1, 4.0) for _ in range(50)]
    assert all(4.0 <= w <= 4.4 for w in waits) and len(set(waits)) > 1
    assert {backoff.rate_limited(n, 0.0) for n in range(1, 6)} == {
        0.0
    }  # "now" is taken at its word, 5 times
    assert (
        max(backoff.rate_limited(12, 0.0) for _ in range(50)) > 8
    )  # then the call backs off anyway
    assert all(
        0 <= backoff.rate_limited(n, None) <= min(60, 2 ** (n - 1))
        for n in range(1, 10)
        for _ in range(20)
    )
    assert max(backoff.rate_limited(8, None) for _ in range(50)) > 8  # it grows
    assert all(
        0 <= backoff.fault(n, None) <= min(8, 0.5 * 2 ** (n - 1))
        for n in range(1, 8)
        for _ in range(20)
    )
    assert (
        backoff.fault(1, 3.0) == 3.0 and backoff.fault(1, 600.0) == 60.0
    )  # a 503's Retry-After, capped
