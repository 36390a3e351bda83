"""The optimizer contract: propose the next candidate, observe its dev result (one small ABC, as Optuna's samplers).

The loop owns the budget: it asks :meth:`Optimizer.propose` for a candidate,
evaluates it on the dev split (one evaluation of ``--budget``), and reports the
result back with :meth:`Optimizer.observe`. An optimizer changes only its
``sites`` (the blamed prompt sites) and ``knobs``; the loop calls
:meth:`Optimizer.retarget` when re-attribution moves the blame. Implementations:
:mod:`optloop.loop.optimizers` (SIMBA, GEPA, Optuna) and :mod:`optloop.loop.edit`
(GrIPS-style phrase edits).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import dspy

from optloop.sites import PROPOSER

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.candidate import Candidate
    from optloop.loop.evaluate import Evaluation, Evaluator

PROPOSER_SITE = PROPOSER  # the prompt site every proposer call is charged to (optloop.sites)


class Optimizer(ABC):
    name: str

    def __init__(self, evaluator: Evaluator, proposer: dspy.BaseLM, trainset: Dataset, *, sites: Sequence[str],
                 knobs: Sequence[str] = (), seed: int = 0):
        self.evaluator = evaluator
        self.proposer = proposer
        self.trainset = trainset
        self.sites = list(sites)
        self.knobs = list(knobs)
        self.seed = seed
        self.seen: set[str] = set()
        self.rounds = 0

    def retarget(self, sites: Sequence[str], knobs: Sequence[str] = ()) -> None:
        self.sites, self.knobs = list(sites), list(knobs)

    @abstractmethod
    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        """The next candidate to evaluate, or ``None`` when the optimizer has nothing new."""

    def observe(self, candidate: Candidate, evaluation: Evaluation, trial: int) -> None:
        """The dev result of a candidate this optimizer proposed."""

    def mark_seen(self, candidate: Candidate) -> None:
        self.seen.add(candidate.digest())

    def release(self, candidate: Candidate) -> None:
        """A proposed candidate that will not be evaluated (the budget is spent)."""
