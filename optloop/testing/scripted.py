"""A loopback OpenAI-compatible endpoint whose behaviour follows a script (:class:`ScriptedOpenAIServer`).

Each request consumes the next scripted behaviour (the last one repeats):

* ``("ok", content)``: a chat completion of ``content``;
* ``("status", code)`` or ``("status", (code, headers[, error]))``: that HTTP error;
* ``("raw", body_text)``: HTTP 200 with that body, as it is;
* ``("hang", seconds)``: no answer (the connection closes after ``seconds``);
* ``("embed", dim)``: an embeddings answer of ``dim`` dimensions;
* ``("respond", fn)``: ``fn(request body)`` returns one of the others for this request.

Requests may come from many threads at once: the script is consumed under a lock, and each recorded
request carries its arrival time (``"at"``, ``time.monotonic()``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from email.message import Message
from typing import Any

from optloop.testing.loopback import LoopbackServer, Reply, chat_completion


class ScriptedOpenAIServer(LoopbackServer):
    def __init__(self, script: list[tuple[str, Any]], *, port: int = 0):
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        super().__init__(port)

    def post(self, path: str, body: bytes, headers: Message) -> Reply | None:
        request = json.loads(body or b"{}")
        with self.lock:
            self.requests.append({"path": path, "body": request, "auth": headers.get("authorization"),
                                  "at": time.monotonic()})
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
            data = [{"object": "embedding", "index": i, "embedding": [float(i + 1)] + [0.0] * (arg - 1)}
                    for i, _ in enumerate(request["input"])]
            return Reply(payload={"object": "list", "data": data, "model": request["model"],
                                  "usage": {"prompt_tokens": 1, "total_tokens": 1}})
        return Reply(payload=chat_completion(request, arg, {"prompt_tokens": 7, "completion_tokens": 3,
                                                            "total_tokens": 10}))


def answer_with(lm: Any, *, keep_max_tokens: bool = False) -> Callable[[dict[str, Any]], tuple[str, Any]]:
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
            return "ok", lm.text(body["messages"], response_format=body.get("response_format"),
                                 max_tokens=body.get("max_tokens"))
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
