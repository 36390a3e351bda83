"""HTTP 429, Retry-After, --rpm / --tpm / --concurrency, against a real loopback endpoint
(``optloop/testing/scripted.py``)."""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate

import pytest

from optloop.errors import ConfigError, LMError, LMUnreachableError
from optloop.lm import LMSettings, OptloopLM, prompt_site
from optloop.testing.scripted import InFlight, ScriptedOpenAIServer


def remote(url: str, **overrides) -> OptloopLM:
    return OptloopLM(
        LMSettings.from_spec("openai:test-model", base_url=url, cache=False, **overrides)
    )


def limited(retry_after: str | None = None) -> tuple[str, tuple]:
    return "status", (429, {"retry-after": retry_after} if retry_after is not None else {})


def test_a_429_waits_the_seconds_retry_after_asks_and_is_not_a_fault():
    with ScriptedOpenAIServer([limited("1"), ("ok", "fine")]) as server:
        lm = remote(server.base_url, max_retries=0)  # 429s do not spend the fault retries
        started = time.perf_counter()
        with prompt_site("answer"):
            assert lm.text("q") == "fine"
        elapsed = time.perf_counter() - started
    gap = server.requests[1]["at"] - server.requests[0]["at"]
    assert (
        1.0 <= gap <= 1.0 + 1.1 and elapsed >= 1.0
    )  # Retry-After plus at most 10% (<= 1 s) of jitter
    (record,) = lm.accounting.records
    assert (record.attempts, record.retries_429, record.faults, record.error) == (2, 1, [], None)
    assert record.rate_limited_s >= 1.0 and record.site == "answer"
    usage = lm.accounting.totals()
    assert (usage.retries_429, usage.faults, usage.errors) == (1, 0, 0)


def test_a_429_honours_retry_after_given_as_an_http_date():
    # An HTTP date has whole seconds: two seconds ahead is between one and two seconds away.
    script = [
        ("respond", lambda body: limited(formatdate(time.time() + 2, usegmt=True))),
        ("ok", "fine"),
    ]
    with ScriptedOpenAIServer(script) as server:
        lm = remote(server.base_url)
        assert lm.text("q") == "fine"
    gap = server.requests[1]["at"] - server.requests[0]["at"]
    assert 0.9 <= gap <= 2.5
    assert lm.accounting.records[0].retries_429 == 1


def test_a_storm_of_429s_slows_a_call_but_does_not_fail_it():
    # The first two 429s say nothing (jittered backoff: up to 1 s, then 2 s), the next ask for no
    # wait.
    script = [limited()] * 2 + [limited("0")] * 3 + [("ok", "made it")]
    with ScriptedOpenAIServer(script) as server:
        lm = remote(server.base_url, max_retries=1)
        assert lm.text("q") == "made it"
    assert len(server.requests) == 6
    record = lm.accounting.records[0]
    assert (record.retries_429, record.attempts, record.error) == (5, 6, None)


def test_an_endpoint_that_always_says_retry_now_is_not_hammered():
    with ScriptedOpenAIServer([limited("0")]) as server:
        lm = remote(server.base_url, rate_limit_wait_s=3)
        started = time.perf_counter()
        with pytest.raises(LMUnreachableError, match="HTTP 429"):
            lm.text("q")
        elapsed = time.perf_counter() - started
    # five requests at once, then backoff: the sleeps reach the 3 s budget within a few more
    # attempts
    assert 5 < len(server.requests) < 20 and elapsed <= 3 + 1.5


def test_429s_and_faults_have_separate_budgets():
    script = [
        limited("0"),
        ("status", 503),
        limited("0"),
        limited("0"),
        ("status", 500),
        ("ok", "ok"),
    ]
    with ScriptedOpenAIServer(script) as server:
        lm = remote(server.base_url, max_retries=2)
        assert lm.text("q") == "ok"
    record = lm.accounting.records[0]
    assert (record.retries_429, record.faults, record.attempts) == (3, ["HTTP 503", "HTTP 500"], 6)


def test_a_rate_limit_that_outlasts_the_wait_budget_stops_the_run_instead_of_failing_questions():
    with ScriptedOpenAIServer([limited("120")]) as server:
        lm = remote(server.base_url, rate_limit_wait_s=5)
        started = time.perf_counter()
        with pytest.raises(LMUnreachableError) as info:
            lm.text("q")
        assert time.perf_counter() - started < 3  # a Retry-After beyond the budget is not slept on
    message = str(info.value)
    assert "HTTP 429" in message and "120s" in message and "\n" not in message
    assert lm.endpoint_down == message and len(server.requests) == 1
    assert lm.accounting.records[0].retries_429 == 1


def test_an_exhausted_quota_is_not_waited_on():
    quota = {
        "message": "You exceeded your current quota",
        "type": "insufficient_quota",
        "code": "insufficient_quota",
    }
    with ScriptedOpenAIServer([("status", (429, {"retry-after": "1"}, quota))]) as server:
        lm = remote(server.base_url)
        with pytest.raises(LMUnreachableError, match="quota is exhausted"):
            lm.text("q")
    assert len(server.requests) == 1


