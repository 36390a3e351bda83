"""The optimizer contract: propose the next candidate, observe its dev result (one small ABC, as
Optuna's samplers).

The loop owns the budget: it asks :meth:`Optimizer.propose` for a candidate,
evaluates it on the dev split (one evaluation of ``--budget``), and reports the
result back with :meth:`Optimizer.observe`. With ``--batch K`` it asks
:meth:`Optimizer.propose_batch` for up to K candidates of one round (an edit round,
a SIMBA step's new programs, K Optuna asks before any tell), evaluates them at once
and reports each back in trial order. An optimizer changes only its
``sites`` (the blamed prompt sites) and ``knobs``; the loop calls
:meth:`Optimizer.retarget` when re-attribution moves the blame.

What the loop keeps for a resumed run and what a shared study needs are hooks of the contract too,
each with the default of an optimizer that has no such state: :meth:`Optimizer.queued` and
:meth:`Optimizer.restore_queue` (the candidates a round made that the loop has not taken yet;
:class:`QueuedOptimizer` keeps them) and :meth:`Optimizer.study_trial` (the Optuna trial a
candidate was asked as). Implementations, one module each beside this one: SIMBA
(:mod:`~optloop.loop.optimizers.simba`), GEPA (:mod:`~optloop.loop.optimizers.gepa`), Optuna
(:mod:`~optloop.loop.optimizers.optuna`), GrIPS-style phrase edits
(:mod:`~optloop.loop.optimizers.edit`); their names in :mod:`~optloop.loop.optimizers.registry`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy

from optloop.loop.proposals.gate import LOG_NAME, ProposalGate
from optloop.loop.proposals.writer import Writer
from optloop.sites import PROPOSER

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.candidate import Candidate
    from optloop.loop.evaluate import Evaluation, Evaluator

PROPOSER_SITE = PROPOSER  # the prompt site every proposer call is charged to (optloop.sites)
ENDPOINT_THREADS = 4  # an optimizer's threads on an LM endpoint (the embedded model gets one)


def default_threads(lm: Any) -> int:
    """How many programs an optimizer runs at once on ``lm``: one on the embedded model (one
    llama.cpp context answers every call in turn, so threads would only wait on it); on an endpoint
    (``LMSettings.backend == "openai"``) its ``--concurrency``, at least :data:`ENDPOINT_THREADS`:
    the LM's throttle bounds the requests in flight either way, and fewer threads would leave slots
    idle."""
    backend = getattr(getattr(lm, "settings", None), "backend", None)
    if backend != "openai":
        return 1
    return max(ENDPOINT_THREADS, int(getattr(lm.settings, "concurrency", None) or 0))


class Optimizer(ABC):
    name: str

    def __init__(
        self,
        evaluator: Evaluator,
        proposer: dspy.BaseLM,
        trainset: Dataset,
        *,
        sites: Sequence[str],
        knobs: Sequence[str] = (),
        seed: int = 0,
        num_threads: int | None = None,
        work: Path | None = None,
        batch: int = 1,
    ):
        """``num_threads``: programs run at once inside a round (default :func:`default_threads` of
        the evaluator's LM); ``work``: where the optimizer keeps state across rounds and resumes
        (default ``<evaluator work>/optimizers/<name>``, inside the run's state directory);
        ``batch``: the candidates the loop evaluates at once (``--batch``), which a round may
        fill."""
        self.evaluator = evaluator
        self.proposer = proposer
        self.trainset = trainset
        self.sites = list(sites)
        self.knobs = list(knobs)
        self.seed = seed
        self.seen: set[str] = set()
        self.rounds = 0
        self._num_threads = num_threads
        self._work = work
        self.batch = max(1, batch)
        # What the optimizer says of its own work (a stage line; the loop sets the run's).
        self.progress: Callable[[str], None] = lambda message: None
        self._gate: ProposalGate | None = None
        self._writer: Writer | None = None

    @property
    def num_threads(self) -> int:
        return self._num_threads or default_threads(getattr(self.evaluator, "lm", None))

    @property
    def work(self) -> Path:
        return self._work or Path(self.evaluator.work) / "optimizers" / self.name

    @property
    def gate(self) -> ProposalGate:
        """The proposal gate every proposal of this optimizer passes
        (:mod:`optloop.loop.proposals.gate`), its verdicts logged in the work directory (so a
        resumed run keeps counting); with an evaluator that has no work directory (a test's fake)
        and none given, kept in memory."""
        if self._gate is None:
            where = self._work or getattr(self.evaluator, "work", None)
            self._gate = ProposalGate(self.work / LOG_NAME if where is not None else None)
        return self._gate

    @property
    def writer(self) -> Writer:
        """Small writing tasks for the proposer, judged by :attr:`gate` (:mod:`~.writer`)."""
        if self._writer is None:
            self._writer = Writer(self.proposer, self.gate)
        return self._writer

    def retarget(self, sites: Sequence[str], knobs: Sequence[str] = ()) -> None:
        self.sites, self.knobs = list(sites), list(knobs)

    @abstractmethod
    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        """The next candidate to evaluate, or ``None`` when the optimizer has nothing new."""

    def propose_batch(self, best: Candidate, best_eval: Evaluation, size: int) -> list[Candidate]:
        """Up to ``size`` candidates to evaluate at once, from one round: :meth:`propose` (which
        may run a round), then what that round left queued (:meth:`next_queued`), never a second
        round before the loop has observed the first's. Empty when the optimizer has nothing
        new."""
        first = self.propose(best, best_eval)
        if first is None:
            return []
        batch = [first]
        while len(batch) < size and (more := self.next_queued()) is not None:
            batch.append(more)
        return batch

    def next_queued(self) -> Candidate | None:
        """The next candidate a round already made (``None``: none left; an optimizer without a
        queue)."""
        return None

    def queued(self) -> list[Candidate]:
        """The candidates a round made that the loop has not taken yet, in order: checkpointed, so
        that a resumed run hands them out first (none: an optimizer without a queue)."""
        return []

    def restore_queue(self, candidates: Sequence[Candidate]) -> None:
        """A resumed run's saved queue given back (an optimizer without a queue ignores it)."""

    def drop_queued(self, keep: Callable[[Candidate], bool]) -> None:
        """Forget the queued candidates ``keep`` refuses (they stay seen, so never proposed
        again): the budget left what they rewrite. An optimizer without a queue has none."""

    def study_trial(self, candidate: Candidate) -> int | None:
        """The number of the study trial ``candidate`` was asked as, for a coordinator that shares
        a study between workers (``None``: not asked of a study)."""
        return None

    def observe(self, candidate: Candidate, evaluation: Evaluation, trial: int) -> None:
        """The dev result of a candidate this optimizer proposed."""

    def mark_seen(self, candidate: Candidate) -> None:
        self.seen.add(candidate.digest())

    def release(self, candidate: Candidate) -> None:
        """A proposed candidate that will not be evaluated (the budget is spent)."""


class QueuedOptimizer(Optimizer):
    """An optimizer whose rounds make several candidates, handed out one at a time: the rest wait
    in :attr:`queue`, which the loop checkpoints and gives back on resume."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.queue: list[Candidate] = []

    def next_queued(self) -> Candidate | None:
        return self.queue.pop(0) if self.queue else None

    def queued(self) -> list[Candidate]:
        return list(self.queue)

    def restore_queue(self, candidates: Sequence[Candidate]) -> None:
        """The saved candidates not proposed since (each now marked seen), first in the queue."""
        self.queue = [c for c in candidates if c.digest() not in self.seen]
        self.seen |= {c.digest() for c in self.queue}

    def drop_queued(self, keep: Callable[[Candidate], bool]) -> None:
        self.queue = [c for c in self.queue if keep(c)]

    def release(self, candidate: Candidate) -> None:
        self.queue.insert(0, candidate)
