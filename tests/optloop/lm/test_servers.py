"""What differs between OpenAI-compatible servers, settled by flags alone: the schema mode (chosen
by probing, remembered per endpoint, in the cache key), request errors (never retried, saying what
to change), and ``--concurrency auto``. The loopback server plays llama.cpp's Python server where
it must (its HTTP 500 with pydantic's validation text for ``json_schema``); the real server is in
``tests/integration/test_llama_server.py``."""

from __future__ import annotations

import json
import threading
import time

import pytest
from pydantic import BaseModel

from optloop.errors import LMError
from optloop.lm import LMRequestError, LMSettings, OptloopLM, Request
from optloop.lm.probe import detect_concurrency
from optloop.testing.loopback import chat_completion
from optloop.testing.scripted import InFlight, ScriptedOpenAIServer

LLAMA_CPP = frozenset({"json_object", "none"})


class City(BaseModel):
    name: str
    population: int


def _lm(base_url: str, **overrides) -> OptloopLM:
    return OptloopLM(LMSettings.from_spec("openai:m", base_url=base_url, **overrides))


def test_auto_falls_back_to_json_object_on_a_server_that_refuses_json_schema_and_says_why():
    with ScriptedOpenAIServer(
        [("ok", "pong"), ("ok", '{"name": "Lisbon", "population": 1}')], schema_modes=LLAMA_CPP
    ) as server:
        lm = _lm(server.base_url)
        lines = lm.check_endpoint()
        assert lm.json("q", City)["name"] == "Lisbon"
    assert "schema mode json_object, chosen by --lm-schema-mode auto" in lines[0]
    assert "json_schema: refused (HTTP 500: Input should be 'text' or 'json_object')" in lines[0]
    assert [
        p["body"]["response_format"]["type"] for p in server.probes if p["kind"] == "schema"
    ] == ["json_schema", "json_object"]
    sent = server.requests[-1]["body"]["response_format"]
    assert sent == {"type": "json_object", "schema": City.model_json_schema()}
    assert (
        lm.backend.decoding(lm.optloop_engine.request([], response_format=City))
        == "schema_mode:json_object"
    )


def test_auto_keeps_json_schema_where_it_is_taken_and_probes_once_per_endpoint():
    with ScriptedOpenAIServer([("ok", '{"name": "x", "population": 1}')]) as server:
        first, second = _lm(server.base_url), _lm(server.base_url)
        first.json("q", City)
        second.json("q2", City)
    assert [p["kind"] for p in server.probes] == [
        "schema"
    ]  # the first schema call probed; the rest remember
    assert all(r["body"]["response_format"]["type"] == "json_schema" for r in server.requests)


def test_the_variable_sets_the_mode_and_an_explicit_mode_the_server_refuses_is_bad_input(
    monkeypatch,
):
    monkeypatch.setenv("OPTLOOP_LM_SCHEMA_MODE", "json_schema")
    with ScriptedOpenAIServer([("ok", "pong")], schema_modes=LLAMA_CPP) as server:
        lm = _lm(server.base_url)
        assert lm.settings.schema_mode == "json_schema"
        with pytest.raises(
            LMRequestError, match="does not take --lm-schema-mode json_schema"
        ) as info:
            lm.check_endpoint()
    assert info.value.exit_code == 2 and "use --lm-schema-mode auto" in str(info.value)


def test_mode_none_writes_the_schema_into_the_instructions_and_checks_the_answer():
    fenced = '```json\n{"name": "Lisbon", "population": 545000}\n```'
    with ScriptedOpenAIServer(
        [("ok", fenced), ("ok", '{"name": "Lisbon"}')], schema_modes=frozenset({"none"})
    ) as server:
        lm = _lm(server.base_url, max_retries=0)
        assert lm.json(
            [{"role": "system", "content": "Extract."}, {"role": "user", "content": "q"}], City
        ) == {"name": "Lisbon", "population": 545000}
        with pytest.raises(
            LMError, match="population"
        ):  # off the schema: a malformed answer, not a result
            lm.json("q2", City)
    body = server.requests[0]["body"]
    assert "response_format" not in body
    assert body["messages"][0]["content"].startswith(
        "Extract.\n\nAnswer with one JSON object and nothing else"
    )
    assert '"population"' in body["messages"][0]["content"]


