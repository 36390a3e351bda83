"""SIMBA, GEPA and Optuna behind one interface: propose the next candidate to evaluate.

The loop owns the budget: it asks :meth:`Optimizer.propose` for a candidate,
evaluates it on the dev split (one evaluation of ``--budget``), and reports the
result back with :meth:`Optimizer.observe`. Each optimizer changes only its
``sites`` (the blamed prompt sites, or every site with ``--untargeted``) and
``knobs`` (Optuna only); the loop calls :meth:`retarget` when re-attribution
moves the blame.

- **SIMBA** (the default when an endpoint writes the instructions; ``edit`` on the embedded
  model, :func:`optloop.loop.request.default_optimizer`): one SIMBA step per round on the
  train split (:mod:`optloop.loop.simba`), on :class:`MemoryProgram` s whose only predictors
  are the blamed sites and whose metric returns the attribution beside the score.
  The program pool and its scores are kept across rounds (and across a resume,
  in ``<work>/pool.json``); each round's best new program is queued (with
  ``--batch K``, its best K, evaluated at once).
- **GEPA**: one GEPA run per target set, its ``log_dir`` under ``<work>/``: each
  round resumes it with a larger metric-call budget, so its Pareto front and
  candidates carry over; a component selector returns the blamed sites, and the
  metric's feedback for a site is the attribution explanation of its failures.
  Its new candidates are queued.
- **Optuna**: TPE over, per blamed site, the seed instruction and rewrites an
  LLM proposer writes from the attributions, plus the values of blamed knobs
  (each system's ``knob_values``); ask and tell, and with ``--batch K`` K asks
  before their tells (the trials asked meanwhile are running, as in Optuna's own
  ``n_jobs``). The study lives in ``--storage`` (SQLite by
  default), so it resumes; with ``postgresql://...`` several workers share it
  (see :mod:`optloop.loop.study`).

SIMBA's and GEPA's inner mini-batch runs are the optimizer's own cost: their
LLM calls are counted and reported, but they are not evaluations (``--estimate``
counts them with a model of each optimizer's rounds, :mod:`optloop.loop.overhead`,
which reads the defaults below: keep the two in step). They run
``num_threads`` programs at once (one on the embedded model): each thread records
into its own recorder, and a shared store serves one question at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import random
import uuid
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy
from dspy.teleprompt.gepa import InstructionProposer

from optloop.attribution import Attribution
from optloop.errors import ConfigError
from optloop.lm import collect_calls, prompt_site
from optloop.loop._base import PROPOSER_SITE, Optimizer
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.gate import ProposalGate, active, current_gate, register_template
from optloop.loop.program import (
    MemoryProgram,
    attr_name,
    examples,
    feedback_metric,
    running,
    site_name,
)
from optloop.loop.simba import (
    SimbaPool,
    SimbaSettings,
    append_advice,
    offer_advice,
    run_example,
    simba_step,
)
from optloop.loop.study import SharedStudy
from optloop.loop.writer import Writer, long_instruction
from optloop.paths import write_atomic

if TYPE_CHECKING:
    from optloop.loop.evaluate import Evaluation

logger = logging.getLogger(__name__)

MAX_EMPTY_ROUNDS = 3
MAX_BUDGET_SLOTS = 500


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


class _QueueOptimizer(Optimizer):
    """Runs rounds of a DSPy optimizer and hands out their new candidates one at a time."""

    fallback_rewrites = 2

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.queue: list[Candidate] = []

    def program(self, candidate: Candidate) -> MemoryProgram:
        """``candidate`` as a program whose predictors are the target sites."""
        return MemoryProgram(candidate, self.sites, self.evaluator.modules(candidate))

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        empty = 0
        while not self.queue and empty < MAX_EMPTY_ROUNDS:
            if not self.sites:
                return None
            self.rounds += 1
            with dspy_bars_hidden(), running(self.evaluator), active(self.gate):
                fresh = self._unseen(self.round(best), best)
                if not fresh:  # nothing this optimizer has not proposed already
                    fresh = self._unseen(self.rewrites(best, examples(self.trainset)), best)
            self.queue += fresh
            empty = 0 if fresh else empty + 1
        return self.queue.pop(0) if self.queue else None

    def release(self, candidate: Candidate) -> None:
        self.queue.insert(0, candidate)

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
        rules, or every reflection rejected): the proposer rewrites each blamed site's
        instruction from its attributed failures."""
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
            "%s produced no new program this round; %d attribution-guided rewrite(s) instead",
            self.name,
            len(out),
        )
        return out


