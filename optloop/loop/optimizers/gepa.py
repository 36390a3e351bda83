"""GEPA: one GEPA run per target set, its ``log_dir`` under ``<work>/``: each round resumes it with
a larger metric-call budget, so its Pareto front and candidates carry over; a component selector
returns the blamed sites, and the metric's feedback for a site is the attribution explanation of
its failures. Its new candidates are queued; every reflection passes the proposal gate
(:class:`GatedProposer`).

A round ends early once :attr:`GepaSettings.refusals_to_stop` reflections in a row were refused
(or failed): a proposer that cannot write a reflection the gate passes would spend the rest of the
round's metric calls, a minute a reflection, on nothing to try. The round then falls back to the
proposer's rewrite of the blamed instructions (:meth:`RoundsOptimizer.rewrites`: a long
instruction gets the writer's short instruction for the site's job), judged by the same gate, in
the same round. The metric calls it left unspent are not carried over to the next round.

Its mini-batch runs are the optimizer's own cost: counted and reported, not evaluations.
:func:`work` models them for ``--estimate`` from the defaults below, for rounds whose reflections
pass the gate (a round cut short by refusals costs less, plus the rewrites' run of train and their
proposer calls, which are not modeled).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.gepa import InstructionProposer
from pydantic import BaseModel, Field

from optloop.lm import collect_calls, prompt_site
from optloop.loop.candidate import Candidate
from optloop.loop.optimizers.base import PROPOSER_SITE
from optloop.loop.optimizers.registry import GEPA
from optloop.loop.optimizers.rounds import RoundsOptimizer
from optloop.loop.program import examples, feedback_metric, site_name
from optloop.loop.proposals.gate import ProposalGate, current_gate
from optloop.loop.spending.estimate import OptimizerWork
from optloop.loop.spending.shape import (
    ACCEPT_SHARE,
    CHARS_PER_TOKEN,
    FEEDBACK_TOKENS,
    JSON_TOKENS,
    RunShape,
)
from optloop.paths import write_atomic

logger = logging.getLogger(__name__)


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


class GepaSettings(BaseModel):
    """The settings of a GEPA round, each with its one default (keyword arguments of
    :class:`GepaOptimizer`)."""

    metric_calls: int | None = Field(
        None,
        gt=0,
        description="metric calls (program runs on one train example) a round grants GEPA; "
        "None: GepaOptimizer.round_metric_calls of the train split",
    )
    refusals_to_stop: int = Field(
        3,
        ge=1,
        description="reflections in a row the proposal gate refused (or that failed) after which "
        "a round stops and falls back to the proposer's rewrite of the blamed instructions (the "
        "writer's short instruction for a long one); a reflection the gate passes starts the "
        "count again",
    )


class GepaOptimizer(RoundsOptimizer):
    """One GEPA run per target set, resumed each round from its ``log_dir`` with a larger
    budget."""

    name = GEPA
    REFLECTION_MINIBATCH = 3  # train examples a reflection sees (at most)

    def __init__(
        self,
        *args: Any,
        metric_calls: int | None = None,
        refusals_to_stop: int | None = None,
        **kwargs: Any,
    ):
        """``metric_calls``, ``refusals_to_stop``: :class:`GepaSettings` (``None``: its
        default)."""
        super().__init__(*args, **kwargs)
        given = {"metric_calls": metric_calls, "refusals_to_stop": refusals_to_stop}
        self.settings = GepaSettings(**{k: v for k, v in given.items() if v is not None})

    @property
    def metric_calls(self) -> int | None:
        return self.settings.metric_calls

    @staticmethod
    def round_metric_calls(train: int) -> int:
        """The metric calls (program runs on one train example) a round grants GEPA by default: two
        passes over train and 12 more (also what --estimate's model of a round assumes:
        :func:`work`)."""
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
        # what this run was granted so far: GEPA counts its calls since start
        ledger = log_dir / "optloop.json"
        granted = (
            json.loads(ledger.read_text()) if ledger.exists() else {"metric_calls": 0, "rounds": 0}
        )
        granted["metric_calls"] += self.metric_calls or self.round_metric_calls(len(train))
        granted["rounds"] += 1
        write_atomic(ledger, json.dumps(granted))
        proposer = GatedProposer(self.gate, refusals_to_stop=self.settings.refusals_to_stop)
        gepa = dspy.GEPA(
            metric=feedback_metric,
            max_metric_calls=granted["metric_calls"],
            reflection_lm=self.proposer,
            instruction_proposer=proposer,
            component_selector=BlamedSiteSelector(self.sites),
            num_threads=self.num_threads,
            track_stats=True,
            use_merge=False,
            seed=self.seed + granted["rounds"],
            reflection_minibatch_size=min(self.REFLECTION_MINIBATCH, len(train)),
            log_dir=str(log_dir),
            gepa_kwargs={"stop_callbacks": [proposer.should_stop]},
        )
        # Every LM call of a system runs on its own prompt site (an unknown prompt raises), so the
        # calls left to charge to this block's site are GEPA's reflections: the proposer's.
        with prompt_site(PROPOSER_SITE):
            result = gepa.compile(self.program(best), trainset=train, valset=train)
        details = getattr(result, "detailed_results", None)
        self.gave_up = proposer.exhausted
        if self.gave_up:
            spent = getattr(details, "total_metric_calls", None)
            logger.info(
                "GEPA round %d stopped after %d reflection(s) in a row were refused or failed "
                "(its run at %s of the %d metric calls granted so far)",
                self.rounds,
                proposer.refused_in_a_row,
                spent if spent is not None else "?",
                granted["metric_calls"],
            )
            if spent is not None and spent < granted["metric_calls"]:
                # What the round left unspent is not the next round's: a round costs what one
                # round is granted, as --estimate models it.
                granted["metric_calls"] = spent
                write_atomic(ledger, json.dumps(granted))
        programs = list(details.candidates) if details else [result]
        return [p.candidate("") for p in programs]


def shown_text(value: Any) -> str:
    """The words of what a reflection was shown (GEPA's reflective examples for one component:
    their inputs, the outputs and the feedback), one text for the gate to find an echo of the
    cases in: an answer that restates them ("Based on the memories provided, Maria donated her
    car ...") is fitted to those cases, not an instruction for the site."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "\n".join(shown_text(v) for v in value.values())
    if isinstance(value, Sequence):
        return "\n".join(shown_text(v) for v in value)
    return "" if value is None else str(value)


class GatedProposer(InstructionProposer):
    """GEPA's own instruction proposer, less the proposals the proposal gate refuses
    (:mod:`optloop.loop.proposals.gate`: cut off by the token limit, not well-formed, an echo of
    GEPA's reflection template, of the examples it was shown (:func:`shown_text`) or of the
    instruction it would replace, not an instruction for the site's job), each counted with a log
    line. A reflection left with no proposal makes no candidate: GEPA skips it without evaluating
    anything.

    ``gate``: the optimizer's gate (``None``: :func:`~optloop.loop.proposals.gate.current_gate`
    when called). It is held here, and the proposer's prompt site and the collection of its call
    records are set up inside each call, so a reflection that GEPA runs in a thread of its own
    (whose context holds none of the round's) is still judged by that gate, charged to the
    proposer and, when its answer was cut, refused as cut off.

    ``refusals_to_stop``: after that many reflections in a row with nothing kept (every proposal
    refused, or the reflection failed) :attr:`exhausted` is true, and :meth:`should_stop`, given
    to GEPA as a stop condition, ends the run; a reflection with a proposal the gate passes
    starts the count again (``None``: never)."""

    def __init__(self, gate: ProposalGate | None = None, *, refusals_to_stop: int | None = None):
        super().__init__()
        self.gate = gate
        self.refusals_to_stop = refusals_to_stop
        self.refused_in_a_row = 0
        self._lock = threading.Lock()

    @property
    def exhausted(self) -> bool:
        """Whether the last :attr:`refusals_to_stop` reflections all ended with nothing kept."""
        return self.refusals_to_stop is not None and self.refused_in_a_row >= self.refusals_to_stop

    def should_stop(self, state: Any) -> bool:
        """GEPA's stop condition (its ``StopperProtocol``): :attr:`exhausted`."""
        return self.exhausted

    def __call__(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, str]:
        gate = self.gate if self.gate is not None else current_gate()
        kept: dict[str, str] = {}
        judged = False
        try:
            for name in components_to_update:
                with prompt_site(PROPOSER_SITE), collect_calls() as calls:
                    proposed = super().__call__(candidate, reflective_dataset, [name])
                cut_off = any(c.truncated for c in calls)
                for component, text in proposed.items():
                    judged = True
                    if not gate.refuses(
                        site_name(component),
                        text,
                        who="GEPA's reflection",
                        cut_off=cut_off,
                        shown=shown_text(reflective_dataset.get(component, ())),
                        replaces=candidate.get(component, ""),
                    ):
                        kept[component] = text
        except Exception:
            judged = True  # a failed reflection leaves nothing to try either; GEPA logs it
            raise
        finally:
            if judged:
                with self._lock:
                    self.refused_in_a_row = 0 if kept else self.refused_in_a_row + 1
        return kept


# --- its cost model (--estimate) ---------------------------------------------------------


def gepa_template_tokens() -> float:
    """The tokens of GEPA's reflection prompt with empty inputs (its default instruction-proposal
    template)."""
    try:
        from gepa.strategies.instruction_proposal import InstructionProposalSignature
    except ImportError:  # another GEPA layout: its template was 942 characters in gepa 0.1
        return 942 / CHARS_PER_TOKEN
    return len(InstructionProposalSignature.default_prompt_template) / CHARS_PER_TOKEN


def work(shape: RunShape) -> OptimizerWork:
    """``--optimizer gepa``'s cost model. A round over ``Q`` train questions is granted ``2Q + 12``
    metric calls (:meth:`GepaOptimizer.round_metric_calls`; one program run on one train question
    each); an iteration runs the current candidate and its mutation on a mini-batch of ``r =
    min(REFLECTION_MINIBATCH, Q)`` and, for the one mutation in two accepted
    (:data:`~optloop.loop.spending.shape.ACCEPT_SHARE`), the new candidate on all ``Q``: about
    ``(2Q + 12) / (2r + Q/2)`` reflection calls a round, half of them new candidates (trials), at
    least one. It mutates the most blamed site only. Its reflections are assumed to pass the
    gate: a round ended early by refused reflections costs less."""
    opt = GepaOptimizer
    q = max(shape.train_questions, 1)
    r = min(opt.REFLECTION_MINIBATCH, q)
    granted = opt.round_metric_calls(q)
    iterations = granted / (2 * r + ACCEPT_SHARE * q)
    per_round = max(iterations * ACCEPT_SHARE, 1.0)
    rounds = math.ceil(shape.budget / per_round)
    site = shape.sites[0] if shape.sites else ""
    ingests = (
        iterations * (min(r, shape.train_episodes) + ACCEPT_SHARE * shape.train_episodes)
        if site in shape.ingest_sites
        else 0.0
    )
    prompt = (
        gepa_template_tokens()
        + shape.instruction_tokens(site)
        + r * (shape.call_tokens(site) + FEEDBACK_TOKENS)
    )
    return shape.work(
        opt.name,
        rounds=rounds,
        trials_per_round=per_round,
        question_runs=rounds * granted,
        episode_ingests=rounds * ingests,
        proposer_calls=rounds * iterations,
        prompt_tokens=prompt,
        completion_tokens=shape.instruction_tokens(site) + JSON_TOKENS,
        threads=shape.threads,
        basis=(
            f"{rounds} GEPA round(s) of {granted} program runs on train questions and "
            f"{iterations:.1f} reflection call(s) on {site or 'the first site'} (mini-batches "
            f"of {r}, one mutation in two accepted and run on all {q}: {per_round:.2g} trial(s) "
            "a round)"
        ),
    )
