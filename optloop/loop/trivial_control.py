"""The trivial-instruction control: the figure a loop's prompt must beat besides the system's own.

A gain counts only when the prompt that carries it beats a trivial instruction as well as the
system's own prompt: a long library prompt can fail for reasons no rewrite of its words is needed
for (``docs/loop.md`` has the case). So every run evaluates a **control** beside the start program
and the best (``--no-control`` skips it, and the report then cannot say what the loop's writing
earned): :func:`control_candidate` is the start program with each prompt site of the first
targeting (:func:`optloop.loop.policy.control_sites`) given
:func:`optloop.loop.candidate.trivial_instruction`, knobs and demos as they are (no prompt site
blamed: no control); the controller evaluates it on dev before the trials and on test beside the
start program and the best; :class:`Comparison` (:func:`compare`) is what the report shows and
MLflow keeps: the three on dev and test with their 95% CIs, and the paired differences loop − own
prompt and loop − control on test, a CI that includes 0 being "no measurable change".

The promotion rule does not look at the control (:func:`optloop.loop.policy.promotion`); whether
the best beat it is recorded beside it (``LoopResult.beats_control``, the MLflow tag
``optloop.beats_control``). Pure functions and data: nothing here evaluates, logs or writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from optloop.loop.candidate import Candidate
from optloop.stats import Interval, bootstrap_mean, paired_bootstrap_delta

if TYPE_CHECKING:
    from optloop.loop.config import LoopConfig
    from optloop.loop.state import Checkpoint, LoopResult

NO_MEASURABLE_CHANGE = "no measurable change"


def control_candidate(start: Candidate, instructions: Mapping[str, str]) -> Candidate:
    """``start`` with each site of ``instructions`` given that instruction (its demos and the knobs
    as they are): the control, when ``instructions`` are the sites' trivial instructions."""
    sites = {
        name: state.model_copy(update={"instructions": instructions[name]})
        if name in instructions
        else state
        for name, state in start.sites.items()
    }
    return start.model_copy(
        update={
            "sites": sites,
            "origin": f"control: the trivial instruction at {', '.join(instructions)}",
            "parent": None,
        }
    )


def verdict(delta: Interval) -> str:
    """What a paired difference says: "measurably better" (its CI above 0), "measurably worse"
    (below 0), or "no measurable change" (its CI includes 0)."""
    if delta.low > 0:
        return "measurably better"
    if delta.high < 0:
        return "measurably worse"
    return NO_MEASURABLE_CHANGE


class Headroom(BaseModel):
    """Whether the blamed sites' prompt can matter: the start program against the control, and
    once the trials have written one, against a written instruction, on the same dev questions
    (:func:`headroom`).

    Blame names the operation that lost a fact; it does not say that any prompt for that operation
    would keep it. When the system's own instruction and the trivial one (and a written one) score
    the same within ``--min-gain`` on n questions, the failures blamed there are the model's, not
    the prompt's: a budget spent rewriting that site buys nothing, and the loop moves it to the
    other targets.
    """

    sites: list[str]
    n: int
    delta: Interval = Field(description="control - start program per dev question, paired")
    min_gain: float
    verdict: str = Field(description="'agree', 'differ' or 'unknown' (too few questions)")
    written: Interval | None = Field(
        None, description="the written instruction - start program per dev question, paired"
    )
    written_label: str = Field("", description="which trial wrote it")
    questions: str = Field("dev", description="the split(s) of the n questions")

    @property
    def model_bound(self) -> bool:
        return self.verdict == "agree"

    def line(self) -> str:
        where = ", ".join(self.sites)
        arms = "own and the trivial instruction"
        delta = f"control - own {self.delta}"
        if self.written is not None:
            arms = f"own, the trivial instruction and {self.written_label}"
            delta += f"; written - own {self.written}"
        if self.verdict == "agree":
            return (
                f"headroom: {where}: {arms} agree within \u00b1{self.min_gain:g} on {self.n} "
                f"{self.questions} questions ({delta}): the failures blamed here are the model's, "
                "not the prompt's; a larger model at that site or a knob would move them"
            )
        if self.verdict == "differ":
            return (
                f"headroom: {where}: {arms} differ on {self.n} {self.questions} questions "
                f"({delta}): the prompt there matters"
            )
        return (
            f"headroom: {where}: {self.n} {self.questions} questions cannot tell whether the "
            f"prompt there matters by \u00b1{self.min_gain:g} ({delta})"
        )


