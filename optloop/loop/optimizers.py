"""SIMBA, GEPA and Optuna behind one interface: propose the next candidate to evaluate.

The loop owns the budget: it asks :meth:`Optimizer.propose` for a candidate,
evaluates it on the dev split (one evaluation of ``--budget``), and reports the
result back with :meth:`Optimizer.observe`. Each optimizer changes only its
``sites`` (the blamed prompt sites, or every site with ``--untargeted``) and
``knobs`` (Optuna only); the loop calls :meth:`retarget` when re-attribution
moves the blame.

- **SIMBA** (the default): one SIMBA step (``max_steps=1``) on the train split
  per round, on a :class:`MemoryProgram` whose unblamed predictors are frozen
  and whose metric returns the attribution beside the score; the round's
  candidate programs not yet evaluated are queued.
- **GEPA**: one short GEPA run per round with a component selector that
  returns the blamed sites and a metric whose feedback for a site is the
  attribution explanation of that site's failures; its new candidates are queued.
- **Optuna**: TPE over, per blamed site, the seed instruction and rewrites an
  LLM proposer writes from the attributions, plus the values of blamed knobs.
  The study lives in ``--storage`` (SQLite by default), so it resumes.

SIMBA's and GEPA's inner mini-batch runs are the optimizer's own cost: their
LLM calls are counted and reported, but they are not evaluations.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dspy

from optloop.lm import prompt_site
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.program import MemoryProgram, examples, feedback_metric, site_name

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.evaluate import Evaluation, Evaluator

logger = logging.getLogger(__name__)

PROPOSER_SITE = "optimizer.proposer"
MAX_EMPTY_ROUNDS = 3


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


class _QueueOptimizer(Optimizer):
    """Runs rounds of a DSPy optimizer and hands out their new candidate programs one at a time."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.queue: list[Candidate] = []

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        empty = 0
        while not self.queue and empty < MAX_EMPTY_ROUNDS:
            if not self.sites:
                return None
            self.rounds += 1
            program = MemoryProgram(self.evaluator, best, self.sites)
            fresh = []
            for i, p in enumerate(self.round(program)):
                c = p.candidate(f"{self.name} round {self.rounds} #{i}")
                if c.digest() not in self.seen and c.digest() != best.digest():
                    self.seen.add(c.digest())
                    fresh.append(c)
            self.queue += fresh
            empty = 0 if fresh else empty + 1
        return self.queue.pop(0) if self.queue else None

    @abstractmethod
    def round(self, program: MemoryProgram) -> list[MemoryProgram]:
        """One round of the DSPy optimizer from ``program``; its candidate programs."""


