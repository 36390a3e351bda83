"""The run's shape that every optimizer's cost model reads: what ``--estimate`` adds to the trials.

Before a trial's dev evaluation the optimizer runs candidates on train and asks the proposer LM
for text. Each optimizer models that work in a function ``work`` beside it
(``optloop/loop/optimizers/<name>.py``, found by
:func:`~optloop.loop.optimizers.work.cost_model`), from its structure and the :class:`RunShape`
made here (:func:`run_shape`: the targets the baseline's blame picks and its measured rates).
Once the run has finished trials, ``--estimate`` measures that work instead
(:func:`~optloop.loop.spending.optimizer_work.measured_work`). The estimate as a whole:
``docs/loop.md``, "Spending limits".
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

import dspy
from pydantic import BaseModel, Field

from optloop.attribution import blame
from optloop.loop.policy import choose_targets
from optloop.loop.proposals.writer import CASE_CHARS, MAX_CASES, failure_summary
from optloop.loop.spending.optimizer_work import OptimizerWork

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.candidate import Candidate
    from optloop.loop.evaluate import Evaluation
    from optloop.loop.state import Checkpoint, LoopConfig

CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text and BPE tokenizers
JSON_TOKENS = 10  # the JSON wrapping of a completion ({"field": "..."})
FIELD_TOKENS = 60  # one advice field of SIMBA's (a sentence or two), or the discussion
FEEDBACK_TOKENS = 80  # GEPA's feedback on one example: the attribution's explanation
PARAPHRASES_PER_EXTRA = 0.5  # a composed edit has 1.5 operations on average, one in 3 a paraphrase
# A writing task shows up to MAX_CASES failures of about CASE_CHARS characters (~4 a token), and
# its answer is a sentence or a short instruction.
WRITE_CASE_TOKENS = MAX_CASES * CASE_CHARS // 4
WRITE_TOKENS = 60
RULE_SHARE = 0.5  # SIMBA gives a new program a rule or a demo with equal odds
ACCEPT_SHARE = 0.5  # of GEPA's mutations, how many beat their parent on the mini-batch


class RunShape(BaseModel):
    """What a model of the optimizer's work reads: the run's shape and the baseline's
    measurements."""

    budget: int
    train_questions: int
    train_episodes: int
    sites: list[str] = Field(
        description="the optimizer's target sites, most blamed first (as the baseline's blame "
        "chooses them; re-attribution may move them)"
    )
    ingest_sites: list[str] = Field(
        default_factory=list, description="of ``sites``, the ingest-stage ones"
    )
    instructions: dict[str, str] = Field(
        default_factory=dict, description="target site -> its start instruction"
    )
    failure_chars: dict[str, int] = Field(
        default_factory=dict,
        description="target site -> characters of the failure summary a proposer "
        "reads (the baseline's dev failures)",
    )
    prompt_tokens: dict[str, float] = Field(
        default_factory=dict,
        description="site -> mean prompt tokens of one computed call, measured",
    )
    question_calls: float = Field(
        description="system-LM requests to answer one train question, ingestion aside (measured)"
    )
    ingest_calls: float = Field(description="requests to ingest one train episode (measured)")
    question_tokens: float | None = Field(
        description="tokens of one such request (measured; None: all cached)"
    )
    ingest_tokens: float | None = Field(
        None, description="tokens of one ingest request (measured; None: all cached)"
    )
    threads: int = Field(
        1, description="programs SIMBA and GEPA run at once (optimizers.default_threads)"
    )
    batch: int = Field(
        1,
        description="trials evaluated at once (--batch): SIMBA evaluates up to that many of a "
        "step's new programs, so a run takes fewer steps",
    )

    def tokens(self, text: str) -> float:
        return len(text) / CHARS_PER_TOKEN

    def instruction_tokens(self, site: str) -> float:
        return self.tokens(self.instructions.get(site, ""))

    def call_tokens(self, site: str) -> float:
        """One call's prompt at ``site`` (what a trajectory shows of it): measured, else its
        instruction alone."""
        return self.prompt_tokens.get(site) or self.instruction_tokens(site)

    def work(
        self,
        optimizer: str,
        *,
        rounds: int,
        trials_per_round: float,
        question_runs: float,
        episode_ingests: float,
        proposer_calls: float,
        prompt_tokens: float,
        completion_tokens: float,
        threads: int | None,
        basis: str,
    ) -> OptimizerWork:
        """The work of ``question_runs`` train questions, ``episode_ingests`` episode ingestions
        and ``proposer_calls`` (``prompt_tokens``, ``completion_tokens`` each), at this run's
        measured rates.

        A model counts, over the whole run, the **runs on train** on the system LM: train
        questions answered (``question_runs``, at the measured requests of answering one, its
        ingestion aside) and train episodes ingested again (``episode_ingests``, at the measured
        requests of ingesting one: a candidate that changes an ingest-stage site cannot reuse the
        stores); and the **proposer calls** with their tokens: a proposer prompt is its template
        (:func:`template_tokens`) plus what the optimizer puts in it (the instruction, the failure
        summary, a trajectory: one call's prompt at each shown site, as measured on the
        baseline), at :data:`CHARS_PER_TOKEN` characters a token; its completion is the text
        asked for."""
        calls = question_runs * self.question_calls + episode_ingests * self.ingest_calls
        parts = [
            (question_runs * self.question_calls, self.question_tokens),
            (episode_ingests * self.ingest_calls, self.ingest_tokens),
        ]
        known = all(per is not None for n, per in parts if n)
        tokens = sum(n * (per or 0.0) for n, per in parts) if known else None
        return OptimizerWork(
            optimizer=optimizer,
            rounds=rounds,
            trials_per_round=trials_per_round,
            calls=calls,
            tokens=tokens,
            proposer_calls=proposer_calls,
            proposer_prompt_tokens=proposer_calls * prompt_tokens,
            proposer_completion_tokens=proposer_calls * completion_tokens,
            threads=threads,
            basis=basis,
        )


@functools.lru_cache(maxsize=32)
def template_tokens(signature: type[dspy.Signature]) -> float:
    """The tokens of a proposer prompt with empty inputs, as DSPy's JSON adapter sends it."""
    messages = dspy.JSONAdapter().format(
        signature, demos=[], inputs={name: "" for name in signature.input_fields}
    )
    return sum(len(str(m.get("content") or "")) for m in messages) / CHARS_PER_TOKEN