def too_few_to_agree(n: int, min_gain: float) -> bool:
    """Whether ``n`` questions are too few to show two programs agree within ``min_gain``
    (:func:`headroom`'s rule of three: fewer than ``3 / min_gain``)."""
    return n * min_gain < 3


def wider_can_agree(train: int, dev: int, min_gain: float) -> bool:
    """Whether the headroom is worth checking on train and dev when dev alone cannot tell: the two
    together are enough questions to show agreement (:func:`too_few_to_agree`), and train has
    some."""
    return train > 0 and not too_few_to_agree(train + dev, min_gain)


def widens(ckpt: Checkpoint, config: LoopConfig) -> bool:
    """Whether the headroom check of the run at ``ckpt`` evaluates the control on train too:
    train and dev together have questions enough to show agreement (:func:`wider_can_agree`),
    the control is not the start program, and dev alone cannot tell (:func:`headroom`'s verdict
    on dev, at ``config``'s ``--min-gain`` and seed, is ``unknown``). Before the control's dev
    evaluation, whether it may: dev has too few questions to show agreement (it may still tell a
    difference alone)."""
    own_train, own_dev, control_dev = ckpt.baseline_train, ckpt.baseline_dev, ckpt.control_dev
    min_gain, seed = config.min_gain, config.seed
    if own_train is None or own_dev is None:
        return False
    if not wider_can_agree(own_train.n, own_dev.n, min_gain):
        return False
    if control_dev is None:
        return too_few_to_agree(own_dev.n, min_gain)
    if control_dev.candidate == own_dev.candidate or control_dev.n != own_dev.n:
        return False
    own = [o.passed for o in own_dev.outcomes]
    theirs = [o.passed for o in control_dev.outcomes]
    return headroom([], own, theirs, min_gain=min_gain, seed=seed).verdict == "unknown"


def headroom(
    sites: list[str],
    own: Sequence[bool],
    control: Sequence[bool],
    *,
    min_gain: float,
    seed: int,
    written: Sequence[bool] | None = None,
    written_label: str = "a written instruction",
    questions: str = "dev",
) -> Headroom:
    """The :class:`Headroom` of ``sites`` from the start program's, the control's and, when given,
    a written instruction's per-question dev results (the same questions, in the same order):
    ``differ`` when a paired CI against the start program excludes 0; ``agree`` when each lies
    within ±``min_gain`` on at least ``3 / min_gain`` questions (with no disagreement seen, the
    rule of three bounds the share of questions they differ on by ``3 / n`` at 95%: fewer
    questions cannot show agreement to ``min_gain``); else ``unknown``."""
    base = [float(x) for x in own]
    delta = paired_bootstrap_delta(base, [float(x) for x in control], seed=seed)
    deltas = [delta]
    if written is not None:
        deltas.append(paired_bootstrap_delta(base, [float(x) for x in written], seed=seed))
    if any(d.low > 0 or d.high < 0 for d in deltas):
        found = "differ"
    elif all(-min_gain <= d.low and d.high <= min_gain for d in deltas) and not (
        too_few_to_agree(len(own), min_gain)
    ):
        found = "agree"
    else:
        found = "unknown"
    return Headroom(
        sites=sites,
        n=len(own),
        delta=delta,
        min_gain=min_gain,
        verdict=found,
        written=deltas[1] if written is not None else None,
        written_label=written_label if written is not None else "",
        questions=questions,
    )


def dev_interval(accuracy: float, n: int, seed: int) -> Interval:
    """A dev accuracy with its bootstrap CI, from its count alone (the finisher of a shared run
    knows the other workers' trials by their accuracy): ``round(accuracy * n)`` passes of ``n``."""
    passes = round(accuracy * n)
    return bootstrap_mean([1.0] * passes + [0.0] * (n - passes), seed=seed)


class Row(BaseModel):
    """One program of the comparison: its dev and test accuracy (``None``: not evaluated)."""

    program: str = Field(description="own, control or best")
    label: str = Field(description="what the report calls it")
    dev: Interval | None = None
    test: Interval | None = None


class Difference(BaseModel):
    """The loop's best less another program: the point difference on dev (where the best was
    chosen, so biased upwards) and the paired bootstrap CI on test."""

    against: str = Field(description="own or control")
    label: str
    dev: float
    test: Interval
    verdict: str = Field(description="verdict(test)")


