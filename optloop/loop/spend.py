"""Spending limits (``--max-cost``, ``--max-calls``) and the ``--estimate`` of a run's cost.

**Limits.** :class:`SpendingLimits` is checked by the controller at step boundaries only:
before each evaluation outside a trial (the baseline's train and dev, the held-out test's
two) and before each trial's proposal. At each of them everything before is checkpointed and
no MLflow child run is open, so stopping there loses nothing and leaves nothing half done;
inside a trial, stopping would throw its evaluation away. What is checked is the run's total
over every process that worked on it (:meth:`~optloop.loop.state.Checkpoint.total_cost`, plus
the other workers' of a shared run): ``--max-calls`` counts the requests the models computed
(``model_calls``, the proposer's included; LM cache hits are free), ``--max-cost`` their
dollars. The check is "has the total reached the limit", so a run may pass its limit by the
cost of one step (one trial, or one held-out evaluation): the limit says when to stop, it
does not cut a step short. The limits are not settings of the run (not in
:class:`~optloop.loop.state.LoopConfig`, its digest or resume key): the same command with a
higher limit resumes it.

When a limit is reached the controller raises :class:`RunStopped`: the checkpoint is kept,
``Loop`` ends the MLflow parent run KILLED with the tag ``optloop.stopped_by`` (``max-cost``,
``max-calls``; removed when a later process takes the run up again), and ``optloop.run``
prints which limit stopped it and exits with :data:`EXIT_LIMIT`.

**Estimate** (``--estimate``): the same machinery stops the run right after its baseline
(reason ``estimate``), and :func:`estimate` projects the whole configured run from it.
The model, stated in the output too (:data:`MODEL`):

- the baseline (train and dev): measured, as it ran;
- each of ``--budget`` trials: one evaluation of the dev split, costed as the baseline's dev
  evaluation with every request computed (tokens and dollars per computed call times all
  requests): an upper bound for the evaluation, since a trial reuses the stores of episodes
  whose ingest prompts it leaves unchanged and the LM cache serves repeated calls. Not
  included: the optimizer's own calls (SIMBA's and GEPA's mini-batches on train, the
  proposer), which depend on the optimizer and the blame;
- the held-out test: two evaluations of the test split (baseline and best; one when the
  baseline stays best), the dev evaluation scaled by the splits' work (sessions to ingest plus
  questions to answer);
- hours: requests x the measured mean latency of one computed call / ``--concurrency``. LM time
  only, as if N requests were always in flight: the sessions of one episode are ingested in
  order, so a split with fewer episodes than N, or local work (embedding, scoring), takes
  longer. The baseline's own hours are its measured wall time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.evaluate import Evaluation
    from optloop.loop.state import Checkpoint

MAX_COST, MAX_CALLS, ESTIMATE = "max-cost", "max-calls", "estimate"
STOPPED_BY = "optloop.stopped_by"  # the MLflow parent run's tag: which limit stopped the run
EXIT_LIMIT = 3  # optloop.run's exit code when a spending limit stopped the run (README "Exit codes")


class RunStopped(Exception):
    """The run stopped on purpose at a step boundary, its checkpoint complete: ``reason`` is ``max-cost``,
    ``max-calls`` or ``estimate``. Not an error (nothing failed); the same command resumes the run."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def run_dollars(cost: Mapping[str, float]) -> float:
    """Dollars of a run's cost dict: the system LM's and a proposer LM's own (0 when nothing priced was spent)."""
    return float(cost.get("cost_usd", 0.0)) + float(cost.get("proposer_cost_usd", 0.0))


def run_calls(cost: Mapping[str, float]) -> int:
    """Requests the models computed, of a run's cost dict: the system LM's and a proposer LM's own."""
    return int(cost.get("model_calls", 0)) + int(cost.get("proposer_model_calls", 0))


class SpendingLimits(BaseModel):
    """``--max-cost``, ``--max-calls`` and ``--estimate`` of one process (see the module docstring)."""

    model_config = {"frozen": True}

    max_cost: float | None = Field(None, gt=0, description="USD, over the run's total")
    max_calls: int | None = Field(None, ge=1, description="model calls, over the run's total")
    estimate: bool = Field(False, description="stop once the baseline is known (optloop.run --estimate)")

    @property
    def active(self) -> bool:
        """Whether any limit is set (without one, the controller need not add up the run's cost at each step)."""
        return self.max_cost is not None or self.max_calls is not None or self.estimate

    def check(self, total: Mapping[str, float], *, baseline_done: bool) -> None:
        """At a step boundary: raise :class:`RunStopped` when ``total`` (the run's cost so far, every process)
        has reached a limit, or when only an estimate was asked for and the baseline is known."""
        if self.estimate and baseline_done:
            raise RunStopped(ESTIMATE, "the baseline is evaluated: estimate only (--estimate)")
        if self.max_cost is not None and (spent := run_dollars(total)) >= self.max_cost:
            raise RunStopped(MAX_COST, f"--max-cost {self.max_cost:g} reached: the run has spent ${spent:.6f}")
        if self.max_calls is not None and (calls := run_calls(total)) >= self.max_calls:
            raise RunStopped(MAX_CALLS, f"--max-calls {self.max_calls} reached: the run has made {calls} model calls")


