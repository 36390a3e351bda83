"""Racing a candidate on dev: stop its evaluation once it is significantly worse than the best.

A candidate answers dev episode by episode in a seeded order (:func:`race_order`, the same for
every candidate of the run and after a resume). After each episode its per-question scores are
paired with the current best's on the same questions and handed to Optuna's
:class:`~optuna.pruners.WilcoxonPruner`, which was written for this: the accuracy of an LLM's
outputs on a set of questions, one step per question. The pruner compares the candidate with the
best trial of a private in-memory study that holds only the best's evaluation, and says to stop
when a one-sided Wilcoxon signed-rank test finds the candidate worse at ``p < P_THRESHOLD``
after at least ``MIN_QUESTIONS`` questions. A stopped evaluation keeps what it answered and says
so (:class:`RaceStop`); it never becomes the best, and ``--budget`` counts it like any other.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from optloop.pipeline import QuestionOutcome

T = TypeVar("T")

# Optuna's own example threshold for LLM accuracy on a set of questions: a candidate stops when a
# one-sided test says it is worse than the best at p < 0.1.
P_THRESHOLD = 0.1
# No decision on fewer questions: four questions lost in a row give p = 0.0625.
MIN_QUESTIONS = 5


class RaceStop(BaseModel):
    """Why a candidate's evaluation stopped before the end of the split."""

    questions: int = Field(description="questions the candidate answered before it stopped")
    of: int = Field(description="questions in the split (a full evaluation)")
    against: str = Field(description="the best it was raced against ('start' or 'trial N')")
    best_accuracy: float = Field(description="the best's accuracy on those same questions")
    p_value: float = Field(description="one-sided Wilcoxon p-value that it is worse")

    def line(self, accuracy: float) -> str:
        """The words of a trial line: ``stopped after 8/20 questions: 0.250 vs trial 2's 0.625
        on them (p=0.031)``."""
        return (
            f"stopped after {self.questions}/{self.of} questions: {accuracy:.3f} vs "
            f"{self.against}'s {self.best_accuracy:.3f} on them (p={self.p_value:.3f})"
        )


class _Evaluated(Protocol):
    """What :class:`RaceSpend` reads of an :class:`~optloop.loop.evaluate.Evaluation`."""

    @property
    def n(self) -> int: ...

    @property
    def full_calls(self) -> int: ...

    llm_calls: int
    stopped: RaceStop | None


class RaceSpend(BaseModel):
    """What racing saved over a run's trials: questions and LLM calls spent on dev against what a
    full evaluation of each candidate would have cost."""

    candidates: int = 0
    stopped: int = Field(0, description="candidates a race stopped before the end of dev")
    questions: int = Field(0, description="dev questions answered, every candidate's")
    full_questions: int = Field(0, description="what a full evaluation of each would answer")
    llm_calls: int = Field(0, description="LLM calls the trials' dev evaluations made")
    full_calls: int = Field(
        0, description="what full evaluations would make (a stopped one's scaled up: an estimate)"
    )
    stopped_share: float | None = Field(
        None, description="a stopped candidate's mean share of a full dev evaluation (questions)"
    )

    @classmethod
    def of(cls, evaluations: Sequence[_Evaluated]) -> RaceSpend:
        stopped = [e.stopped for e in evaluations if e.stopped is not None]
        return cls(
            candidates=len(evaluations),
            stopped=len(stopped),
            questions=sum(e.n for e in evaluations),
            full_questions=sum(e.n if e.stopped is None else e.stopped.of for e in evaluations),
            llm_calls=sum(e.llm_calls for e in evaluations),
            full_calls=sum(e.full_calls for e in evaluations),
            stopped_share=(
                round(sum(s.questions / s.of for s in stopped) / len(stopped), 3)
                if stopped
                else None
            ),
        )

    def line(self) -> str:
        """``racing: 3 of 5 candidates stopped early (each after 0.30 of dev on average); 64 of
        100 dev questions answered, 1,234 LLM calls (full evaluations: about 2,001)``."""
        share = (
            f" (each after {self.stopped_share:.2f} of dev on average)"
            if self.stopped_share is not None
            else ""
        )
        return (
            f"racing: {self.stopped} of {self.candidates} candidates stopped early{share}; "
            f"{self.questions} of {self.full_questions} dev questions answered, "
            f"{self.llm_calls:,} LLM calls (full evaluations: about {self.full_calls:,})"
        )


