"""The models of each optimizer's own LM calls (``work`` in each optimizer's module, on a
``optloop.loop.spending.shape.RunShape``): what ``--estimate`` adds to the trials.

Each model is checked against the structure it states (rounds, runs on train, proposer calls) on a
hand-made
:class:`RunShape`; :func:`run_shape` against a baseline whose blame, calls and tokens are known.
How close the models come to a real run is checked end to end in ``test_run_cli.py`` (the
``--estimate`` test).
"""

from __future__ import annotations

import pytest

from optloop.attribution import Attribution, ErrorType
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.cost import LMCost
from optloop.loop.evaluate import Evaluation, QuestionOutcome
from optloop.loop.optimizers import registry
from optloop.loop.optimizers.edit import ParaphrasePhrase
from optloop.loop.optimizers.edit import work as edit_work
from optloop.loop.optimizers.gepa import work as gepa_work
from optloop.loop.optimizers.optuna import work as optuna_work
from optloop.loop.optimizers.propose import ProposeInstruction
from optloop.loop.optimizers.simba import work as simba_work
from optloop.loop.optimizers.work import cost_model, modeled_work
from optloop.loop.spending.estimate import trials_at_once
from optloop.loop.spending.shape import RunShape, run_shape, template_tokens
from optloop.loop.state import Checkpoint, LoopConfig

ANSWER, CURATE = "answer", "md_flat.curate"
FIVE_PHRASES = (
    "Answer briefly. Use the memories. Say I don't know, when unsure. Never guess."  # 5 phrases
)


def shape(**update) -> RunShape:
    """10 train questions in 5 episodes; 2 requests a question, 3 an episode's ingestion, 100
    tokens each."""
    fields = dict(
        budget=10,
        train_questions=10,
        train_episodes=5,
        sites=[ANSWER, CURATE],
        ingest_sites=[CURATE],
        instructions={ANSWER: FIVE_PHRASES, CURATE: "Keep the user's facts."},
        prompt_tokens={ANSWER: 400.0, CURATE: 300.0},
        question_calls=2.0,
        ingest_calls=3.0,
        question_tokens=100.0,
        ingest_tokens=100.0,
        threads=4,
    )
    return RunShape(**(fields | update))


def test_every_optimizer_has_a_model():
    assert all(callable(cost_model(name)) for name in registry.names())
    assert modeled_work(shape(), "nosuch") is None


def test_edit_screens_the_best_and_every_edit_of_a_round_on_a_mini_batch():
    work = edit_work(shape())
    # answer: 3 single-phrase deletions + delete all + 1 composed edit + 3 written; curate (one
    # phrase): delete all + 1 composed + 3 written
    # 10 trials, 13 edits a round: 1 round, and 4 (log2 11, rounded up) after a trial that beats
    # the best
    assert work.trials_per_round == 13 and work.rounds == 1 + 4
    assert (
        work.calls == 5 * 14 * 6 * 2.0 + 5 * 5 * 5 * 3.0
    )  # 14 screenings of 6 questions; curate edits ingest 5 episodes
    assert work.tokens == pytest.approx(work.calls * 100)
    assert (
        work.proposer_calls == 5 * 2 * 0.5 + 5 * 2 * 3 and work.threads is None
    )  # paraphrases and writing tasks; screening is an evaluation: --concurrency
    assert work.proposer_prompt_tokens / work.proposer_calls > template_tokens(
        ParaphrasePhrase
    )  # and a phrase
    assert "5 round(s) of 13 edits (4 of them after a trial that beats the best) (answer 8" in (
        work.basis
    )
    no_ingest = edit_work(shape(sites=[ANSWER], ingest_sites=[], budget=3))
    assert (
        no_ingest.rounds == 1 + 2 and no_ingest.calls == 3 * 9 * 6 * 2.0
    )  # the best and 8 edits, no store rebuilt
    assert edit_work(shape(sites=[ANSWER], ingest_sites=[], budget=1)).rounds == 1


def test_simba_runs_one_step_a_trial_and_asks_for_advice_for_half_its_new_programs():
    work = simba_work(shape(budget=3, ingest_sites=[]))
    assert work.rounds == 3 and work.trials_per_round == 1 and work.threads == 4
    assert work.calls == 3 * (2 + 3) * 6 * 2.0  # 2 sampled and 3 new programs on a mini-batch of 6
    assert work.proposer_calls == 3 * 1.5
    # the advice prompt shows both instructions and two trajectories (a call's prompt at each site)
    assert work.proposer_prompt_tokens / work.proposer_calls > 2 * (400 + 300)
    ingest = simba_work(shape(budget=3))
    assert (
        ingest.calls == work.calls + 3 * 1.5 * 5 * 3.0
    )  # a rule on curate rebuilds the mini-batch's episodes


def test_gepa_spends_the_metric_calls_a_round_is_granted_and_reflects_on_the_first_site():
    work = gepa_work(
        shape(train_questions=4, train_episodes=2, budget=2, sites=[ANSWER], ingest_sites=[])
    )
    # 2 x 4 + 12 = 20 metric calls a round; an iteration: 2 x 3 on mini-batches + half the time 4
    # on all train
    assert work.proposer_calls / work.rounds == pytest.approx(20 / 8)
    assert work.trials_per_round == pytest.approx(1.25) and work.rounds == 2
    assert work.calls == 2 * 20 * 2.0 and work.threads == 4
    assert (
        work.proposer_prompt_tokens / work.proposer_calls > 3 * 400
    )  # 3 examples, each a call's prompt


