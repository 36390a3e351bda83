"""A model that needs no model: each answer is a function of the request alone.

:func:`oracle_reply` answers md_flat's curation (the session's user lines become facts), mem0's
extraction (the new messages' user lines become memories; one line in three, chosen by its text, is
lost) and the answer site (the gold answer when
the memories hold it, else "I don't know"), and graphiti's entity and edge extraction (the user and
the capitalised words of its kept lines, one edge each); any other schema gets a valid stub.
Because nothing depends on the order requests arrive in, a run at any concurrency gets the same
answers:
:class:`KeyedEndpoint` serves it over HTTP with a latency fixed by the request (so parallel calls
finish out of order) and, for some requests, an HTTP 500 the first time they are asked (cured by
the retry, so the episode's graph is saved as faulted); :class:`OracleLlama` stands in for
llama.cpp (``LocalLlamaBackend._model``) to record an LM cache as if from the embedded model.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from optloop.lm import LMSettings, OptloopLM
from optloop.testing.chaos import schema_stub
from optloop.testing.oracle import prompt_section, response_schema
from optloop.testing.scripted import ScriptedOpenAIServer

DONT_KNOW = "I don't know"


def _digest(messages: Any) -> bytes:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).digest()


def _user_lines(text: str) -> list[str]:
    """The user's lines of a transcript, less one in three (chosen by its text): a memory that
    loses facts, so some answers fail and are attributed."""
    lines = [
        line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("user:")
    ]
    return [line for line in lines if _digest(line)[0] % 3]


def _current_message(text: str) -> str:
    """graphiti's ``<CURRENT_MESSAGE>`` block of a prompt."""
    found = re.search(r"<CURRENT_MESSAGE>\n(.*?)</CURRENT_MESSAGE>", text, re.S)
    return found.group(1) if found else ""


def _graphiti_names(text: str) -> list[str]:
    """Capitalised words, not a line's first, of the user lines kept from graphiti's current
    message."""
    words = [
        word
        for line in _user_lines(_current_message(text))
        for word in re.findall(r"\w+", line)[1:]
    ]
    return list(dict.fromkeys(word for word in words if word[:1].isupper()))


def oracle_reply(
    messages: list[dict[str, Any]], response_format: dict[str, Any] | None, gold: dict[str, str]
) -> str:
    """The content of the oracle's answer; ``gold`` maps question texts to gold answers."""
    schema = response_schema(response_format)
    fields = sorted((schema.get("properties") or {}).keys())
    user = str(messages[-1].get("content") or "") if messages else ""
    if fields == ["facts"]:  # md_flat.curate: what the file held, plus the session's user lines
        kept = [
            line.removeprefix("- ").split("] ", 1)[-1]
            for line in prompt_section(user, "memory_file").splitlines()
            if line.startswith("- ")
        ]
        return json.dumps({"facts": kept + _user_lines(prompt_section(user, "session"))})
    if fields == ["memory"]:  # mem0.extract: the new messages' user lines
        new = user.split("## New Messages", 1)[-1].split("\n## ", 1)[0]
        return json.dumps(
            {
                "memory": [
                    {"id": str(i), "text": text, "attributed_to": "user", "linked_memory_ids": []}
                    for i, text in enumerate(_user_lines(new))
                ]
            }
        )
    if fields == [
        "extracted_entities"
    ]:  # graphiti: the user, and the capitalised words the user said
        names = ["User", *_graphiti_names(user)]
        return json.dumps(
            {"extracted_entities": [{"name": name, "entity_type_id": 0} for name in names]}
        )
    if fields == [
        "edges"
    ]:  # graphiti: the user is related to each entity by the line that names it
        listed = re.search(r"<ENTITIES>\n(.*?)\n</ENTITIES>", user, re.S)
        names = [e["name"] for e in json.loads(listed.group(1))] if listed else []
        lines = _user_lines(_current_message(user))
        edges = [
            {
                "source_entity_name": "User",
                "target_entity_name": name,
                "relation_type": "SAID",
                "fact": next(line for line in lines if name in line),
            }
            for name in names
            if name != "User" and any(name in line for line in lines)
        ]
        return json.dumps({"edges": edges})
    if fields == ["answer"]:
        answer = gold.get(prompt_section(user, "question").strip())
        memories = prompt_section(user, "memories").lower()
        known = answer is not None and all(
            part.strip().lower() in memories for part in answer.split(",")
        )
        return json.dumps({"answer": answer if known else DONT_KNOW})
    return json.dumps(schema_stub(schema)) if schema else "ok"


def gold_answers(episodes: Iterable[Any]) -> dict[str, str]:
    return {q.question: q.gold for episode in episodes for q in episode.questions}


class KeyedEndpoint(ScriptedOpenAIServer):
    """:func:`oracle_reply` over HTTP after ``latency_s`` x (0.5 to 1.5) fixed by the request; the
    first asking of one request in ``fault_every`` gets HTTP 500 (0: never). ``served`` counts
    requests by key."""

    def __init__(self, gold: dict[str, str], *, latency_s: float = 0.02, fault_every: int = 0):
        super().__init__([("respond", self._respond)])
        self.gold, self.latency_s, self.fault_every = gold, latency_s, fault_every
        self.served: Counter[bytes] = Counter()
        self._count_lock = threading.Lock()

    def lm(self, concurrency: int, cache_path: Path, **settings: Any) -> OptloopLM:
        """An LM on this endpoint (model ``oracle``) at ``concurrency``, its cache at
        ``cache_path``."""
        return OptloopLM(
            LMSettings.from_spec(
                "openai:oracle",
                base_url=self.base_url,
                concurrency=concurrency,
                cache_path=cache_path,
                **settings,
            )
        )

    def forget(self) -> None:
        """Ask again as never asked: the next run on this endpoint (same URL, so the same cache
        keys) gets the same faults."""
        with self._count_lock:
            self.served.clear()

    def _respond(self, body: dict[str, Any]) -> tuple[str, Any]:
        key = _digest([body.get("messages"), body.get("response_format")])
        with self._count_lock:
            asked = self.served[key]
            self.served[key] += 1
        time.sleep(self.latency_s * (0.5 + key[0] / 255))
        if self.fault_every and asked == 0 and key[1] % self.fault_every == 0:
            return "status", 500
        return "ok", oracle_reply(
            body.get("messages") or [], body.get("response_format"), self.gold
        )


class OracleLlama:
    """What ``llama_cpp.Llama.create_chat_completion`` returns, answered
    by :func:`oracle_reply`."""

    def __init__(self, gold: dict[str, str]):
        self.gold = gold
        self.calls = 0

    def create_chat_completion(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        content = oracle_reply(kwargs["messages"], kwargs.get("response_format"), self.gold)
        return {
            "id": "oracle",
            "object": "chat.completion",
            "created": 0,
            "model": "oracle.gguf",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                }
            ],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
        }


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
CLOCK = {"seconds", "created_at", "updated_at"}


def without_clock(graph: dict[str, Any]) -> Any:
    """A graph's JSON less what the clock and chance decide, so two runs can be compared: timings
    and the stores' own creation times dropped, and the uuid4s mem0 and graphiti name memories with
    numbered in order of appearance (two runs at the same concurrency differ in these too)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in CLOCK}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    names: dict[str, str] = {}
    text = UUID.sub(
        lambda m: names.setdefault(m.group(0), f"uuid{len(names)}"), json.dumps(strip(graph))
    )
    return json.loads(text)