@dataclass(frozen=True)
class Against:
    """What a dev evaluation races against: the best's outcomes on the split, how the run names the
    best, and the run's seed (the order the episodes are answered in)."""

    outcomes: Sequence[QuestionOutcome]
    label: str
    seed: int = 0

    def race(self) -> Race:
        return Race(self.outcomes, self.label)


def race_order(items: Sequence[T], seed: int, key: str = "") -> list[T]:
    """``items`` shuffled by ``seed`` (and ``key``, the split's name): the order every candidate
    of a run answers them in."""
    order = list(items)
    random.Random(f"{seed}:{key}").shuffle(order)
    return order


class Race:
    """One candidate's evaluation raced against ``best_outcomes`` (the best's outcomes on the
    same split).

    Args:
        best_outcomes: the current best's per-question outcomes on the split.
        against: how the best is named in what the run says (``start``, ``trial 3``).
        p_threshold: stop when the candidate is worse at this one-sided p-value.
        min_questions: answer at least this many questions before any decision.
    """

    def __init__(
        self,
        best_outcomes: Sequence[QuestionOutcome],
        against: str,
        *,
        p_threshold: float = P_THRESHOLD,
        min_questions: int = MIN_QUESTIONS,
    ):
        import optuna
        from optuna.exceptions import ExperimentalWarning

        self.against = against
        self._steps = {(o.episode_id, o.question_id): i for i, o in enumerate(best_outcomes)}
        self._best = {i: float(o.passed) for i, o in enumerate(best_outcomes)}
        self._mine: dict[int, float] = {}
        # as the Optuna optimizer does: no "A new study created in memory" line per race
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)
            pruner = optuna.pruners.WilcoxonPruner(
                p_threshold=p_threshold, n_startup_steps=min_questions
            )
        self._study = optuna.create_study(direction="maximize", pruner=pruner)
        self._study.add_trial(
            optuna.trial.create_trial(
                value=sum(self._best.values()) / max(1, len(self._best)),
                intermediate_values=dict(self._best),
            )
        )
        self._trial = self._study.ask()

    def observe(self, outcomes: Sequence[QuestionOutcome]) -> RaceStop | None:
        """Report ``outcomes`` (one episode's); a :class:`RaceStop` when the candidate should
        stop here."""
        for outcome in outcomes:
            step = self._steps.get((outcome.episode_id, outcome.question_id))
            if step is not None:
                self._mine[step] = float(outcome.passed)
                self._trial.report(self._mine[step], step)
        if not self._mine:
            return None
        with warnings.catch_warnings():
            # scipy warns of the normal approximation on ties and small samples.
            warnings.simplefilter("ignore")
            stop = self._trial.should_prune()
        if not stop:
            return None
        steps = sorted(self._mine)
        return RaceStop(
            questions=len(steps),
            of=len(self._steps),
            against=self.against,
            best_accuracy=round(sum(self._best[s] for s in steps) / len(steps), 4),
            p_value=round(self._p_value(steps), 4),
        )

    def _p_value(self, steps: list[int]) -> float:
        """The one-sided p-value the pruner decided on (recomputed for the report)."""
        from scipy.stats import wilcoxon

        diffs = [self._mine[s] - self._best[s] for s in steps]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(wilcoxon(diffs, alternative="less", zero_method="zsplit").pvalue)


__all__ = [
    "MIN_QUESTIONS",
    "P_THRESHOLD",
    "Against",
    "Race",
    "RaceSpend",
    "RaceStop",
    "race_order",
]
