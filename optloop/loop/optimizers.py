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
  The study lives in ``--storage`` (SQLite by default), so it resumes; with
  ``postgresql://...`` several workers share it (see :mod:`optloop.loop.study`).

SIMBA's and GEPA's inner mini-batch runs are the optimizer's own cost: their
LLM calls are counted and reported, but they are not evaluations.
"""

from __future__ import annotations

import contextlib
import io
import logging
import uuid
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import dspy

from optloop.attribution import Attribution
from optloop.errors import ConfigError
from optloop.lm import prompt_site, response_format_to_schema
from optloop.loop._base import PROPOSER_SITE, Optimizer
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.program import MemoryProgram, attr_name, examples, feedback_metric, site_name
from optloop.loop.study import SharedStudy

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.evaluate import Evaluation, Evaluator

logger = logging.getLogger(__name__)

MAX_EMPTY_ROUNDS = 3
MAX_BUDGET_SLOTS = 500


@contextlib.contextmanager
def dspy_bars_hidden() -> Iterator[None]:
    """Hide the tqdm bars DSPy's parallel executor prints to stdout inside an optimizer round (SIMBA and GEPA
    offer no switch for them), unless DSPy's logger is verbose (``--verbose``): the run's own status line says
    what runs."""
    if logging.getLogger("dspy").getEffectiveLevel() <= logging.INFO:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def unchanged(programs: Sequence[MemoryProgram], source: MemoryProgram) -> bool:
    """Whether every program carries the same prompts as ``source`` (a round that produced nothing)."""
    digest = source.candidate("").digest()
    return all(p.candidate("").digest() == digest for p in programs)


class _QueueOptimizer(Optimizer):
    """Runs rounds of a DSPy optimizer and hands out their new candidate programs one at a time."""

    fallback_rewrites = 2

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
            with dspy_bars_hidden():
                programs = self.round(program)
                if unchanged(programs, program):
                    programs = self.rewrites(program, examples(self.trainset))
            for i, p in enumerate(programs):
                c = p.candidate(f"{self.name} round {self.rounds} #{i}{getattr(p, 'origin_note', '')}")
                if c.digest() not in self.seen and c.digest() != best.digest():
                    self.seen.add(c.digest())
                    fresh.append(c)
            self.queue += fresh
            empty = 0 if fresh else empty + 1
        return self.queue.pop(0) if self.queue else None

    @abstractmethod
    def round(self, program: MemoryProgram) -> list[MemoryProgram]:
        """One round of the DSPy optimizer from ``program``; its candidate programs."""

    def rewrites(self, program: MemoryProgram, train: list[dspy.Example]) -> list[MemoryProgram]:
        """Last resort when a round yields no new program (a proposer too small to write usable
        rules, or every reflection rejected): the proposer rewrites each blamed site's
        instruction from its attributed failures."""
        runs = [program(**ex.inputs()) for ex in train]
        attributions = [Attribution.model_validate(r.attribution) for r in runs if r.attribution]
        out = []
        for i in range(self.fallback_rewrites):
            candidate = program.deepcopy()
            for site in self.sites:
                predictor = getattr(candidate, attr_name(site))
                text = propose_instruction(self.proposer, site, predictor.signature.instructions,
                                           failure_summary(attributions, site), rollout=self.rounds * 100 + i)
                if text:
                    predictor.signature = predictor.signature.with_instructions(text)
            candidate.origin_note = " (proposer rewrite)"
            out.append(candidate)
        logger.info("%s produced no new program this round; %d attribution-guided rewrite(s) instead", self.name,
                    len(out))
        return out


class SimbaOptimizer(_QueueOptimizer):
    name = "simba"

    def __init__(self, *args: Any, bsize: int = 6, num_candidates: int = 2, max_demos: int = 2, tries: int = 2,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.bsize, self.num_candidates, self.max_demos, self.tries = bsize, num_candidates, max_demos, tries

    def round(self, program: MemoryProgram) -> list[MemoryProgram]:
        train = examples(self.trainset)
        simba = dspy.SIMBA(metric=feedback_metric, bsize=min(self.bsize, len(train)),
                           num_candidates=self.num_candidates, max_steps=1, max_demos=self.max_demos,
                           prompt_model=_Charged(self.proposer, keys=[attr_name(s) for s in self.sites]),
                           num_threads=1)
        best = simba.compile(program, trainset=train, seed=self.seed + self.rounds)
        programs = [entry["program"] for entry in getattr(best, "candidate_programs", [])] or [best]
        if unchanged(programs, program):
            programs += self.attributed_rules(program, train)
        return programs

    def attributed_rules(self, program: MemoryProgram, train: list[dspy.Example]) -> list[MemoryProgram]:
        """SIMBA's rule step on failures alone, when its sampled trajectories show no contrast.

        SIMBA writes a rule only from a better and a worse trajectory of one example; with a
        small model every sample often fails alike and the step yields nothing. The
        attribution already says why each failed, so each failing example's trajectory goes
        to SIMBA's own ``append_a_rule`` (its ``OfferFeedback`` prompt) as the worse
        trajectory, with the attribution as its reward info, and the advice lands on the
        blamed modules.
        """
        import random

        from dspy.teleprompt.simba_utils import append_a_rule, wrap_program

        rng = random.Random(self.seed * 1000 + self.rounds)
        runs = [wrap_program(program, feedback_metric)(ex) for ex in train]
        failing = [r for r in runs if float(r["score"]) < 1.0]
        blamed = [r for r in failing if (r["output_metadata"].get("site") or "") in self.sites]
        pool = blamed or failing
        rng.shuffle(pool)
        if not pool:
            return []
        run = pool[0]  # one rule per round: each call carries every blamed prompt
        before = {n: p.signature.instructions for n, p in program.named_predictors()}
        predictor2name = {id(p): n for n, p in program.named_predictors()}
        for attempt in range(self.tries):
            candidate = program.deepcopy()
            rollout = self.rounds * 100 + attempt
            try:
                append_a_rule([dict(run)], candidate, predictor2name=predictor2name,
                              batch_10p_score=float("-inf"), batch_90p_score=float("inf"),
                              prompt_model=_Charged(self.proposer.copy(rollout_id=rollout, temperature=1.0),
                                                    keys=[attr_name(s) for s in self.sites]))
            except Exception as exc:  # noqa: BLE001 - SIMBA logs and skips a failed strategy too
                logger.warning("SIMBA rule step failed: %s", exc)
                continue
            if self._adds_advice(candidate, before):
                return [candidate]
        return []

    @staticmethod
    def _adds_advice(candidate: MemoryProgram, before: dict[str, str]) -> bool:
        """Whether some module's instructions gained advice of 3+ words besides its own name."""
        for name, predictor in candidate.named_predictors():
            added = predictor.signature.instructions[len(before.get(name, "")):].strip()
            if len(set(added.lower().split()) - {name.lower()}) >= 3:
                return True
        return False


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