# --- the run's shape -----------------------------------------------------------------------------


def _per_call(evaluation: Evaluation, ingest: set[str], at_ingest: bool) -> float | None:
    """Tokens of one computed call of ``evaluation`` at its ingest-stage sites (``at_ingest``) or
    at the others; of any call when it has no per-site figures. ``None`` when no such call was
    computed."""
    if not evaluation.sites:
        return evaluation.tokens / evaluation.model_calls if evaluation.model_calls else None
    chosen = [cost for site, cost in evaluation.sites.items() if (site in ingest) == at_ingest]
    computed = sum(cost.model_calls for cost in chosen)
    return sum(cost.tokens for cost in chosen) / computed if computed else None


def run_shape(
    ckpt: Checkpoint,
    config: LoopConfig,
    train: Dataset,
    *,
    stages: Mapping[str, str],
    start: Candidate | None,
    threads: int = 1,
) -> RunShape:
    """The shape of the run ``ckpt`` holds the baseline of: ``train``, the split; ``stages``, the
    system's prompt sites and their stages (``ingest``, ``retrieve``, ``answer``); ``start``, the
    program the run starts from.

    The target sites are chosen from the baseline's blame as the loop chooses them; the per-request
    rates are the baseline's train evaluation's (ingestion apart from the questions, tokens per
    computed call per stage)."""
    train_eval, dev = ckpt.baseline_train, ckpt.baseline_dev
    assert train_eval is not None and dev is not None, "the shape needs the baseline"
    both = [train_eval, dev]
    if config.sites:
        sites = list(config.sites)
    else:  # as Controller._target chooses them
        passed = sum(o.passed for ev in both for o in ev.outcomes)
        entries = blame([a for ev in both for a in ev.attributions()], passed=passed)
        sites = choose_targets(entries, config, list(stages))[0]
    ingest = {name for name, stage in stages.items() if stage == "ingest"}
    questions = sum(len(e.questions) for e in train.episodes)
    episodes = len(train.episodes)
    prompt_tokens = {}
    for site in sites:
        costs = [ev.sites[site] for ev in both if site in ev.sites]
        if computed := sum(c.model_calls for c in costs):
            prompt_tokens[site] = sum(c.prompt_tokens for c in costs) / computed
    return RunShape(
        budget=config.budget,
        train_questions=questions,
        train_episodes=episodes,
        sites=sites,
        ingest_sites=[s for s in sites if s in ingest],
        instructions={
            s: start.sites[s].instructions for s in sites if start is not None and s in start.sites
        },
        failure_chars={s: len(failure_summary(dev.attributions(), s)) for s in sites},
        prompt_tokens=prompt_tokens,
        question_calls=(train_eval.llm_calls - train_eval.ingest_calls) / max(questions, 1),
        ingest_calls=train_eval.ingest_calls / max(episodes, 1),
        question_tokens=_per_call(train_eval, ingest, at_ingest=False),
        ingest_tokens=_per_call(train_eval, ingest, at_ingest=True),
        threads=threads,
        batch=config.batch,
    )


__all__ = [
    "CHARS_PER_TOKEN",
    "RunShape",
    "run_shape",
    "template_tokens",
]
