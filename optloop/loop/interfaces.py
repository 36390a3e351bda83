"""The controller's interfaces: what :class:`~optloop.loop.controller.Controller` talks to, and
the data it hands over through them.

The controller owns the algorithm and the checkpoint discipline and nothing else; what it talks to
sits behind these small interfaces, so tests drive it with fakes
(``tests/optloop/loop/test_controller.py``) and :class:`optloop.loop.runs.runner.Loop` wires the
real ones. Each interface, what it does, and its real implementation:

- :class:`CandidateEvaluator`: one candidate over a named split -> Evaluation;
  ``split_evaluator.SplitEvaluator`` (the Evaluator)
- :class:`TrackingSink`: records the run (parent metrics, child runs, artifacts, the prompt
  registry); ``tracking.sink.MlflowSink``
- :class:`Coordinator`: who evaluates the baseline, who may take the next trial, who finishes;
  ``coordinator.LocalCoordinator``, ``coordinator.SharedCoordinator``
- ``make_optimizer``: an :class:`~optloop.loop.optimizers.base.Optimizer` for (sites, knobs);
  ``Loop._optimizer`` (:mod:`~optloop.loop.optimizers.registry`)
- :class:`~optloop.loop.runs.context.RunContext`: config, checkpoint, start program, progress,
  cost; built by ``Loop``
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from optloop.attribution import BlameEntry
from optloop.loop.candidate import Candidate
from optloop.loop.evaluate import Evaluation
from optloop.loop.racing import Against
from optloop.loop.state import Cost, LoopConfig, LoopResult, Trial
from optloop.loop.trivial_control import Comparison
from optloop.stats import Interval

Split = Literal["train", "dev", "test"]


class CandidateEvaluator(Protocol):
    """Runs one candidate over one of the run's splits (one *evaluation*: what ``--budget`` counts
    on dev)."""

    @property
    def site_names(self) -> list[str]:
        """Every prompt site of the system, in the system's order."""

    def evaluate(
        self, candidate: Candidate, split: Split, *, against: Against | None = None
    ) -> Evaluation:
        """``candidate`` over every episode of ``split``, each failure attributed; with
        ``against``, raced against the best's outcomes and stopped once significantly worse
        (:mod:`optloop.loop.racing`). May raise (the run stops; the checkpoint holds everything
        evaluated before)."""

    def evaluate_many(
        self, candidates: Sequence[Candidate], split: Split, *, against: Against | None = None
    ) -> list[Evaluation]:
        """Each of ``candidates`` over ``split`` as :meth:`evaluate` does, possibly at once
        (``--batch``): the evaluations in the candidates' order, each the one :meth:`evaluate`
        would give. May raise."""

    def prompt_texts(self, candidate: Candidate) -> dict[str, str]:
        """site -> the exact prompt text ``candidate`` sends there."""

    def trivial_instruction(self, site: str) -> str:
        """DSPy's default instruction for ``site``'s signature (the control's text there:
        :func:`optloop.loop.candidate.trivial_instruction`)."""


@dataclass(frozen=True)
class Targeting:
    """What the baseline's attribution decided: the blame, and what the optimizer may change."""

    entries: list[BlameEntry]
    errors: dict[str, int]
    targets: list[str]
    sites: list[str]
    knobs: list[str]
    note: str
    control_sites: list[str] = field(default_factory=list)
    control_note: str = ""
    # Whether the control's sites' prompt can matter (optloop.loop.trivial_control.Headroom.line).
    headroom: str = ""


@dataclass(frozen=True)
class Summary:
    """Everything the run's record holds at the end (the sink turns it into metrics and
    artifacts)."""

    config: LoopConfig
    base: Candidate
    best: Candidate
    baseline_train: Evaluation
    baseline_dev: Evaluation
    test_before: Evaluation
    test_after: Evaluation
    entries: list[BlameEntry]
    points: list[tuple[int, float]]
    best_curve: list[float]
    test_before_ci: Interval
    test_after_ci: Interval
    delta_test_ci: Interval
    evaluations: int
    cost: Cost
    texts_before: dict[str, str]
    texts_after: dict[str, str]
    diff: str
    comparison: Comparison
    control: Candidate | None = None
    control_dev: Evaluation | None = None
    control_test: Evaluation | None = None
    texts_control: dict[str, str] = field(default_factory=dict)