CONTEXT_400 = (
    400,
    {},
    {
        "message": "This model's maximum context length is 2048 tokens. However, you requested "
        "9658 tokens (9146 in the messages, 512 in the completion). Please reduce the "
        "length of the messages or completion.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    },
)


def test_a_prompt_longer_than_the_context_fails_at_once_with_the_sizes_and_the_server_flag():
    with ScriptedOpenAIServer([("status", CONTEXT_400)]) as server:
        lm = _lm(server.base_url, max_retries=3)
        with pytest.raises(LMRequestError) as info:
            lm.text("a long prompt")
    message = str(info.value)
    assert len(server.requests) == 1  # no retry: the same request cannot fit the next time
    assert "a 9146-token prompt" in message and "the server's context is 2048" in message
    assert "--n_ctx" in message and "at least 16384" in message and info.value.exit_code == 2
    assert lm.accounting.records[-1].error == message and lm.endpoint_down is None


def test_a_validation_error_naming_a_field_is_a_request_error_even_as_http_500():
    body = {
        "message": "1 validation error:\n  {'type': 'less_than_equal', 'loc': ('body', "
        "'temperature'), "
        "'msg': 'Input should be less than or equal to 2', 'input': 3}",
        "type": "internal_server_error",
    }
    with ScriptedOpenAIServer([("status", (500, {}, body))]) as server:
        lm = _lm(server.base_url, max_retries=3)
        with pytest.raises(
            LMRequestError, match="refuses the request's temperature .Input should be less"
        ):
            lm.text("q")
    assert len(server.requests) == 1


def test_a_plain_server_error_is_still_retried():
    with ScriptedOpenAIServer([("status", 500), ("ok", "fine")]) as server:
        assert _lm(server.base_url, max_retries=2).text("q") == "fine"
    assert len(server.requests) == 2


class _Serial:
    """A backend stand-in that answers one request at a time, ``seconds`` each (a llama.cpp
    server)."""

    def __init__(self, seconds: float, slots: int = 1):
        self.seconds = seconds
        self.gate = threading.Semaphore(slots)

    def complete(self, request: Request) -> dict:
        with self.gate:
            time.sleep(self.seconds)
        return {"choices": [{"message": {"content": "ok"}}]}

    def where(self) -> str:
        return "http://127.0.0.1:1/v1"


@pytest.mark.parametrize("slots, expected", [(1, 1), (2, 2), (4, 8)])
def test_concurrency_auto_measures_how_many_requests_the_server_serves_at_once(slots, expected):
    found = detect_concurrency(_Serial(0.15, slots), default=8)  # type: ignore[arg-type]
    assert found.concurrency == expected, found.line


def test_concurrency_auto_is_the_endpoint_default_and_an_explicit_number_wins(monkeypatch):
    assert LMSettings.from_spec("openai:m", base_url="http://x/v1").concurrency_auto
    assert not LMSettings.from_spec(
        "openai:m", base_url="http://x/v1", concurrency=3
    ).concurrency_auto
    assert not LMSettings.from_spec("local").concurrency_auto
    monkeypatch.setenv("OPTLOOP_CONCURRENCY", "auto")
    assert LMSettings.from_spec("openai:m", base_url="http://x/v1").concurrency_auto


def test_the_timeout_counts_the_request_not_the_wait_for_a_concurrency_slot():
    # 6 calls at once, one slot: the last waits ~1.5 s in optloop's queue, yet each request takes
    # 0.3 s < 0.5 s.
    with ScriptedOpenAIServer([("respond", InFlight(0.3))]) as server:
        lm = _lm(server.base_url, concurrency=1, timeout_s=0.5, max_retries=0)
        threads = [threading.Thread(target=lm.text, args=(f"q{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    records = lm.accounting.records
    assert len(records) == 6 and all(r.error is None and not r.faults for r in records)
    assert max(r.throttled_s for r in records) > 1.0  # it did wait, outside the timeout


def test_llama_servers_own_context_error_carries_its_sizes_in_the_error_object():
    body = {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 9146,
        "n_ctx": 4096,
    }
    with ScriptedOpenAIServer([("status", (400, {}, body))]) as server:
        lm = _lm(server.base_url, max_retries=3)
        with pytest.raises(LMRequestError) as info:
            lm.text("q")
    message = str(info.value)
    assert "a 9146-token prompt" in message and "the server's context is 4096" in message
    assert "at least 16384" in message and len(server.requests) == 1


def _rambling(closes_at: int):
    """A llama.cpp-like server whose JSON answer runs to max_tokens until the schema bounds the
    array to ``closes_at`` items or fewer."""

    def respond(body):
        form = body["response_format"]
        facts = (form.get("schema") or form["json_schema"]["schema"])["properties"]["facts"]
        bounded = facts.get("maxItems", 10**6) <= closes_at
        answer = chat_completion(
            body, '{"facts": ["a"]}' if bounded else '{"facts": ["a", "a', USAGE
        )
        answer["choices"][0]["finish_reason"] = "stop" if bounded else "length"
        return "raw", json.dumps(answer)

    return respond


USAGE = {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}
FACTS = {"type": "object", "properties": {"facts": {"type": "array", "items": {"type": "string"}}}}


@pytest.mark.parametrize(
    "closes_at, bounds", [(4, [None, (4, 100)]), (1, [None, (4, 100), (1, 25)])]
)
def test_a_json_answer_cut_at_max_tokens_is_asked_again_under_tighter_bounds_in_json_object_mode(
    closes_at, bounds
):
    with ScriptedOpenAIServer(
        [("respond", _rambling(closes_at))], schema_modes=LLAMA_CPP
    ) as server:
        lm = _lm(server.base_url, schema_mode="json_object")
        assert lm.json("list the facts", FACTS) == {"facts": ["a"]}
    sent = [r["body"]["response_format"]["schema"]["properties"]["facts"] for r in server.requests]
    assert [
        (f["maxItems"], f["items"]["maxLength"]) if "maxItems" in f else None for f in sent
    ] == bounds
    assert {r["body"]["max_tokens"] for r in server.requests} == {512}  # the budget never grows
    record = lm.accounting.records[-1]
    assert record.attempts == 1 and record.completion_tokens == 7 * len(bounds)


def test_in_json_schema_mode_a_cut_answer_is_retried_as_sent():
    """An endpoint that takes json_schema (OpenAI, vLLM) gets the request as the caller made it:
    its schema is not rewritten."""
    with ScriptedOpenAIServer([("respond", _rambling(4))]) as server:
        lm = _lm(server.base_url, schema_mode="json_schema", max_retries=1)
        with pytest.raises(LMError, match="truncated at max_tokens"):
            lm.json("list the facts", FACTS)
    assert all(
        "maxItems"
        not in r["body"]["response_format"]["json_schema"]["schema"]["properties"]["facts"]
        for r in server.requests
    )