# --- the estimate ---------------------------------------------------------------------------------------------

MODEL = ("baseline: measured (train + dev, wall time); each trial: the baseline's dev evaluation with every request "
         "computed (stores reused and cache hits make it cheaper; the optimizer's own calls, its train mini-batches "
         "and proposals, are not included); held-out test: 2 evaluations of the test split, the dev evaluation scaled "
         "by sessions + questions; hours: requests x mean latency / concurrency, LM time only, as if that many "
         "requests were always in flight (an episode's sessions go in order, so few episodes take longer)")


class Part(BaseModel):
    """One row of the estimate: a part of the run and what it is expected to cost (None: unknown)."""

    part: str
    evaluations: int
    calls: int
    tokens: int | None
    cost_usd: float | None
    hours: float | None


class Estimate(BaseModel):
    """The expected cost of the whole configured run (see the module docstring for the model)."""

    parts: list[Part]
    total: Part
    concurrency: int
    latency_s: float | None = Field(description="mean seconds of one computed call, measured on the baseline's dev")
    priced: bool = Field(description="whether the model has a price (else dollars are unknown)")
    model: str = MODEL


def work_units(dataset: Dataset) -> int:
    """What an evaluation of ``dataset`` has to do: sessions to ingest plus questions to answer."""
    return sum(len(e.sessions) + len(e.questions) for e in dataset.episodes)


def _scaled(dev: Evaluation, evaluations: float, name: str, count: int, concurrency: int) -> Part:
    """``evaluations`` times ``dev`` with every request computed (see the module docstring)."""
    calls = round(dev.llm_calls * evaluations)
    computed = dev.model_calls
    per_call = (lambda value: None if value is None or not computed else value / computed)
    tokens, dollars, latency = per_call(dev.tokens), per_call(dev.cost_usd), per_call(dev.lm_seconds)
    return Part(part=name, evaluations=count, calls=calls, tokens=None if tokens is None else round(calls * tokens),
                cost_usd=None if dollars is None else calls * dollars,
                hours=None if latency is None else calls * latency / concurrency / 3600)


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def estimate(ckpt: Checkpoint, *, budget: int, concurrency: int, dev_units: int, test_units: int) -> Estimate:
    """The whole run of ``budget`` trials, from ``ckpt``'s baseline (train and dev must be evaluated);
    ``dev_units``, ``test_units``: :func:`work_units` of the dev and test splits."""
    train, dev = ckpt.baseline_train, ckpt.baseline_dev
    assert train is not None and dev is not None, "the estimate needs the baseline"
    baseline = Part(part="baseline (measured)", evaluations=2, calls=train.llm_calls + dev.llm_calls,
                    tokens=train.tokens + dev.tokens,
                    cost_usd=_sum([train.cost_usd, dev.cost_usd]),
                    hours=(train.seconds + dev.seconds) / 3600)
    trials = _scaled(dev, budget, f"{budget} trials", budget, concurrency)
    test = _scaled(dev, 2 * test_units / max(dev_units, 1), "held-out test", 2, concurrency)
    parts = [baseline, trials, test]
    total = Part(part="total", evaluations=sum(p.evaluations for p in parts), calls=sum(p.calls for p in parts),
                 tokens=_sum([p.tokens for p in parts]), cost_usd=_sum([p.cost_usd for p in parts]),
                 hours=_sum([p.hours for p in parts]))
    latency = dev.lm_seconds / dev.model_calls if dev.lm_seconds is not None and dev.model_calls else None
    return Estimate(parts=parts, total=total, concurrency=concurrency, latency_s=latency,
                    priced=dev.cost_usd is not None)


__all__ = ["ESTIMATE", "EXIT_LIMIT", "MAX_CALLS", "MAX_COST", "MODEL", "STOPPED_BY", "Estimate", "Part", "RunStopped",
           "SpendingLimits", "estimate", "run_calls", "run_dollars", "work_units"]