def propose_instruction(proposer: dspy.BaseLM, site: str, instruction: str, failures: str, *,
                        rollout: int) -> str | None:
    """One rewrite of ``instruction`` by the proposer LM (``None`` when it fails)."""
    try:
        with prompt_site(PROPOSER_SITE), dspy.context(lm=proposer.copy(rollout_id=rollout, temperature=1.0),
                                                      adapter=dspy.JSONAdapter()):
            text = dspy.Predict(ProposeInstruction)(site=site, instruction=instruction,
                                                    failures=failures).new_instruction.strip()
    except Exception as exc:  # noqa: BLE001 - a failed proposal is one candidate fewer
        logger.warning("proposer failed for %s: %s", site, exc)
        return None
    return text or None


def failure_summary(attributions: Sequence[Attribution], site: str) -> str:
    """The failures blamed on ``site``, one line each: what the proposer rewrites from."""
    lines = [f"- {a.error_type.value}: {a.explanation[:300]}" for a in attributions if a.target == site]
    return "\n".join(lines)[:3000] or "(no failure attributed here yet)"


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
    """TPE over LLM-proposed instructions per blamed site and the values of blamed knobs.

    The study is a :class:`~optloop.loop.study.SharedStudy`: several workers may ask it for
    trials at once. Each site's candidate instructions are proposed once per study (first
    proposer wins, the others wait for its list), so every worker searches the same space; a
    candidate is claimed before it is evaluated, so no two workers evaluate the same one.
    """

    name = "optuna"
    max_duplicates = 20

    def __init__(self, *args: Any, storage: str | None = None, study_name: str | None = None,
                 shared: SharedStudy | None = None, budget: int = MAX_BUDGET_SLOTS, proposals: int = 3,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if shared is None:  # a study of its own (one worker)
            if storage is None or study_name is None:
                raise ConfigError("OptunaOptimizer needs a shared study, or a storage URL and a study name")
            shared = SharedStudy(storage, study_name, worker=uuid.uuid4().hex[:12], budget=budget, seed=self.seed)
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
        if stored is not None:  # proposals are made once per study, so every worker and a resumed study see
            return list(stored)  # the same space
        holder = self.shared.claim(f"optloop:proposing:{site}", {"worker": self.shared.worker})["worker"]
        if holder != self.shared.worker:
            stored = self.shared.wait_for(key, holder=holder, what=f"candidate instructions for {site}")
            if stored is not None:
                return list(stored)
            logger.warning("%s stopped before proposing for %s; proposing here", self.shared.describe(holder), site)
        seed_text = base.sites[site].instructions
        failures = failure_summary(best_eval.attributions(), site)
        texts = [seed_text]
        for i in range(self.proposals):
            text = propose_instruction(self.proposer, site, seed_text, failures, rollout=i)
            if text and text not in texts:
                texts.append(text)
        return list(self.shared.claim(key, texts))

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        from optuna.trial import TrialState

        spaces = {f"site:{s}": self._instructions(s, best, best_eval) for s in self.sites}
        # knob values around the baseline's, not the best's: a categorical's choices may never change in a study
        spaces |= {f"knob:{k}": knob_choices(self.evaluator.system_name, k, self._base_knobs.get(k))
                   for k in self.knobs if k in best.knobs}
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
                    sites[target] = SiteState(instructions=choices[index], demos=best.sites[target].demos)
                else:
                    knobs[target] = choices[index]
            candidate = Candidate(sites=sites, knobs=knobs, origin=f"optuna trial {trial.number}")
            digest = candidate.digest()
            if digest in self.seen:
                previous = [t for t in self.study.trials if t.params == trial.params and t.value is not None]
                self.study.tell(trial, previous[0].value if previous else 0.0)  # already evaluated: no budget spent
                self.duplicates += 1
                continue
            self.seen.add(digest)
            owner = self.shared.claim_candidate(digest, trial.number)
            if owner["worker"] != self.shared.worker:  # another worker has it: its result, when known, is ours
                trial.set_user_attr("optloop:duplicate_of", owner["study_trial"])
                theirs = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                          if t.number == owner["study_trial"]]
                if theirs:
                    self.study.tell(trial, theirs[0].value)
                else:
                    self.study.tell(trial, state=TrialState.FAIL)
                self.duplicates += 1
                continue
            trial.set_user_attr("optloop:digest", digest)
            self.pending[digest] = trial
            return candidate
        logger.warning("optuna keeps proposing evaluated candidates: the search space is exhausted")
        return None

    def observe(self, candidate: Candidate, evaluation: Evaluation, trial: int) -> None:
        optuna_trial = self.pending.pop(candidate.digest(), None)
        if optuna_trial is not None:
            optuna_trial.set_user_attr("optloop:trial", trial)
            self.study.tell(optuna_trial, evaluation.accuracy)

    def release(self, candidate: Candidate) -> None:
        from optuna.trial import TrialState

        optuna_trial = self.pending.pop(candidate.digest(), None)
        if optuna_trial is not None:  # the budget went to other workers: not evaluated
            self.study.tell(optuna_trial, state=TrialState.FAIL)

    def study_trial(self, candidate: Candidate) -> int | None:
        optuna_trial = self.pending.get(candidate.digest())
        return None if optuna_trial is None else optuna_trial.number


