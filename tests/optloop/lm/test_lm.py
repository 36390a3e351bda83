"""Unit tests of the LM layer that need no model: settings, cache, accounting, remote endpoints.

Remote behaviour is exercised against a real loopback HTTP server with the real
``openai`` client (see ``optloop/testing/scripted.py``).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from optloop.errors import ConfigError, LMError, LMUnreachableError
from optloop.lm import (
    Accounting,
    CallRecord,
    LMCache,
    LMSettings,
    OptloopLM,
    bundled_model_path,
    collect_calls,
    prompt_site,
    response_format_to_schema,
)
from optloop.testing.loopback import closed_port_url
from optloop.testing.scripted import ScriptedOpenAIServer

REPO = Path(__file__).resolve().parents[3]


class City(BaseModel):
    name: str
    population: int


# --- settings ---------------------------------------------------------------------------


def test_default_spec_is_the_bundled_local_model():
    settings = LMSettings.from_spec()
    assert settings.backend == "local" and settings.model == ""
    assert bundled_model_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.parametrize(
    ("spec", "backend", "model"),
    [
        ("local", "local", ""),
        ("local:/models/x.gguf", "local", "/models/x.gguf"),
        ("/models/y.gguf", "local", "/models/y.gguf"),
        ("openai:gpt-4o-mini", "openai", "gpt-4o-mini"),
        ("openai/qwen2.5", "openai", "qwen2.5"),
    ],
)
def test_spec_strings_select_backend_and_model(spec, backend, model):
    settings = LMSettings.from_spec(spec)
    assert (settings.backend, settings.model) == (backend, model)


def test_spec_from_environment_and_base_url(monkeypatch):
    monkeypatch.setenv("OPTLOOP_LM", "openai:llama3")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    settings = LMSettings.from_spec(None, timeout_s=None)
    assert settings.model == "llama3" and settings.base_url == "http://127.0.0.1:11434/v1"
    assert settings.timeout_s == 60.0  # None overrides fall through to the default


def test_flag_overrides_environment_base_url(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env:1/v1")
    assert (
        LMSettings.from_spec("openai:m", base_url="http://flag:2/v1").base_url
        == "http://flag:2/v1"
    )


@pytest.mark.parametrize(
    ("spec", "overrides", "needle"),
    [
        ("gpt4", {}, "unknown LM spec 'gpt4'"),
        ("openai:", {}, "needs a model name"),
        ("local", {"max_tokens": 0}, "invalid LM setting max_tokens"),
        ("local", {"max_retries": 99}, "invalid LM setting max_retries"),
    ],
)
def test_bad_settings_raise_one_line_config_errors(spec, overrides, needle):
    with pytest.raises(ConfigError) as info:
        LMSettings.from_spec(spec, **overrides)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_missing_gguf_names_the_file():
    with pytest.raises(ConfigError, match="GGUF model file not found: /nope/model.gguf"):
        OptloopLM(LMSettings.from_spec("local:/nope/model.gguf"))


def test_openai_without_key_or_base_url_says_what_to_set():
    with pytest.raises(ConfigError, match="OPENAI_API_KEY is not set"):
        OptloopLM(LMSettings.from_spec("openai:gpt-4o-mini"))


# --- response formats ---------------------------------------------------------------------


def test_every_way_to_ask_for_json_normalizes_to_a_schema():
    schema = City.model_json_schema()
    assert response_format_to_schema(City) == (schema, True)
    assert response_format_to_schema(
        {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    ) == (schema, True)
    assert response_format_to_schema({"type": "json_object", "schema": schema}) == (schema, True)
    assert response_format_to_schema({"type": "json_object"}) == (None, True)
    assert response_format_to_schema(None) == (None, False)
    with pytest.raises(ConfigError):
        response_format_to_schema({"type": "xml"})


# --- cache and accounting ---------------------------------------------------------------


def test_cache_key_depends_on_every_input_that_changes_the_answer():
    base = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "schema": None,
        "temperature": 0.0,
    }
    key = LMCache.key(base)
    assert key == LMCache.key(dict(reversed(list(base.items()))))  # order-insensitive
    for change in (
        {"model": "m2"},
        {"messages": [{"role": "user", "content": "ho"}]},
        {"schema": {"type": "object"}},
        {"temperature": 0.7},
    ):
        assert LMCache.key({**base, **change}) != key


def test_cache_survives_reopening_the_file(tmp_path):
    path = tmp_path / "c.sqlite"
    LMCache(path).put("k", {"choices": [{"message": {"content": "x"}}]})
    reopened = LMCache(path)
    assert reopened.get("k") == {"choices": [{"message": {"content": "x"}}]} and len(reopened) == 1
    assert reopened.get("missing") is None


def test_a_cache_hit_reports_the_seconds_its_response_took_to_compute(tmp_path):
    path = tmp_path / "cache.sqlite"
    LMCache(path).put("k", {"choices": []}, 2.5)
    LMCache(path).put("old", {"choices": []})
    assert LMCache(path).get_timed("k") == ({"choices": []}, 2.5)
    assert LMCache(path).get_timed("old") == ({"choices": []}, None)
    with ScriptedOpenAIServer([("ok", "hello")]) as server:
        lm = _remote(server.base_url)
        lm.text("q")
        lm.text("q")
    computed, hit = lm.accounting.records
    assert not computed.cached and computed.replayed_s is None
    # the cache keeps the model's seconds to the millisecond: a replay may read 0.5 ms more
    assert hit.cached and hit.replayed_s is not None
    assert 0 <= hit.replayed_s <= computed.seconds + 0.0005
    totals = lm.accounting.totals()
    assert totals.replayed_calls == 1 and totals.replayed_tokens == hit.prompt_tokens + (
        hit.completion_tokens
    )


def test_a_cache_written_before_responses_kept_their_time_opens_and_gains_the_column(tmp_path):
    import sqlite3

    path = tmp_path / "cache.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE responses (key TEXT PRIMARY KEY, response TEXT NOT NULL, created REAL)"
    )
    conn.execute("INSERT INTO responses VALUES ('k', '{\"choices\": []}', 0)")
    conn.commit()
    conn.close()
    cache = LMCache(path)
    assert cache.get_timed("k") == ({"choices": []}, None) and cache.get("k") == {"choices": []}
    cache.put("new", {"choices": []}, 1.0)
    assert cache.get_timed("new") == ({"choices": []}, 1.0) and len(cache) == 2


def test_corrupt_cache_file_gives_a_clear_error(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigError, match="is corrupt"):
        LMCache(path)


def test_accounting_totals_by_site_and_since_mark():
    acc = Accounting()
    with collect_calls() as seen:  # a collector in this context sees every record added
        acc.add(CallRecord("a", "m", 10, 5, 1.0, cached=False))
        mark = acc.mark()
        acc.add(CallRecord("a", "m", 10, 5, 0.1, cached=True))
        acc.add(CallRecord("b", "m", 3, 2, 0.5, cached=False, attempts=3))
    assert (
        acc.totals().calls == 3 and acc.totals().model_calls == 2 and acc.totals().cache_hits == 1
    )
    assert acc.totals().tokens == 20  # cached calls spend no tokens
    assert acc.totals(since=mark).calls == 2 and acc.totals("b").retries == 2
    assert set(acc.by_site()) == {"a", "b"} and len(seen) == 3


def test_prompt_site_is_scoped():
    from optloop.lm import current_site

    assert current_site() is None
    with prompt_site("mem0.extract"):
        with prompt_site("answer"):
            assert current_site() == "answer"
        assert current_site() == "mem0.extract"
    assert current_site() is None


# --- OpenAI-compatible endpoints over loopback HTTP -----------------------------------


def _remote(base_url: str, **overrides) -> OptloopLM:
    return OptloopLM(LMSettings.from_spec("openai:test-model", base_url=base_url, **overrides))


def test_remote_call_sends_the_schema_and_is_accounted_to_the_site():
    with ScriptedOpenAIServer([("ok", '{"name": "Lisbon", "population": 545000}')]) as server:
        lm = _remote(server.base_url)
        with prompt_site("answer"):
            out = lm.json("Largest city of Portugal?", City)
    assert out == {"name": "Lisbon", "population": 545000}
    sent = server.requests[0]["body"]
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"]["required"] == ["name", "population"]
    record = lm.accounting.records[0]
    assert (record.site, record.prompt_tokens, record.completion_tokens, record.cached) == (
        "answer",
        7,
        3,
        False,
    )


def test_json_object_schema_mode_for_llama_cpp_servers():
    with ScriptedOpenAIServer([("ok", '{"name": "x", "population": 1}')]) as server:
        _remote(server.base_url, schema_mode="json_object").json("q", City)
    assert server.requests[0]["body"]["response_format"] == {
        "type": "json_object",
        "schema": City.model_json_schema(),
    }


def test_transient_5xx_and_non_json_bodies_are_retried_then_succeed():
    script = [
        ("status", 503),
        ("ok", "not json {"),
        ("status", 500),
        ("ok", '{"name": "y", "population": 2}'),
    ]
    with ScriptedOpenAIServer(script) as server:
        lm = _remote(server.base_url, max_retries=3)
        assert lm.json("q", City)["name"] == "y"
    assert len(server.requests) == 4
    assert lm.accounting.records[-1].attempts == 4 and lm.accounting.totals().retries == 3


def test_retries_are_bounded_and_the_error_is_one_line():
    with ScriptedOpenAIServer([("status", 502)]) as server:
        lm = _remote(server.base_url, max_retries=2)
        with pytest.raises(LMError) as info:
            lm.text("q")
    assert len(server.requests) == 3
    assert "HTTP 502" in str(info.value) and "\n" not in str(info.value)
    assert lm.accounting.totals().errors == 1


def test_an_endpoint_answering_only_5xx_is_taken_as_down_on_the_third_call():
    with ScriptedOpenAIServer([("status", 500)]) as server:
        lm = _remote(server.base_url, max_retries=1)
        for prompt in ("a", "b"):  # one failed call fails its question only
            with pytest.raises(LMError) as info:
                lm.text(prompt)
            assert not isinstance(info.value, LMUnreachableError)
        with pytest.raises(LMUnreachableError) as info:
            lm.copy(temperature=1.0).text("c")  # copies share the count: one endpoint
    message = str(info.value)
    assert "HTTP 500" in message and "3 calls in a row" in message and "\n" not in message
    assert server.base_url in message and len(server.requests) == 6
    assert lm.endpoint_down == message


def test_a_success_between_5xx_calls_resets_the_count():
    script = [("status", 500), ("status", 500), ("ok", "fine"), ("status", 500)]
    with ScriptedOpenAIServer(script) as server:
        lm = _remote(server.base_url, max_retries=0)
        for prompt in ("a", "b"):
            with pytest.raises(LMError):
                lm.text(prompt)
        assert lm.text("c") == "fine"
        for prompt in ("d", "e"):
            with pytest.raises(LMError) as info:
                lm.text(prompt)
            assert not isinstance(info.value, LMUnreachableError)
    assert lm.endpoint_down is None


def test_client_errors_are_not_retried():
    with ScriptedOpenAIServer([("status", 401)]) as server:
        with pytest.raises(LMError, match="rejected the API key"):
            _remote(server.base_url).text("q")
    assert len(server.requests) == 1


def test_remote_responses_are_cached(tmp_path):
    with ScriptedOpenAIServer([("ok", "hello")]) as server:
        lm = _remote(server.base_url)
        assert lm.text("q") == lm.text("q") == "hello"
    assert len(server.requests) == 1 and lm.accounting.totals().cache_hits == 1


def test_refused_connection_names_the_url_quickly():
    url = closed_port_url()
    lm = _remote(url, max_retries=2, timeout_s=5)
    started = time.perf_counter()
    with pytest.raises(LMUnreachableError) as info:
        lm.text("q")
    assert url in str(info.value) and "\n" not in str(info.value)
    assert time.perf_counter() - started < 5


def test_an_endpoint_that_never_answers_fails_within_the_timeout():
    with ScriptedOpenAIServer([("hang", 30)]) as server:
        lm = _remote(server.base_url, timeout_s=1.5, max_retries=3)
        started = time.perf_counter()
        with pytest.raises(LMUnreachableError, match="did not answer in time"):
            lm.text("q")
        elapsed = time.perf_counter() - started
    # No new attempt starts once the timeout budget is spent: one attempt + backoff.
    assert elapsed < 1.5 * 2 + 1


def test_cli_with_unreachable_endpoint_prints_one_line_and_exits_75():
    url = closed_port_url()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "optloop",
            "doctor",
            "--lm",
            "openai:some-model",
            "--lm-base-url",
            url,
            "--lm-timeout",
            "3",
            "--lm-retries",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 75  # endpoint unavailable (EX_TEMPFAIL), not bad input
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert (
        lines == [line for line in lines if line.startswith("optloop: error:")] and len(lines) == 1
    ), proc.stderr
    assert url in lines[0] and "Traceback" not in proc.stderr


def test_dspy_sees_an_lm_that_supports_response_schemas():
    with ScriptedOpenAIServer([("ok", '{"answer": "Paris"}')]) as server:
        lm = _remote(server.base_url)
        import dspy

        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            result = dspy.Predict("question -> answer")(question="Capital of France?")
    assert result.answer == "Paris"
    fmt = server.requests[0]["body"]["response_format"]
    assert (
        fmt["type"] == "json_schema"
        and fmt["json_schema"]["schema"]["properties"]["answer"]["type"] == "string"
    )
    assert json.loads(json.dumps(lm.dump_state()))["settings"]["backend"] == "openai"


def test_cache_file_is_sqlite_under_the_state_dir(isolated_state):
    with ScriptedOpenAIServer([("ok", "x")]) as server:
        lm = _remote(server.base_url)
        lm.text("q")
    path = isolated_state / "lm_cache.sqlite"
    assert lm.settings.resolved_cache_path() == path
    assert sqlite3.connect(path).execute("select count(*) from responses").fetchone()[0] == 1


def test_bound_schema_only_tightens_unbounded_strings_and_arrays():
    from optloop.lm import bound_schema

    schema = {
        "type": "object",
        "properties": {
            "type": {"type": "string"},  # a property named "type" is still just a property
            "tags": {"type": "array", "items": {"type": "string"}},
            "kind": {"type": "string", "enum": ["a", "b"]},
            "short": {"type": "string", "maxLength": 5},
            "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "few": {"type": "array", "minItems": 20, "items": {"$ref": "#/$defs/X"}},
        },
        "$defs": {"X": {"type": "object", "properties": {"v": {"type": "string"}}}},
    }
    bounded = bound_schema(schema, max_chars=50, max_items=4)
    props = bounded["properties"]
    assert props["type"]["maxLength"] == 50 and props["tags"]["maxItems"] == 4
    assert props["tags"]["items"]["maxLength"] == 50 and "maxLength" not in props["kind"]
    assert props["short"]["maxLength"] == 5 and props["nick"]["anyOf"][0]["maxLength"] == 50
    assert (
        props["few"]["maxItems"] == 20
        and bounded["$defs"]["X"]["properties"]["v"]["maxLength"] == 50
    )
    assert "maxLength" not in schema["properties"]["type"]  # the input is not modified


def test_raw_control_characters_in_json_strings_are_escaped_not_failed():
    from optloop.lm import _check_json

    response = {
        "choices": [
            {"message": {"content": '{"answer": "line one\nline two"}'}, "finish_reason": "stop"}
        ]
    }
    _check_json(response)
    assert json.loads(response["choices"][0]["message"]["content"]) == {
        "answer": "line one\nline two"
    }


class _RamblingLlama:
    """Stands in for llama_cpp.Llama: runs out of tokens until the schema allows at most
    ``closes_at`` items."""

    def __init__(self, closes_at: int):
        self.closes_at = closes_at
        self.calls: list[dict] = []

    def create_chat_completion(self, **kwargs):
        self.calls.append(kwargs)
        if "response_format" not in kwargs:  # plain text
            return {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "hi"},
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
            }
        items = kwargs["response_format"]["schema"]["properties"]["facts"]["maxItems"]
        done = items <= self.closes_at
        return {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop" if done else "length",
                    "message": {
                        "role": "assistant",
                        "content": '{"facts": ["a"]}' if done else '{"facts": ["a',
                    },
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107},
        }


def _local_with(monkeypatch, tmp_path, llama) -> OptloopLM:

    from optloop.lm import LocalLlamaBackend
    from optloop.lm.llama import ContextPool

    model = tmp_path / "fake.gguf"
    model.write_bytes(b"gguf")
    monkeypatch.setattr(LocalLlamaBackend, "_model", lambda self: ContextPool(lambda: llama, 1))
    return OptloopLM(LMSettings.from_spec(f"local:{model}", cache_path=tmp_path / "cache.sqlite"))


FACTS = {"type": "object", "properties": {"facts": {"type": "array", "items": {"type": "string"}}}}


@pytest.mark.parametrize(
    "closes_at, bounds",
    [(16, [(16, 400)]), (4, [(16, 400), (4, 100)]), (1, [(16, 400), (4, 100), (1, 25)])],
)
def test_a_truncated_local_answer_is_asked_again_under_tighter_bounds_at_the_same_budget(
    monkeypatch, tmp_path, closes_at, bounds
):
    llama = _RamblingLlama(closes_at)
    lm = _local_with(monkeypatch, tmp_path, llama)
    assert lm.json("list the facts", FACTS) == {"facts": ["a"]}
    seen = [
        (
            c["response_format"]["schema"]["properties"]["facts"]["maxItems"],
            c["response_format"]["schema"]["properties"]["facts"]["items"]["maxLength"],
        )
        for c in llama.calls
    ]
    assert seen == bounds
    assert {c["max_tokens"] for c in llama.calls} == {512}  # the budget never grows
    record = lm.accounting.records[-1]
    assert record.attempts == 1 and record.completion_tokens == 7 * len(
        bounds
    )  # every try is paid for
    # An answer asked again under tighter bounds is whole JSON but cut where the bound fell.
    assert record.truncated is (len(bounds) > 1)


def test_a_cached_local_json_answer_is_not_served_under_other_decoding_bounds(
    monkeypatch, tmp_path
):

    from optloop.lm import LocalLlamaBackend
    from optloop.lm.llama import ContextPool

    llama = _RamblingLlama(closes_at=16)
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"gguf")
    monkeypatch.setattr(LocalLlamaBackend, "_model", lambda self: ContextPool(lambda: llama, 1))

    def lm(**bounds) -> OptloopLM:
        return OptloopLM(
            LMSettings.from_spec(f"local:{model}", cache_path=tmp_path / "cache.sqlite", **bounds)
        )

    lm().json("list the facts", FACTS)
    lm().json("list the facts", FACTS)  # same bounds: the cache answers
    assert len(llama.calls) == 1
    lm(max_array_items=3, max_string_chars=80).json("list the facts", FACTS)
    assert len(llama.calls) == 2  # other bounds: decoded again, under those bounds
    assert llama.calls[-1]["response_format"]["schema"]["properties"]["facts"]["maxItems"] == 3
    lm(max_array_items=3, max_string_chars=80).text("say hi")  # plain text: bounds play no part
    lm().text("say hi")
    assert len(llama.calls) == 3


def test_a_local_answer_that_never_closes_fails_after_three_tries_of_max_tokens(
    monkeypatch, tmp_path
):
    llama = _RamblingLlama(closes_at=0)
    lm = _local_with(monkeypatch, tmp_path, llama)
    with pytest.raises(LMError, match="truncated at max_tokens"):
        lm.json("list the facts", FACTS)
    assert len(llama.calls) == 3 and {c["max_tokens"] for c in llama.calls} == {512}
    assert lm.accounting.records[-1].attempts == 1  # deterministic decoding: not retried again


def test_a_truncated_local_answer_without_a_schema_is_not_asked_again(monkeypatch, tmp_path):
    llama = _RamblingLlama(closes_at=0)
    llama.create_chat_completion = lambda **kw: (
        llama.calls.append(kw),
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length",
                    "message": {"role": "assistant", "content": "a b c"},
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 512, "total_tokens": 513},
        },
    )[1]
    lm = _local_with(monkeypatch, tmp_path, llama)
    assert lm.text("ramble") == "a b c" and len(llama.calls) == 1