def test_optuna_proposes_up_front_and_runs_nothing_on_train():
    work = optuna_work(shape(failure_chars={ANSWER: 800, CURATE: 0}))
    assert (work.rounds, work.trials_per_round, work.calls, work.proposer_calls) == (0, 0, 0, 6)
    # a prompt: the template, the site's instruction and its failure summary (the mean over the 2
    # sites)
    assert work.proposer_prompt_tokens / 6 == pytest.approx(
        template_tokens(ProposeInstruction)
        + (len(FIVE_PHRASES) + len("Keep the user's facts.") + 800) / 4 / 2
    )


def evaluation(
    split: str,
    *,
    passed: int,
    failed: int,
    target: str,
    calls: int,
    ingest: int,
    sites: dict[str, LMCost],
) -> Evaluation:
    outcomes = [
        QuestionOutcome(
            episode_id="e",
            question_id=f"q{i}",
            task_type="t",
            question="?",
            gold="g",
            prediction="g" if i < passed else "x",
            score=float(i < passed),
            passed=i < passed,
            attribution=None
            if i < passed
            else Attribution(
                question_id=f"q{i}",
                error_type=ErrorType.RESPONSE,
                target=target,
                explanation="answered from nothing",
            ),
        )
        for i in range(passed + failed)
    ]
    return Evaluation(
        split=split,
        candidate="c",
        outcomes=outcomes,
        llm_calls=calls,
        ingest_calls=ingest,
        model_calls=calls,
        tokens=sum(c.tokens for c in sites.values()),
        sites=sites,
    )


def test_the_runs_shape_comes_from_the_baseline_and_the_loops_targeting():
    from optloop.datasets import load_dataset
    from optloop.loop.policy import split_dataset

    config = LoopConfig(system="md_flat", run_name="r", budget=4)
    train, _, _ = split_dataset(load_dataset("builtin:tiny"), config)  # 2 episodes, 4 questions
    train_eval = evaluation(
        "train",
        passed=2,
        failed=2,
        target=ANSWER,
        calls=8,
        ingest=4,
        sites={
            ANSWER: LMCost(calls=4, model_calls=4, tokens=800, prompt_tokens=760),
            CURATE: LMCost(calls=4, model_calls=4, tokens=400, prompt_tokens=300),
        },
    )
    dev_eval = evaluation(
        "dev",
        passed=1,
        failed=2,
        target=ANSWER,
        calls=5,
        ingest=2,
        sites={ANSWER: LMCost(calls=3, model_calls=2, tokens=400, prompt_tokens=380)},
    )
    ckpt = Checkpoint(config_digest="x", baseline_train=train_eval, baseline_dev=dev_eval)
    start = Candidate(
        sites={
            ANSWER: SiteState(instructions=FIVE_PHRASES),
            CURATE: SiteState(instructions="Keep."),
        }
    )
    stages = {ANSWER: "answer", CURATE: "ingest"}
    got = run_shape(ckpt, config, train, stages=stages, start=start, threads=4)
    assert (
        got.sites == [ANSWER] and got.ingest_sites == []
    )  # the blamed site, as the loop targets it
    assert (got.train_questions, got.train_episodes, got.budget, got.threads) == (4, 2, 4, 4)
    assert got.question_calls == (8 - 4) / 4 and got.ingest_calls == 4 / 2
    assert (
        got.question_tokens == 800 / 4 and got.ingest_tokens == 400 / 4
    )  # per computed call, by stage
    assert got.prompt_tokens == {ANSWER: (760 + 380) / 6} and got.instructions == {
        ANSWER: FIVE_PHRASES
    }
    assert got.failure_chars[ANSWER] > len("answered from nothing")  # the summary a proposer reads
    untargeted = run_shape(
        ckpt, config.model_copy(update={"untargeted": True}), train, stages=stages, start=start
    )
    assert untargeted.sites == [ANSWER, CURATE] and untargeted.ingest_sites == [CURATE]
    given = run_shape(
        ckpt, config.model_copy(update={"sites": [CURATE]}), train, stages=stages, start=start
    )
    assert given.sites == [CURATE] and given.ingest_sites == [CURATE]


def test_simba_with_a_batch_evaluates_several_programs_of_a_step_so_a_run_takes_fewer_steps():
    one, batched = simba_work(shape(budget=6)), simba_work(shape(budget=6, batch=4))
    assert (one.rounds, one.trials_per_round) == (6, 1)
    assert (batched.rounds, batched.trials_per_round) == (
        2,
        3,
    )  # a step makes 3 new programs: at most 3 a step
    assert batched.calls == pytest.approx(
        one.calls / 3
    ) and batched.proposer_calls == pytest.approx(one.proposer_calls / 3)


def test_a_batch_holds_no_more_trials_than_one_round_of_the_optimizer_yields():
    simba = simba_work(shape(budget=50, batch=8))
    assert trials_at_once(8, simba) == 3  # a SIMBA step makes 3 new programs
    assert trials_at_once(2, simba) == 2
    assert trials_at_once(8, None) == 8
    assert trials_at_once(8, optuna_work(shape(budget=50, batch=8))) == 8  # proposals up front
