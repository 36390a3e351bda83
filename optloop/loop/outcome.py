"""What a finished run reports, made from the evaluations the worker that finishes it holds.

The controller (:meth:`~optloop.loop.controller.Controller._finish`) evaluates the start program,
the run's best (:func:`best_of`) and the control on test, then hands what it has to
:meth:`Outcome.of`, which makes the figures: the dev curve, the held-out intervals (each
difference paired by question), the promotion and the comparison with the control. From an
:class:`Outcome` come the sink's :class:`~optloop.loop.interfaces.Summary`, the run's note and
its :class:`~optloop.loop.state.LoopResult`. Nothing here evaluates, records or registers: the
controller does, in its order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from optloop.loop.candidate import Candidate
from optloop.loop.evaluate import Evaluation
from optloop.loop.interfaces import Summary, Targeting, TrialRecord
from optloop.loop.policy import held_out_intervals, power_line, promotion, small_split_warning
from optloop.loop.racing import RaceSpend
from optloop.loop.state import Checkpoint, Cost, LoopConfig, LoopResult, Tried
from optloop.loop.trivial_control import Comparison, compare, control_line
from optloop.stats import Interval


def best_of(
    base: Candidate, baseline_accuracy: float, records: Sequence[TrialRecord]
) -> tuple[Candidate, int]:
    """The run's best candidate and its trial number: the highest dev accuracy of ``records``
    evaluated on the whole split (a race stopped none of them), the earliest of a tie, when it
    beats the baseline's; else the start program ``base`` itself, trial 0."""
    best, best_trial, best_accuracy = base, 0, baseline_accuracy
    for r in records:
        if not r.stopped and r.accuracy > best_accuracy:
            best, best_trial, best_accuracy = r.candidate, r.trial, r.accuracy
    return best, best_trial