class TrackingSink(Protocol):
    """Where a run is recorded. The controller calls it only after the state it reports is
    checkpointed, so a resumed run never records a trial twice (a kill after the checkpoint write
    and before the call would lose that one record: the ``acc_dev`` point a resumed run finds
    missing from
    :meth:`dev_steps` it logs again)."""

    def log_dev(self, trial: int, accuracy: float, best: float) -> None:
        """The dev accuracy of trial ``trial`` (0: the baseline) and the best so far."""

    def dev_steps(self) -> set[int]:
        """The trials whose dev accuracy :meth:`log_dev` has recorded (asked by a resumed run
        only)."""

    def log_targets(self, targeting: Targeting) -> None:
        """The baseline's blame and the targets chosen from it (recorded once, by the leading
        worker)."""

    def open_trial(
        self, trial: int, tags: Mapping[str, str] | None
    ) -> AbstractContextManager[str]:
        """A record for one trial (a child run), open while the trial is evaluated; yields its id.
        The record must be findable by the trial number alone (see :meth:`discard_trial`)."""

    def log_trial(
        self,
        trial: int,
        candidate: Candidate,
        evaluation: Evaluation,
        *,
        base: Candidate,
        diff: str,
    ) -> None:
        """The trial's candidate, evaluation and prompt diff against ``base``, into its open
        record."""

    def discard_trial(self, trial: int) -> None:
        """Delete every record of trial ``trial``, which a kill left half done (it is redone under
        the same number). Only this worker ever holds a trial number, so every such record is its
        own."""

    def log_summary(self, summary: Summary) -> None:
        """The run's final metrics and artifacts."""

    def register(self, texts: Mapping[str, str], *, promote: bool, message: str) -> dict[str, Any]:
        """New registry versions of the changed prompts (moving ``champion`` when ``promote``);
        what was registered, per site."""

    def tag_result(self, promoted: bool, reason: str, note: str) -> None:
        """Why the champion moved or not, and the run's note."""


@dataclass(frozen=True)
class TrialRecord:
    """One evaluated trial as the finisher sees it (this worker's or, shared, any worker's)."""

    trial: int
    accuracy: float
    candidate: Candidate
    # A race stopped its dev evaluation: its accuracy is on the questions it answered, and it
    # never becomes the run's best.
    stopped: bool = False


class Coordinator(Protocol):
    """Who does what when one or several workers run the same loop.

    :class:`~optloop.loop.workers.coordinator.LocalCoordinator` is one worker; the shared one
    splits the budget between the workers of one Optuna study (:mod:`optloop.loop.workers.study`).
    """

    @property
    def leads(self) -> bool:
        """Whether this worker evaluates the baseline and records run-level metrics."""

    @property
    def scope(self) -> str:
        """Appended to notes about this worker's own trials (``" by this worker"`` when shared)."""

    def wait_for_baseline(self) -> tuple[Evaluation, Evaluation] | None:
        """The leader's (train, dev) baseline; ``None`` when this worker evaluates it."""

    def publish_baseline(self, train: Evaluation, dev: Evaluation) -> None:
        """Hand the baseline to the other workers (the leader only)."""

    def wait_for_control(self) -> Evaluation | None:
        """The leader's evaluation of the control on dev; ``None`` when this worker evaluates
        it."""

    def publish_control(self, dev: Evaluation) -> None:
        """Hand the control's dev evaluation to the other workers (the leader only)."""

    def republish(self, trials: Sequence[Trial]) -> None:
        """Report evaluated trials a kill kept from being reported."""

    def budget_left(self, trials: Sequence[Trial]) -> bool:
        """Whether this worker may try to take another trial (``trials``: this worker's
        checkpoint)."""

    def upcoming(self, trials: Sequence[Trial]) -> int:
        """The number the next trial will probably get (for progress messages)."""

    def room(self, trials: Sequence[Trial]) -> int:
        """How many trials are left to take, at most (a batch is no larger)."""

    def take(
        self, trials: Sequence[Trial], candidate: Candidate, study_trial: int | None
    ) -> int | None:
        """The trial number ``candidate`` is evaluated as; ``None`` when the budget went to other
        workers."""

    def trial_tags(self) -> dict[str, str] | None:
        """Tags for a trial's record (which worker ran it)."""

    def report(self, trial: Trial, cost: Callable[[], Cost]) -> None:
        """An evaluated trial, checkpointed: tell the other workers (``cost``: what this worker's
        processes have spent on the run so far)."""

    def best_accuracy(self, mine: float, baseline: float) -> float:
        """The run's best dev accuracy so far, given this worker's best."""

    def settle(self, finish: Callable[[], LoopResult], cost: Callable[[], Cost]) -> LoopResult:
        """After this worker's last trial: ``finish()`` when this worker finishes the run, else the
        result of the worker that did."""

    def records(self, trials: Sequence[Trial]) -> list[TrialRecord]:
        """Every evaluated trial of the run, by trial number (``trials``: this worker's
        checkpoint)."""

    def others_cost(self) -> dict[str, float]:
        """What the other workers spent, every process of theirs (added to this one's cost in the
        result)."""

    def publish(self, result: LoopResult) -> LoopResult:
        """Hand the final result to the other workers; the result as every worker returns it."""


__all__ = [
    "CandidateEvaluator",
    "Coordinator",
    "Split",
    "Summary",
    "Targeting",
    "TrackingSink",
    "TrialRecord",
]