class SimbaOptimizer(_QueueOptimizer):
    """SIMBA steps on one program pool kept across rounds (:mod:`optloop.loop.simba`)."""

    name = "simba"
    BSIZE, NUM_CANDIDATES = (
        6,
        2,
    )  # the defaults (also what --estimate's model of a step assumes: overhead.py)

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


class BlamedSiteSelector:
    """GEPA component selector: the blamed sites of the candidate, most-blamed first."""

    def __init__(self, sites: Sequence[str]):
        self.sites = list(sites)

    def __call__(
        self,
        state: Any,
        trajectories: Any,
        subsample_scores: Any,
        candidate_idx: int,
        candidate: dict[str, str],
    ) -> list[str]:
        chosen = [name for site in self.sites for name in candidate if site_name(name) == site]
        return chosen[:1] or list(candidate)[:1]


class GepaOptimizer(_QueueOptimizer):
    """One GEPA run per target set, resumed each round from its ``log_dir`` with a larger
    budget."""

    name = "gepa"
    REFLECTION_MINIBATCH = 3  # train examples a reflection sees (at most)

    def __init__(self, *args: Any, metric_calls: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.metric_calls = metric_calls

    @staticmethod
    def round_metric_calls(train: int) -> int:
        """The metric calls (program runs on one train example) a round grants GEPA by default: two
        passes over train and 12 more (also what --estimate's model of a round assumes:
        overhead.py)."""
        return 2 * train + 12

    def log_dir(self) -> Path:
        """The GEPA run of the current target sites (a retarget starts another: its candidates'
        components are those sites)."""
        key = hashlib.sha1(",".join(sorted(self.sites)).encode()).hexdigest()[:12]
        return self.work / f"run-{key}"

    def round(self, best: Candidate) -> list[Candidate]:
        train = examples(self.trainset)
        log_dir = self.log_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        ledger = (
            log_dir / "optloop.json"
        )  # what this run was granted so far: GEPA counts its calls since start
        granted = (
            json.loads(ledger.read_text()) if ledger.exists() else {"metric_calls": 0, "rounds": 0}
        )
        granted["metric_calls"] += self.metric_calls or self.round_metric_calls(len(train))
        granted["rounds"] += 1
        write_atomic(ledger, json.dumps(granted))
        gepa = dspy.GEPA(
            metric=feedback_metric,
            max_metric_calls=granted["metric_calls"],
            reflection_lm=self.proposer,
            instruction_proposer=GatedProposer(),
            component_selector=BlamedSiteSelector(self.sites),
            num_threads=self.num_threads,
            track_stats=True,
            use_merge=False,
            seed=self.seed + granted["rounds"],
            reflection_minibatch_size=min(self.REFLECTION_MINIBATCH, len(train)),
            log_dir=str(log_dir),
        )
        # Every LM call of a system runs on its own prompt site (an unknown prompt raises), so the
        # calls left to charge to this block's site are GEPA's reflections: the proposer's.
        with prompt_site(PROPOSER_SITE):
            result = gepa.compile(self.program(best), trainset=train, valset=train)
        programs = (
            list(result.detailed_results.candidates)
            if getattr(result, "detailed_results", None)
            else [result]
        )
        return [p.candidate("") for p in programs]


class GatedProposer(InstructionProposer):
    """GEPA's own instruction proposer, less the proposals the proposal gate refuses
    (:mod:`optloop.loop.gate`: cut off by the token limit, not well-formed, an echo of GEPA's
    reflection template, not an instruction for the site's job), each counted with a log line. A
    reflection left with no proposal makes no candidate: GEPA skips it without evaluating
    anything."""

    def __call__(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, str]:
        gate = current_gate()
        kept = {}
        for name in components_to_update:
            with collect_calls() as calls:
                proposed = super().__call__(candidate, reflective_dataset, [name])
            cut_off = any(c.truncated for c in calls)
            for component, text in proposed.items():
                if not gate.refuses(
                    site_name(component), text, who="GEPA's reflection", cut_off=cut_off
                ):
                    kept[component] = text
        return kept


@register_template
class ProposeInstruction(dspy.Signature):
    """You improve one prompt of an AI assistant's memory pipeline. Below is the prompt's current
    instruction and the failures attributed to it. Write a complete replacement instruction that keeps
    the task and the output format, and fixes these failures."""  # noqa: E501

    site: str = dspy.InputField(desc="which step of the pipeline this prompt drives")
    instruction: str = dspy.InputField(desc="the current instruction")
    failures: str = dspy.InputField(desc="attributed failures: error type and explanation")
    new_instruction: str = dspy.OutputField()


def propose_instruction(
    proposer: dspy.BaseLM,
    site: str,
    instruction: str,
    failures: str,
    *,
    rollout: int,
    gate: ProposalGate | None = None,
) -> str | None:
    """One rewrite of ``instruction`` by the proposer LM (``None`` when it fails, or when the
    proposal gate refuses what it wrote: :mod:`optloop.loop.gate`). A long instruction (a library
    prompt of thousands of tokens) is never handed over to be re-typed: the writer asks for a short
    instruction for the site's job instead (:meth:`optloop.loop.writer.Writer.instruction`)."""
    gate = gate or current_gate()
    if long_instruction(instruction):
        return Writer(proposer, gate).instruction(site, failures, rollout=rollout)
    try:
        with (
            prompt_site(PROPOSER_SITE),
            collect_calls() as calls,
            dspy.context(
                lm=proposer.copy(rollout_id=rollout, temperature=1.0), adapter=dspy.JSONAdapter()
            ),
        ):
            text = dspy.Predict(ProposeInstruction)(
                site=site, instruction=instruction, failures=failures
            ).new_instruction.strip()
    except Exception as exc:  # noqa: BLE001 - a failed proposal is one candidate fewer
        logger.warning("proposer failed for %s: %s", site, exc)
        return None
    cut_off = any(c.truncated for c in calls)
    if text and gate.refuses(
        site, text, who="the proposer's rewrite", cut_off=cut_off, shown=failures
    ):
        return None
    return text or None


def failure_summary(attributions: Sequence[Attribution], site: str) -> str:
    """The failures blamed on ``site``, one line each: what the proposer rewrites from."""
    lines = [
        f"- {a.error_type.value}: {a.explanation[:300]}" for a in attributions if a.target == site
    ]
    return "\n".join(lines)[:3000] or "(no failure attributed here yet)"


class OptunaOptimizer(Optimizer):
    """TPE over LLM-proposed instructions per blamed site and the values of blamed knobs.

    The study is a :class:`~optloop.loop.study.SharedStudy`: several workers may ask it for
    trials at once. Each site's candidate instructions are proposed once per study (first
    proposer wins, the others wait for its list), so every worker searches the same space; a
    candidate is claimed before it is evaluated, so no two workers evaluate the same one.
    """

    name = "optuna"
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
        if (
            stored is not None
        ):  # proposals are made once per study, so every worker and a resumed study see
            return list(stored)  # the same space
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
            if (
                digest in self.pending
            ):  # asked again while a batch evaluates it: no value to tell yet
                self.study.tell(trial, state=TrialState.FAIL)
                self.duplicates += 1
                continue
            if digest in self.seen:
                previous = [
                    t
                    for t in self.study.trials
                    if t.params == trial.params and t.value is not None
                ]
                self.study.tell(
                    trial, previous[0].value if previous else 0.0
                )  # already evaluated: no budget spent
                self.duplicates += 1
                continue
            self.seen.add(digest)
            owner = self.shared.claim_candidate(digest, trial.number)
            if (
                owner["worker"] != self.shared.worker
            ):  # another worker has it: its result, when known, is ours
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


# edit builds on this module's base, not on this module
from optloop.loop.edit import EditOptimizer  # noqa: E402

OPTIMIZERS: dict[str, type[Optimizer]] = {
    "simba": SimbaOptimizer,
    "gepa": GepaOptimizer,
    "optuna": OptunaOptimizer,
    "edit": EditOptimizer,
}


__all__ = [
    "OPTIMIZERS",
    "BlamedSiteSelector",
    "EditOptimizer",
    "GepaOptimizer",
    "Optimizer",
    "OptunaOptimizer",
    "SimbaOptimizer",
]