class Comparison(BaseModel):
    """The report's three rows and two differences (see the module docstring)."""

    rows: list[Row]
    differences: list[Difference]
    control_sites: list[str] = Field(
        default_factory=list, description="the sites the control rewrote (empty: no control)"
    )
    control_note: str = Field("", description="why there is no control ('': there is one)")
    beats_control: bool | None = Field(
        None, description="the best measurably beats the control on test (None: no control)"
    )

    def row(self, program: str) -> Row:
        return next(r for r in self.rows if r.program == program)


def compare(
    *,
    seed: int,
    n_dev: int,
    own_dev: float,
    best_dev: float,
    control_dev: float | None,
    own_test: Interval,
    best_test: Interval,
    control_test: Interval | None,
    best_minus_own: Interval,
    best_minus_control: Interval | None,
    best_trial: int,
    control_sites: list[str],
    control_note: str,
    started: bool = False,
) -> Comparison:
    """The comparison of a finished run's figures: dev accuracies (CIs from their counts, seeded
    with ``seed``), test intervals and paired differences as the controller measured them;
    ``started``: the run started from ``--start`` instructions, not the system's own."""
    own = "start prompt (--start)" if started else "system's own prompt"
    best = (
        f"loop's best (trial {best_trial})"
        if best_trial
        else f"loop's best (the {'start' if started else 'own'} prompt: no trial beat it)"
    )
    has_control = control_dev is not None and control_test is not None
    rows = [
        Row(program="own", label=own, dev=dev_interval(own_dev, n_dev, seed), test=own_test),
        Row(
            program="control",
            label=(
                f"trivial instruction (control: {', '.join(control_sites)})"
                if has_control
                else "trivial instruction (control)"
            ),
            dev=None if control_dev is None else dev_interval(control_dev, n_dev, seed),
            test=control_test,
        ),
        Row(program="best", label=best, dev=dev_interval(best_dev, n_dev, seed), test=best_test),
    ]
    differences = [
        Difference(
            against="own",
            label=f"loop \u2212 {'start' if started else 'own'} prompt",
            dev=best_dev - own_dev,
            test=best_minus_own,
            verdict=verdict(best_minus_own),
        )
    ]
    if has_control and control_dev is not None and best_minus_control is not None:
        differences.append(
            Difference(
                against="control",
                label="loop \u2212 control",
                dev=best_dev - control_dev,
                test=best_minus_control,
                verdict=verdict(best_minus_control),
            )
        )
    return Comparison(
        rows=rows,
        differences=differences,
        control_sites=list(control_sites) if has_control else [],
        control_note=control_note,
        beats_control=None if best_minus_control is None else best_minus_control.low > 0,
    )


def comparison_of(result: LoopResult) -> Comparison:
    """The comparison of a run's result (:func:`compare` on its figures)."""
    return compare(
        seed=result.config.seed,
        n_dev=result.n_dev,
        own_dev=result.baseline_dev,
        best_dev=result.best_dev,
        control_dev=result.control_dev,
        own_test=result.test_before_ci,
        best_test=result.test_after_ci,
        control_test=result.test_control_ci,
        best_minus_own=result.delta_test_ci,
        best_minus_control=result.delta_control_ci,
        best_trial=result.best_trial,
        control_sites=result.control_sites,
        control_note=result.control_note,
        started=bool(result.config.start),
    )


def control_line(comparison: Comparison) -> str | None:
    """The note's sentence when the loop's prompt does not measurably beat the control (``None``
    when it does, or when there is no control)."""
    if comparison.beats_control is not False:
        return None
    diff = next(d for d in comparison.differences if d.against == "control")
    return (
        f"the loop's prompt does not measurably beat the trivial instruction: loop \u2212 control "
        f"on test {diff.test} ({diff.verdict}), so this run shows no gain from the loop's writing "
        "beyond what a trivial instruction gets"
    )


__all__ = [
    "Comparison",
    "Difference",
    "Headroom",
    "NO_MEASURABLE_CHANGE",
    "Row",
    "compare",
    "comparison_of",
    "control_candidate",
    "control_line",
    "dev_interval",
    "headroom",
    "too_few_to_agree",
    "wider_can_agree",
    "widens",
    "verdict",
]
