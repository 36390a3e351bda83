"""The extraction stage's answer read: the objects the model wrote, as facts and refused items.

``tiered.extract`` answers a list of ``{key, value, category}`` objects
(:class:`signatures.tiered.ExtractedFact`), decoded under that schema, so the answer
always parses; what the model cannot be relied on for is done here, in code:

- the key is normalized (:func:`~systems.tiered.keys.slug`: lower case, underscores, no
  leading ``my_``) and a known key with the same words is reused
  (:func:`~systems.tiered.keys.known_key`), so a new value supersedes the old one;
- an object with no usable key or value is refused with the reason: an empty key, the
  schema's own word ("key"), a sentence for a key, ``forget`` (forgetting is the
  deterministic rule's job), an empty or placeholder value;
- several objects for one key in one answer are a list, not an update: one value ``a, b``;
- an item that is not an object (text where an object belongs) is refused.

Each :class:`Fact` keeps the objects it came from (``written``), so the trace shows what
the model wrote next to what was stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, Field

from systems.tiered.keys import file_under, known_key, label_of, normalize_value, slug

_PLACEHOLDERS = frozenset(
    {
        "",
        "value",
        "values",
        "unknown",
        "none",
        "n/a",
        "na",
        "null",
        "nil",
        "?",
        "-",
        "...",
        "tbd",
        "not mentioned",
        "not given",
    }
)
_TEMPLATE_KEYS = frozenset({"key", "keys", "attribute", "fact", "name_of_attribute", "value"})
MAX_KEY_WORDS = 6


class Fact(BaseModel):
    """One fact to store: its key as stored, its value (several values of a key merged), its
    category."""

    key: str
    label: str
    value: str
    category: str
    # the objects the model wrote for it
    written: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def written_keys(self) -> list[str]:
        return list(dict.fromkeys(str(item.get("key", "")) for item in self.written))


class Refused(BaseModel):
    """An item of the answer that stored nothing, and why."""

    item: Any
    reason: str


class ParsedExtraction(BaseModel):
    facts: list[Fact] = Field(default_factory=list)
    refused: list[Refused] = Field(default_factory=list)


def as_object(item: Any) -> dict[str, Any] | None:
    """An answer item as a plain object (``None`` when it is not one)."""
    if isinstance(item, BaseModel):
        return item.model_dump(mode="json")
    if isinstance(item, dict):
        return dict(item)
    return None


def _read(item: Any, known: Sequence[str]) -> Fact | Refused:
    written = as_object(item)
    if written is None:
        return Refused(item=str(item), reason="not a {key, value} object")
    raw_key, value = (
        str(written.get("key") or "").strip(),
        " ".join(str(written.get("value") or "").split()),
    )
    value = value.strip().rstrip(".").strip()
    key = slug(raw_key)
    if not key:
        return Refused(item=written, reason="empty key")
    if key == "forget":
        return Refused(
            item=written,
            reason="a 'forget' fact is not obeyed: forgetting is the deterministic rule's job",
        )
    if key in _TEMPLATE_KEYS:
        return Refused(item=written, reason="the key is the schema's placeholder")
    if len(key.split("_")) > MAX_KEY_WORDS:
        return Refused(item=written, reason="the key is a sentence, not an attribute name")
    if normalize_value(value) in _PLACEHOLDERS:
        return Refused(item=written, reason="no value (empty or a placeholder)")
    key = known_key(key, known)
    category = file_under(key, written.get("category"))
    return Fact(key=key, label=label_of(key), value=value, category=category, written=[written])


def parse_facts(items: Iterable[Any] | None, known_keys: Sequence[str] = ()) -> ParsedExtraction:
    """The extraction stage's answer as facts to store and refused items (see the module)."""
    parsed = ParsedExtraction()
    by_key: dict[str, Fact] = {}
    for item in items or []:
        result = _read(item, known_keys)
        if isinstance(result, Refused):
            parsed.refused.append(result)
        elif result.key in by_key:
            held = by_key[result.key]
            held.written += result.written
            if normalize_value(result.value) not in {
                normalize_value(v) for v in held.value.split(", ")
            }:
                held.value = f"{held.value}, {result.value}"
        else:
            by_key[result.key] = result
            parsed.facts.append(result)
    return parsed
