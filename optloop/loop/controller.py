"""The loop controller: propose, evaluate, observe, re-attribute and retarget, finish.

:class:`Controller` owns the loop's algorithm and its checkpoint discipline, nothing else: what it
talks to sits behind :mod:`optloop.loop.interfaces` (the evaluator, the tracking sink, the
coordinator, the optimizer factory), so tests drive it with fakes
(``tests/optloop/loop/test_controller.py``) and :class:`optloop.loop.runs.runner.Loop` wires the
real ones. What one run works on is its :class:`~optloop.loop.runs.context.RunContext`; the
figures a finished run reports are made by :mod:`optloop.loop.outcome`. The data flow, the
interfaces and the checkpoint: ``docs/architecture.md`` ("The loop controller", "Resume and crash
consistency").
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from optloop.attribution import blame
from optloop.loop.candidate import Candidate, prompt_diff
from optloop.loop.evaluate import Evaluation
from optloop.loop.interfaces import (
    CandidateEvaluator,
    Coordinator,
    Split,
    Summary,
    Targeting,
    TrackingSink,
    TrialRecord,
)
from optloop.loop.optimizers.base import Optimizer
from optloop.loop.outcome import Outcome, best_of
from optloop.loop.policy import choose_targets, control_sites, floor_warning
from optloop.loop.racing import Against
from optloop.loop.runs.context import RunContext
from optloop.loop.spending.eta import TrialLine
from optloop.loop.state import (
    Checkpoint,
    Cost,
    LoopConfig,
    LoopResult,
    Recheck,
    Trial,
    add_costs,
)
from optloop.loop.trivial_control import (
    Headroom,
    control_candidate,
    headroom,
    widens,
)

logger = logging.getLogger(__name__)


@dataclass
class _Best:
    candidate: Candidate
    evaluation: Evaluation
    trial: int = 0

    @property
    def label(self) -> str:
        return f"trial {self.trial}" if self.trial else "the start program"


# --- the controller -----------------------------------------------------------------------


class Controller:
    """Runs the loop once, or resumes it from the context's checkpoint::

        baseline on train and dev ─► blame ─► targets ─► the control on dev
            ─► repair what a kill left half done
            ─► while the coordinator grants a trial: the optimizer proposes ─► evaluate on dev
               (a child run of the sink) ─► the optimizer observes ─► if better: re-attribute,
               retarget
            ─► settle (the coordinator) ─► baseline, best and control on test ─► summary,
               registry ─► result

    The control (:mod:`optloop.loop.trivial_control`) is the start program with each site of the
    first targeting given its signature's trivial instruction; the leading worker evaluates it on
    dev once the targets are chosen and hands it to the others as it hands over the baseline, and
    the worker that finishes the run evaluates it on test.

    Checkpoint discipline, so that a resumed run equals an uninterrupted one: every evaluation is
    checkpointed as soon as it returns; a trial is appended to the checkpoint *before* its record
    (child run) opens, so on resume a trial without an evaluation has its records discarded and
    its candidate redone first under the same number (:meth:`_repair`); the optimizer is rebuilt
    and told every candidate already tried, a queue-based one given its saved queue back. The
    budget counts the checkpoint's trials (shared: the study's slots), so nothing is counted
    twice, and every save writes what this process has spent, so the run's cost adds up every
    process that worked on it. Spending limits are checked at step boundaries only
    (:meth:`_boundary`).
    """

    def __init__(
        self,
        context: RunContext,
        evaluator: CandidateEvaluator,
        sink: TrackingSink,
        coordinator: Coordinator,
        make_optimizer: Callable[[list[str], list[str]], Optimizer],
    ):
        self.ctx = context
        self.evaluator = evaluator
        self.sink = sink
        self.coordinator = coordinator
        self.make_optimizer = make_optimizer
        # trials a kill left half done, redone first as a batch of their own (_repair)
        self._redo = 0
        # sites a headroom check found the model's, not the prompt's: the budget left them
        self._bound: set[str] = set()

    @property
    def config(self) -> LoopConfig:
        return self.ctx.config

    @property
    def ckpt(self) -> Checkpoint:
        return self.ctx.checkpoint

    def run(self) -> LoopResult:
        """The whole loop; the result every worker of the run returns. The checkpoint says finished
        after.

        One call is one process's share of the run (:meth:`Checkpoint.begin_process`). When it
        stops midway (a kill signal turned into ``KeyboardInterrupt``, an error, a spending limit's
        :class:`~optloop.loop.spending.limits.RunStopped` at a step boundary), what it spent is
        written into the checkpoint on disk before the exception goes on.
        """
        self.ckpt.begin_process()
        try:
            self._baseline()
            self._boundary()  # after the baseline: where --estimate stops
            targeting = self._target()
            control = self._control(targeting)
            targeting = self._headroom(targeting, control)
            self._repair()
            optimizer, best = self._resume_optimizer(targeting)
            note = self._trials(optimizer, best, targeting, control)
            result = self.coordinator.settle(
                lambda: self._finish(targeting, control, note), self.run_cost
            )
            if not self.ckpt.finished:
                self.ckpt.finished = True
                self.ctx.save()
            return result
        except BaseException:
            try:
                self.ctx.keep_spending()
            except Exception as exc:  # noqa: BLE001 - the original exception matters more
                logger.warning("could not save this process's cost into the checkpoint: %s", exc)
            raise

    def run_cost(self) -> Cost:
        """What this worker's processes have spent on the run, this one's up to now included."""
        return self.ckpt.total_cost(self.ctx.cost())

    def total_cost(self) -> Cost:
        """What the whole run has spent so far: this worker's processes plus, shared, the other
        workers' (their seconds are worker-seconds)."""
        return add_costs(self.run_cost(), self.coordinator.others_cost())

    def _boundary(self) -> None:
        """A step boundary: everything before it is checkpointed and no trial is open, so the run
        may stop here when it has reached a spending limit (:meth:`SpendingLimits.check` raises
        ``RunStopped``)."""
        limits = self.ctx.limits
        if limits.active:
            limits.check(self.total_cost(), baseline_done=self.ckpt.baseline_dev is not None)

    # --- before the trials ----------------------------------------------------------------

    def _evaluate(self, candidate: Candidate, split: Split) -> Evaluation:
        return self.evaluator.evaluate(candidate, split)

    def _baseline(self) -> None:
        """The start program on train and dev, each checkpointed as soon as it is known."""
        ckpt = self.ckpt
        if (
            ckpt.baseline_dev is None
            and (theirs := self.coordinator.wait_for_baseline()) is not None
        ):
            ckpt.baseline_train, ckpt.baseline_dev = theirs
            self.ctx.save()
        if ckpt.baseline_train is None:
            self._boundary()
            ckpt.baseline_train = self._evaluate(self.ctx.base, "train")
            self.ctx.save()
        if ckpt.baseline_dev is None:
            self._boundary()
            ckpt.baseline_dev = self._evaluate(self.ctx.base, "dev")
            self.ctx.save()
            self.sink.log_dev(0, ckpt.baseline_dev.accuracy, ckpt.baseline_dev.accuracy)
        self.coordinator.publish_baseline(ckpt.baseline_train, ckpt.baseline_dev)

    def _target(self) -> Targeting:
        """Blame over the baseline's failures, and the sites and knobs the optimizer may change."""
        ckpt = self.ckpt
        assert ckpt.baseline_train is not None and ckpt.baseline_dev is not None
        evaluations = [ckpt.baseline_train, ckpt.baseline_dev]
        entries = blame(
            [a for ev in evaluations for a in ev.attributions()],
            passed=sum(ev.passed for ev in evaluations),
        )
        errors = dict(sum((Counter(ev.error_counts()) for ev in evaluations), Counter()))
        ckpt.targets = [e.target for e in entries]
        sites, knobs, note = choose_targets(entries, self.config, self.evaluator.site_names)
        compared, why_none = control_sites(entries, self.config, self.evaluator.site_names)
        if note:
            logger.warning("%s", note)
        train, dev = ckpt.baseline_train, ckpt.baseline_dev
        if floor := floor_warning(train.passed, train.n, dev.passed, dev.n):
            self.ctx.progress(floor)  # the console and run.log, before any budget is spent
            note = floor + ("; " + note if note else "")
        targeting = Targeting(
            entries=entries,
            errors=errors,
            targets=list(ckpt.targets),
            sites=sites,
            knobs=knobs,
            note=note,
            control_sites=compared,
            control_note=why_none,
        )
        if self.coordinator.leads:
            self.sink.log_targets(targeting)
        return targeting

    def _control(self, targeting: Targeting) -> Candidate | None:
        """The control candidate (``None``: the run has none), evaluated on dev by the leading
        worker and checkpointed as soon as it returns, then handed to the other workers. A
        control that is the start program (its sites already carry the trivial instruction)
        takes the baseline's evaluation."""
        if not targeting.control_sites:
            if targeting.control_note and self.coordinator.leads:
                self.ctx.progress(f"control: {targeting.control_note}")
            return None
        ckpt, base = self.ckpt, self.ctx.base
        assert ckpt.baseline_dev is not None
        control = control_candidate(
            base, {s: self.evaluator.trivial_instruction(s) for s in targeting.control_sites}
        )
        if not self.coordinator.leads:
            return control  # the leader's evaluation is fetched when this worker finishes
        if ckpt.control_dev is None:
            if control.digest() == base.digest():
                ckpt.control_dev = ckpt.baseline_dev
            else:
                self._boundary()
                ckpt.control_dev = self._evaluate(control, "dev")
            self.ctx.save()
            self.ctx.progress(
                f"control (the trivial instruction at {', '.join(targeting.control_sites)}): "
                f"dev {ckpt.control_dev.accuracy:.3f}, the start program "
                f"{ckpt.baseline_dev.accuracy:.3f}"
            )
        self.coordinator.publish_control(ckpt.control_dev)
        return control

    def _headroom(self, targeting: Targeting, control: Candidate | None) -> Targeting:
        """Whether the prompt at the control's sites can matter (:func:`headroom`: the start
        program and the control on the same dev questions, and on train too when dev alone cannot
        tell: :meth:`_headroom_wider`). When the two agree within ``--min-gain``, the failures
        blamed there are the model's: the optimizer gets the other targets, if the blame names
        any, and the run says so."""
        found = self._headroom_of(targeting.control_sites)
        if found is None:
            return targeting
        if control is not None and self.coordinator.leads and widens(self.ckpt, self.config):
            found = self._headroom_wider(targeting.control_sites, control, found)
        line = found.line()
        sites = [s for s in targeting.sites if s not in found.sites]
        if found.model_bound and (sites or targeting.knobs) and sites != targeting.sites:
            line += f"; the budget goes to {', '.join(sites + targeting.knobs)}"
            targeting = replace(targeting, sites=sites)
            self._bound.update(found.sites)
        elif found.model_bound:
            line += "; the blame names no other target, so the budget stays there"
        if self.coordinator.leads:
            self.ctx.progress(line)
        return replace(targeting, headroom=line)

    def _headroom_wider(self, sites: list[str], control: Candidate, dev: Headroom) -> Headroom:
        """The headroom on train and dev when dev alone cannot tell and the two together are
        questions enough to show agreement (:func:`widens`): the control answers train too (once;
        checkpointed), the start program's train answers are the baseline's, and the two are
        compared on every train and dev question. Train's questions are the ones whose failures
        the blame read, as dev's are; neither program was chosen on them, so the paired
        comparison is as fair there as on dev. ``dev`` (its verdict on dev) when the control
        answered other train questions."""
        ckpt = self.ckpt
        own_train, own_dev, control_dev = ckpt.baseline_train, ckpt.baseline_dev, ckpt.control_dev
        assert own_train is not None and own_dev is not None and control_dev is not None
        if ckpt.control_train is None:
            self.ctx.progress(
                f"{dev.line()}; the control answers train too ({own_train.n} questions)"
            )
            self._boundary()
            ckpt.control_train = self._evaluate(control, "train")
            self.ctx.save()
        if ckpt.control_train.n != own_train.n:
            return dev
        own = [o.passed for ev in (own_train, own_dev) for o in ev.outcomes]
        theirs = [o.passed for ev in (ckpt.control_train, control_dev) for o in ev.outcomes]
        return headroom(
            sites,
            own,
            theirs,
            min_gain=self.config.min_gain,
            seed=self.config.seed,
            questions="train and dev",
        )

    def _headroom_after(self, targeting: Targeting, control: Candidate | None) -> Targeting:
        """The headroom again after the trials, with a third arm: of the trials that rewrote the
        control's sites and answered all of dev, the best, against the start program and the
        control on the same dev questions (:func:`headroom`). Its line follows the first one."""
        found = self._headroom_written(targeting, control)
        lines = [r.line for r in self.ckpt.rechecks]
        if found is not None:
            lines.append(f"after the trials, {found.line().removeprefix('headroom: ')}")
        if not lines:
            return targeting
        after = "; ".join(lines)
        return replace(
            targeting,
            headroom=f"{targeting.headroom}; {after}"
            if targeting.headroom
            else f"headroom: {after}",
        )

    def _headroom_written(
        self, targeting: Targeting, control: Candidate | None
    ) -> Headroom | None:
        """:meth:`_headroom_of` the control's sites with the best trial so far that rewrote them
        (to neither the start program's text nor the control's) and answered all of dev as the
        third arm; None without such a trial."""
        own, base = self.ckpt.baseline_dev, self.ctx.base
        if control is None or own is None:
            return None
        written = [
            (t.evaluation, t.trial)
            for t in self.ckpt.trials
            if t.evaluation is not None
            and t.evaluation.complete
            and t.evaluation.n == own.n
            and any(
                t.candidate.sites.get(s) not in (base.sites.get(s), control.sites.get(s))
                for s in targeting.control_sites
            )
        ]
        if not written:
            return None
        top, trial = max(written, key=lambda w: (w[0].accuracy, -w[1]))
        return self._headroom_of(targeting.control_sites, top, f"trial {trial}'s instruction")

    def _stalled(self) -> int:
        """The trials in a row, up to the last one evaluated, without a new best, when that is a
        multiple of ``--stall`` (else 0: no re-check due)."""
        if not self.config.stall:
            return 0
        streak = 0
        for t in sorted(self.ckpt.trials, key=lambda t: t.trial, reverse=True):
            if t.evaluation is None:
                continue
            if t.improved:
                break
            streak += 1
        return streak if streak and streak % self.config.stall == 0 else 0

    def _recheck(
        self,
        optimizer: Optimizer,
        best: Candidate,
        targeting: Targeting,
        control: Candidate | None,
        trial: int,
    ) -> None:
        """After a stall (:meth:`_stalled`) while the optimizer still rewrites the control's
        sites, the headroom again, with the best trial that rewrote them as the third arm
        (:meth:`_headroom_written`). When the three agree within ``--min-gain``, the optimizer
        is retargeted on the other sites and knobs it had, if any, and its queued candidates that
        rewrite the sites it left (from ``best``'s text) are dropped. Checkpointed (the budget
        stays moved after a resume), said, and in the summary's headroom line."""
        streak = self._stalled()
        spent_there = [s for s in optimizer.sites if s in targeting.control_sites]
        if (
            not streak
            or not spent_there
            or any(r.after_trial == trial for r in self.ckpt.rechecks)
        ):
            return
        found = self._headroom_written(targeting, control)
        if found is None:
            return
        line = (
            f"after trial {trial} ({streak} without a new best), "
            f"{found.line().removeprefix('headroom: ')}"
        )
        left: list[str] = []
        sites = [s for s in optimizer.sites if s not in found.sites]
        if found.model_bound and (sites or optimizer.knobs):
            left = spent_there
            line += f"; the rest of the budget goes to {', '.join(sites + optimizer.knobs)}"
            self._bound.update(found.sites)
            optimizer.retarget(sites, list(optimizer.knobs))
            optimizer.drop_queued(lambda c: all(c.sites.get(s) == best.sites.get(s) for s in left))
            self.ckpt.queue = optimizer.queued()
        elif found.model_bound:
            line += "; the blame names no other target, so the budget stays there"
        self.ckpt.rechecks.append(Recheck(after_trial=trial, left=left, line=line))
        self.ctx.save()
        self.ctx.progress(f"headroom {line}")

    def _targets_of(self, evaluation: Evaluation) -> tuple[list[str], list[str]]:
        """The sites and knobs the blame of ``evaluation``'s failures names
        (:func:`choose_targets`), without those a headroom check moved the budget off."""
        sites, knobs, _ = choose_targets(
            evaluation.blame(), self.config, self.evaluator.site_names
        )
        return self._unbound(sites, knobs)

    def _unbound(self, sites: list[str], knobs: list[str]) -> tuple[list[str], list[str]]:
        """``sites`` and ``knobs`` without the sites a headroom check moved the budget off, unless
        nothing would be left."""
        kept = [s for s in sites if s not in self._bound]
        return (kept, knobs) if kept or knobs else (sites, knobs)

    def _headroom_of(
        self, sites: list[str], written: Evaluation | None = None, label: str = ""
    ) -> Headroom | None:
        """:func:`headroom` of ``sites`` from the start program's and the control's dev outcomes
        (and ``written``'s, labelled ``label``); None when there is no control on dev to compare,
        or it is the start program itself, or it answered other questions."""
        own, control_dev = self.ckpt.baseline_dev, self.ckpt.control_dev
        if not sites or own is None or control_dev is None:
            return None
        if control_dev is own or control_dev.n != own.n:
            return None
        return headroom(
            sites,
            [o.passed for o in own.outcomes],
            [o.passed for o in control_dev.outcomes],
            min_gain=self.config.min_gain,
            seed=self.config.seed,
            written=None if written is None else [o.passed for o in written.outcomes],
            written_label=label,
        )

    def _repair(self) -> None:
        """Undo a trial a kill left half done (its record discarded, its candidate queued first),
        then report evaluated trials a kill kept from being reported."""
        ckpt = self.ckpt
        half_done = [t for t in ckpt.trials if t.evaluation is None]
        for trial in half_done:
            self.sink.discard_trial(trial.trial)
            ckpt.trials.remove(trial)
        ckpt.queue[:0] = [t.candidate for t in half_done]  # in trial order, as the batch was taken
        self._redo = len(half_done)
        self.ctx.save()
        self.coordinator.republish(ckpt.trials)
        if ckpt.processes > 1:
            self._relog_dev()

    def _relog_dev(self) -> None:
        """The ``acc_dev`` points a kill kept from being logged (it came between a checkpoint write
        and the sink's call), with the best so far as it was then: the baseline's (by the leading
        worker) and this worker's trials' (when shared, the best among the baseline and this
        worker's trials up to it)."""
        ckpt = self.ckpt
        assert ckpt.baseline_dev is not None
        best = ckpt.baseline_dev.accuracy
        points = [(0, best, best)] if self.coordinator.leads else []
        for t in sorted(ckpt.trials, key=lambda t: t.trial):
            if t.evaluation is not None:
                best = max(best, t.evaluation.accuracy)
                points.append((t.trial, t.evaluation.accuracy, best))
        logged = self.sink.dev_steps()
        for trial, accuracy, best_so_far in points:
            if trial not in logged:
                self.sink.log_dev(trial, accuracy, best_so_far)

    def _resume_optimizer(self, targeting: Targeting) -> tuple[Optimizer, _Best]:
        """A fresh optimizer told everything already tried, retargeted on the best so far, its
        queue restored."""
        ckpt, base = self.ckpt, self.ctx.base
        assert ckpt.baseline_dev is not None
        self._bound.update(s for r in ckpt.rechecks for s in r.left)
        optimizer = self.make_optimizer(*self._unbound(targeting.sites, targeting.knobs))
        optimizer.mark_seen(base)
        best = _Best(base, ckpt.baseline_dev)
        for t in ckpt.trials:
            optimizer.mark_seen(t.candidate)
            if (
                t.evaluation is not None
                and t.evaluation.complete
                and t.evaluation.accuracy > best.evaluation.accuracy
            ):
                best = _Best(t.candidate, t.evaluation, t.trial)
        if best.trial:
            optimizer.retarget(*self._targets_of(best.evaluation))
        optimizer.restore_queue(ckpt.queue)
        # Its rounds counted on: a round's draws are seeded by its number, and a round numbered
        # again from 1 would make the first round's candidates, all seen, so nothing new.
        optimizer.rounds = ckpt.optimizer_rounds()
        return optimizer, best

    # --- the trials -----------------------------------------------------------------------

    def _trials(
        self,
        optimizer: Optimizer,
        best: _Best,
        targeting: Targeting,
        control: Candidate | None,
    ) -> str:
        """Propose, evaluate and observe while the coordinator grants trials, ``--batch``
        candidates at a time; the note (``targeting``'s), extended when the optimizer ran dry.
        After each trial, a stall may check the headroom again (:meth:`_recheck`).

        A batch is one round's candidates (:meth:`Optimizer.propose_batch`), taken as trials in
        order and checkpointed before any is evaluated; they are evaluated at once
        (``evaluate_many``), then recorded, observed and checkpointed one by one in trial order,
        each improving one moving the best (and the blame) before the next is observed. Trials a
        kill left half done are redone first as a batch of their own, so the run goes on as the
        uninterrupted one did."""
        ckpt, cfg, coordinator = self.ckpt, self.config, self.coordinator
        assert ckpt.baseline_dev is not None
        note = targeting.note
        eta = self.ctx.baseline_done(ckpt) if coordinator.budget_left(ckpt.trials) else None
        while coordinator.budget_left(ckpt.trials):
            self._boundary()  # the last trial and its acc_dev point are recorded
            upcoming = coordinator.upcoming(ckpt.trials)
            size, self._redo = (
                self._redo or max(1, min(cfg.batch, coordinator.room(ckpt.trials))),
                0,
            )
            left = f", ETA {eta.text(self._done())}" if eta is not None else ""
            self.ctx.progress(
                f"trial {upcoming}/{cfg.budget}: {optimizer.name} proposing for "
                f"{', '.join(optimizer.sites)}{left}"
            )
            started = time.perf_counter()
            candidates = optimizer.propose_batch(best.candidate, best.evaluation, size)
            ckpt.queue, ckpt.rounds = optimizer.queued(), optimizer.rounds
            if not candidates:
                why = (
                    f"{optimizer.name} proposed nothing new after {len(ckpt.trials)} "
                    f"evaluation(s){coordinator.scope}"
                )
                self.ctx.progress(f"{why}: the rest of the budget is left unspent")
                note = (note + "; " if note else "") + why
                break
            trials = self._take(optimizer, candidates)
            if not trials:  # other workers took the rest of the budget meanwhile
                break
            if len(trials) > 1:
                self.ctx.progress(
                    f"trials {trials[0].trial}-{trials[-1].trial}/{cfg.budget}: evaluating "
                    f"{len(trials)} candidates at once{left}"
                )
            against = self._against(best)
            evaluations = self._evaluate_many(trials, against)
            # each trial's share of the batch's time, proposals included
            seconds: float | None = None
            for trial, evaluation in zip(trials, evaluations):
                self._record_trial(trial, evaluation, against)
                if seconds is None:  # a trial alone was evaluated inside its record
                    seconds = (time.perf_counter() - started) / len(trials)
                assert trial.evaluation is not None
                evaluation = trial.evaluation
                optimizer.observe(trial.candidate, evaluation, trial.trial)
                if evaluation.complete and evaluation.accuracy > best.evaluation.accuracy:
                    trial.improved = True
                    best = _Best(trial.candidate, evaluation, trial.trial)
                    self._retarget(optimizer, evaluation)
                self.ctx.save()
                coordinator.report(trial, self.run_cost)
                best_so_far = coordinator.best_accuracy(
                    best.evaluation.accuracy, ckpt.baseline_dev.accuracy
                )
                self.sink.log_dev(trial.trial, evaluation.accuracy, best_so_far)
                if eta is not None:
                    eta.trial_took(seconds)
                self.ctx.trial_done(
                    TrialLine(
                        trial=trial.trial,
                        budget=cfg.budget,
                        accuracy=evaluation.accuracy,
                        best=best_so_far,
                        seconds=seconds,
                        eta_s=None if eta is None else eta.seconds_left(self._done()),
                        stopped=(
                            None
                            if evaluation.stopped is None
                            else evaluation.stopped.line(evaluation.accuracy)
                        ),
                    )
                )
                self._recheck(optimizer, best.candidate, targeting, control, trial.trial)
            if len(trials) < len(candidates):  # the budget went to other workers
                break
        return note

    def _done(self) -> int:
        """Trials of this worker's checkpoint with an evaluation."""
        return sum(t.evaluation is not None for t in self.ckpt.trials)

    def _take(self, optimizer: Optimizer, candidates: Sequence[Candidate]) -> list[Trial]:
        """``candidates`` as trials, numbered by the coordinator in order and in the checkpoint
        (saved) before any is evaluated; the ones the budget no longer allows go back to the
        optimizer."""
        taken: list[Trial] = []
        for i, candidate in enumerate(candidates):
            study_trial = optimizer.study_trial(candidate)
            trial_no = self.coordinator.take(self.ckpt.trials, candidate, study_trial)
            if trial_no is None:
                for rest in reversed(candidates[i:]):
                    optimizer.release(rest)
                break
            trial = Trial(trial=trial_no, candidate=candidate)
            self.ckpt.trials.append(trial)
            taken.append(trial)
        if taken:
            self.ctx.save()
        return taken

    def _against(self, best: _Best) -> Against | None:
        """What the next trials race against on dev: the best's outcomes (``None``: ``--no-race``,
        every candidate answers every dev question)."""
        if not self.config.race:
            return None
        return Against(best.evaluation.outcomes, best.label, seed=self.config.seed)

    def _evaluate_many(
        self, trials: Sequence[Trial], against: Against | None
    ) -> list[Evaluation | None]:
        """Several trials' candidates on dev at once; a trial alone is evaluated inside its record
        instead (``None``: :meth:`_record_trial` evaluates it)."""
        if len(trials) == 1:
            return [None]
        return list(
            self.evaluator.evaluate_many([t.candidate for t in trials], "dev", against=against)
        )

    def _record_trial(
        self, trial: Trial, evaluation: Evaluation | None, against: Against | None = None
    ) -> None:
        """``trial``'s record (a child run): its evaluation (made here when ``None``: the record's
        time is then the evaluation's), logged into it, then set on the trial. The trial is in the
        checkpoint before its record opens, so whatever a kill leaves of it is found and discarded
        on resume (:meth:`_repair`)."""
        base = self.ctx.base
        with self.sink.open_trial(trial.trial, self.coordinator.trial_tags()) as run_id:
            trial.child_run_id = run_id
            if evaluation is None:
                evaluation = self.evaluator.evaluate(trial.candidate, "dev", against=against)
            diff = prompt_diff(
                self.evaluator.prompt_texts(base), self.evaluator.prompt_texts(trial.candidate)
            )
            self.sink.log_trial(trial.trial, trial.candidate, evaluation, base=base, diff=diff)
        trial.evaluation = evaluation

    def _retarget(self, optimizer: Optimizer, evaluation: Evaluation) -> None:
        """A new best: re-attribute from its failures and retarget the optimizer when the blame
        moved."""
        sites, knobs = self._targets_of(evaluation)
        if (sites, knobs) != (optimizer.sites, optimizer.knobs):
            self.ctx.progress(f"re-attribution: blame moved to {', '.join(sites + knobs)}")
            optimizer.retarget(sites, knobs)

    # --- the end --------------------------------------------------------------------------

    def _control_test(self, control: Candidate, best: Candidate) -> Evaluation:
        """The control on test, checkpointed as soon as it returns (the held-out evaluation of the
        start program or of the best when the control is that program), and its dev evaluation
        from the leading worker when another worker evaluated it."""
        ckpt = self.ckpt
        if ckpt.control_dev is None:  # another worker leads, and evaluated it
            ckpt.control_dev = self.coordinator.wait_for_control()
            assert ckpt.control_dev is not None, "the leading worker evaluates the control on dev"
            self.ctx.save()
        if ckpt.control_test is None:
            assert ckpt.test_before is not None and ckpt.test_after is not None
            if control.digest() == self.ctx.base.digest():
                ckpt.control_test = ckpt.test_before
            elif control.digest() == best.digest():
                ckpt.control_test = ckpt.test_after
            else:
                self._boundary()
                ckpt.control_test = self._evaluate(control, "test")
            self.ctx.save()
        return ckpt.control_test

    def _finish(self, targeting: Targeting, control: Candidate | None, note: str) -> LoopResult:
        """The held-out test of the start program, the run's best and the control, the summary, the
        registry, the result (run by the one worker that finishes the run)."""
        ckpt, cfg, base = self.ckpt, self.config, self.ctx.base
        assert ckpt.baseline_train is not None and ckpt.baseline_dev is not None
        records = self.coordinator.records(ckpt.trials)
        best, best_trial = best_of(base, ckpt.baseline_dev.accuracy, records)
        if ckpt.test_before is None:
            self._boundary()
            ckpt.test_before = self._evaluate(base, "test")
            self.ctx.save()
        if ckpt.test_after is None:
            if best is not base:
                self._boundary()
            ckpt.test_after = ckpt.test_before if best is base else self._evaluate(best, "test")
            self.ctx.save()
        control_test = self._control_test(control, best) if control is not None else None
        targeting = self._headroom_after(targeting, control)
        outcome = Outcome.of(
            cfg, ckpt, targeting, base, best, best_trial, records, control, control_test
        )
        cost = self.total_cost()
        texts_before, texts_after = (
            self.evaluator.prompt_texts(base),
            self.evaluator.prompt_texts(best),
        )
        diff = prompt_diff(texts_before, texts_after)
        self.sink.log_summary(
            outcome.summary(
                cost,
                texts_before,
                texts_after,
                diff,
                {} if control is None else self.evaluator.prompt_texts(control),
            )
        )
        changed = outcome.changed
        if changed and not ckpt.registered:
            message = (
                f"optloop run {cfg.run_name}: test {outcome.before.accuracy:.3f} -> "
                f"{outcome.after.accuracy:.3f}; {outcome.reason}"
            )
            ckpt.registered = self.sink.register(
                {s: texts_after[s] for s in changed}, promote=outcome.promoted, message=message
            )
            self.ctx.save()  # registered once: a kill after this point does not register again
        note = outcome.note(note)
        self.sink.tag_result(outcome.promoted, outcome.reason, note)
        # the gate's counts go into the result before it is published, so that every worker of
        # a shared run prints the one result
        result = outcome.result(cost, diff, note)
        if proposals := self.ctx.proposals():
            result = result.model_copy(update={"proposals": proposals})
        result = self.coordinator.publish(result)
        ckpt.finished = True
        self.ctx.save()
        return result


__all__ = [
    "CandidateEvaluator",
    "Controller",
    "Coordinator",
    "RunContext",
    "Split",
    "Summary",
    "Targeting",
    "TrackingSink",
    "TrialRecord",
]