class SimbaOptimizer(_QueueOptimizer):
    name = "simba"

    def __init__(self, *args: Any, bsize: int = 6, num_candidates: int = 2, max_demos: int = 2, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.bsize, self.num_candidates, self.max_demos = bsize, num_candidates, max_demos

    def round(self, program: MemoryProgram) -> list[MemoryProgram]:
        train = examples(self.trainset)
        simba = dspy.SIMBA(metric=feedback_metric, bsize=min(self.bsize, len(train)),
                           num_candidates=self.num_candidates, max_steps=1, max_demos=self.max_demos,
                           prompt_model=_Charged(self.proposer), num_threads=1)
        best = simba.compile(program, trainset=train, seed=self.seed + self.rounds)
        return [entry["program"] for entry in getattr(best, "candidate_programs", [])] or [best]


class BlamedSiteSelector:
    """GEPA component selector: the blamed sites of the candidate, most-blamed first."""

    def __init__(self, sites: Sequence[str]):
        self.sites = list(sites)

    def __call__(self, state: Any, trajectories: Any, subsample_scores: Any, candidate_idx: int,
                 candidate: dict[str, str]) -> list[str]:
        chosen = [name for site in self.sites for name in candidate if site_name(name) == site]
        return chosen[:1] or list(candidate)[:1]


class GepaOptimizer(_QueueOptimizer):
    name = "gepa"

    def __init__(self, *args: Any, metric_calls: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.metric_calls = metric_calls

    def round(self, program: MemoryProgram) -> list[MemoryProgram]:
        train = examples(self.trainset)
        calls = self.metric_calls or 2 * len(train) + 12
        gepa = dspy.GEPA(metric=feedback_metric, max_metric_calls=calls, reflection_lm=_Charged(self.proposer),
                         component_selector=BlamedSiteSelector(self.sites), num_threads=1, track_stats=True,
                         use_merge=False, seed=self.seed + self.rounds, reflection_minibatch_size=min(3, len(train)))
        result = gepa.compile(program, trainset=train, valset=train)
        return list(result.detailed_results.candidates) if getattr(result, "detailed_results", None) else [result]


class ProposeInstruction(dspy.Signature):
    """You improve one prompt of an AI assistant's memory pipeline. Below is the prompt's current
    instruction and the failures attributed to it. Write a complete replacement instruction that keeps
    the task and the output format, and fixes these failures."""

    site: str = dspy.InputField(desc="which step of the pipeline this prompt drives")
    instruction: str = dspy.InputField(desc="the current instruction")
    failures: str = dspy.InputField(desc="attributed failures: error type and explanation")
    new_instruction: str = dspy.OutputField()


def knob_choices(system: str, knob: str, current: Any) -> list[Any]:
    """The values Optuna may try for a knob (the current value always among them)."""
    if knob == "search_recipe":
        from systems.graphiti_system import SEARCH_RECIPES

        values = sorted(n for n in SEARCH_RECIPES if n.startswith("EDGE_"))
    else:
        values = {"top_k": [1, 3, 5, 10, 20], "threshold": [0.0, 0.1, 0.2, 0.3], "rerank": [False, True],
                  "max_context_tokens": [2000, 4000, 6000, 8000]}.get(knob, [])
    return list(dict.fromkeys([current, *values]))


class OptunaOptimizer(Optimizer):
    """TPE over LLM-proposed instructions per blamed site and the values of blamed knobs."""

    name = "optuna"

    def __init__(self, *args: Any, storage: str, study_name: str, proposals: int = 3, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize",
                                         sampler=optuna.samplers.TPESampler(seed=self.seed), load_if_exists=True)
        self.proposals = proposals
        self.pending: dict[str, Any] = {}
        self.duplicates = 0

    def _instructions(self, site: str, base: Candidate, best_eval: Evaluation) -> list[str]:
        key = f"instructions:{site}"
        stored = self.study.user_attrs.get(key)
        if stored is not None:  # proposals are made once per study, so a resumed study sees the same space
            return list(stored)
        seed_text = base.sites[site].instructions
        failures = "\n".join(f"- {a.error_type.value}: {a.explanation[:300]}" for a in best_eval.attributions()
                             if a.target == site)[:3000] or "(no failure attributed here yet)"
        texts = [seed_text]
        predict = dspy.Predict(ProposeInstruction)
        for i in range(self.proposals):
            try:
                with prompt_site(PROPOSER_SITE), dspy.context(lm=self.proposer.copy(rollout_id=i, temperature=1.0),
                                                              adapter=dspy.JSONAdapter()):
                    text = predict(site=site, instruction=seed_text, failures=failures).new_instruction.strip()
            except Exception as exc:  # noqa: BLE001 - a failed proposal is one choice fewer
                logger.warning("proposer failed for %s: %s", site, exc)
                continue
            if text and text not in texts:
                texts.append(text)
        self.study.set_user_attr(key, texts)
        return texts

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        spaces = {f"site:{s}": self._instructions(s, best, best_eval) for s in self.sites}
        spaces |= {f"knob:{k}": knob_choices(self.evaluator.system_name, k, best.knobs.get(k)) for k in self.knobs
                   if k in best.knobs}
        spaces = {name: choices for name, choices in spaces.items() if len(choices) > 1}
        if not spaces:
            return None
        while self.duplicates < 20:
            self.rounds += 1
            trial = self.study.ask()
            sites = dict(best.sites)
            knobs = dict(best.knobs)
            for name, choices in spaces.items():
                index = trial.suggest_categorical(name, list(range(len(choices))))
                kind, target = name.split(":", 1)
                if kind == "site":
                    sites[target] = SiteState(instructions=choices[index], demos=best.sites[target].demos)
                else:
                    knobs[target] = choices[index]
            candidate = Candidate(sites=sites, knobs=knobs, origin=f"optuna trial {trial.number}")
            if candidate.digest() in self.seen:
                previous = [t for t in self.study.trials if t.params == trial.params and t.value is not None]
                self.study.tell(trial, previous[0].value if previous else 0.0)  # already evaluated: no budget spent
                self.duplicates += 1
                continue
            self.seen.add(candidate.digest())
            self.pending[candidate.digest()] = trial
            return candidate
        logger.warning("optuna keeps proposing evaluated candidates: the search space is exhausted")
        return None

    def observe(self, candidate: Candidate, evaluation: Evaluation, trial: int) -> None:
        optuna_trial = self.pending.pop(candidate.digest(), None)
        if optuna_trial is not None:
            self.study.tell(optuna_trial, evaluation.accuracy)


class _Charged(dspy.BaseLM):
    """The proposer LM with its calls charged to the ``optimizer.proposer`` site in the accounting."""

    def __init__(self, lm: dspy.BaseLM):
        super().__init__(model=getattr(lm, "model", "proposer"), model_type="chat", cache=False)
        self.inner = lm
        self.kwargs = dict(getattr(lm, "kwargs", {}))

    def forward(self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **kwargs: Any):
        with prompt_site(PROPOSER_SITE):
            return self.inner.forward(prompt=prompt, messages=messages, **kwargs)

    def copy(self, **kwargs: Any) -> _Charged:
        return _Charged(self.inner.copy(**kwargs))

    def __deepcopy__(self, memo: dict[int, Any]) -> _Charged:
        return self


OPTIMIZERS: dict[str, type[Optimizer]] = {"simba": SimbaOptimizer, "gepa": GepaOptimizer, "optuna": OptunaOptimizer}


__all__ = ["OPTIMIZERS", "BlamedSiteSelector", "GepaOptimizer", "Optimizer", "OptunaOptimizer", "SimbaOptimizer",
           "knob_choices"]
