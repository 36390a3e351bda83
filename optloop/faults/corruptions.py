"""The corruptions an :class:`~optloop.faults.model.OperationFault` plants: what a site's output
(or input) becomes under the fault ("extraction keeps only the first fact", "the answer ignores the
memories"), and what a store does to its memories after each session. Each is a plain function, so
a test can check it on its own."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import dspy
from pydantic import BaseModel

from optloop.text import words

if TYPE_CHECKING:
    from systems.base import MemorySystem

_NUMBERISH = re.compile(
    r"\d|\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b|\b(monday|tuesday|wednesday|"
    r"thursday|friday|saturday|sunday|yesterday|today|tomorrow)\b",
    re.I,
)
UNRELATED_QUERY = "weather forecast for the weekend"


def _item_text(item: Any) -> str:
    from optloop.tracing.recorder import _text

    return _text(item)


def _normalize(text: str) -> str:
    return " ".join(words(text))


def _already_in_file(item: Any, inputs: dict[str, Any]) -> bool:
    return bool(_normalize(_item_text(item))) and _normalize(_item_text(item)) in _normalize(
        str(inputs.get("memory_file", ""))
    )


def _blur(text: str) -> str:
    """The same sentence with its specifics (names, numbers, places) replaced: an overwrite."""
    # the sentence's own words, case and spelling kept (not optloop.text.words)
    parts = text.split()
    out = [
        ("something" if i > 0 and (w[:1].isupper() or any(c.isdigit() for c in w)) else w)
        for i, w in enumerate(parts)
    ]
    if out == parts and parts:
        out[-1] = "something"
    return " ".join(out)


def drop_numbers(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return [i for i in items if not _NUMBERISH.search(_item_text(i))]


def first_only(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return items[:1]


def drop_all(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return []


def keys_only(items: list[Any], _: dict[str, Any]) -> list[Any]:
    """Facts cut to their keys: a ``{key, value}`` object keeps its key with an empty value, a
    ``Key|Value`` line only its key; nothing the extraction wrote carries a value."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, BaseModel) and "value" in type(item).model_fields:
            out.append(item.model_copy(update={"value": ""}))
        elif isinstance(item, dict) and "value" in item:
            out.append({**item, "value": ""})
        else:
            out.append(_item_text(item).split("|", 1)[0].strip())
    return out


def forget_old(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    return [i for i in items if not _already_in_file(i, inputs)]


def blur_old(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    return [(_blur(i) if isinstance(i, str) and _already_in_file(i, inputs) else i) for i in items]


def _own_text(item: Any) -> str:
    """The text an extracted item carries: the string, or its ``text`` field."""
    if isinstance(item, str):
        return item
    if isinstance(item, BaseModel) and "text" in type(item).model_fields:
        return str(item.text)  # type: ignore[attr-defined]
    if isinstance(item, dict) and "text" in item:
        return str(item["text"])
    return _item_text(item)


def _with_text(item: Any, text: str) -> Any:
    """``item`` with its text replaced (a string, or a model or dict with a ``text`` field)."""
    if isinstance(item, str):
        return text
    if isinstance(item, BaseModel) and "text" in type(item).model_fields:
        return item.model_copy(update={"text": text})
    if isinstance(item, dict) and "text" in item:
        return {**item, "text": text}
    return item


def first_words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


def truncate_facts(items: list[Any], _: dict[str, Any]) -> list[Any]:
    """Every extracted fact kept, but cut to its first four words."""
    return [_with_text(i, first_words(_own_text(i), 4)) for i in items]


def truncate_new(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    """The facts already in the file kept as they are; every new fact cut to its first four
    words."""
    return [
        i if _already_in_file(i, inputs) else _with_text(i, first_words(_own_text(i), 4))
        for i in items
    ]


def compress_old(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    """The facts already in the file collapsed into one summary line (their first twelve words);
    new facts kept."""
    old = [i for i in items if _already_in_file(i, inputs)]
    new = [i for i in items if not _already_in_file(i, inputs)]
    if not old:
        return new
    return [first_words("; ".join(_own_text(i) for i in old), 12), *new]


def shift_numbers(text: str) -> str:
    """Every number one higher: ``3`` becomes ``4``, ``2023`` becomes ``2024``, ``10:30`` becomes
    ``11:31``."""
    return re.sub(r"\d+", lambda m: str(int(m.group()) + 1), text)


def strip_specifics(text: str) -> str:
    """``text`` without its names, numbers and dates (capitalized words after the first, digits,
    months, days)."""
    words = text.split()
    kept = [
        w
        for i, w in enumerate(words)
        if not ((i > 0 and w[:1].isupper()) or any(c.isdigit() for c in w) or _NUMBERISH.search(w))
    ]
    return " ".join(kept)


def query_without_specifics(prediction: dspy.Prediction, inputs: dict[str, Any]) -> None:
    prediction["query"] = strip_specifics(str(inputs.get("question", "")))


def echo_question(prediction: dspy.Prediction, inputs: dict[str, Any]) -> None:
    prediction["answer"] = str(inputs.get("question", ""))


def first_memory_only(inputs: dict[str, Any]) -> dict[str, Any]:
    lines = str(inputs.get("memories", "")).splitlines()
    return {**inputs, "memories": lines[0] if lines else "(no memories)"}


def delete_old(system: MemorySystem, before: set[str]) -> None:
    """The store removes every unit that existed before this session."""
    for memory_id in sorted(before):
        system.delete_memory(memory_id)


def overwrite_old(system: MemorySystem, before: set[str]) -> None:
    """The store rewrites every unit that existed before this session, its specifics blurred."""
    for item in system.all_memories():
        if item.id in before:
            system.update_memory(item.id, _blur(item.text.split(": ", 1)[-1]))


def _content(item: Any) -> str:
    """What ``update_memory`` takes for ``item``: a raw turn's content (its ``speaker: `` shown in
    front dropped)."""
    text = str(item.text)
    return text.split(": ", 1)[-1] if (item.metadata or {}).get("kind") == "turn" else text


def lose_alternate_writes(system: MemorySystem, before: set[str]) -> None:
    """The store acknowledges every write of this session but persists only every other one (2nd,
    4th, ... lost)."""
    new = [m.id for m in system.all_memories() if m.id not in before]
    for memory_id in new[1::2]:
        system.delete_memory(memory_id)


def shift_old_numbers(system: MemorySystem, before: set[str]) -> None:
    """The store rewrites every unit that existed before this session with each of its numbers one
    higher."""
    for item in system.all_memories():
        if item.id in before:
            shifted = shift_numbers(_content(item))
            if shifted != _content(item):
                system.update_memory(item.id, shifted)
