"""A loopback OpenAI-compatible endpoint that needs no model (:class:`OracleEndpoint`): md_flat's
curate call keeps the session's user lines as facts, the answer call gives the gold answer when the
memories hold it, unless the answer instruction carries the planted sentence, and everything else
gets a schema-valid stub. So deleting the planted sentence is a real improvement, for the crash
bench (``experiments/bench/crash.py``) and the command-line tests."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from optloop.testing.chaos import stub_answer
from optloop.testing.scripted import ScriptedOpenAIServer

DATASET = "builtin:tiny"
PLANTED = "Always reply that you do not know."
DONT_KNOW = "I don't know"


def prompt_section(text: str, name: str) -> str:
    """The value of DSPy's ``[[ ## name ## ]]`` section in a prompt ("" when absent)."""
    pattern = rf"\[\[ ## {re.escape(name)} ## \]\]\n(.*?)(?:\n\n\[\[ ## |\n\nRespond with|\Z)"
    match = re.search(pattern, text, re.S)
    return match.group(1) if match else ""


def response_schema(response_format: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON schema of an OpenAI (``json_schema``) or llama.cpp (``json_object`` + ``schema``)
    response format."""
    fmt = response_format or {}
    return (fmt.get("json_schema") or {}).get("schema") or fmt.get("schema") or {}


class OracleEndpoint:
    """The loopback endpoint of the module docstring; ``requests`` counts what it answered."""

    def __init__(self, dataset: str = DATASET, planted: str = PLANTED, *, delay: float = 0.0):
        from optloop.datasets import load_dataset

        self.gold = {
            q.question: q.gold for e in load_dataset(dataset).episodes for q in e.questions
        }
        self.planted = planted
        # seconds per chat answer (a run long enough for a second worker to join)
        self.delay = delay
        self.hold_when: Callable[[], bool] | None = None  # while true, requests wait for release()
        self.holding = threading.Event()  # set when a request is being held
        self._released = threading.Event()
        self.requests = 0
        self.server = ScriptedOpenAIServer([("respond", self._respond)])
        default_handle_error = self.server.httpd.handle_error

        def handle_error(request: Any, client_address: Any) -> None:
            if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                # a killed client is what this endpoint is for
                default_handle_error(request, client_address)

        self.server.httpd.handle_error = handle_error  # type: ignore[method-assign]

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def __enter__(self) -> OracleEndpoint:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.__exit__(*exc)

    def release(self) -> None:
        """Let held requests go on, and hold no more."""
        self.hold_when = None
        self._released.set()

    def _respond(self, body: dict[str, Any]) -> tuple[str, Any]:
        self.requests += 1
        if self.hold_when is not None and self.hold_when():
            self.holding.set()
            self._released.wait(120)
        if "input" in body:  # /embeddings
            return "embed", 8
        if self.delay:
            time.sleep(self.delay)
        fields = sorted(
            (response_schema(body.get("response_format")).get("properties") or {}).keys()
        )
        messages = body.get("messages") or []
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        user = messages[-1].get("content") or "" if messages else ""
        if fields == ["facts"]:
            session = prompt_section(user, "session")
            facts = [
                line.split(":", 1)[1].strip()
                for line in session.splitlines()
                if line.startswith("user:")
            ]
            return "ok", json.dumps({"facts": facts})
        if fields == ["answer"]:
            gold = self.gold.get(prompt_section(user, "question").strip())
            memories = prompt_section(user, "memories").lower()
            known = gold is not None and all(
                part.strip().lower() in memories for part in gold.split(",")
            )
            return "ok", json.dumps(
                {"answer": gold if known and self.planted not in system else DONT_KNOW}
            )
        return stub_answer(body)
