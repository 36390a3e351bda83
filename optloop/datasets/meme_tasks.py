"""MEME's six tasks, shared by both loaders (:mod:`optloop.datasets.meme` and
:mod:`optloop.datasets.meme_published`): each task's scorer, the tasks answered by abstaining,
and the names a record may give a task."""

from __future__ import annotations

import re

from optloop.datasets._model import ScorerName

TASK_SCORERS: dict[str, ScorerName] = {
    "exact_recall": "contains",
    "aggregation": "contains_all",
    "tracking": "contains",
    "deletion": "abstain",
    "cascade": "contains",
    "absence": "abstain",
}
ABSTAIN_TASKS = frozenset({"deletion", "absence"})
_ALIASES = {
    "recall": "exact_recall",
    "exact": "exact_recall",
    "update": "tracking",
    "delete": "deletion",
    "absent": "absence",
}
# The published layout's ``task_type`` values (its own names, without the parenthesised variant).
_PUBLISHED = {
    "exact": "exact_recall",
    "multi-hop": "aggregation",
    "multiple-update": "tracking",
    "deletion": "deletion",
    "cascade-d": "cascade",
    "cascade-u": "absence",
}
MEME_TASKS = tuple(TASK_SCORERS)


def task_name(raw: str) -> str | None:
    """The canonical MEME task for ``raw`` ("Exact recall" -> "exact_recall"), or None."""
    name = re.sub(r"[\s\-]+", "_", raw.strip().lower())
    name = _ALIASES.get(name, name)
    return name if name in TASK_SCORERS else None


def published_task(raw: str) -> str | None:
    """MEME's task for a published ``task_type`` ("Cascade-D (1-hop)" -> "cascade"), or None."""
    base = re.sub(r"\(.*?\)", " ", raw).strip().lower()
    return _PUBLISHED.get(re.sub(r"\s+", "-", base))
