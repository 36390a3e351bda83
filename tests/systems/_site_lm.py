"""A scripted LM that answers each call by the prompt site making it (no model is loaded).

``SiteLM({"tiered.extract": fn_or_list, "answer": ...})``: for each call the reply for the
active site (:func:`optloop.lm.current_site`) is the next item of its list, or ``fn(fields)``
where ``fields`` are the call's input fields as DSPy rendered them (``fields["message"]``).
A site without a script gets a neutral reply: no facts, no summary, no gate decision, "I don't
know".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import dspy
from dspy.utils import DummyLM

from optloop.lm import Accounting, current_site

Reply = dict[str, Any]
Script = list[Reply] | Callable[[dict[str, str]], Reply]

DEFAULTS: dict[str, Reply] = {
    "tiered.extract": {"facts": []},
    "tiered.summarize": {"summary": ""},
    "gated.admit": {"decisions": []},
    "answer": {"answer": "I don't know"},
    "retrieve.query": {"query": ""},
}
_FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with|\Z)", re.DOTALL)


def input_fields(messages: list[dict[str, Any]]) -> dict[str, str]:
    """The input fields of a JSONAdapter request, by name."""
    user = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
    return {name: value.strip() for name, value in _FIELD.findall(user)}


class _Replies:
    def __init__(self, lm: SiteLM):
        self.lm = lm

    def __iter__(self) -> _Replies:
        return self

    def __next__(self) -> Reply:
        site = current_site() or "?"
        fields = input_fields(self.lm.last_messages)
        self.lm.calls.append((site, fields))
        script = self.lm.scripts.get(site)
        if callable(script):
            return script(fields)
        if script:
            return script.pop(0)
        return DEFAULTS.get(site, {})


class SiteLM(DummyLM):
    """DummyLM whose replies are chosen by prompt site; ``calls`` lists (site, input fields) in
    order."""

    def __init__(self, scripts: dict[str, Script] | None = None):
        self.scripts: dict[str, Script] = {
            name: (list(script) if isinstance(script, list) else script)
            for name, script in (scripts or {}).items()
        }
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.last_messages: list[dict[str, Any]] = []
        super().__init__(_Replies(self), adapter=dspy.JSONAdapter())  # type: ignore[arg-type]
        self.accounting = Accounting()  # what the recorder and the pipeline read call counts from

    def forward(self, prompt: Any = None, messages: Any = None, **kwargs: Any) -> Any:
        self.last_messages = list(messages or [])
        return super().forward(prompt=prompt, messages=messages, **kwargs)

    def sites(self) -> list[str]:
        return [site for site, _ in self.calls]


def echo_memories(fields: dict[str, str]) -> Reply:
    """An answer that repeats the memories it was given: right exactly when retrieval brought the
    answer."""
    return {"answer": fields.get("memories", "")}
