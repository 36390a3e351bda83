"""What ``tiered`` puts in context: LTM facts by similarity, recent MTM summaries, the
conversation.

The ``search_recipe`` knob decides which facts and summaries may be searched at all:
``similarity`` (every one), ``category`` (only the category the question is routed to,
:func:`~systems.tiered.keys.category_of`) or ``category:<name>`` (only that category).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from systems.base import MemoryItem
from systems.tiered.keys import GENERAL, category_of
from systems.tiered.store import TieredStore

RECIPES: tuple[str, ...] = ("similarity", "category")


def allowed_categories(recipe: str, query: str) -> set[str] | None:
    """The categories a recipe lets a search for ``query`` see (``None``: every one)."""
    if recipe == "similarity":
        return None
    if recipe == "category":
        routed = category_of(query)
        return None if routed == GENERAL else {routed}
    return {recipe.partition(":")[2]}


def search(store: TieredStore, knobs: Mapping[str, Any], query: str, k: int) -> list[MemoryItem]:
    """The ``k`` live LTM facts most similar to ``query`` within the recipe's categories, at least
    ``threshold``."""
    allowed = allowed_categories(str(knobs["search_recipe"]), query)
    facts = [
        f
        for f in store.live_facts()
        if f.id in store.vectors and (allowed is None or f.category in allowed)
    ]
    if k <= 0 or not facts:
        return []
    query_vector = store.embedder.embed_one(query)
    scored = sorted(
        ((float(store.vectors[f.id] @ query_vector), f) for f in facts),
        key=lambda pair: (-pair[0], pair[1].id),
    )
    threshold = knobs["threshold"]
    return [
        fact.to_item(score) for score, fact in scored if threshold is None or score >= threshold
    ][:k]


def recent_summaries(store: TieredStore, knobs: Mapping[str, Any], query: str) -> list[MemoryItem]:
    """The ``mtm_summaries`` most recent conversation summaries the recipe allows, oldest first."""
    limit = int(knobs["mtm_summaries"])
    if limit <= 0:
        return []
    allowed = allowed_categories(str(knobs["search_recipe"]), query)
    kept = [s for s in store.summaries() if allowed is None or allowed & set(s.categories)]
    return [summary.to_item() for summary in kept[-limit:]]


def conversation(store: TieredStore, knobs: Mapping[str, Any]) -> list[MemoryItem]:
    """The last ``stm_turns`` turns of the current conversation."""
    limit = int(knobs["stm_turns"])
    return [turn.to_item() for turn in store.stm_turns()[-limit:]] if limit > 0 else []
