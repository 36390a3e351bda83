"""Who does what when one worker, or several, run the same loop: the
controller's :class:`~optloop.loop.interfaces.Coordinator`.

:class:`LocalCoordinator` is one worker: it evaluates the baseline, numbers trials from its
checkpoint and finishes the run itself. :class:`SharedCoordinator` is one worker of several
sharing one Optuna study (:class:`~optloop.loop.workers.study.SharedStudy`, ``--optimizer
optuna``): the first worker (the leader) creates the MLflow parent run and evaluates the baseline
and the trivial-instruction control on dev (:mod:`optloop.loop.trivial_control`), handing both over
through the study, every worker takes budget slots from the study, and the worker that sees
the last evaluation done finishes the run (the control's test evaluation included) while the
others wait for its result. The controller
(:mod:`optloop.loop.controller`) calls both the same way; ``Loop``
(:mod:`optloop.loop.runs.runner`) also asks them about the parent run and the Optuna optimizer's
study. See ``docs/architecture.md``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from optloop.errors import ConfigError, OptloopError
from optloop.lm import redact_url
from optloop.loop.candidate import Candidate
from optloop.loop.evaluate import Evaluation
from optloop.loop.interfaces import TrialRecord
from optloop.loop.state import Cost, LoopConfig, LoopResult, Trial
from optloop.loop.workers.study import SharedStudy

logger = logging.getLogger(__name__)

RESULT_KEY = "optloop:result"
PARENT_KEY = "optloop:parent_run_id"
FINISHER_KEY = "optloop:finisher"
CONTROL_KEY = "optloop:control_dev"


class LocalCoordinator:
    """One worker: the whole budget, numbered by its own checkpoint.

    ``storage`` and ``study_name`` are the Optuna optimizer's own study (only
    ``--optimizer optuna`` uses them).
    """

    leads = True
    scope = ""

    def __init__(self, budget: int, *, storage: str | None = None, study_name: str | None = None):
        self.budget = budget
        self.storage = storage
        self.study_name = study_name

    # --- the controller's interface ------------------------------------------------------

    def wait_for_baseline(self) -> tuple[Evaluation, Evaluation] | None:
        return None

    def publish_baseline(self, train: Evaluation, dev: Evaluation) -> None:
        pass

    def wait_for_control(self) -> Evaluation | None:
        return None

    def publish_control(self, dev: Evaluation) -> None:
        pass

    def republish(self, trials: Sequence[Trial]) -> None:
        pass

    def budget_left(self, trials: Sequence[Trial]) -> bool:
        return len(trials) < self.budget

    def upcoming(self, trials: Sequence[Trial]) -> int:
        return len(trials) + 1

    def room(self, trials: Sequence[Trial]) -> int:
        return self.budget - len(trials)

    def take(
        self, trials: Sequence[Trial], candidate: Candidate, study_trial: int | None
    ) -> int | None:
        return len(trials) + 1

    def trial_tags(self) -> dict[str, str] | None:
        return None

    def report(self, trial: Trial, cost: Callable[[], Cost]) -> None:
        pass

    def best_accuracy(self, mine: float, baseline: float) -> float:
        return mine

    def settle(self, finish: Callable[[], LoopResult], cost: Callable[[], Cost]) -> LoopResult:
        return finish()

    def records(self, trials: Sequence[Trial]) -> list[TrialRecord]:
        return [
            TrialRecord(
                t.trial, t.evaluation.accuracy, t.candidate, stopped=not t.evaluation.complete
            )
            for t in trials
            if t.evaluation is not None
        ]

    def others_cost(self) -> dict[str, float]:
        return {}

    def publish(self, result: LoopResult) -> LoopResult:
        return result

    # --- the wiring's interface ----------------------------------------------------------

    def leader_parent_run_id(self) -> str | None:
        """The parent run another worker created (``None``: this worker creates it)."""
        return None

    def adopt_parent_run(self, run_id: str) -> None:
        """Record ``run_id`` as the run's one parent run."""

    def finished_elsewhere(self) -> bool:
        """Whether another worker finished the run (so this worker's failure did not fail it)."""
        return False

    def optimizer_kwargs(self) -> dict[str, Any]:
        """What the Optuna optimizer needs to open its study."""
        return {"storage": self.storage, "study_name": self.study_name, "budget": self.budget}

    def close(self) -> None:
        pass


