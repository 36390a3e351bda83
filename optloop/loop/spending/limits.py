"""Spending limits (``--max-cost``, ``--max-calls``): when a run stops, and how it says so.

**Limits.** :class:`SpendingLimits` is checked by the controller at step boundaries only:
before each evaluation outside a trial (the baseline's train and dev, the held-out test's
two) and before each trial's proposal. At each of them everything before is checkpointed and
no MLflow child run is open, so stopping there loses nothing and leaves nothing half done;
inside a trial, stopping would throw its evaluation away. What is checked is the run's total
over every process that worked on it (:meth:`~optloop.loop.state.Checkpoint.total_cost`, plus
the other workers' of a shared run): ``--max-calls`` counts the requests the models computed
(``model_calls``, the proposer's included; LM cache hits are free), ``--max-cost`` their
dollars. The check is "has the total reached the limit", so a run may pass its limit by the
cost of one step (one trial or one ``--batch`` of them, or one held-out evaluation): the limit says
when to stop, it does not cut a step short. The limits are not settings of the run (not in
:class:`~optloop.loop.state.LoopConfig`, its digest or resume key): the same command with a
higher limit resumes it.

When a limit is reached the controller raises :class:`RunStopped`: the checkpoint is kept,
``Loop`` ends the MLflow parent run KILLED with the tag ``optloop.stopped_by`` (``max-cost``,
``max-calls``; removed when a later process takes the run up again), and ``optloop.run``
prints which limit stopped it and exits with :data:`EXIT_LIMIT`.

The ``--estimate`` of a run's cost is :mod:`optloop.loop.spending.estimate`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from optloop.failures import ALLOWED_SHARE

MAX_COST, MAX_CALLS, ESTIMATE = "max-cost", "max-calls", "estimate"
STOPPED_BY = "optloop.stopped_by"  # the MLflow parent run's tag: which limit stopped the run
# optloop.run's exit code when a spending limit stopped the run (docs/loop.md, "Resume,
# interrupts and exit codes")
EXIT_LIMIT = 3


class RunStopped(Exception):
    """The run stopped on purpose at a step boundary, its checkpoint complete: ``reason`` is
    ``max-cost``, ``max-calls`` or ``estimate``. Not an error (nothing failed); the same command
    resumes the run."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def run_dollars(cost: Mapping[str, float]) -> float:
    """Dollars of a run's cost dict: the system LM's and a proposer LM's own (0 when nothing priced
    was spent)."""
    return float(cost.get("cost_usd", 0.0)) + float(cost.get("proposer_cost_usd", 0.0))


def run_calls(cost: Mapping[str, float]) -> int:
    """Requests the models computed, of a run's cost dict: the system LM's and a proposer LM's
    own."""
    return int(cost.get("model_calls", 0)) + int(cost.get("proposer_model_calls", 0))


class SpendingLimits(BaseModel):
    """``--max-cost``, ``--max-calls``, ``--estimate`` and ``--max-failed-share`` of one process
    (see the module docstring)."""

    model_config = {"frozen": True}

    max_cost: float | None = Field(None, gt=0, description="USD, over the run's total")
    max_calls: int | None = Field(None, ge=1, description="model calls, over the run's total")
    estimate: bool = Field(
        False, description="stop once the baseline is known (optloop.run --estimate)"
    )
    max_failed_share: float = Field(
        ALLOWED_SHARE,
        ge=0,
        le=1,
        description="the share of an evaluation's LM calls that may fail after their retries "
        "before its figures are withheld (exit code 4; optloop.failures)",
    )

    @property
    def active(self) -> bool:
        """Whether any limit is set (without one, the controller need not add up the run's cost at
        each step)."""
        return self.max_cost is not None or self.max_calls is not None or self.estimate

    def check(self, total: Mapping[str, float], *, baseline_done: bool) -> None:
        """At a step boundary: raise :class:`RunStopped` when ``total`` (the run's cost so far,
        every process) has reached a limit, or when only an estimate was asked for and the baseline
        is known."""
        if self.estimate and baseline_done:
            raise RunStopped(ESTIMATE, "the baseline is evaluated: estimate only (--estimate)")
        if self.max_cost is not None and (spent := run_dollars(total)) >= self.max_cost:
            raise RunStopped(
                MAX_COST, f"--max-cost {self.max_cost:g} reached: the run has spent ${spent:.6f}"
            )
        if self.max_calls is not None and (calls := run_calls(total)) >= self.max_calls:
            raise RunStopped(
                MAX_CALLS,
                f"--max-calls {self.max_calls} reached: the run has made {calls} model calls",
            )


__all__ = [
    "ESTIMATE",
    "EXIT_LIMIT",
    "MAX_CALLS",
    "MAX_COST",
    "STOPPED_BY",
    "RunStopped",
    "SpendingLimits",
    "run_calls",
    "run_dollars",
]
