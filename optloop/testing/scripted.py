"""A loopback OpenAI-compatible endpoint whose behaviour follows a script
(:class:`ScriptedOpenAIServer`).

Each request consumes the next scripted behaviour (the last one repeats):

* ``("ok", content)``: a chat completion of ``content``;
* ``("status", code)`` or ``("status", (code, headers[, error]))``: that HTTP error;
* ``("raw", body_text)``: HTTP 200 with that body, as it is;
* ``("hang", seconds)``: no answer (the connection closes after ``seconds``);
* ``("embed", dim)``: an embeddings answer of ``dim`` dimensions;
* ``("respond", fn)``: ``fn(request body)`` returns one of the others for this request.

Requests may come from many threads at once: the script is consumed under a lock, and each recorded
request carries its arrival time (``"at"``, ``time.monotonic()``). optloop's start-up probes are
answered apart from the script (``probes``), as a server taking ``schema_modes`` would.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from email.message import Message
from typing import Any

from optloop.testing.loopback import LoopbackServer, Reply, chat_completion

# optloop's start-up probes (the schema mode, --concurrency auto) are answered outside the script
# and recorded in ``probes``, not ``requests``, as a server that takes ``schema_modes`` would
# answer them; a llama.cpp Python server takes {"json_object", "none"} and answers json_schema with
# HTTP 500 and pydantic's validation text (LLAMA_CPP_REJECTION, word for word).
ALL_SCHEMA_MODES = frozenset({"json_schema", "json_object", "none"})
LLAMA_CPP_REJECTION = {
    "error": {  # llama-cpp-python 0.3.36's server, word for word
        "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
        "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\", "
        "'input': 'json_schema', 'ctx': {'expected': \"'text' or 'json_object'\"}}\n\n  "
        "Endpoint: POST /v1/chat/completions",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}


def _probe_kind(body: dict[str, Any]) -> str | None:
    from optloop.lm.endpoint import SCHEMA_PROBE
    from optloop.lm.probe import CONCURRENCY_PROBE

    text = json.dumps(body.get("messages") or [])
    return (
        "schema" if SCHEMA_PROBE in text else "concurrency" if CONCURRENCY_PROBE in text else None
    )


def _schema_mode(body: dict[str, Any]) -> str:
    fmt = body.get("response_format") or {}
    return (
        "none" if not fmt else "json_schema" if fmt.get("type") == "json_schema" else "json_object"
    )


_USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


class ScriptedOpenAIServer(LoopbackServer):
    def __init__(
        self,
        script: list[tuple[str, Any]],
        *,
        port: int = 0,
        schema_modes: frozenset[str] = ALL_SCHEMA_MODES,
    ):
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.probes: list[dict[str, Any]] = []
        self.schema_modes = schema_modes
        self.lock = threading.Lock()
        super().__init__(port)

    def post(self, path: str, body: bytes, headers: Message) -> Reply | None:
        request = json.loads(body or b"{}")
        if (probe := _probe_kind(request)) is not None:
            with self.lock:
                self.probes.append({"kind": probe, "body": request, "at": time.monotonic()})
            if probe == "concurrency":
                return Reply(payload=chat_completion(request, "ok", _USAGE))
            if _schema_mode(request) in self.schema_modes:
                return Reply(payload=chat_completion(request, '{"city": "Lisbon"}', _USAGE))
            return Reply(500, LLAMA_CPP_REJECTION)
        if _schema_mode(request) not in self.schema_modes:
            return Reply(500, LLAMA_CPP_REJECTION)
        with self.lock:
            self.requests.append(
                {
                    "path": path,
                    "body": request,
                    "auth": headers.get("authorization"),
                    "at": time.monotonic(),
                }
            )
            kind, arg = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if kind == "respond":
            kind, arg = arg(request)
        if kind == "hang":
            time.sleep(arg)
            return None
        if kind == "status":
            code, extra, *error = arg if isinstance(arg, tuple) else (arg, {})
            detail = error[0] if error else {"message": f"scripted {code}", "type": "server_error"}
            return Reply(code, {"error": detail}, headers=extra)
        if kind == "raw":
            return Reply(raw=arg.encode())
        if kind == "embed":
            data = [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": [float(i + 1)] + [0.0] * (arg - 1),
                }
                for i, _ in enumerate(request["input"])
            ]
            return Reply(
                payload={
                    "object": "list",
                    "data": data,
                    "model": request["model"],
                    "usage": {"prompt_tokens": 1, "total_tokens": 1},
                }
            )
        return Reply(payload=chat_completion(request, arg, _USAGE))


def answer_with(
    lm: Any, *, keep_max_tokens: bool = False
) -> Callable[[dict[str, Any]], tuple[str, Any]]:
    """A ``("respond", ...)`` behaviour that answers every chat request with a real LM.

    ``ScriptedOpenAIServer([("respond", answer_with(lm))])`` is an OpenAI-compatible
    endpoint in front of ``lm`` (the embedded SmolLM2 in tests): the request's messages
    and ``response_format`` go to ``lm`` unchanged, its sampling parameters are the
    server's own (``lm``'s settings), as with any hosted model. ``keep_max_tokens``: the
    request's ``max_tokens`` holds too, as on any real server (a 1-token ping is not a
    512-token essay on a busy CPU).
    """

    def respond(body: dict[str, Any]) -> tuple[str, Any]:
        if keep_max_tokens:
            return "ok", lm.text(
                body["messages"],
                response_format=body.get("response_format"),
                max_tokens=body.get("max_tokens"),
            )
        return "ok", lm.text(body["messages"], response_format=body.get("response_format"))

    return respond


class InFlight:
    """A responder that takes ``seconds`` per request and records the most requests it held at once
    (``peak``)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.inside = self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> tuple[str, Any]:
        with self._lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        time.sleep(self.seconds)
        with self._lock:
            self.inside -= 1
        return "ok", "x"
