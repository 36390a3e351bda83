"""GEPA: one GEPA run per target set, its ``log_dir`` under ``<work>/``: each round resumes it with
a larger metric-call budget, so its Pareto front and candidates carry over; a component selector
returns the blamed sites, and the metric's feedback for a site is the attribution explanation of
its failures. Its new candidates are queued; every reflection passes the proposal gate
(:class:`GatedProposer`).

Its mini-batch runs are the optimizer's own cost: counted and reported, not evaluations.
:func:`work` models them for ``--estimate`` from the defaults below.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt.gepa import InstructionProposer

from optloop.lm import collect_calls, prompt_site
from optloop.loop.budget.estimate import OptimizerWork
from optloop.loop.budget.shape import (
    ACCEPT_SHARE,
    CHARS_PER_TOKEN,
    FEEDBACK_TOKENS,
    JSON_TOKENS,
    RunShape,
)
from optloop.loop.candidate import Candidate
from optloop.loop.gate import current_gate
from optloop.loop.optimizers.base import PROPOSER_SITE
from optloop.loop.optimizers.registry import GEPA
from optloop.loop.optimizers.rounds import RoundsOptimizer
from optloop.loop.program import examples, feedback_metric, site_name
from optloop.paths import write_atomic


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


class GepaOptimizer(RoundsOptimizer):
    """One GEPA run per target set, resumed each round from its ``log_dir`` with a larger
    budget."""

    name = GEPA
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
    """``--optimizer gepa`` (see the module docstring)."""
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