class _Charged(dspy.BaseLM):
    """The proposer LM, its calls charged to the ``optimizer.proposer`` site.

    With ``keys`` (used for SIMBA's rule step), a JSON request is sent with SIMBA's
    ``OfferFeedback`` schema (DSPy sends bare JSON mode for its open dict), its
    free-form ``module_advice`` dict asked for with exactly those keys (the modules the optimizer may change):
    a stricter schema than the original, so any answer is still valid, and a
    small model under grammar-constrained decoding no longer invents keys forever.
    """

    def __init__(self, lm: dspy.BaseLM, keys: Sequence[str] = ()):
        super().__init__(model=getattr(lm, "model", "proposer"), model_type="chat", cache=False)
        self.inner = lm
        self.keys = list(keys)
        self.kwargs = dict(getattr(lm, "kwargs", {}))

    @property
    def supports_response_schema(self) -> bool:
        return bool(getattr(self.inner, "supports_response_schema", False))

    @property
    def supported_params(self) -> set[str]:
        return set(getattr(self.inner, "supported_params", set()))

    def forward(self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **kwargs: Any):
        fmt = kwargs.get("response_format")
        if self.keys and fmt is not None:
            schema, _ = response_format_to_schema(fmt)
            if schema is None:  # DSPy asks for bare JSON when an output is an open dict: give SIMBA's schema
                from dspy.teleprompt.simba_utils import OfferFeedback

                from signatures._layout import output_model

                schema = output_model(OfferFeedback).model_json_schema()
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"schema": _fixed_keys(schema, self.keys)}}
        with prompt_site(PROPOSER_SITE):
            respond = getattr(self.inner, "provider_response", self.inner.forward)  # OptloopLM: keeps the rollout
            return respond(prompt=prompt, messages=messages, **kwargs)

    def copy(self, **kwargs: Any) -> _Charged:
        return _Charged(self.inner.copy(**kwargs), self.keys)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Charged:
        return self


def _fixed_keys(schema: Any, keys: Sequence[str]) -> Any:
    """``schema`` with every free-form string dict given exactly ``keys``."""
    if isinstance(schema, list):
        return [_fixed_keys(s, keys) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _fixed_keys(v, keys) for k, v in schema.items()}
    extra = out.get("additionalProperties")
    if out.get("type") == "object" and isinstance(extra, dict) and not out.get("properties"):
        out["properties"] = {k: dict(extra) for k in keys}
        out["required"] = list(keys)
        out["additionalProperties"] = False
    return out


from optloop.loop.edit import EditOptimizer  # noqa: E402 - edit builds on this module's base, not on this module

OPTIMIZERS: dict[str, type[Optimizer]] = {"simba": SimbaOptimizer, "gepa": GepaOptimizer, "optuna": OptunaOptimizer,
                                          "edit": EditOptimizer}


__all__ = ["OPTIMIZERS", "BlamedSiteSelector", "EditOptimizer", "GepaOptimizer", "Optimizer", "OptunaOptimizer", "SimbaOptimizer",
           "knob_choices"]
