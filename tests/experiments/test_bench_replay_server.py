"""The replay endpoint of the throughput benchmark: answers from an optloop LM cache, with latency
and 429s."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from optloop.errors import ConfigError, LMError
from optloop.lm import LMSettings, OptloopLM
from optloop.testing.replay import ReplayConfig, ReplayServer, load_cache, request_keys
from optloop.testing.scripted import ScriptedOpenAIServer

REPO = Path(__file__).resolve().parents[2]
SCHEMA = {
    "title": "Answer",
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}


def calls(lm: OptloopLM) -> list[str]:
    """The workload recorded and replayed: plain text, a schema, JSON without one, a stop list."""
    return [
        lm.text("What is the capital of France?"),
        lm.text("Name a colour.", max_tokens=16),
        json.dumps(lm.json("Answer in JSON: 2 + 2?", SCHEMA)),
        lm.text("Reply with JSON.", response_format={"type": "json_object"}),
        lm.text("Count: one, two,", stop=["\n", "five"]),
    ]


def echo(body: dict) -> tuple[str, str]:
    prompt = body["messages"][-1]["content"]
    if body.get("response_format"):
        return "ok", json.dumps({"answer": prompt[:12]})
    return "ok", prompt.upper()


@pytest.fixture
def recorded(tmp_path) -> tuple[Path, str, list[str]]:
    """A tiny LM cache written by a real OptloopLM against the scripted endpoint: (file, identity,
    answers)."""
    path = tmp_path / "recorded.sqlite"
    with ScriptedOpenAIServer([("respond", echo)]) as server:
        lm = OptloopLM(
            LMSettings.from_spec("openai:recorder", base_url=server.base_url, cache_path=path)
        )
        answers = calls(lm)
    return path, lm.backend.identity, answers


def client(url: str, **overrides) -> OptloopLM:
    return OptloopLM(LMSettings.from_spec("openai:replay", base_url=url, cache=False, **overrides))


def test_it_replays_every_recorded_answer_after_the_injected_latency(recorded):
    path, identity, answers = recorded
    config = ReplayConfig(latency_ms=100, jitter_ms=20, seed=7)
    with ReplayServer(load_cache(path), identity=identity, config=config) as server:
        lm = client(server.base_url)
        lm.check_endpoint()  # the 1-token startup probe is answered, though never recorded
        assert calls(lm) == answers
        with pytest.raises(LMError, match="no recorded response"):
            lm.text("a prompt nobody recorded")
    assert (
        server.stats.hits,
        server.stats.misses,
        server.stats.probes,
        server.stats.injected_429,
    ) == (5, 1, 1, 0)
    replayed = [r for r in lm.accounting.records if r.error is None][1:]  # after the probe
    assert all(r.seconds >= 0.08 for r in replayed)
    assert all(
        (r.prompt_tokens, r.completion_tokens) == (7, 3) for r in replayed
    )  # the recorded usage
    assert 0.08 * 5 <= server.stats.latency_s <= 0.12 * 5


def test_latencies_and_429s_are_fixed_by_the_seed_not_by_the_order_of_requests(recorded):
    path, identity, _ = recorded
    keys = sorted(load_cache(path))
    a, b, c = (ReplayConfig(latency_ms=300, jitter_ms=50, seed=seed) for seed in (1, 1, 2))
    lat = [a.latency_s(k) for k in keys]
    assert lat == [b.latency_s(k) for k in reversed(keys)][::-1] != [c.latency_s(k) for k in keys]
    assert all(0.25 <= s <= 0.35 for s in lat)
    spread = [a.latency_s(k, n) for k in keys for n in range(40)]
    assert 0.29 <= sum(spread) / len(spread) <= 0.31 and min(spread) < 0.26 and max(spread) > 0.34
    # The rate over 10,000 draws (keys of their own, so the recording's keys cannot move it):
    # a binomial's standard deviation there is 0.003, and the bounds sit five of them away.
    config = ReplayConfig(rate_429=0.1, seed=1)
    refusals = [config.refuses(f"key-{i}", n) for i in range(50) for n in range(200)]
    assert 0.085 <= sum(refusals) / len(refusals) <= 0.115


def test_injected_429s_carry_retry_after_and_lose_no_answer_under_concurrency(recorded):
    path, identity, answers = recorded
    config = ReplayConfig(latency_ms=20, jitter_ms=10, seed=3, rate_429=0.5, retry_after=0.05)
    injected = []
    for _ in range(2):  # the same seed twice: the same 429s
        with ReplayServer(load_cache(path), identity=identity, config=config) as server:
            lm = client(server.base_url, max_retries=0, concurrency=8)
            with ThreadPoolExecutor(8) as pool:
                runs = list(pool.map(lambda _: calls(lm), range(8)))
        assert runs == [answers] * 8
        usage = lm.accounting.totals()
        assert usage.errors == 0 and usage.retries_429 == server.stats.injected_429 > 0
        assert server.stats.hits == 40 and server.stats.requests == 40 + server.stats.injected_429
        injected.append(server.stats.injected_429)
    assert injected[0] == injected[1]


def test_a_retry_after_sent_as_an_http_date_is_honoured(recorded):
    path, identity, answers = recorded
    responses = load_cache(path)
    key = request_keys(
        {
            "model": "replay",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0.0,
            "max_tokens": 512,
            "seed": 0,
        },
        identity,
        [],
    )[-1]

    def config(seed: int) -> ReplayConfig:
        return ReplayConfig(
            latency_ms=0,
            jitter_ms=0,
            seed=seed,
            rate_429=0.5,
            retry_after=2,
            retry_after_date=True,
        )

    # a seed under which this request is refused the first time and answered the second
    seed = next(
        s for s in range(100) if config(s).refuses(key, 0) and not config(s).refuses(key, 1)
    )
    with ReplayServer(responses, identity=identity, config=config(seed)) as server:
        lm = client(server.base_url)
        started = time.perf_counter()
        assert lm.text("What is the capital of France?") == answers[0]
        elapsed = time.perf_counter() - started
    record = lm.accounting.records[0]
    assert record.retries_429 == server.stats.injected_429 == 1
    assert (
        elapsed >= 0.9 and record.rate_limited_s >= 0.9
    )  # an HTTP date has whole seconds: 1 to 2 s away


def test_answers_recorded_from_the_embedded_model_are_found_under_its_identity_and_bounds(
    monkeypatch, tmp_path
):
    """The benchmark records once on the embedded LM (identity ``local:<gguf>:<size>``, schema
    calls decoded under ``bounds:16x400``), then replays to an endpoint LM: the endpoint's requests
    must find those entries."""
    from optloop.lm import LocalLlamaBackend
    from optloop.lm.llama import ContextPool

    class Recorded:
        def create_chat_completion(self, **kwargs):
            content = '{"answer": "4"}' if kwargs.get("response_format") else "Paris"
            return {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "fake.gguf",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": content},
                    }
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13},
            }

    model = tmp_path / "fake.gguf"
    model.write_bytes(b"gguf")
    monkeypatch.setattr(LocalLlamaBackend, "_model", lambda self: ContextPool(Recorded, 1))
    local = OptloopLM(LMSettings.from_spec(f"local:{model}", cache_path=tmp_path / "local.sqlite"))
    assert local.text("Capital of France?") == "Paris" and local.json("2 + 2?", SCHEMA) == {
        "answer": "4"
    }
    with ReplayServer(
        load_cache(tmp_path / "local.sqlite"),
        identity=local.backend.identity,
        config=ReplayConfig(latency_ms=0, jitter_ms=0),
    ) as server:
        lm = client(server.base_url)
        assert lm.text("Capital of France?") == "Paris" and lm.json("2 + 2?", SCHEMA) == {
            "answer": "4"
        }
    assert server.stats.hits == 2 and server.stats.misses == 0


def test_request_keys_match_the_engines_cache_keys(recorded):
    path, identity, _ = recorded
    body = {
        "model": "replay",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0.0,
        "max_tokens": 512,
        "seed": 0,
    }
    assert request_keys(body, identity, [])[-1] in load_cache(path)
    assert request_keys({**body, "seed": 1}, identity, [])[-1] not in load_cache(path)


def test_bad_options_and_files_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="rate-429"):
        ReplayConfig(rate_429=1.0)
    with pytest.raises(ConfigError, match="jitter"):
        ReplayConfig(latency_ms=10, jitter_ms=20)
    with pytest.raises(ConfigError, match="no LM cache"):
        load_cache(tmp_path / "missing.sqlite")
    (tmp_path / "junk.sqlite").write_bytes(b"not sqlite" * 200)
    with pytest.raises(ConfigError, match="not a readable"):
        load_cache(tmp_path / "junk.sqlite")


def test_the_command_line_serves_until_terminated_and_reports_its_stats(recorded):
    path, identity, answers = recorded
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "optloop.testing.replay",
            "--cache",
            str(path),
            "--identity",
            identity,
            "--latency-ms",
            "5",
            "--jitter-ms",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert client(url).text("What is the capital of France?") == answers[0]
        with urllib.request.urlopen(url + "/stats", timeout=10) as response:
            assert json.loads(response.read())["hits"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and '"hits": 1' in err


def test_a_request_the_recording_lacks_is_answered_by_the_fallback_once_and_kept(tmp_path):
    """Recording through the server (``experiments.bench.batch``): a miss is computed by the
    fallback (there, the embedded model), kept under the request's key and served from the
    responses the next time, as a replay would serve it."""
    asked: list[Any] = []

    def fallback(body: dict[str, Any]) -> dict[str, Any]:
        asked.append(body)
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "Paris"},
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }

    responses: dict[str, Any] = {}
    config = ReplayConfig(latency_ms=0, jitter_ms=0)
    with ReplayServer(
        responses, identity="local:fake.gguf:4", config=config, fallback=fallback
    ) as server:
        lm = client(server.base_url)
        assert lm.text("What is the capital of France?") == "Paris"
        assert lm.text("What is the capital of France?", cache=False) == "Paris"
        assert server.stats.misses == 0 and server.stats.hits == 2
    assert (
        len(asked) == 1 and asked[0]["messages"][-1]["content"] == "What is the capital of France?"
    )
    with ReplayServer(
        dict(responses), identity="local:fake.gguf:4", config=config
    ) as server:  # replayed
        assert client(server.base_url).text("What is the capital of France?") == "Paris"
        assert server.stats.misses == 0
