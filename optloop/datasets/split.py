"""Deterministic train / dev / test splits by episode.

Questions of one episode share a memory store, so they never straddle splits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from optloop.datasets._model import Dataset


def split_counts(n: int, fractions: Sequence[float]) -> list[int]:
    """Largest-remainder allocation of n items; every positive fraction gets one when n allows."""
    total = sum(fractions)
    exact = [n * f / total for f in fractions]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(fractions)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    for i, f in enumerate(fractions):
        if f > 0 and counts[i] == 0:
            donor = max(range(len(counts)), key=lambda j: (counts[j], -j))
            if counts[donor] > 1:
                counts[donor] -= 1
                counts[i] += 1
    return counts


def split_episodes(
    dataset: Dataset, fractions: Sequence[float] = (0.5, 0.25, 0.25), seed: int = 0
) -> tuple[Dataset, Dataset, Dataset]:
    """Split ``dataset`` into (train, dev, test) datasets of whole episodes.

    ``fractions`` are three non-negative weights (normalized if they do not sum to 1).
    The assignment depends only on the episode ids and ``seed`` (not on input order);
    each split keeps the dataset's episode order. Every positive fraction gets at least
    one episode when there are enough episodes. Names get ``[train]``/``[dev]``/``[test]``.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ValueError(
            "fractions must be three non-negative numbers with a positive sum, got "
            f"{tuple(fractions)}"
        )
    ids = sorted(e.id for e in dataset.episodes)
    random.Random(seed).shuffle(ids)
    counts = split_counts(len(ids), fractions)
    assignment: dict[str, int] = {}
    start = 0
    for part, count in enumerate(counts):
        for episode_id in ids[start : start + count]:
            assignment[episode_id] = part
        start += count
    names = ("train", "dev", "test")
    return tuple(  # type: ignore[return-value]
        Dataset(
            name=f"{dataset.name}[{names[part]}]",
            uri=dataset.uri,
            episodes=[e for e in dataset.episodes if assignment[e.id] == part],
        )
        for part in range(3)
    )