@dataclass(frozen=True)
class Outcome:
    """A finished run: the start program (``base``), its best and its control with the
    checkpoint that holds their evaluations, and the figures made of them (:meth:`of`)."""

    config: LoopConfig
    checkpoint: Checkpoint
    targeting: Targeting
    base: Candidate
    best: Candidate
    best_trial: int
    records: list[TrialRecord]
    control: Candidate | None
    control_test: Evaluation | None
    points: list[tuple[int, float]]  # (trial, dev accuracy): the baseline's, then each trial's
    best_curve: list[float]  # the best dev accuracy at each point
    test_before_ci: Interval
    test_after_ci: Interval
    delta_test_ci: Interval  # best - start program, paired by question
    test_control_ci: Interval | None
    delta_control_ci: Interval | None  # best - control, paired by question
    promoted: bool
    reason: str
    comparison: Comparison

    @classmethod
    def of(
        cls,
        config: LoopConfig,
        checkpoint: Checkpoint,
        targeting: Targeting,
        base: Candidate,
        best: Candidate,
        best_trial: int,
        records: list[TrialRecord],
        control: Candidate | None,
        control_test: Evaluation | None,
    ) -> Outcome:
        """The figures of a run whose checkpoint holds the baseline and the held-out test of
        ``base`` and ``best`` (:func:`best_of`), and ``control_test`` when it has a control."""
        ckpt = checkpoint
        assert ckpt.baseline_dev is not None
        assert ckpt.test_before is not None and ckpt.test_after is not None
        before, after = ckpt.test_before, ckpt.test_after
        points = [(0, ckpt.baseline_dev.accuracy)] + [(r.trial, r.accuracy) for r in records]
        # A trial a race stopped never raises the best: its figure is on part of dev.
        ranked = [ckpt.baseline_dev.accuracy] + [
            -1.0 if r.stopped else r.accuracy for r in records
        ]
        best_curve = list(accumulate(ranked, max))
        before_ci, after_ci, delta_ci = held_out_intervals(before, after, seed=config.seed)
        control_ci: Interval | None = None
        control_delta_ci: Interval | None = None
        if control_test is not None:
            control_ci, _, control_delta_ci = held_out_intervals(
                control_test, after, seed=config.seed
            )
        promoted, reason = promotion(config.promote_if, best is not base, delta_ci)
        control_dev = ckpt.control_dev if control_test is not None else None
        comparison = compare(
            seed=config.seed,
            n_dev=ckpt.baseline_dev.n,
            own_dev=ckpt.baseline_dev.accuracy,
            best_dev=max(best_curve),
            control_dev=None if control_dev is None else control_dev.accuracy,
            own_test=before_ci,
            best_test=after_ci,
            control_test=control_ci,
            best_minus_own=delta_ci,
            best_minus_control=control_delta_ci,
            best_trial=best_trial,
            control_sites=targeting.control_sites,
            control_note=targeting.control_note,
            started=bool(config.start),
        )
        return cls(
            config=config,
            checkpoint=checkpoint,
            targeting=targeting,
            base=base,
            best=best,
            best_trial=best_trial,
            records=records,
            control=control,
            control_test=control_test,
            points=points,
            best_curve=best_curve,
            test_before_ci=before_ci,
            test_after_ci=after_ci,
            delta_test_ci=delta_ci,
            test_control_ci=control_ci,
            delta_control_ci=control_delta_ci,
            promoted=promoted,
            reason=reason,
            comparison=comparison,
        )

    @property
    def baseline_dev(self) -> Evaluation:
        assert self.checkpoint.baseline_dev is not None
        return self.checkpoint.baseline_dev

    @property
    def before(self) -> Evaluation:
        """The start program on test."""
        assert self.checkpoint.test_before is not None
        return self.checkpoint.test_before

    @property
    def after(self) -> Evaluation:
        """The run's best on test."""
        assert self.checkpoint.test_after is not None
        return self.checkpoint.test_after

    @property
    def control_dev(self) -> Evaluation | None:
        """The control on dev, when the run evaluated it on test as well."""
        return self.checkpoint.control_dev if self.control_test is not None else None

    @property
    def changed(self) -> list[str]:
        """The sites whose prompt the best changed."""
        return self.best.changed_sites(self.base)

    def summary(
        self,
        cost: Cost,
        texts_before: dict[str, str],
        texts_after: dict[str, str],
        diff: str,
        texts_control: dict[str, str],
    ) -> Summary:
        """The run's record for the sink, with what the run spent, the prompt texts of the start
        program, the best and the control, and the prompt diff."""
        assert self.checkpoint.baseline_train is not None
        return Summary(
            config=self.config,
            base=self.base,
            best=self.best,
            baseline_train=self.checkpoint.baseline_train,
            baseline_dev=self.baseline_dev,
            test_before=self.before,
            test_after=self.after,
            entries=self.targeting.entries,
            points=self.points,
            best_curve=self.best_curve,
            test_before_ci=self.test_before_ci,
            test_after_ci=self.test_after_ci,
            delta_test_ci=self.delta_test_ci,
            evaluations=len(self.records),
            cost=cost,
            texts_before=texts_before,
            texts_after=texts_after,
            diff=diff,
            comparison=self.comparison,
            control=self.control,
            control_dev=self.control_dev,
            control_test=self.control_test,
            texts_control=texts_control,
        )

    def note(self, note: str) -> str:
        """The run's ``note`` with the control's line after it (or why the run has no control) and
        the small-split warning before it."""
        if line := control_line(self.comparison):
            note = (note + "; " if note else "") + line
        elif not self.targeting.control_sites and self.config.control:
            note = (note + "; " if note else "") + f"control: {self.targeting.control_note}"
        if warning := small_split_warning(self.baseline_dev.n, self.before.n):
            note = warning + ("; " + note if note else "")
        return note

    def failed_calls(self) -> dict[str, int]:
        """The failed LM calls behind each figure of the result (only those that had any): under
        the threshold of :mod:`optloop.failures` they are reported beside the figure."""
        ckpt = self.checkpoint
        best = (
            self.baseline_dev
            if self.best_trial == 0
            else next(
                (
                    t.evaluation
                    for t in ckpt.trials
                    if t.trial == self.best_trial and t.evaluation is not None
                ),
                None,
            )
        )
        control_test = self.control_test
        counts = {
            "baseline_dev": self.baseline_dev.lm_failed_calls,
            "best_dev": best.lm_failed_calls if best is not None else 0,
            "test_before": self.before.lm_failed_calls,
            "test_after": self.after.lm_failed_calls,
            "control_dev": ckpt.control_dev.lm_failed_calls if ckpt.control_dev else 0,
            "control_test": control_test.lm_failed_calls if control_test else 0,
        }
        return {name: n for name, n in counts.items() if n}

    def result(self, cost: Cost, diff: str, note: str) -> LoopResult:
        """The run's result, as the checkpoint stands now (what the registry registered
        included)."""
        ckpt, best, base, comparison = self.checkpoint, self.best, self.base, self.comparison
        control_dev = self.control_dev
        return LoopResult(
            config=self.config,
            parent_run_id=ckpt.parent_run_id or "",
            targets=ckpt.targets,
            tunable_sites=self.targeting.sites,
            tunable_knobs=self.targeting.knobs,
            baseline_dev=self.baseline_dev.accuracy,
            best_dev=max(self.best_curve),
            best_trial=self.best_trial,
            test_before=self.before.accuracy,
            test_after=self.after.accuracy,
            evaluations=len(self.records),
            changed_sites=self.changed,
            changed_knobs={k: best.knobs[k] for k in best.changed_knobs(base)},
            promoted=self.promoted,
            promotion_reason=self.reason,
            registered=ckpt.registered,
            cost=cost,
            n_dev=self.baseline_dev.n,
            n_test=self.before.n,
            test_before_ci=self.test_before_ci,
            test_after_ci=self.test_after_ci,
            delta_test_ci=self.delta_test_ci,
            tried=[
                Tried.of(r.trial, r.candidate, r.accuracy, base, r.stopped) for r in self.records
            ],
            prompt_diff=diff,
            note=note,
            failed_calls=self.failed_calls(),
            control_sites=comparison.control_sites,
            control_note=comparison.control_note,
            control_dev=None if control_dev is None else control_dev.accuracy,
            test_control_ci=self.test_control_ci,
            delta_control_ci=self.delta_control_ci,
            beats_control=comparison.beats_control,
            racing=RaceSpend.of([t.evaluation for t in ckpt.trials if t.evaluation is not None]),
            power=self.power(),
            headroom=self.targeting.headroom,
        )

    def power(self) -> str:
        """The power line at the start program's accuracy on each split (:func:`power_line`):
        dev's, and the held-out test's measured before the trials' best."""
        return power_line(
            self.baseline_dev.n,
            self.before.n,
            self.baseline_dev.accuracy,
            self.config.min_gain,
            test_accuracy=self.before.accuracy,
        )


__all__ = ["Outcome", "best_of"]
