"""optloop's own prompt sites, shared by every system: the answer and the query rewrite.

These are not library prompts, so their text is ours. ``answer`` is the LLM
that uses the retrieved memories; ``retrieve.query`` (optional) rewrites the
question before retrieval, so a retrieval failure has a prompt to fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import dspy


class Memory(Protocol):
    """What :func:`render_memories` reads of a memory (``systems.base.MemoryItem`` is one;
    signatures/ does not import systems/)."""

    @property
    def text(self) -> str: ...

    @property
    def metadata(self) -> Mapping[str, Any]: ...


class AnswerFromMemories(dspy.Signature):
    """Answer the user's question using only the memories below. Give the shortest answer that is
    correct: a name, a number, a date, yes or no, or an option letter when options are given. If the
    memories do not contain the answer, reply "I don't know"."""  # noqa: E501

    memories: str = dspy.InputField(desc="what the memory system retrieved, one memory per line")
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class RewriteQuery(dspy.Signature):
    """Rewrite the user's question into a short search query that would find the stored memory
    holding its answer: keep names, places, dates and the attribute asked about."""

    question: str = dspy.InputField()
    query: str = dspy.OutputField()


def render_memories(memories: Sequence[Memory]) -> str:
    """One memory per line, with its date when the system kept one."""
    if not memories:
        return "(no memories)"
    lines = []
    for memory in memories:
        when = memory.metadata.get("timestamp") or memory.metadata.get("created_at")
        lines.append(f"- [{when}] {memory.text}" if when else f"- {memory.text}")
    return "\n".join(lines)
