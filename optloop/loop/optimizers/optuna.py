"""Optuna: TPE over, per blamed site, the seed instruction and rewrites an LLM proposer writes from
the attributions, plus the values of blamed knobs (each system's ``knob_values``); ask and tell,
and with ``--batch K`` K asks before their tells (the trials asked meanwhile are running, as in
Optuna's own ``n_jobs``). The study lives in ``--storage`` (SQLite by default), so it resumes; with
``postgresql://...`` several workers share it (see :mod:`optloop.loop.workers.study`).

:func:`work` models its proposer calls for ``--estimate``.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from optloop.errors import ConfigError
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.optimizers.base import Optimizer
from optloop.loop.optimizers.propose import ProposeInstruction, propose_instruction
from optloop.loop.optimizers.registry import OPTUNA
from optloop.loop.proposals.writer import failure_summary
from optloop.loop.spending.estimate import OptimizerWork
from optloop.loop.spending.shape import CHARS_PER_TOKEN, JSON_TOKENS, RunShape, template_tokens
from optloop.loop.workers.study import SharedStudy

if TYPE_CHECKING:
    from optloop.loop.evaluate import Evaluation


logger = logging.getLogger(__name__)


MAX_BUDGET_SLOTS = 500


class OptunaOptimizer(Optimizer):
    """TPE over LLM-proposed instructions per blamed site and the values of blamed knobs.

    The study is a :class:`~optloop.loop.workers.study.SharedStudy`: several workers may ask it for
    trials at once. Each site's candidate instructions are proposed once per study (first
    proposer wins, the others wait for its list), so every worker searches the same space; a
    candidate is claimed before it is evaluated, so no two workers evaluate the same one.
    """

    name = OPTUNA
    max_duplicates = 20
    # instructions proposed per site (the default; also what --estimate's model assumes:
    # overhead.py)
    PROPOSALS = 3

    def __init__(
        self,
        *args: Any,
        storage: str | None = None,
        study_name: str | None = None,
        shared: SharedStudy | None = None,
        budget: int = MAX_BUDGET_SLOTS,
        proposals: int = PROPOSALS,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if shared is None:  # a study of its own (one worker)
            if storage is None or study_name is None:
                raise ConfigError(
                    "OptunaOptimizer needs a shared study, or a storage URL and a study name"
                )
            shared = SharedStudy(
                storage, study_name, worker=uuid.uuid4().hex[:12], budget=budget, seed=self.seed
            )
            shared.join("standalone")
        self.shared = shared
        self.study = shared.study
        self.proposals = proposals
        self.pending: dict[str, Any] = {}
        self.duplicates = 0
        self._base_knobs = dict(self.evaluator.baseline().knobs)
        self._fail_my_stale_trials()

    def _fail_my_stale_trials(self) -> None:
        """Trials this worker asked for in an interrupted run of it: they were never told."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get("optloop:worker") == self.shared.worker:
                self.study.tell(t.number, state=TrialState.FAIL)

    def _instructions(self, site: str, base: Candidate, best_eval: Evaluation) -> list[str]:
        key = f"instructions:{site}"
        stored = self.shared.get(key)
        # proposals are made once per study, so every worker and a resumed study see the same
        # space
        if stored is not None:
            return list(stored)
        holder = self.shared.claim(f"optloop:proposing:{site}", {"worker": self.shared.worker})[
            "worker"
        ]
        if holder != self.shared.worker:
            stored = self.shared.wait_for(
                key, holder=holder, what=f"candidate instructions for {site}"
            )
            if stored is not None:
                return list(stored)
            logger.warning(
                "%s stopped before proposing for %s; proposing here",
                self.shared.describe(holder),
                site,
            )
        seed_text = base.sites[site].instructions
        failures = failure_summary(best_eval.attributions(), site)
        texts = [seed_text]
        for i in range(self.proposals):
            text = propose_instruction(
                self.proposer, site, seed_text, failures, rollout=i, gate=self.gate
            )
            if text and text not in texts:
                texts.append(text)
        return list(self.shared.claim(key, texts))

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        from optuna.trial import TrialState

        spaces = {f"site:{s}": self._instructions(s, best, best_eval) for s in self.sites}
        # knob values around the baseline's, not the best's: a categorical's choices may never
        # change in a study
        spaces |= {
            f"knob:{k}": self.evaluator.knob_choices(k, self._base_knobs.get(k))
            for k in self.knobs
            if k in best.knobs
        }
        spaces = {name: choices for name, choices in spaces.items() if len(choices) > 1}
        if not spaces:
            return None
        while self.duplicates < self.max_duplicates:
            self.rounds += 1
            trial = self.study.ask()
            trial.set_user_attr("optloop:worker", self.shared.worker)
            sites = dict(best.sites)
            knobs = dict(best.knobs)
            for name, choices in spaces.items():
                index = trial.suggest_categorical(name, list(range(len(choices))))
                kind, target = name.split(":", 1)
                if kind == "site":
                    sites[target] = SiteState(
                        instructions=choices[index], demos=best.sites[target].demos
                    )
                else:
                    knobs[target] = choices[index]
            candidate = Candidate(sites=sites, knobs=knobs, origin=f"optuna trial {trial.number}")
            digest = candidate.digest()
            # asked again while a batch evaluates it: no value to tell yet
            if digest in self.pending:
                self.study.tell(trial, state=TrialState.FAIL)
                self.duplicates += 1
                continue
            if digest in self.seen:
                previous = [
                    t
                    for t in self.study.trials
                    if t.params == trial.params and t.value is not None
                ]
                # already evaluated: no budget spent
                self.study.tell(trial, previous[0].value if previous else 0.0)
                self.duplicates += 1
                continue
            self.seen.add(digest)
            owner = self.shared.claim_candidate(digest, trial.number)
            # another worker has it: its result, when known, is ours
            if owner["worker"] != self.shared.worker:
                trial.set_user_attr("optloop:duplicate_of", owner["study_trial"])
                theirs = [
                    t
                    for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.number == owner["study_trial"]
                ]
                if theirs:
                    self.study.tell(trial, theirs[0].value)
                else:
                    self.study.tell(trial, state=TrialState.FAIL)
                self.duplicates += 1
                continue
            trial.set_user_attr("optloop:digest", digest)
            self.pending[digest] = trial
            return candidate
        logger.warning(
            "optuna keeps proposing evaluated candidates: the search space is exhausted"
        )
        return None

    def propose_batch(self, best: Candidate, best_eval: Evaluation, size: int) -> list[Candidate]:
        """``size`` asks before any tell (as Optuna's own ``n_jobs`` keeps several trials running),
        in this thread, so the batch depends on the seed and its size alone; with more than one,
        TPE's ``constant_liar`` counts the running ones as bad, which keeps a batch's asks
        apart."""
        if size > 1 and not getattr(self.study.sampler, "_constant_liar", True):
            import optuna

            self.study.sampler = optuna.samplers.TPESampler(
                seed=self.seed + 7919 * max(self.shared.rank, 0), constant_liar=True
            )
        batch: list[Candidate] = []
        while len(batch) < size and (candidate := self.propose(best, best_eval)) is not None:
            batch.append(candidate)
        return batch

    def observe(self, candidate: Candidate, evaluation: Evaluation, trial: int) -> None:
        from optuna.trial import TrialState

        optuna_trial = self.pending.pop(candidate.digest(), None)
        if optuna_trial is None:
            return
        optuna_trial.set_user_attr("optloop:trial", trial)
        if evaluation.stopped is not None:
            # A race stopped it on dev: a pruned trial, its accuracy on the questions it answered
            # as its last intermediate value (what TPE ranks pruned trials by).
            optuna_trial.report(evaluation.accuracy, evaluation.n)
            self.study.tell(optuna_trial, state=TrialState.PRUNED)
        else:
            self.study.tell(optuna_trial, evaluation.accuracy)

    def release(self, candidate: Candidate) -> None:
        from optuna.trial import TrialState

        optuna_trial = self.pending.pop(candidate.digest(), None)
        if optuna_trial is not None:  # the budget went to other workers: not evaluated
            self.study.tell(optuna_trial, state=TrialState.FAIL)

    def study_trial(self, candidate: Candidate) -> int | None:
        optuna_trial = self.pending.get(candidate.digest())
        return None if optuna_trial is None else optuna_trial.number


# --- its cost model (--estimate) ---------------------------------------------------------


def work(shape: RunShape) -> OptimizerWork:
    """``--optimizer optuna``'s cost model: ``PROPOSALS`` proposer calls per target site, once
    per study, up front; no runs on train. The proposals for sites a retarget adds are not
    modeled."""
    opt = OptunaOptimizer
    calls = opt.PROPOSALS * len(shape.sites)
    prompt = sum(
        template_tokens(ProposeInstruction)
        + shape.instruction_tokens(s)
        + shape.failure_chars.get(s, 0) / CHARS_PER_TOKEN
        for s in shape.sites
    ) / max(len(shape.sites), 1)
    completion = (
        sum(shape.instruction_tokens(s) for s in shape.sites) / max(len(shape.sites), 1)
        + JSON_TOKENS
    )
    return shape.work(
        opt.name,
        rounds=0,
        trials_per_round=0,
        question_runs=0,
        episode_ingests=0,
        proposer_calls=calls,
        prompt_tokens=prompt,
        completion_tokens=completion,
        threads=None,
        basis=(
            f"{opt.PROPOSALS} proposed instructions per target site ({len(shape.sites)}), once, "
            "up front; no runs on train"
        ),
    )