class SharedCoordinator:
    """One worker of a run shared through an Optuna study (see the module docstring and
    :mod:`optloop.loop.workers.study` for the records it keeps)."""

    scope = " by this worker"

    def __init__(
        self, study: SharedStudy, config: LoopConfig, progress: Callable[[str], None] | None = None
    ):
        self.study = study
        self.config = config
        self.progress = progress or (lambda message: None)

    @classmethod
    def join(
        cls,
        config: LoopConfig,
        storage: str,
        worker: str,
        progress: Callable[[str], None] | None = None,
    ) -> SharedCoordinator:
        """Open the study named after the run, refuse a finished run or other settings, and take a
        rank."""
        study = SharedStudy(
            storage, config.run_name, worker=worker, budget=config.budget, seed=config.seed
        )
        try:
            if study.get(RESULT_KEY) is not None:
                raise ConfigError(
                    f"run {config.run_name!r} already finished (MLflow run "
                    f"{study.get(PARENT_KEY)}); "
                    "pick another --run-name to run again"
                )
            rank = study.join(config.digest(shared=True))
        except BaseException:
            study.close()
            raise
        coordinator = cls(study, config, progress)
        if rank:
            coordinator.progress(f"joined run {config.run_name} as worker {rank}")
            logger.info("joined study %s as worker %d (%s)", config.run_name, rank, worker)
        return coordinator

    @property
    def leads(self) -> bool:
        return self.study.leader

    def wait_for_leader(self, key: str, what: str) -> Any:
        """The value the leader publishes under ``key``; an OptloopError if it stopped before."""
        leader = self.study.leader_id() or ""
        value = self.study.wait_for(key, holder=leader, what=what, progress=self.progress)
        if value is None:
            raise OptloopError(
                f"{self.study.describe(leader)}, the first worker of run "
                f"{self.config.run_name!r}, "
                f"stopped before publishing {what}; rerun the same command on that host to "
                "resume it"
            )
        return value

    # --- the controller's interface ------------------------------------------------------

    def wait_for_baseline(self) -> tuple[Evaluation, Evaluation] | None:
        if self.leads:
            return None
        train, dev = (
            Evaluation.model_validate(
                self.wait_for_leader(f"optloop:baseline_{split}", "the baseline evaluation")
            )
            for split in ("train", "dev")
        )
        return train, dev

    def publish_baseline(self, train: Evaluation, dev: Evaluation) -> None:
        if self.leads:
            for split, evaluation in (("train", train), ("dev", dev)):
                self.study.claim(f"optloop:baseline_{split}", evaluation.model_dump(mode="json"))

    def wait_for_control(self) -> Evaluation | None:
        """The leader's evaluation of the control on dev (asked by the worker that finishes the
        run, once the leader has evaluated it before its trials)."""
        if self.leads:
            return None
        return Evaluation.model_validate(
            self.wait_for_leader(CONTROL_KEY, "the control's evaluation on dev")
        )

    def publish_control(self, dev: Evaluation) -> None:
        if self.leads:
            self.study.claim(CONTROL_KEY, dev.model_dump(mode="json"))

    def republish(self, trials: Sequence[Trial]) -> None:
        done = self.study.done()
        for t in trials:
            if t.trial - 1 not in done and t.evaluation is not None:
                self.study.publish_done(t.trial - 1, done_record(t))

    def budget_left(self, trials: Sequence[Trial]) -> bool:
        return self.study.can_take()

    def upcoming(self, trials: Sequence[Trial]) -> int:
        return len(self.study.slots()) + 1

    def room(self, trials: Sequence[Trial]) -> int:
        return self.study.budget - len(self.study.slots()) + len(self.study.my_open_slots())

    def take(
        self, trials: Sequence[Trial], candidate: Candidate, study_trial: int | None
    ) -> int | None:
        slot = self.study.take_slot(candidate.digest(), study_trial)
        return None if slot is None else slot + 1

    def trial_tags(self) -> dict[str, str] | None:
        return {"optloop.worker": f"{self.study.rank}:{self.study.worker}"}

    def report(self, trial: Trial, cost: Callable[[], Cost]) -> None:
        self.study.publish_done(trial.trial - 1, done_record(trial))
        self.study.put_cost(cost())

    def best_accuracy(self, mine: float, baseline: float) -> float:
        return self.study.best_accuracy(baseline)

    def settle(self, finish: Callable[[], LoopResult], cost: Callable[[], Cost]) -> LoopResult:
        """Leave the trial loop, then finish the run if every evaluation is done and no other
        worker does it, else wait for the worker that finishes it; every worker returns the same
        result."""
        study = self.study
        if voided := study.void_my_open_slots():
            logger.warning(
                "trial(s) %s of an interrupted run of this worker were not redone: nothing "
                "new to propose",
                ", ".join(str(k + 1) for k in voided),
            )
        study.put_cost(cost())
        study.leave()
        while True:
            result = study.get(RESULT_KEY)
            if result is not None:
                return LoopResult.model_validate(result)
            settled, waiting_on = study.settled()
            if settled:
                finisher = study.claim(FINISHER_KEY, study.worker)
                if finisher == study.worker:
                    return finish()
                waiting_on = [finisher]
            dead = [w for w in waiting_on if not study.alive(w)]
            if dead:
                raise OptloopError(
                    f"{study.describe(dead[0])} of run {self.config.run_name!r} stopped before "
                    "its part was done; rerun the same command on that host to resume it (this "
                    "worker's trials are saved)"
                )
            self.progress(
                "budget spent or taken; waiting for "
                f"{', '.join(study.describe(w) for w in waiting_on)} "
                "to finish the run"
            )
            time.sleep(study.poll)

    def records(self, trials: Sequence[Trial]) -> list[TrialRecord]:
        done = sorted(self.study.results().values(), key=lambda d: d["trial"])
        return [
            TrialRecord(
                d["trial"],
                d["accuracy"],
                Candidate.model_validate(d["candidate"]),
                stopped=bool(d.get("stopped")),
            )
            for d in done
        ]

    def others_cost(self) -> dict[str, float]:
        return self.study.others_cost()

    def publish(self, result: LoopResult) -> LoopResult:
        shared = shareable(result)
        self.study.claim(RESULT_KEY, shared)
        return LoopResult.model_validate(shared)  # the very result every other worker prints

    # --- the wiring's interface ----------------------------------------------------------

    def leader_parent_run_id(self) -> str | None:
        """The leader's parent run, once it published it (``None`` when this worker leads)."""
        return None if self.leads else self.wait_for_leader(PARENT_KEY, "the MLflow parent run")

    def adopt_parent_run(self, run_id: str) -> None:
        """The leader records ``run_id`` as the one parent run; a study with another one is
        refused."""
        if self.leads and self.study.claim(PARENT_KEY, run_id) != run_id:
            raise ConfigError(
                f"study {self.config.run_name!r} already has another MLflow parent run; pick "
                "another --run-name"
            )

    def finished_elsewhere(self) -> bool:
        return bool(self.study.get(RESULT_KEY))

    def optimizer_kwargs(self) -> dict[str, Any]:
        return {"shared": self.study}

    def close(self) -> None:
        self.study.close()


def done_record(trial: Trial) -> dict[str, Any]:
    """What the other workers learn about an evaluated trial."""
    assert trial.evaluation is not None
    return {
        "trial": trial.trial,
        "accuracy": trial.evaluation.accuracy,
        "stopped": not trial.evaluation.complete,
        "child_run_id": trial.child_run_id,
        "candidate": trial.candidate.model_dump(mode="json"),
    }


def shareable(result: LoopResult) -> dict[str, Any]:
    """``result`` as JSON for the other workers, with no password from a storage or tracking
    URL."""
    config = result.config.model_copy(
        update={
            "storage": redact_url(result.config.storage),
            "tracking_uri": redact_url(result.config.tracking_uri),
        }
    )
    return json.loads(result.model_copy(update={"config": config}).model_dump_json())


__all__ = ["LocalCoordinator", "SharedCoordinator", "done_record", "shareable"]
