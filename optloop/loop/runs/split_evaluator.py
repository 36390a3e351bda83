"""The controller's :class:`~optloop.loop.interfaces.CandidateEvaluator` on the real
:class:`~optloop.loop.evaluate.Evaluator`: :class:`SplitEvaluator`, one candidate over one of the
run's named splits (train, dev, test)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from optloop.datasets import Dataset
from optloop.loop.candidate import Candidate, prompt_text
from optloop.loop.evaluate import Evaluation, Evaluator
from optloop.loop.interfaces import Split
from optloop.loop.policy import questions
from optloop.loop.racing import Against


class SplitEvaluator:
    """The :class:`Evaluator` over the run's named splits: the controller's
    ``CandidateEvaluator``."""

    def __init__(
        self, evaluator: Evaluator, splits: dict[str, Dataset], progress: Callable[[str], None]
    ):
        self.evaluator = evaluator
        self.splits = splits
        self.progress = progress

    @property
    def site_names(self) -> list[str]:
        return list(self.evaluator.sites)

    def evaluate(
        self, candidate: Candidate, split: Split, *, against: Against | None = None
    ) -> Evaluation:
        dataset = self.splits[split]
        raced = f", raced against {against.label}" if against is not None else ""
        self.progress(
            f"evaluating {candidate.origin} on {split} ({questions(dataset)} questions{raced})"
        )
        return self.evaluator.evaluate(candidate, dataset, split=split, against=against)

    def evaluate_many(
        self, candidates: Sequence[Candidate], split: Split, *, against: Against | None = None
    ) -> list[Evaluation]:
        dataset = self.splits[split]
        raced = f", raced against {against.label}" if against is not None else ""
        self.progress(
            f"evaluating {len(candidates)} candidates at once on {split} ({questions(dataset)} "
            f"questions each{raced})"
        )
        return self.evaluator.evaluate_many(candidates, dataset, split=split, against=against)

    def trivial_instruction(self, site: str) -> str:
        return self.evaluator.trivial_instruction(site)

    def prompt_texts(self, candidate: Candidate) -> dict[str, str]:
        sites = self.evaluator.sites
        return {n: prompt_text(sites[n], s) for n, s in candidate.sites.items() if n in sites}


__all__ = ["SplitEvaluator"]
