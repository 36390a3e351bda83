"""Blame: attributions summed per prompt site and per knob, ranked for the optimizer.

Counting failures alone ranks upstream stages too high. The decisive error of a failure is the
*first* stage that went wrong in data-flow order (extract → keep → retrieve → answer), so a
question whose evidence was never stored can never show a fault of the answer site, even when
that site is broken too: upstream failures mask downstream ones. A system whose ingestion drops
half the facts and whose answer prompt was broken would have its failures split about evenly
between the two, and a ranking by count would name whichever happened to be larger.

So :func:`blame` also gives each target its **failure rate given a correct input**: the failures
it decided, over the questions that reached its stage intact (the passes, the failures decided
at a later stage, and its own). That is the per-stage conditional error rate of pipeline error
analysis (retrieval recall, then answer accuracy given retrieval), computed from the same
decisive attributions. With ``passed`` given, targets rank by that rate (ties: by count);
without it, by count alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, Field

from optloop.attribution.taxonomy import Attribution, ErrorType, Target, is_knob, is_prompt_site

# Data-flow order of the error types: a failure decided at a later stage got through every earlier
# one.
STAGE: dict[str, int] = {
    ErrorType.EXTRACTION.value: 0,
    ErrorType.UPDATE.value: 1,
    ErrorType.DELETION.value: 1,
    ErrorType.RETRIEVAL.value: 2,
    ErrorType.CONTAMINATION.value: 2,
    ErrorType.RESPONSE.value: 3,
}


class BlameEntry(BaseModel):
    target: str
    failures: int
    share: float = Field(description="of the attributed failures, the share this target decided")
    types: dict[str, int]
    is_knob: bool
    is_prompt: bool
    reached: int | None = Field(
        None,
        description="questions that reached this target's stage intact "
        "(None when the passes were not given)",
    )
    rate: float | None = Field(
        None, description="failures / reached: the failure rate given a correct input"
    )

    @property
    def blamed(self) -> Target:
        """``target`` as a :class:`~optloop.attribution.taxonomy.Target`."""
        return Target.parse(self.target)


def blame(attributions: Iterable[Attribution], *, passed: int | None = None) -> list[BlameEntry]:
    """Targets ranked for the optimizer, unattributed failures left out (see the module docstring).

    ``passed``: how many questions passed in the evaluations the attributions come from. Given,
    each entry carries ``reached`` and ``rate`` and the ranking is by rate, then by count;
    ``None``: by count.
    """
    counts: Counter[str] = Counter()
    types: dict[str, Counter[str]] = {}
    by_stage: Counter[int] = Counter()
    total = 0
    for a in attributions:
        if a.target is None:
            continue
        total += 1
        counts[a.target] += 1
        types.setdefault(a.target, Counter())[a.error_type.value] += 1
        if a.error_type.value in STAGE:
            by_stage[STAGE[a.error_type.value]] += 1
    entries = []
    for target, n in counts.most_common():
        reached = rate = None
        if passed is not None:
            stage = STAGE.get(types[target].most_common(1)[0][0], max(STAGE.values()))
            reached = passed + n + sum(k for s, k in by_stage.items() if s > stage)
            rate = n / reached
        entries.append(
            BlameEntry(
                target=target,
                failures=n,
                share=n / total,
                types=dict(types[target]),
                is_knob=is_knob(target),
                is_prompt=is_prompt_site(target),
                reached=reached,
                rate=rate,
            )
        )
    if passed is not None:
        # stable: count order breaks full ties
        entries.sort(key=lambda e: (-(e.rate or 0.0), -e.failures))
    return entries
