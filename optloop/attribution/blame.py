"""Blame: attributions summed per prompt site and per knob, with shares."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel

from optloop.attribution.taxonomy import Attribution, Target, is_knob, is_prompt_site


class BlameEntry(BaseModel):
    target: str
    failures: int
    share: float
    types: dict[str, int]
    is_knob: bool
    is_prompt: bool

    @property
    def blamed(self) -> Target:
        """``target`` as a :class:`~optloop.attribution.taxonomy.Target`."""
        return Target.parse(self.target)


def blame(attributions: Iterable[Attribution]) -> list[BlameEntry]:
    """Targets ordered by how many failures they decided (unattributed ones are left out)."""
    counts: Counter[str] = Counter()
    types: dict[str, Counter[str]] = {}
    total = 0
    for a in attributions:
        if a.target is None:
            continue
        total += 1
        counts[a.target] += 1
        types.setdefault(a.target, Counter())[a.error_type.value] += 1
    return [BlameEntry(target=t, failures=n, share=n / total, types=dict(types[t]), is_knob=is_knob(t),
                        is_prompt=is_prompt_site(t))
            for t, n in counts.most_common()]

