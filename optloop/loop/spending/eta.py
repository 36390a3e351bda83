"""How long a run has left: the ETA printed before the first trial and on every trial line.

Before any trial of this process is timed, the ETA is the projection of the rest of the run by
``--estimate``'s model (:func:`optloop.loop.spending.estimate.estimate`, fed by the measured
baseline): the trials' and the optimizer's time per trial, times the trials left, plus the held-out
test. Once trials have been timed here, their measured mean (wall time from the proposal to the
last record, the optimizer's own work and a batch's shared time included) replaces the projected
time per trial; the held-out test (the control's test evaluation with it) stays projected, since it
has not run yet; the control's dev evaluation is done before the first trial, like the baseline. A
baseline served from the LM cache is timed by the seconds the cache kept for each response (what
computing it took). When even those are unknown (a cache written without them), the held-out
test is taken to take two timed trials (it evaluates the test split twice, before and after, and
a trial's time holds one evaluation of dev, about as large, plus the optimizer's work), three
with the control: the ETA is unknown only until the first trial is timed.

:class:`TrialLine` is what the controller reports after each trial; its :meth:`TrialLine.text` is
one plain line (no terminal needed): ``trial 3/50 dev 0.550 (best 0.650) 41 s, ETA 18 min``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from optloop.loop.spending.estimate import CONTROL_PART, CONTROL_TRAIN_PART, HELD_OUT_PART
from optloop.progress import duration, trial_line

if TYPE_CHECKING:
    from optloop.loop.spending.estimate import Estimate


def projected(seconds: float) -> str:
    """``37.5 h``, ``25 min``, ``12 s``: a projected time (an ETA, a part of an estimate), in hours
    from one hour and in minutes from one minute."""
    return duration(seconds, minutes_from=60, hours_from=3600)


class TrialLine(BaseModel):
    """One evaluated trial, as a progress line reports it."""

    trial: int
    budget: int
    accuracy: float = Field(description="its dev accuracy")
    best: float = Field(description="the run's best dev accuracy so far, the baseline's included")
    seconds: float = Field(description="wall time it took (a batch's time shared by its trials)")
    eta_s: float | None = Field(
        None, description="seconds the run has left, held-out test included (None: unknown)"
    )
    stopped: str | None = Field(
        None, description="why a race stopped its dev evaluation early (None: it answered all)"
    )

    def text(self) -> str:
        return trial_line(
            self.trial,
            self.budget,
            self.accuracy,
            self.best,
            self.seconds,
            self.eta_s,
            stopped=self.stopped,
        )


class Eta:
    """The seconds a run of ``budget`` trials has left (see the module docstring): ``trial_s``, the
    projected seconds of one trial (its evaluation and the optimizer's share); ``test_s``, the
    held-out test's (``None``: unknown, then so is the ETA until a trial is timed); ``held_out``,
    the held-out test's evaluations (3 with the control)."""

    def __init__(
        self, budget: int, *, trial_s: float | None, test_s: float | None, held_out: int = 2
    ):
        self.budget = budget
        self.trial_s = trial_s
        self.test_s = test_s
        self.held_out = held_out
        self.timed: list[float] = []

    @classmethod
    def of(cls, figures: Estimate, budget: int) -> Eta:
        """From an estimate of the whole run: its trials' and optimizer's parts over ``budget``,
        and its held-out part (a part of unknown time leaves its share unknown)."""
        per_trial: float | None = 0.0
        test_s: float | None = None
        held_out = 2
        for part in figures.parts:
            # done by the time trials begin: the baseline, the control's dev (and train) evaluation
            if part.part.startswith(("baseline", CONTROL_PART, CONTROL_TRAIN_PART)):
                continue
            if part.part == HELD_OUT_PART:
                test_s = None if part.hours is None else part.hours * 3600
                held_out = part.evaluations
            elif per_trial is not None:
                per_trial = (
                    None if part.hours is None else per_trial + part.hours * 3600 / max(budget, 1)
                )
        return cls(budget, trial_s=per_trial, test_s=test_s, held_out=held_out)

    def trial_took(self, seconds: float) -> None:
        """A trial of this process took ``seconds`` (wall time)."""
        self.timed.append(seconds)

    def seconds_left(self, done: int) -> float | None:
        """Seconds to the end of the run once ``done`` trials are evaluated (``None``: unknown)."""
        per_trial = sum(self.timed) / len(self.timed) if self.timed else self.trial_s
        test_s = self.test_s
        if test_s is None and self.timed:
            test_s = self.held_out * sum(self.timed) / len(self.timed)
        if per_trial is None or test_s is None:
            return None
        return max(self.budget - done, 0) * per_trial + test_s

    def text(self, done: int) -> str:
        """``18 min``, or ``unknown``."""
        left = self.seconds_left(done)
        return "unknown" if left is None else projected(left)


__all__ = ["Eta", "TrialLine", "projected"]
