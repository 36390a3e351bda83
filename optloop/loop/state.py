"""What a loop run persists and returns: checkpoint, trials, result; and, from
:mod:`optloop.loop.config` where it is defined, what it is configured by (:class:`LoopConfig`).

These are plain data (pydantic models): the controller (:mod:`optloop.loop.controller`)
reads and writes them, the checkpoint file holds them between runs, and every
worker of a shared run exchanges them. Nothing here does I/O except
:meth:`Checkpoint.save` and :meth:`Checkpoint.load`. See ``docs/architecture.md``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from optloop.attribution.taxonomy import Target
from optloop.errors import ConfigError
from optloop.loop.candidate import Candidate

# Defined in optloop.loop.config (imported without the loop's libraries), read here as before.
from optloop.loop.config import MAX_BATCH as MAX_BATCH
from optloop.loop.config import MAX_BUDGET as MAX_BUDGET
from optloop.loop.config import LoopConfig as LoopConfig
from optloop.loop.config import _digest as _digest
from optloop.loop.config import check_fractions as check_fractions
from optloop.loop.evaluate import Evaluation
from optloop.loop.racing import RaceSpend
from optloop.paths import write_atomic
from optloop.stats import Interval

Cost = dict[str, int | float]
PROCESSES = "processes"  # the cost key that counts the processes that worked on a run


def add_costs(a: Mapping[str, int | float], b: Mapping[str, int | float]) -> Cost:
    """``a + b`` key by key (seconds rounded to 0.1, dollars to 1e-9; counts stay whole
    numbers)."""
    out: Cost = dict(a)
    for key, value in b.items():
        total = out.get(key, 0) + value
        out[key] = (
            round(total, 9 if "cost_usd" in key else 1) if isinstance(total, float) else total
        )
    return out


class Trial(BaseModel):
    trial: int
    candidate: Candidate
    evaluation: Evaluation | None = None
    child_run_id: str | None = None
    improved: bool = False


class Recheck(BaseModel):
    """The headroom checked again after a stall (:meth:`Controller._recheck`): what it found, and
    the sites the budget left because of it."""

    after_trial: int = Field(description="the trial after which it was checked")
    left: list[str] = Field(
        default_factory=list, description="the sites the budget left ([]: it stayed)"
    )
    line: str = Field(description="what it found, as the run's progress and summary say it")


_ROUND = re.compile(r"\bround (\d+)\b")  # in a candidate's origin: "edit round 2: ..."


class Checkpoint(BaseModel):
    """A run's state between processes: everything evaluated, and what every process spent.

    Cost (see :meth:`total_cost`): ``spent`` sums the processes before this one, ``spending`` is
    this process's own so far (rewritten with every save, so a kill loses only what it spent since
    the last one), ``processes`` counts them all, this one included.
    """

    config_digest: str
    resume_key: str | None = Field(
        None, description="LoopConfig.resume_key(): how the same command finds the run"
    )
    auto_named: bool = Field(
        False, description="started without --run-name (so the same command resumes it)"
    )
    worker: str = Field(
        default_factory=lambda: uuid.uuid4().hex[:12],
        description="this worker's id in a shared study (kept across resumes)",
    )
    parent_run_id: str | None = None
    split: dict[str, list[str]] = Field(default_factory=dict)
    baseline_train: Evaluation | None = None
    baseline_dev: Evaluation | None = None
    targets: list[str] = Field(default_factory=list)
    trials: list[Trial] = Field(default_factory=list)
    queue: list[Candidate] = Field(default_factory=list)
    rounds: int | None = Field(
        None,
        description="rounds the optimizer had run at the last save (None: a checkpoint saved "
        "before optloop kept the count; resume reads it from the trials' origins)",
    )
    test_before: Evaluation | None = None
    test_after: Evaluation | None = None
    control_dev: Evaluation | None = Field(
        None, description="the trivial-instruction control on dev (optloop.loop.trivial_control)"
    )
    control_test: Evaluation | None = Field(
        None, description="the trivial-instruction control on test"
    )
    control_train: Evaluation | None = Field(
        None,
        description="the control on train, when dev alone could not tell whether the blamed "
        "sites' prompt matters (Controller._headroom)",
    )
    rechecks: list[Recheck] = Field(
        default_factory=list,
        description="the headroom checked again after each stall (--stall), in trial order",
    )
    registered: dict[str, Any] = Field(default_factory=dict)
    finished: bool = False
    spent: Cost = Field(
        default_factory=dict, description="what the earlier processes of this run spent, summed"
    )
    spending: Cost = Field(default_factory=dict, description="what this process has spent so far")
    processes: int = Field(0, description="processes that worked on this run, this one included")

    def begin_process(self) -> None:
        """A new process takes the run over: what the last one spent becomes part of ``spent``."""
        self.spent = add_costs(self.spent, self.spending)
        self.spending = {}
        self.processes += 1

    def total_cost(self, spending: Cost | None = None) -> Cost:
        """What every process of the run spent (``spending``: this process's, if newer than the
        saved one), with ``processes``."""
        total = add_costs(self.spent, self.spending if spending is None else spending)
        total[PROCESSES] = max(self.processes, 1)
        return total

    def progress(self, budget: int) -> str:
        """Where the run stands, in a few words ("2 of 3 trials done")."""
        if self.baseline_dev is None:
            return "the baseline not yet evaluated"
        done = sum(t.evaluation is not None for t in self.trials)
        if self.test_before is not None or done >= budget:
            return f"{done} of {budget} trials done, the held-out test under way"
        return f"{done} of {budget} trials done"

    def optimizer_rounds(self) -> int:
        """The rounds the optimizer had run: the saved count, or, in a checkpoint saved before the
        count was kept, the highest "round N" its trials and queue are named after (an edit,
        SIMBA or GEPA round names its candidates so)."""
        if self.rounds is not None:
            return self.rounds
        named = [*(t.candidate for t in self.trials), *self.queue]
        return max((int(m[1]) for c in named if (m := _ROUND.search(c.origin))), default=0)

    def save(self, path: Path) -> None:
        write_atomic(path, self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            return cls.model_validate_json(path.read_text())
        except Exception as exc:  # noqa: BLE001 - a corrupt checkpoint is the user's to remove
            raise ConfigError(
                f"checkpoint {path} is unreadable ({type(exc).__name__}); delete that run "
                "directory or pick another --run-name"
            ) from None


class Tried(BaseModel):
    """One evaluated candidate, for the summary: what the optimizer tried and how it scored on
    dev."""

    trial: int
    origin: str
    changed: list[str]
    dev: float
    stopped: bool = Field(
        False,
        description="a race stopped it on dev: its dev figure is on the questions it answered",
    )

    @classmethod
    def of(
        cls, trial: int, candidate: Candidate, dev: float, base: Candidate, stopped: bool = False
    ) -> Tried:
        return cls(
            trial=trial,
            origin=candidate.origin,
            dev=dev,
            stopped=stopped,
            changed=candidate.changed_sites(base)
            + [str(Target.knob(k)) for k in candidate.changed_knobs(base)],
        )


class LoopResult(BaseModel):
    config: LoopConfig
    parent_run_id: str
    targets: list[str]
    tunable_sites: list[str]
    tunable_knobs: list[str]
    baseline_dev: float
    best_dev: float
    best_trial: int
    test_before: float
    test_after: float
    evaluations: int
    changed_sites: list[str]
    changed_knobs: dict[str, Any]
    promoted: bool
    promotion_reason: str = Field(
        description="why the champion alias moved or did not (see promotion())"
    )
    registered: dict[str, Any]
    cost: dict[str, int | float]
    n_dev: int = Field(description="dev questions")
    n_test: int = Field(description="held-out test questions")
    test_before_ci: Interval = Field(
        description="baseline's test accuracy, bootstrap CI over test questions"
    )
    test_after_ci: Interval = Field(
        description="best candidate's test accuracy, bootstrap CI over test questions"
    )
    delta_test_ci: Interval = Field(
        description="after - before per test question, paired bootstrap CI"
    )
    tried: list[Tried] = Field(
        default_factory=list, description="every evaluated candidate, in trial order"
    )
    prompt_diff: str = Field(
        "", description="unified diff of the start prompts and the best candidate's"
    )
    note: str = ""
    proposals: dict[str, int] = Field(
        default_factory=dict,
        description="the optimizer's proposals by the proposal gate's verdict: 'passed' or the "
        "reason each was refused (optloop.loop.proposals.gate)",
    )
    failed_calls: dict[str, int] = Field(
        default_factory=dict,
        description="LM calls that failed after their retries, per figure "
        "(baseline_dev, best_dev, test_before, test_after, control_dev, control_test); "
        "absent: none",
    )
    control_sites: list[str] = Field(
        default_factory=list,
        description="the sites the trivial-instruction control gave DSPy's default instruction "
        "(optloop.loop.trivial_control); empty: no control, control_note says why",
    )
    control_note: str = Field("", description="why the run has no control ('': it has one)")
    control_dev: float | None = Field(None, description="the control's dev accuracy")
    test_control_ci: Interval | None = Field(
        None, description="the control's test accuracy, bootstrap CI over test questions"
    )
    delta_control_ci: Interval | None = Field(
        None, description="best - control per test question, paired bootstrap CI"
    )
    beats_control: bool | None = Field(
        None,
        description="whether the best measurably beats the control on test (delta_control_ci "
        "above 0); None: no control",
    )
    racing: RaceSpend | None = Field(
        None,
        description="the dev questions and LLM calls this worker's trials spent, against full "
        "evaluations (what racing saved; nothing stopped under --no-race)",
    )
    headroom: str = Field(
        "",
        description="whether the blamed sites' prompt can matter: the start program against the "
        "control on the same dev questions (optloop.loop.trivial_control.Headroom); '': no "
        "control",
    )
    power: str = Field(
        "",
        description="what the splits can show: the smallest held-out gain at the baseline's "
        "accuracy, against --min-gain (optloop.loop.policy.power_line)",
    )

    @property
    def delta_test(self) -> float:
        return self.test_after - self.test_before

    @property
    def test_control(self) -> float | None:
        """The control's test accuracy (``None``: no control)."""
        return None if self.test_control_ci is None else self.test_control_ci.estimate