def test_concurrent_calls_through_a_429_storm_all_succeed_and_count_every_429():
    def storm(body):  # every prompt is refused twice, then answered
        prompt = body["messages"][-1]["content"]
        with lock:
            seen[prompt] = seen.get(prompt, 0) + 1
            n = seen[prompt]
        return limited("0.05") if n <= 2 else ("ok", prompt.upper())

    lock, seen = threading.Lock(), {}
    with ScriptedOpenAIServer([("respond", storm)]) as server:
        lm = remote(server.base_url, max_retries=0, concurrency=8)
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: lm.text(f"q{i}"), range(24)))
    assert answers == [f"Q{i}" for i in range(24)]
    usage = lm.accounting.totals()
    assert (usage.calls, usage.errors, usage.retries_429, usage.faults) == (24, 0, 48, 0)
    assert len(server.requests) == 72


def test_rpm_is_one_bucket_for_every_thread_of_the_process():
    with ScriptedOpenAIServer([("ok", "x")]) as server:
        lm = remote(server.base_url, rpm=600, concurrency=8)  # 10 a second, a burst of 10
        other = OptloopLM(lm.settings)  # a second LM on the same endpoint shares the bucket
        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: (lm if i % 2 else other).text(f"q{i}"), range(30)))
        elapsed = time.perf_counter() - started
    arrivals = sorted(r["at"] for r in server.requests)
    assert elapsed >= 1.8  # (30 - 10) / 10 per second
    for t0 in arrivals:
        assert sum(t0 <= t < t0 + 0.5 for t in arrivals) <= 10 + 5 + 1
    throttled = lm.accounting.totals().throttled_s + other.accounting.totals().throttled_s
    assert throttled > 1.0


def test_tpm_paces_calls_by_their_estimated_tokens_and_settles_on_the_usage():
    with ScriptedOpenAIServer([("ok", "x")]) as server:  # the server reports 10 tokens a call
        lm = remote(server.base_url, tpm=6000)  # 100 tokens a second, a bucket of 100
        started = time.perf_counter()
        lm.text("a" * 400, max_tokens=100)  # ~200 tokens estimated: waits ~1 s
        first = time.perf_counter() - started
        lm.text("b", max_tokens=20)  # 190 tokens came back after the first call: no wait
        second = time.perf_counter() - started - first
    assert first >= 0.9 and second < 0.5
    assert (
        lm.accounting.records[0].throttled_s >= 0.9 and lm.accounting.records[1].throttled_s < 0.3
    )


def test_concurrency_caps_requests_in_flight_at_the_endpoint():
    slow = InFlight(0.1)
    with ScriptedOpenAIServer([("respond", slow)]) as server:
        lm = remote(server.base_url, concurrency=3)
        with ThreadPoolExecutor(10) as pool:
            list(pool.map(lambda i: lm.text(f"q{i}"), range(20)))
    assert slow.peak == 3


def test_concurrency_defaults_and_the_environment(monkeypatch):
    assert LMSettings.from_spec("local").concurrency == 1
    assert LMSettings.from_spec("openai:m", base_url="http://h/v1").concurrency == 8
    monkeypatch.setenv("OPTLOOP_CONCURRENCY", "4")
    assert (
        LMSettings.from_spec("openai:m").concurrency == 4
        and LMSettings.from_spec("local").concurrency == 4
    )
    assert LMSettings.from_spec("openai:m", concurrency=2).concurrency == 2  # the flag wins
    monkeypatch.setenv("OPTLOOP_CONCURRENCY", "many")
    with pytest.raises(ConfigError, match="OPTLOOP_CONCURRENCY='many'"):
        LMSettings.from_spec("local")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [(["--rpm", "0"], "rpm"), (["--tpm", "-5"], "tpm"), (["--concurrency", "0"], "concurrency")],
)
def test_bad_load_flags_are_one_line_config_errors(flags, needle):
    from optloop.cli.command import add_lm_arguments, lm_settings_from_args

    parser = argparse.ArgumentParser()
    add_lm_arguments(parser)
    with pytest.raises(ConfigError, match=f"invalid LM setting {needle}"):
        lm_settings_from_args(
            parser.parse_args(["--lm", "openai:m", "--lm-base-url", "http://h/v1", *flags])
        )


def test_the_load_flags_reach_the_settings():
    from optloop.cli.command import add_lm_arguments, lm_settings_from_args

    parser = argparse.ArgumentParser()
    add_lm_arguments(parser)
    args = parser.parse_args(
        [
            "--lm",
            "openai:m",
            "--lm-base-url",
            "http://h/v1",
            "--rpm",
            "500",
            "--tpm",
            "200000",
            "--concurrency",
            "16",
        ]
    )
    settings = lm_settings_from_args(args)
    assert (settings.rpm, settings.tpm, settings.concurrency) == (500, 200000, 16)
    assert lm_settings_from_args(parser.parse_args(["--lm", "local"])).concurrency == 1


def test_a_client_error_is_still_not_retried_under_load_settings():
    with ScriptedOpenAIServer([("status", 400)]) as server:
        lm = remote(server.base_url, rpm=6000, concurrency=2)
        with pytest.raises(LMError):
            lm.text("q")
    assert len(server.requests) == 1
