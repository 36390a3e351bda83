"""SIMBA: one SIMBA step per round on the train split (:mod:`~optloop.loop.optimizers.simba_step`),
on :class:`~optloop.loop.program.MemoryProgram` s whose only predictors are the blamed sites and
whose metric returns the attribution beside the score. The program pool and its scores are kept
across rounds (and across a resume, in ``<work>/pool.json``); each round's best new program is
queued (with ``--batch K``, its best K, evaluated at once). The default when an endpoint writes
the instructions (``edit`` on the embedded model,
:func:`optloop.loop.runs.request.default_optimizer`).

Its mini-batch runs are the optimizer's own cost: counted and reported, not evaluations.
:func:`work` models them for ``--estimate`` from the defaults below.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

import dspy

from optloop.loop.candidate import Candidate
from optloop.loop.optimizers.registry import SIMBA
from optloop.loop.optimizers.rounds import RoundsOptimizer
from optloop.loop.optimizers.simba_step import (
    SimbaPool,
    SimbaSettings,
    advice_signature,
    append_advice,
    offer_advice,
    run_example,
    simba_step,
)
from optloop.loop.program import MemoryProgram, attr_name, examples
from optloop.loop.spending.estimate import OptimizerWork
from optloop.loop.spending.shape import (
    FIELD_TOKENS,
    JSON_TOKENS,
    RULE_SHARE,
    RunShape,
    template_tokens,
)

logger = logging.getLogger(__name__)


class SimbaOptimizer(RoundsOptimizer):
    """SIMBA steps on one program pool kept across rounds
    (:mod:`optloop.loop.optimizers.simba_step`)."""

    name = SIMBA
    # the defaults (also what --estimate's model of a step assumes: :func:`work`)
    BSIZE, NUM_CANDIDATES = 6, 2

    def __init__(
        self,
        *args: Any,
        bsize: int = BSIZE,
        num_candidates: int = NUM_CANDIDATES,
        max_demos: int = 2,
        tries: int = 2,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.settings = SimbaSettings(
            bsize=bsize, num_candidates=num_candidates, max_demos=max_demos
        )
        self.tries = tries
        self._pool: SimbaPool | None = None

    @property
    def pool(self) -> SimbaPool:
        """The program pool, read from ``<work>/pool.json`` when a run before this one left it."""
        if self._pool is None:
            self._pool = SimbaPool(self.work / "pool.json", self.seed)
        return self._pool

    def round(self, best: Candidate) -> list[Candidate]:
        train = examples(self.trainset)
        self.settings.num_threads = self.num_threads
        # new to the pool, best first: the best one, or with --batch K the step's best K to
        # evaluate at once
        winners = simba_step(
            self.pool,
            best,
            train,
            build=self.program,
            lm=self.evaluator.lm,
            proposer=self.proposer,
            settings=self.settings,
        )[: self.batch]
        return winners or self.attributed_rules(best, train)

    def attributed_rules(self, best: Candidate, train: list[dspy.Example]) -> list[Candidate]:
        """SIMBA's rule step on failures alone, when its sampled trajectories show no contrast.

        SIMBA writes a rule only from a better and a worse trajectory of one example; with a
        small model every sample often fails alike and the step yields nothing. The
        attribution already says why each failed, so one failing example's run is shown to the
        proposer as the worse run, with the attribution as its reward info, and the advice lands
        on the blamed modules.
        """
        rng = random.Random(self.seed * 1000 + self.rounds)
        program = self.program(best)
        runs = [run_example(program, ex) for ex in train]
        failing = [r for r in runs if r.score < 1.0]
        blamed = [r for r in failing if (r.info.get("site") or "") in self.sites]
        pool = blamed or failing
        rng.shuffle(pool)
        if not pool:
            return []
        run = pool[0]  # one rule per round: each call carries every blamed prompt
        before = {n: p.signature.instructions for n, p in program.named_predictors()}
        for attempt in range(self.tries):
            candidate = program.deepcopy()
            proposer = self.proposer.copy(rollout_id=self.rounds * 100 + attempt, temperature=1.0)
            try:
                append_advice(candidate, offer_advice(candidate, proposer, worse=run, better=None))
            except Exception as exc:  # noqa: BLE001 - SIMBA logs and skips a failed strategy too
                logger.warning("SIMBA rule step failed: %s", exc)
                continue
            if self._adds_advice(candidate, before):
                return [candidate.candidate(" (attributed rule)")]
        return []

    @staticmethod
    def _adds_advice(candidate: MemoryProgram, before: dict[str, str]) -> bool:
        """Whether some module's instructions gained advice of 3+ words besides its own name."""
        for name, predictor in candidate.named_predictors():
            added = predictor.signature.instructions[len(before.get(name, "")) :].strip()
            if len(set(added.lower().split()) - {name.lower()}) >= 3:
                return True
        return False


# --- its cost model (--estimate) ---------------------------------------------------------


def work(shape: RunShape) -> OptimizerWork:
    """``--optimizer simba``'s cost model. One SIMBA step a round and one trial a round
    (``min(--batch, NUM_CANDIDATES + 1)`` with ``--batch``: the step's best new programs,
    evaluated at once). A step runs ``NUM_CANDIDATES`` sampled programs on the mini-batch (``b =
    min(BSIZE, train questions)`` questions), then its ``NUM_CANDIDATES + 1`` new programs on it;
    half the new programs (:data:`~optloop.loop.spending.shape.RULE_SHARE`) get a rule (one advice
    call to the proposer each, showing a worse and a better trajectory; a rule on an ingest site
    rebuilds the mini-batch's ``min(b, train episodes)`` episodes), half a demo (no call)."""
    opt = SimbaOptimizer
    b = min(opt.BSIZE, shape.train_questions)
    m = min(b, shape.train_episodes)
    made = opt.NUM_CANDIDATES + 1
    # one winner a step, or a batch of the step's new programs
    per_round = max(1, min(shape.batch, made))
    rounds = math.ceil(shape.budget / per_round)
    rules = made * RULE_SHARE
    names = tuple(attr_name(s) for s in shape.sites)
    advice: Any = advice_signature(names)  # a class made at run time: hashable, as lru_cache needs
    # the template, the instructions, and the worse and the better trajectory
    prompt = (
        template_tokens(advice)
        + sum(shape.instruction_tokens(s) for s in shape.sites)
        + 2 * sum(shape.call_tokens(s) for s in shape.sites)
    )
    return shape.work(
        opt.name,
        rounds=rounds,
        trials_per_round=per_round,
        question_runs=rounds * (opt.NUM_CANDIDATES + made) * b,
        episode_ingests=rounds * rules * m if shape.ingest_sites else 0.0,
        proposer_calls=rounds * rules,
        prompt_tokens=prompt,
        completion_tokens=FIELD_TOKENS * (len(names) + 1) + JSON_TOKENS,
        threads=shape.threads,
        basis=(
            f"{rounds} SIMBA step(s), {per_round} trial(s) a step: {opt.NUM_CANDIDATES} sampled "
            f"and {made} new programs on {b} train questions, {rules:g} advice call(s) to the "
            "proposer a step (a rule for half the new programs)"
            + (f", a rule on an ingest site ingesting {m} episodes" if shape.ingest_sites else "")
        ),
    )
