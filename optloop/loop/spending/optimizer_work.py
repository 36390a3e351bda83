"""The optimizer's own LM work over a run, beside the evaluations: :class:`OptimizerWork`, what
the ``--estimate`` model (:mod:`optloop.loop.spending.estimate`) prices as the optimizer's part.

It is modeled from the optimizer's structure before any trial has finished
(:mod:`optloop.loop.spending.shape`, one model per optimizer, its assumptions in its ``basis``),
and measured on the run's finished trials once the checkpoint has some (:func:`measured_work`: the
run's total less its evaluations, per round of the optimizer, times the rounds the run takes).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from optloop.sites import PROPOSER

if TYPE_CHECKING:
    from optloop.loop.state import Checkpoint


class OptimizerWork(BaseModel):
    """The optimizer's own LM work over the whole run, beside the evaluations: what
    :func:`~optloop.loop.spending.estimate.estimate` prices as the optimizer's part. Modeled from
    the optimizer's structure (:mod:`optloop.loop.spending.shape`) or measured on the run's
    finished trials (:func:`measured_work`)."""

    optimizer: str
    measured: bool = Field(
        False, description="measured on the run's finished trials (else modeled)"
    )
    rounds: int = Field(
        description="the optimizer's rounds over the run (0: its work is done once, up front)"
    )
    trials_per_round: float = Field(
        description="candidates one round yields for the loop to evaluate (0: up front)"
    )
    calls: float = Field(
        description="system-LM requests: the optimizer's runs on train (screening, mini-batches)"
    )
    tokens: float | None = Field(
        description="their tokens, every request computed (None: unknown)"
    )
    proposer_calls: float = Field(
        description="requests to the proposer LM (advice, reflection, paraphrases, ...)"
    )
    proposer_prompt_tokens: float = Field(
        description="their prompt tokens, all calls (a measured work: every token)"
    )
    proposer_completion_tokens: float = Field(
        0.0, description="their completion tokens, all calls"
    )
    cost_usd: float | None = Field(
        None,
        description="dollars, measured (a measured work only; a modeled one is "
        "priced from its tokens)",
    )
    threads: int | None = Field(
        None, description="runs at once on the system LM (None: an evaluation's, --concurrency)"
    )
    basis: str = Field(description="how the figures were made (the estimate's optimizer line)")

    @property
    def proposer_tokens(self) -> float:
        return self.proposer_prompt_tokens + self.proposer_completion_tokens

    def per_trial(self, budget: int) -> float:
        """Requests (both LMs) per trial of a run of ``budget`` trials."""
        return (self.calls + self.proposer_calls) / max(budget, 1)


def measured_work(
    ckpt: Checkpoint, model: OptimizerWork | None, budget: int
) -> OptimizerWork | None:
    """The optimizer's own work over the whole run, measured on the run's finished trials (``None``
    when none has finished: then only ``model`` can say).

    What the optimizer has spent so far is the run's total over every process
    (:meth:`Checkpoint.total_cost`) less its evaluations (the baseline's, the finished trials', a
    held-out one); its proposer calls are those of a ``--proposer-lm`` (``proposer_*``) and the
    system LM's at the proposer site. That is scaled to the whole run by rounds, since an optimizer
    spends a round's work before the round's first trial: when the checkpoint counts the rounds
    begun (:meth:`Checkpoint.optimizer_rounds`), those rounds and as many more as the rest of the
    budget takes at the candidates a round has made so far; else ``model``'s rounds over the
    rounds begun (``k`` trials at ``model``'s trials a round); ``budget / k`` without a model;
    nothing more for an optimizer whose work is done up front (Optuna's proposals,
    ``model.rounds == 0``). Half-done trials and redone steps count as the optimizer's (they are
    neither evaluations nor free).
    """
    done = [t.evaluation for t in ckpt.trials if t.evaluation is not None]
    if not done:
        return None
    evaluations = [
        e
        for e in (ckpt.baseline_train, ckpt.baseline_dev, *done, ckpt.test_before)
        if e is not None
    ]
    if (
        ckpt.test_after is not None
        and ckpt.test_before is not None
        and ckpt.test_after.candidate != ckpt.test_before.candidate
    ):
        evaluations.append(ckpt.test_after)
    # the control's, unless it took the baseline's or a held-out evaluation (the same program)
    made = {
        (e.split, e.candidate)
        for e in (ckpt.baseline_train, ckpt.baseline_dev, ckpt.test_before, ckpt.test_after)
        if e is not None
    }
    for control in (ckpt.control_dev, ckpt.control_test, ckpt.control_train):
        if control is not None and (control.split, control.candidate) not in made:
            evaluations.append(control)
    total = ckpt.total_cost()
    at_site = {key: float(total.get(f"{key}/{PROPOSER}", 0)) for key in ("llm_calls", "tokens")}
    calls = max(
        float(total.get("llm_calls", 0))
        - at_site["llm_calls"]
        - sum(e.llm_calls for e in evaluations),
        0.0,
    )
    tokens = max(
        float(total.get("tokens", 0)) - at_site["tokens"] - sum(e.tokens for e in evaluations), 0.0
    )
    proposer_calls = float(total.get("proposer_llm_calls", 0)) + at_site["llm_calls"]
    proposer_tokens = float(total.get("proposer_tokens", 0)) + at_site["tokens"]
    dollars: float | None = None
    if "cost_usd" in total and all(e.cost_usd is not None for e in evaluations):
        dollars = max(float(total["cost_usd"]) - sum(e.cost_usd or 0.0 for e in evaluations), 0.0)
        if "proposer_cost_usd" in total:
            dollars += float(total["proposer_cost_usd"])
        elif total.get("proposer_model_calls"):  # a --proposer-lm without a price
            dollars = None
    k, seen, observed = len(done), ckpt.optimizer_rounds(), ""
    if model is None:
        rounds, per_round, begun = budget, 1.0, k
    elif model.rounds == 0:
        rounds, per_round, begun = 0, 0.0, 0
    elif seen:
        # The rounds the optimizer has run, and the candidates they made (taken, or queued for
        # the trials to come): the rest of the budget at that many a round.
        begun, proposed = seen, len(ckpt.trials) + len(ckpt.queue)
        per_round, observed = proposed / begun, ", as the rounds so far made them"
        rounds = begun + math.ceil(max(budget - proposed, 0) / per_round)
    else:
        rounds, per_round = model.rounds, model.trials_per_round
        begun = min(rounds, max(math.ceil(k / per_round), 1)) if per_round else rounds
    scale = rounds / begun if begun else 1.0
    how = (
        f"scaled by rounds: {rounds} in the run / {begun} begun ({per_round:.3g} trial(s) a "
        f"round{observed})"
        if begun
        else "nothing more to come: its work is done up front"
    )
    return OptimizerWork(
        optimizer=model.optimizer if model is not None else "optimizer",
        measured=True,
        rounds=rounds,
        trials_per_round=per_round,
        calls=calls * scale,
        tokens=tokens * scale,
        proposer_calls=proposer_calls * scale,
        proposer_prompt_tokens=proposer_tokens * scale,
        cost_usd=None if dollars is None else dollars * scale,
        threads=None if model is None else model.threads,
        basis=(
            f"the {k} finished trial(s): {calls:.0f} requests on train and "
            f"{proposer_calls:.0f} to the proposer "
            f"so far (the run's total less its evaluations), {how}"
        ),
    )


__all__ = ["OptimizerWork", "measured_work"]
