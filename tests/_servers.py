"""A loopback OpenAI-compatible HTTP server whose behaviour follows a script.

It is a real HTTP server on 127.0.0.1 spoken to by the real ``openai`` client,
so tests exercise the LM layer's actual network path: status codes, bodies
that do not parse, answers that never come. Each request consumes the next
scripted behaviour (the last one repeats).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable
from typing import Any

# Behaviours: ("ok", content) | ("status", code) | ("status", (code, headers[, error])) | ("raw", body_text)
#             | ("hang", seconds) | ("embed", dim)
#             | ("respond", fn): fn(request body) returns one of the other behaviours for this request
# Requests may come from many threads at once: the script is consumed under a lock, and each
# recorded request carries its arrival time ("at", time.monotonic()).


# optloop's start-up probes (the schema mode, --concurrency auto) are answered outside the script and
# recorded in ``probes``, not ``requests``: a server that takes ``schema_modes`` (a llama.cpp server:
# {"json_object", "none"}, answering HTTP 500 with pydantic's validation text to json_schema, as it does).


LLAMA_CPP_REJECTION = {"error": {  # llama-cpp-python 0.3.36's server, word for word
    "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
               "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected': "
               "\"'text' or 'json_object'\"}}\n\n  Endpoint: POST /v1/chat/completions",
    "type": "internal_server_error", "param": None, "code": None}}


def _probe_kind(body: dict[str, Any]) -> str | None:
    from optloop.lm.endpoint import SCHEMA_PROBE
    from optloop.lm.probe import CONCURRENCY_PROBE

    text = json.dumps(body.get("messages") or [])
    return "schema" if SCHEMA_PROBE in text else "concurrency" if CONCURRENCY_PROBE in text else None


def _schema_mode(body: dict[str, Any]) -> str:
    fmt = body.get("response_format") or {}
    return "none" if not fmt else "json_schema" if fmt.get("type") == "json_schema" else "json_object"


class ScriptedOpenAIServer:
    def __init__(self, script: list[tuple[str, Any]],
                 schema_modes: frozenset[str] = frozenset({"json_schema", "json_object", "none"})):
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.probes: list[dict[str, Any]] = []
        self.schema_modes = schema_modes
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if (probe := _probe_kind(body)) is not None:
                    with server.lock:
                        server.probes.append({"kind": probe, "body": body, "at": time.monotonic()})
                    if probe == "concurrency":
                        return self._chat(body, "ok")
                    if _schema_mode(body) in server.schema_modes:
                        return self._chat(body, '{"city": "Lisbon"}')
                    return self._send(500, LLAMA_CPP_REJECTION)
                if _schema_mode(body) not in server.schema_modes:
                    return self._send(500, LLAMA_CPP_REJECTION)
                with server.lock:
                    server.requests.append({"path": self.path, "body": body, "auth": self.headers.get("authorization"),
                                            "at": time.monotonic()})
                    kind, arg = server.script.pop(0) if len(server.script) > 1 else server.script[0]
                if kind == "respond":
                    kind, arg = arg(body)
                if kind == "hang":
                    time.sleep(arg)
                    return
                if kind == "status":
                    code, headers, *error = arg if isinstance(arg, tuple) else (arg, {})
                    body = error[0] if error else {"message": f"scripted {code}", "type": "server_error"}
                    self._send(code, {"error": body}, headers=headers)
                elif kind == "raw":
                    self._send(200, None, raw=arg.encode())
                elif kind == "embed":
                    data = [{"object": "embedding", "index": i, "embedding": [float(i + 1)] + [0.0] * (arg - 1)}
                            for i, _ in enumerate(body["input"])]
                    self._send(200, {"object": "list", "data": data, "model": body["model"],
                                     "usage": {"prompt_tokens": 1, "total_tokens": 1}})
                else:
                    self._chat(body, arg)

            def _chat(self, body: dict[str, Any], content: str) -> None:
                self._send(200, {
                    "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
                })

            def _send(self, code: int, payload: Any, raw: bytes | None = None,
                      headers: dict[str, str] | None = None) -> None:
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128  # many clients at once (the default backlog of 5 resets connections)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedOpenAIServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def answer_with(lm: Any) -> Callable[[dict[str, Any]], tuple[str, Any]]:
    """A ``("respond", ...)`` behaviour that answers every chat request with a real LM.

    ``ScriptedOpenAIServer([("respond", answer_with(lm))])`` is an OpenAI-compatible
    endpoint in front of ``lm`` (the embedded SmolLM2 in tests): the request's messages
    and ``response_format`` go to ``lm`` unchanged, its sampling parameters are the
    server's own (``lm``'s settings), as with any hosted model.
    """

    def respond(body: dict[str, Any]) -> tuple[str, Any]:
        return "ok", lm.text(body["messages"], response_format=body.get("response_format"))

    return respond


class InFlight:
    """A responder that takes ``seconds`` per request and records the most requests it held at once (``peak``)."""

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


def closed_port_url() -> str:
    """A loopback URL on which nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
