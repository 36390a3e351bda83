"""What one run of the controller works on: :class:`RunContext` (the config, the checkpoint and
where it is saved, the start program, the callbacks that report progress, cost and trials, and
this process's spending limits)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from optloop.loop.candidate import Candidate
from optloop.loop.spending.eta import Eta, TrialLine
from optloop.loop.spending.limits import SpendingLimits
from optloop.loop.state import Checkpoint, Cost, LoopConfig


def _no_progress(message: str) -> None:
    """The default progress callback: says nothing."""


def _no_cost() -> Cost:
    return {}


def _no_projection(checkpoint: Checkpoint) -> Eta | None:
    return None


def _no_line(line: TrialLine) -> None:
    """The default trial callback: says nothing."""


def _no_proposals() -> dict[str, int]:
    return {}


@dataclass
class RunContext:
    """What one run of the controller works on.

    ``checkpoint`` is saved to ``path``; ``base`` is the start program (the system's prompts with
    ``--start`` applied); ``progress`` receives one-line status messages; ``cost`` returns what
    this process has spent so far (LLM calls, tokens, seconds), saved with every checkpoint (the
    run's total adds up every process's: :meth:`Checkpoint.total_cost`); ``limits`` are this
    process's ``--max-cost``, ``--max-calls`` and ``--estimate``, checked at step boundaries
    against that total (:mod:`optloop.loop.spending`); ``baseline_done`` is called once the
    baseline is known and trials are to come (``Loop`` prints the projection of the whole run
    there) and returns the :class:`Eta` its projection starts; ``trial_done`` receives one
    :class:`TrialLine` per evaluated trial; ``proposals`` counts what the proposal gate said of
    the optimizer's proposals, by verdict (:func:`optloop.loop.proposals.gate.refusals`), for the
    result the worker that finishes the run publishes.
    """

    config: LoopConfig
    checkpoint: Checkpoint
    path: Path
    base: Candidate
    progress: Callable[[str], None] = _no_progress
    cost: Callable[[], Cost] = _no_cost
    limits: SpendingLimits = SpendingLimits()
    baseline_done: Callable[[Checkpoint], Eta | None] = _no_projection
    trial_done: Callable[[TrialLine], None] = _no_line
    proposals: Callable[[], dict[str, int]] = _no_proposals

    def save(self) -> None:
        """Write the checkpoint atomically, with what this process has spent so far."""
        self.checkpoint.spending = self.cost()
        self.checkpoint.save(self.path)

    def keep_spending(self) -> None:
        """Write the run's cost (the earlier processes', this one's, their count) into the
        checkpoint *on disk* and nothing else: called when the run stops midway (an interrupt, an
        error), when the rest of the checkpoint in memory may be ahead of the last step it
        completed."""
        if not self.path.exists():
            return
        saved = Checkpoint.load(self.path)
        # its cost fields are consistent in memory (begin_process moved the last spending)
        ckpt = self.checkpoint
        saved.spent, saved.processes, saved.spending = ckpt.spent, ckpt.processes, self.cost()
        saved.save(self.path)


__all__ = ["RunContext"]
