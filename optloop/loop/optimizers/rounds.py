"""Optimizers that run rounds of a DSPy optimizer (SIMBA, GEPA) and hand out each round's new
candidates one at a time; when a round yields nothing new, or gives up on its proposals (GEPA's
round after refused reflections in a row), the proposer rewrites each blamed site's instruction
from its attributed failures in the same round. After :data:`MAX_EMPTY_ROUNDS` rounds in a row
with nothing new even so, the optimizer has nothing more to propose."""

from __future__ import annotations

import contextlib
import io
import logging
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import dspy

from optloop.attribution import Attribution
from optloop.loop.candidate import Candidate
from optloop.loop.optimizers.base import QueuedOptimizer
from optloop.loop.optimizers.propose import propose_instruction
from optloop.loop.program import MemoryProgram, attr_name, examples, running
from optloop.loop.proposals.gate import active
from optloop.loop.proposals.writer import failure_summary

if TYPE_CHECKING:
    from optloop.loop.evaluate import Evaluation


logger = logging.getLogger(__name__)


MAX_EMPTY_ROUNDS = 3


@contextlib.contextmanager
def dspy_bars_hidden() -> Iterator[None]:
    """Hide the tqdm bars DSPy's parallel executor prints to stdout inside an optimizer round
    (SIMBA and GEPA offer no switch for them), unless DSPy's logger is verbose (``--verbose``): the
    run's own status line says what runs."""
    if logging.getLogger("dspy").getEffectiveLevel() <= logging.INFO:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class RoundsOptimizer(QueuedOptimizer):
    """Runs rounds of a DSPy optimizer and hands out their new candidates one at a time."""

    fallback_rewrites = 2
    # Set by a round that stopped because its proposals kept being refused: the proposer's
    # rewrites are added to what it made (see the module doc).
    gave_up = False

    def program(self, candidate: Candidate) -> MemoryProgram:
        """``candidate`` as a program whose predictors are the target sites."""
        return MemoryProgram(candidate, self.sites, self.evaluator.modules(candidate))

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        empty = 0
        while not self.queue and empty < MAX_EMPTY_ROUNDS:
            if not self.sites:
                return None
            self.rounds += 1
            self.gave_up = False
            with dspy_bars_hidden(), running(self.evaluator), active(self.gate):
                fresh = self._unseen(self.round(best), best)
                # Nothing this optimizer has not proposed already, or a round that gave up.
                if not fresh or self.gave_up:
                    fresh += self._unseen(self.rewrites(best, examples(self.trainset)), best)
            self.queue += fresh
            empty = 0 if fresh else empty + 1
        return self.queue.pop(0) if self.queue else None

    def _unseen(self, candidates: Sequence[Candidate], best: Candidate) -> list[Candidate]:
        """The candidates not proposed before (now marked seen), named after this round."""
        fresh = []
        for i, c in enumerate(candidates):
            if c.digest() not in self.seen and c.digest() != best.digest():
                self.seen.add(c.digest())
                fresh.append(
                    c.model_copy(
                        update={"origin": f"{self.name} round {self.rounds} #{i}{c.origin}"}
                    )
                )
        return fresh

    @abstractmethod
    def round(self, best: Candidate) -> list[Candidate]:
        """One round of the DSPy optimizer from ``best``; its candidates (``origin``: a note, or
        empty)."""

    def rewrites(self, best: Candidate, train: list[dspy.Example]) -> list[Candidate]:
        """Last resort when a round yields no new program (a proposer too small to write usable
        rules, or every reflection rejected) or gives up (:attr:`gave_up`): the proposer rewrites
        each blamed site's instruction from its attributed failures (a long instruction: the
        writer's short instruction for the site's job), each rewrite judged by the round's
        proposal gate."""
        program = self.program(best)
        runs = [program(**ex.inputs()) for ex in train]
        attributions = [Attribution.model_validate(r.attribution) for r in runs if r.attribution]
        out = []
        for i in range(self.fallback_rewrites):
            candidate = program.deepcopy()
            for site in self.sites:
                predictor = getattr(candidate, attr_name(site))
                text = propose_instruction(
                    self.proposer,
                    site,
                    predictor.signature.instructions,
                    failure_summary(attributions, site),
                    rollout=self.rounds * 100 + i,
                )
                if text:
                    predictor.signature = predictor.signature.with_instructions(text)
            out.append(candidate.candidate(" (proposer rewrite)"))
        logger.info(
            "%s %s this round; %d attribution-guided rewrite(s) instead",
            self.name,
            "gave up on its proposals" if self.gave_up else "produced no new program",
            len(out),
        )
        return out
