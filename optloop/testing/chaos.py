"""An OpenAI-compatible loopback endpoint that misbehaves on a schedule (:class:`FaultyEndpoint`),
for the reliability tests and the endpoint-chaos bench (``experiments/bench/chaos.py``). Request
number ``n`` (1-based, counted by the server) gets the disruption the :class:`FaultSchedule` names
for it, or a real answer (from an LM, or a schema-valid stub: :func:`stub_answer`):

``http500`` / ``http503``  an HTTP error status
``truncated``              HTTP 200 and a JSON body cut off mid-way
``nonjson``                HTTP 200 and an HTML error page
``hang``                   no answer until past the client's timeout
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from optloop.errors import ConfigError
from optloop.testing.scripted import ScriptedOpenAIServer, answer_with

Disruption = Literal["http500", "http503", "truncated", "nonjson", "hang"]
TRUNCATED_BODY = (
    '{"id": "cmpl-1", "object": "chat.completion", "created": 0, "choices": [{"index": 0, '
    '"message": {"ro'
)
NON_JSON_BODY = (
    "<html><head><title>502 Bad Gateway</title></head><body>upstream went away</body></html>"
)


DEFAULT_AT: dict[int, Disruption] = {
    3: "http500",
    6: "truncated",
    9: "http503",
    12: "nonjson",
    15: "hang",
    18: "http503",
    19: "http500",
}


class FaultSchedule(BaseModel):
    """Which request numbers get which fault: position ``(n - 1) % period + 1`` of a cycle."""

    period: int = Field(20, ge=1)
    at: dict[int, Disruption] = Field(default_factory=lambda: dict(DEFAULT_AT))
    max_hangs: int = Field(
        1, ge=0, description="hangs cost a timeout each: at most this many, later ones answer"
    )

    @classmethod
    def parse(cls, text: str) -> FaultSchedule:
        """``"20:3=http500,6=truncated,15=hang"`` (period, then position=fault pairs)."""
        try:
            period, _, pairs = text.partition(":")
            at = {
                int(pos): kind
                for pos, _, kind in (p.partition("=") for p in pairs.split(",") if p.strip())
            }
            return cls(period=int(period), at=at)
        except ValueError as exc:
            raise ConfigError(
                f"--schedule {text!r}: write PERIOD:POS=FAULT,... with FAULT one of "
                f"http500, http503, truncated, nonjson, hang ({' '.join(str(exc).split())[:120]})"
            ) from None

    def fault(self, n: int) -> Disruption | None:
        return self.at.get((n - 1) % self.period + 1)


def schema_stub(
    schema: dict[str, Any] | None, text: str = "keep every name, date and number"
) -> Any:
    """The smallest document valid under a JSON schema (strings: ``text``), for an endpoint that
    needs no model."""
    defs = (schema or {}).get("$defs") or (schema or {}).get("definitions") or {}

    def visit(node: Any) -> Any:
        if not isinstance(node, dict):
            return "stub"
        if "$ref" in node:
            return visit(defs.get(node["$ref"].rsplit("/", 1)[-1], {}))
        if "const" in node:
            return node["const"]
        if node.get("enum"):
            return node["enum"][0]
        for key in ("anyOf", "oneOf", "allOf"):
            if node.get(key):
                return visit(node[key][0])
        kind = node.get("type")
        kind = kind[0] if isinstance(kind, list) else kind
        if kind == "object" or "properties" in node:
            return {name: visit(sub) for name, sub in (node.get("properties") or {}).items()}
        return {"array": [], "integer": 0, "number": 0.0, "boolean": False, "null": None}.get(
            str(kind), text
        )

    return visit(schema or {})


def stub_answer(body: dict[str, Any]) -> tuple[str, Any]:
    """A ``respond`` behaviour: a schema-valid stub (no model), for tests of everything but the
    answers.

    Its strings vary with the request's seed, as a sampled answer would (an optimizer's
    rollouts then propose distinct candidates), and each is a well-formed instruction, so an
    optimizer that leaves out the others (:func:`optloop.loop.proposals.units.problems`) keeps it.
    """
    fmt = body.get("response_format") or {}
    text = f"Keep every name, date and number of the question (variant {body.get('seed', 0)})."
    if fmt.get("type") == "json_schema":
        return "ok", json.dumps(schema_stub((fmt.get("json_schema") or {}).get("schema"), text))
    if fmt.get("type") == "json_object":
        return "ok", json.dumps(schema_stub(fmt.get("schema"), text) if fmt.get("schema") else {})
    last = ((body.get("messages") or [{}])[-1].get("content") or "") if body else ""
    if fields := _chat_fields(str(last)):  # DSPy's chat format: each output field, then completed
        return "ok", "".join(f"[[ ## {f} ## ]]\n{text}\n\n" for f in fields) + (
            "[[ ## completed ## ]]"
        )
    return "ok", "ok"


def _chat_fields(prompt: str) -> list[str]:
    """The output fields a DSPy chat-format prompt asks for ("Respond with the corresponding
    output fields, starting with the field `[[ ## a ## ]]`, then `[[ ## b ## ]]`, ...")."""
    asked = prompt.rpartition("Respond with the corresponding output fields")[2]
    return [f for f in re.findall(r"\[\[ ## (\w+) ## \]\]", asked) if f != "completed"]


class FaultyEndpoint:
    """An OpenAI-compatible loopback endpoint: the real ``lm`` behind a fault schedule.

    ``lm=None`` answers with :func:`stub_answer` instead (fast; for what needs no model).

    ``down_when()`` (checked at every request) switches it off for good: the request
    that sees it true is dropped and the server stops listening, so later requests are
    refused, as from a crashed server.
    """

    def __init__(
        self,
        lm: Any,
        schedule: FaultSchedule | None = None,
        *,
        hang_s: float = 5.0,
        down_when: Callable[[], bool] | None = None,
        port: int = 0,
        client_timeout: float | None = None,
    ):
        self.schedule = schedule or FaultSchedule(at={})
        self.hang_s = hang_s
        self.client_timeout = client_timeout
        self.down_when = down_when
        self.answer = answer_with(lm, keep_max_tokens=True) if lm is not None else stub_answer
        self.log: list[
            tuple[int, str]
        ] = []  # (request number, fault or "ok" or "dropped" or "slow")
        self.answer_seconds: list[float] = []  # how long each real answer took
        self.down = False
        self._lock = threading.Lock()
        self._hangs = 0
        # port: the same address again, as a restarted server would have
        self.server = ScriptedOpenAIServer([("respond", self._respond)], port=port)
        default_handle_error = self.server.httpd.handle_error

        def handle_error(request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                # a client that gave up on an answer is no news
                default_handle_error(request, client_address)

        self.server.httpd.handle_error = handle_error  # type: ignore[method-assign]

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def port(self) -> int:
        return self.server.httpd.server_address[1]

    def __enter__(self) -> FaultyEndpoint:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.down:
            self.server.__exit__(*exc)

    def _respond(self, body: dict[str, Any]) -> tuple[str, Any]:
        with self._lock:
            n = len(self.log) + 1
            if self.down or (self.down_when is not None and self.down_when()):
                self.log.append((n, "dropped"))
                if not self.down:
                    self.down = True
                    threading.Thread(target=self._stop, daemon=True).start()
                return "hang", 0  # the connection closes with no answer
            fault = self.schedule.fault(n)
            if fault == "hang":
                if self._hangs >= self.schedule.max_hangs:
                    fault = None
                else:
                    self._hangs += 1
            self.log.append((n, fault or "ok"))
        if fault is None:
            started = time.perf_counter()
            answer = self.answer(body)
            self.answer_seconds.append(time.perf_counter() - started)
            if self.client_timeout and self.answer_seconds[-1] >= self.client_timeout:
                # a real answer the client had stopped waiting for: a fault nobody injected
                with self._lock:
                    self.log[n - 1] = (n, "slow")
            return answer
        return {
            "http500": ("status", 500),
            "http503": ("status", 503),
            "truncated": ("raw", TRUNCATED_BODY),
            "nonjson": ("raw", NON_JSON_BODY),
            "hang": ("hang", self.hang_s),
        }[fault]

    def _stop(self) -> None:
        self.server.httpd.shutdown()
        self.server.httpd.server_close()

    def injected(self) -> Counter[str]:
        return Counter(kind for _, kind in self.log if kind not in ("ok", "dropped", "slow"))

    @property
    def slow(self) -> int:
        """Real answers that took longer than the client waited (timeouts the schedule did not
        inject)."""
        return sum(kind == "slow" for _, kind in self.log)
