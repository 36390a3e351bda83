"""Spending limits and ``--estimate`` in the controller, driven by the fakes of
``test_controller``.

The fake meter charges 10 model calls per evaluation and 1 per proposal, at $0.01 a call, so
every limit below falls at a known step. A run stopped by a limit must leave nothing half done
(no open or discarded trial, nothing to redo), and the same run resumed with a higher limit, or
none, must end exactly where an unlimited run ends, at exactly its cost.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from optloop.datasets import load_dataset
from optloop.loop.evaluate import Evaluation
from optloop.loop.spending.estimate import (
    Chains,
    OptimizerWork,
    estimate,
    measured_chains,
    measured_work,
)
from optloop.loop.spending.limits import ESTIMATE, MAX_CALLS, MAX_COST, RunStopped, SpendingLimits
from optloop.loop.state import Checkpoint, Trial
from optloop.loop.workers.coordinator import LocalCoordinator
from tests.optloop.loop.test_controller import (
    BASE,
    EVALUATION_CALLS,
    PROPOSAL_CALLS,
    Clock,
    MemorySink,
    Run,
    without_cost,
)

DOLLARS_PER_CALL = 0.01
BASELINE = 2 * EVALUATION_CALLS  # train + dev
CONTROL = EVALUATION_CALLS  # the trivial-instruction control on dev, before the first trial
TRIAL = EVALUATION_CALLS + PROPOSAL_CALLS


def priced(run: Run) -> Run:
    """``run`` whose meter also reports model calls and dollars, as ``Loop._cost`` does for a
    priced model."""
    meter = run.meter
    run.context.cost = lambda: {
        "llm_calls": meter.calls,
        "model_calls": meter.calls,
        "tokens": 100 * meter.calls,
        "cost_usd": round(meter.calls * DOLLARS_PER_CALL, 9),
    }
    return run


def limited(path: Path, sink: MemorySink, limits: SpendingLimits, **kwargs) -> Run:
    run = priced(Run(path, sink, sink.clock, **kwargs))
    run.context.limits = limits
    return run


def stop(path: Path, sink: MemorySink, limits: SpendingLimits) -> tuple[RunStopped, Run]:
    run = limited(path, sink, limits)
    with pytest.raises(RunStopped) as stopped:
        run.run()
    return stopped.value, run


def clean_run(tmp_path: Path):
    sink = MemorySink(Clock())
    run = priced(Run(tmp_path / "clean.json", sink, sink.clock))
    return run.run()


def nothing_half_done(path: Path, sink: MemorySink) -> None:
    ckpt = Checkpoint.load(path)
    assert all(t.evaluation is not None for t in ckpt.trials) and not ckpt.finished
    assert all(r["status"] == "FINISHED" for r in sink.children.values()) and sink.discarded == []
    assert sorted(sink.dev_steps()) == list(
        range(len(ckpt.trials) + 1)
    )  # every trial's acc_dev point logged


def test_max_calls_stops_after_a_trial_and_a_higher_limit_resumes_to_the_unlimited_result(
    tmp_path,
):
    path, sink = tmp_path / "ckpt.json", MemorySink(Clock())
    stopped, _ = stop(
        path, sink, SpendingLimits(max_calls=BASELINE + CONTROL + TRIAL + 1)
    )  # reached during trial 2
    assert (
        stopped.reason == MAX_CALLS
        and str(stopped) == "--max-calls 42 reached: the run has made 52 model calls"
    )
    ckpt = Checkpoint.load(path)
    assert (
        len(ckpt.trials) == 2 and ckpt.spending["model_calls"] == BASELINE + CONTROL + 2 * TRIAL
    )  # trial 2 was finished
    nothing_half_done(path, sink)

    again, run = stop(
        path, sink, SpendingLimits(max_calls=BASELINE + CONTROL + 2 * TRIAL)
    )  # the same total: no new step
    assert again.reason == MAX_CALLS and run.evaluator.calls == [] and run.optimizers == []
    assert Checkpoint.load(path).spending == {
        "llm_calls": 0,
        "model_calls": 0,
        "tokens": 0,
        "cost_usd": 0.0,
    }

    _, run = stop(
        path, sink, SpendingLimits(max_calls=BASELINE + CONTROL + 4 * TRIAL)
    )  # a higher limit: two more trials
    assert [c[0] for c in run.evaluator.calls] == ["dev", "dev"] and len(
        Checkpoint.load(path).trials
    ) == 4
    nothing_half_done(path, sink)

    result = limited(
        path, sink, SpendingLimits(max_calls=10_000)
    ).run()  # high enough: it finishes
    clean = clean_run(tmp_path)
    assert without_cost(result) == without_cost(clean)
    assert result.cost == clean.cost | {
        "processes": 4
    }  # nothing was redone: exactly the unlimited run's cost
    assert (
        sink.trials() == [1, 2, 3, 4, 5]
        and sink.discarded == []
        and sorted(sink.dev_steps()) == list(range(6))
    )


def test_max_cost_stops_before_each_held_out_evaluation_and_the_run_finishes_as_an_unlimited_one(
    tmp_path,
):
    path, sink = tmp_path / "ckpt.json", MemorySink(Clock())
    after_trials = (
        BASELINE + CONTROL + 5 * TRIAL
    ) * DOLLARS_PER_CALL  # $0.85: every trial done, the test not begun
    stopped, _ = stop(path, sink, SpendingLimits(max_cost=after_trials - 0.05))
    assert (
        stopped.reason == MAX_COST
        and str(stopped) == "--max-cost 0.8 reached: the run has spent $0.850000"
    )
    ckpt = Checkpoint.load(path)
    assert len(ckpt.trials) == 5 and ckpt.test_before is None and sink.summary is None
    nothing_half_done(path, sink)

    stopped, run = stop(
        path, sink, SpendingLimits(max_cost=after_trials + 0.05)
    )  # one held-out evaluation more
    ckpt = Checkpoint.load(path)
    assert run.evaluator.calls[0][0] == "test" and len(run.evaluator.calls) == 1
    assert ckpt.test_before is not None and ckpt.test_after is None and stopped.reason == MAX_COST

    result = limited(path, sink, SpendingLimits(max_cost=5.0)).run()
    clean = clean_run(tmp_path)
    assert without_cost(result) == without_cost(clean) and result.cost == clean.cost | {
        "processes": 3
    }
    assert result.cost["cost_usd"] == pytest.approx(
        (11 * EVALUATION_CALLS + 5 * PROPOSAL_CALLS) * DOLLARS_PER_CALL
    )
    assert len(sink.registered) == 1 and Checkpoint.load(path).finished


def test_estimate_stops_after_the_baseline_and_the_next_run_reuses_it(tmp_path):
    path, sink = tmp_path / "ckpt.json", MemorySink(Clock())
    stopped, run = stop(path, sink, SpendingLimits(estimate=True))
    assert stopped.reason == ESTIMATE and [c[0] for c in run.evaluator.calls] == ["train", "dev"]
    ckpt = Checkpoint.load(path)
    assert ckpt.baseline_dev is not None and ckpt.trials == [] and sink.dev == [(0, 0.25, 0.25)]
    assert len(sink.targets) == 0  # stopped before anything but the baseline was done

    resumed = limited(path, sink, SpendingLimits())
    result = resumed.run()
    assert "train" not in [
        c[0] for c in resumed.evaluator.calls
    ]  # the baseline came from the checkpoint
    # the control (targeted once the baseline is known) and the five trials
    assert [c[0] for c in resumed.evaluator.calls].count("dev") == 6
    clean = clean_run(tmp_path)
    assert without_cost(result) == without_cost(clean) and result.cost == clean.cost | {
        "processes": 2
    }


class SpendingWorkers(LocalCoordinator):
    """One worker of a shared run whose other workers have spent ``others`` already."""

    def __init__(self, budget: int, others: dict[str, float]):
        super().__init__(budget)
        self.others = others

    def others_cost(self) -> dict[str, float]:
        return dict(self.others)


def test_a_limit_counts_what_the_other_workers_spent(tmp_path):
    path, sink = tmp_path / "ckpt.json", MemorySink(Clock())
    run = limited(
        path, sink, SpendingLimits(max_cost=1.0), coordinator=SpendingWorkers(5, {"cost_usd": 0.9})
    )
    with pytest.raises(
        RunStopped, match=r"spent \$1\.000000"
    ):  # 0.9 + the baseline's train, 10 calls at $0.01
        run.run()
    assert [c[0] for c in run.evaluator.calls] == [
        "train"
    ]  # stopped before the baseline's dev evaluation
    ckpt = Checkpoint.load(path)
    assert ckpt.baseline_train is not None and ckpt.baseline_dev is None and ckpt.trials == []


# --- the limits and the estimate alone -----------------------------------------------------------


@pytest.mark.parametrize(
    "limits, total, reason",
    [
        (
            SpendingLimits(max_cost=1.0),
            {"cost_usd": 0.6, "proposer_cost_usd": 0.4},
            MAX_COST,
        ),  # both LMs count
        (SpendingLimits(max_cost=1.0), {"cost_usd": 0.99}, None),
        (
            SpendingLimits(max_calls=5),
            {"model_calls": 3, "proposer_model_calls": 2, "llm_calls": 100},
            MAX_CALLS,
        ),
        (
            SpendingLimits(max_calls=5),
            {"model_calls": 4, "llm_calls": 100},
            None,
        ),  # cache hits are free
        (SpendingLimits(), {"model_calls": 10**9, "cost_usd": 10**9}, None),
    ],
)
def test_a_limit_is_reached_when_the_total_gets_to_it(limits, total, reason):
    if reason is None:
        limits.check(total, baseline_done=True)
        return
    with pytest.raises(RunStopped) as stopped:
        limits.check(total, baseline_done=True)
    assert stopped.value.reason == reason


def test_limits_are_positive():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        SpendingLimits(max_cost=0)
    with pytest.raises(ValidationError):
        SpendingLimits(max_calls=0)
    assert not SpendingLimits().active and SpendingLimits(estimate=True).active


def measured(
    split: str,
    *,
    calls: int,
    computed: int,
    tokens: int,
    dollars: float | None,
    lm_seconds: float | None,
    seconds: float,
) -> Evaluation:
    return Evaluation(
        split=split,
        candidate="c",
        outcomes=[],
        llm_calls=calls,
        model_calls=computed,
        tokens=tokens,
        cost_usd=dollars,
        lm_seconds=lm_seconds,
        seconds=seconds,
    )


@pytest.mark.parametrize("dev_passes", [0, 1])
def test_the_estimate_warns_first_when_the_baseline_answers_no_dev_question(dev_passes):
    from optloop.cli.run_tables import estimate_lines
    from optloop.loop.runs.runner import LoopConfig
    from tests.optloop.loop.test_promotion import evaluation

    def answered(split: str, passes: list[bool]) -> Evaluation:
        costs = measured(
            split, calls=4, computed=4, tokens=400, dollars=None, lm_seconds=4, seconds=5
        )
        outcomes = evaluation({("e", f"q{i}"): ok for i, ok in enumerate(passes)}).outcomes
        return costs.model_copy(update={"outcomes": outcomes})

    ckpt = Checkpoint(
        config_digest="x",
        baseline_train=answered("train", [True, False, False, False]),
        baseline_dev=answered("dev", [i < dev_passes for i in range(4)]),
    )
    figures = estimate(ckpt, budget=3, concurrency=1, dev_units=4, test_units=4)
    config = LoopConfig(system="md_flat", run_name="r")
    lines = estimate_lines(figures, ckpt, config, "python -m optloop.run --system md_flat")
    floor = "warning: the baseline answered none of the 4 dev questions (1 of 4 train)"
    assert lines[0].startswith(floor) if not dev_passes else not lines[0].startswith("warning")


def test_the_estimate_extrapolates_the_baseline_dev_evaluation():
    ckpt = Checkpoint(
        config_digest="x",
        baseline_train=measured(
            "train", calls=30, computed=30, tokens=3000, dollars=0.03, lm_seconds=60, seconds=90
        ),
        baseline_dev=measured(
            "dev", calls=10, computed=5, tokens=500, dollars=0.05, lm_seconds=10, seconds=30
        ),
    )
    figures = estimate(ckpt, budget=3, concurrency=4, dev_units=10, test_units=15)
    baseline, trials, test = figures.parts
    assert (baseline.calls, baseline.tokens, baseline.evaluations) == (40, 3500, 2)
    assert baseline.cost_usd == pytest.approx(0.08) and baseline.hours == pytest.approx(
        120 / 3600
    )  # measured
    # per computed call: 100 tokens, $0.01, 2 s; a trial = 10 requests, every one computed
    assert (trials.calls, trials.tokens, trials.evaluations) == (30, 3000, 3)
    assert trials.cost_usd == pytest.approx(0.30) and trials.hours == pytest.approx(
        30 * 2 / 4 / 3600
    )
    assert (test.calls, test.tokens, test.evaluations) == (
        30,
        3000,
        2,
    )  # 2 evaluations x 1.5 the dev split's work
    assert figures.total.calls == 100 and figures.total.cost_usd == pytest.approx(0.68)
    assert figures.latency_s == pytest.approx(2.0) and figures.priced and figures.concurrency == 4


def test_an_unpriced_or_fully_cached_baseline_says_what_it_cannot_know():
    unpriced = Checkpoint(
        config_digest="x",
        baseline_train=measured(
            "train", calls=3, computed=3, tokens=30, dollars=None, lm_seconds=3, seconds=4
        ),
        baseline_dev=measured(
            "dev", calls=2, computed=2, tokens=20, dollars=None, lm_seconds=2, seconds=3
        ),
    )
    figures = estimate(unpriced, budget=2, concurrency=1, dev_units=4, test_units=4)
    assert (
        not figures.priced
        and figures.total.cost_usd is None
        and figures.total.tokens == 20 + 30 + 2 * 20 + 2 * 20
    )
    assert figures.total.hours is not None
    cached = unpriced.model_copy(
        update={
            "baseline_dev": measured(
                "dev", calls=2, computed=0, tokens=0, dollars=0.0, lm_seconds=0.0, seconds=1
            )
        }
    )
    figures = estimate(cached, budget=2, concurrency=1, dev_units=4, test_units=4)
    assert (
        figures.parts[1].calls == 4
        and figures.parts[1].tokens is None
        and figures.parts[1].hours is None
    )
    assert figures.latency_s is None and figures.total.tokens is None
    # A cache that kept each response's computing time: the replay still projects the run.
    from optloop.loop.spending.eta import Eta

    replayed = cached.model_copy(
        update={
            "baseline_dev": cached.baseline_dev.model_copy(
                update={"replayed_calls": 2, "replayed_seconds": 3.0, "replayed_tokens": 40}
            )
        }
    )
    figures = estimate(replayed, budget=2, concurrency=1, dev_units=4, test_units=4)
    trials = figures.parts[1]
    assert figures.latency_s == pytest.approx(1.5)  # 3 s over the 2 hits
    assert trials.tokens == 4 * 20 and trials.hours == pytest.approx(4 * 1.5 / 3600)
    assert trials.cost_usd is None  # the hits' dollars are not recorded
    assert Eta.of(figures, 2).seconds_left(0) is not None


# --- the floor: an episode's chain of sequential requests ----------------------------------------


def test_an_evaluation_takes_at_least_its_longest_chain_of_sequential_requests():
    # the baseline: on dev, 10 requests, 2 s per computed call; the test split 1.5 times dev's
    # work: 15 requests
    ckpt = baseline_checkpoint()
    figures = estimate(
        ckpt, budget=3, concurrency=4, dev_units=10, test_units=15, chains=Chains(dev=6, test=3)
    )
    _, trials, test = figures.parts
    # a trial: 10 requests / 4 in flight = 2.5 requests' time, but its longest episode chains 6: 6
    # x 2 s each
    assert (
        trials.floor is not None
        and trials.floor.binds
        and (trials.floor.split, trials.floor.requests) == ("dev", 6)
    )
    assert (
        trials.hours == pytest.approx(3 * 6 * 2 / 3600) and trials.calls == 30
    )  # the floor costs no call
    # a held-out evaluation: 15 requests / 4 = 3.75 requests' time, more than its chain of 3: N
    # decides
    assert (
        test.floor is not None
        and not test.floor.binds
        and test.hours == pytest.approx(30 * 2 / 4 / 3600)
    )
    assert figures.total.hours == pytest.approx(sum(p.hours for p in figures.parts))
    assert figures.floor_lines() == [
        "time of the 3 trials set by the longest dev episode's 6 sequential requests (12 s an "
        "evaluation), not by --concurrency 4: its sessions are ingested in order, then a "
        "question"
    ]
    # one request at a time, the chain never binds: the same hours as without chains
    serial = estimate(
        ckpt, budget=3, concurrency=1, dev_units=10, test_units=15, chains=Chains(dev=6, test=3)
    )
    plain = estimate(ckpt, budget=3, concurrency=1, dev_units=10, test_units=15)
    assert [p.hours for p in serial.parts] == [
        p.hours for p in plain.parts
    ] and serial.floor_lines() == []
    assert all(p.floor is None for p in plain.parts)


def test_the_chains_are_measured_on_the_baseline_dev_evaluation_and_the_splits_longest_episodes():
    tiny = load_dataset("builtin:tiny")  # 4 episodes of 2 sessions; 2, 3, 2, 2 questions
    dev = tiny.model_copy(update={"episodes": tiny.episodes[:2]})  # 4 sessions, 5 questions
    longer = tiny.episodes[2].model_copy(
        update={"sessions": tiny.episodes[2].sessions * 3}
    )  # 6 sessions
    test = tiny.model_copy(update={"episodes": [longer, tiny.episodes[3]]})
    # one of dev's two stores built (2 sessions, 6 requests: 3 a session), 10 requests for its 5
    # questions: 2 each
    evaluation = Evaluation(
        split="dev",
        candidate="c",
        outcomes=[],
        llm_calls=16,
        model_calls=16,
        ingest_calls=6,
        stores_built=1,
        stores_reused=1,
    )
    chains = measured_chains(Checkpoint(config_digest="x", baseline_dev=evaluation), dev, test)
    assert chains == Chains(dev=2 * 3 + 2, test=6 * 3 + 2)
    nothing_built = evaluation.model_copy(update={"stores_built": 0, "ingest_calls": 0})
    assert (
        measured_chains(Checkpoint(config_digest="x", baseline_dev=nothing_built), dev, test)
        is None
    )


# --- the optimizer's own calls -------------------------------------------------------------------


def baseline_checkpoint(**update) -> Checkpoint:
    """The baseline of ``test_the_estimate_extrapolates_the_baseline_dev_evaluation``: on dev, per
    computed call, 100 tokens, $0.01 and 2 s (per token: $0.0001, 0.02 s)."""
    return Checkpoint(
        config_digest="x",
        baseline_train=measured(
            "train", calls=30, computed=30, tokens=3000, dollars=0.03, lm_seconds=60, seconds=90
        ),
        baseline_dev=measured(
            "dev", calls=10, computed=5, tokens=500, dollars=0.05, lm_seconds=10, seconds=30
        ),
        **update,
    )


def work(**update) -> OptimizerWork:
    fields = dict(
        optimizer="edit",
        rounds=1,
        trials_per_round=10,
        calls=40,
        tokens=4000,
        proposer_calls=2,
        proposer_prompt_tokens=300,
        proposer_completion_tokens=100,
        threads=None,
        basis="a model",
    )
    return OptimizerWork(**(fields | update))


def test_the_estimate_adds_the_optimizers_own_calls_as_a_part_of_their_own():
    plain = estimate(baseline_checkpoint(), budget=3, concurrency=4, dev_units=10, test_units=15)
    figures = estimate(
        baseline_checkpoint(),
        budget=3,
        concurrency=4,
        dev_units=10,
        test_units=15,
        optimizer=work(),
    )
    assert [p.part for p in figures.parts] == [
        "baseline (measured)",
        "3 trials",
        "optimizer (edit, modeled)",
        "held-out test",
    ]
    optimizer = figures.parts[2]
    assert (optimizer.evaluations, optimizer.calls, optimizer.tokens) == (
        0,
        42,
        4400,
    )  # train runs + 2 proposals
    assert optimizer.cost_usd == pytest.approx(
        4400 * 0.0001
    )  # the system LM's measured dollars per token
    # 40 requests at 2 s, 4 at once; the proposer's 400 tokens at 0.02 s, one call at a time
    assert optimizer.hours == pytest.approx((40 * 2 / 4 + 400 * 0.02) / 3600)
    assert (
        figures.total.calls == plain.total.calls + 42
        and figures.total.evaluations == plain.total.evaluations
    )
    assert figures.total.cost_usd == pytest.approx(plain.total.cost_usd + 0.44)
    assert figures.optimizer == work() and plain.optimizer is None and len(plain.parts) == 3


def test_the_proposers_price_threads_and_an_unpriced_proposer_lm():
    ckpt = baseline_checkpoint()
    priced = estimate(
        ckpt,
        budget=3,
        concurrency=4,
        dev_units=10,
        test_units=15,
        optimizer=work(threads=2),
        proposer_price=(1e-6, 2e-6),
    )
    optimizer = priced.parts[2]
    assert optimizer.cost_usd == pytest.approx(4000 * 0.0001 + 300 * 1e-6 + 100 * 2e-6)
    assert optimizer.hours == pytest.approx(
        (40 * 2 / 2 + 400 * 0.02) / 3600
    )  # SIMBA's 2 threads, not 4
    unknown = estimate(
        ckpt,
        budget=3,
        concurrency=4,
        dev_units=10,
        test_units=15,
        optimizer=work(),
        own_proposer=True,
    )
    assert (
        unknown.parts[2].cost_usd is None
        and unknown.total.cost_usd is None
        and unknown.parts[2].tokens == 4400
    )
    no_proposals = estimate(
        ckpt,
        budget=3,
        concurrency=4,
        dev_units=10,
        test_units=15,
        optimizer=work(proposer_calls=0, proposer_prompt_tokens=0, proposer_completion_tokens=0),
        own_proposer=True,
    )
    assert no_proposals.parts[2].cost_usd == pytest.approx(
        0.4
    )  # no proposer call: its price does not matter


def trial(n: int, calls: int) -> Trial:
    """Trial ``n``, its dev evaluation of ``calls`` requests (10 tokens and $0.001 each); half done
    when ``calls < 0``."""
    evaluation = (
        None
        if calls < 0
        else measured(
            "dev",
            calls=calls,
            computed=calls,
            tokens=10 * calls,
            dollars=0.001 * calls,
            lm_seconds=calls,
            seconds=calls,
        )
    )
    return Trial(trial=n, candidate=BASE, evaluation=evaluation)


def test_the_optimizers_calls_are_measured_on_finished_trials_and_scaled_by_rounds():
    # the baseline (40 requests) and 2 finished trials (10 each), a third left half done; the run
    # spent 100: the optimizer 40, of them 4 at the proposer site (the system LM's own), 600 tokens
    # (400 the proposer's) and $0.04
    spent = {
        "llm_calls": 100,
        "model_calls": 100,
        "tokens": 3500 + 200 + 600,
        "cost_usd": 0.08 + 0.02 + 0.04,
        "llm_calls/optimizer.proposer": 4,
        "tokens/optimizer.proposer": 400,
    }
    ckpt = baseline_checkpoint(
        trials=[trial(1, 10), trial(2, 10), trial(3, -1)], spent=spent, processes=2
    )
    assert (
        measured_work(baseline_checkpoint(), work(), 10) is None
    )  # no finished trial: only a model can say
    one_a_round = measured_work(
        ckpt, work(rounds=10, trials_per_round=1), 10
    )  # SIMBA: 2 of 10 rounds begun
    assert one_a_round is not None and one_a_round.measured and one_a_round.optimizer == "edit"
    assert (one_a_round.calls, one_a_round.proposer_calls) == (36 * 5, 4 * 5)
    assert (one_a_round.tokens, one_a_round.proposer_tokens) == (200 * 5, 400 * 5)
    assert one_a_round.cost_usd == pytest.approx(0.04 * 5)
    assert (
        "the 2 finished trial(s): 36 requests on train and 4 to the proposer so far"
        in one_a_round.basis
    )
    ten_a_round = measured_work(
        ckpt, work(rounds=2, trials_per_round=10), 20
    )  # edit: round 1 of 2 begun
    assert ten_a_round is not None and ten_a_round.calls == 36 * 2
    up_front = measured_work(
        ckpt, work(rounds=0, trials_per_round=0), 10
    )  # Optuna: its proposals are made
    assert up_front is not None and up_front.calls == 36 and "done up front" in up_front.basis
    no_model = measured_work(ckpt, None, 10)
    assert no_model is not None and no_model.calls == 36 * 10 / 2


def test_the_rounds_a_run_counted_scale_the_optimizers_work_by_the_candidates_they_made():
    """An edit round made 15 candidates where its model said 8: the rest of a budget of 50 takes
    3 more such rounds, not the model's; a checkpoint from before the count was kept reads it from
    its trials' origins."""
    spent = {"llm_calls": 100, "model_calls": 100, "tokens": 4300}
    ckpt = baseline_checkpoint(
        trials=[trial(1, 10), trial(2, 10), trial(3, -1)],
        queue=[BASE],
        rounds=1,
        spent=spent,
    )  # round 1 made 4 candidates: 3 taken (one half done), 1 queued; 40 requests on train
    one = measured_work(ckpt, work(rounds=13, trials_per_round=8), 10)
    assert one is not None and one.rounds == 1 + 2 and one.trials_per_round == 4
    assert one.calls == 40 * 3 and "as the rounds so far made them" in one.basis
    two = measured_work(ckpt.model_copy(update={"rounds": 2}), work(rounds=13), 10)
    assert two is not None and (two.rounds, two.calls) == (2 + 3, 40 * 5 / 2)
    named = [
        t.model_copy(update={"candidate": BASE.model_copy(update={"origin": "edit round 1: x"})})
        for t in ckpt.trials
    ]
    old = ckpt.model_copy(update={"rounds": None, "trials": named})
    assert measured_work(old, work(rounds=13), 10) == one
    up_front = measured_work(ckpt, work(rounds=0, trials_per_round=0), 10)
    assert up_front is not None and up_front.calls == 40  # Optuna's rounds: none to scale by


def test_a_proposer_lm_of_its_own_is_measured_apart_and_unpriced_it_leaves_dollars_unknown():
    spent = {
        "llm_calls": 80,
        "model_calls": 80,
        "tokens": 5000,
        "cost_usd": 0.1,
        "proposer_llm_calls": 3,
        "proposer_model_calls": 3,
        "proposer_tokens": 900,
    }
    ckpt = baseline_checkpoint(trials=[trial(1, 10)], spent=spent)
    measured_one = measured_work(ckpt, work(rounds=1, trials_per_round=5), 5)
    assert measured_one is not None
    assert (measured_one.calls, measured_one.proposer_calls, measured_one.proposer_tokens) == (
        30,
        3,
        900,
    )
    assert measured_one.cost_usd is None  # the proposer LM has no price
    priced = measured_work(
        ckpt.model_copy(update={"spent": spent | {"proposer_cost_usd": 0.5}}),
        work(rounds=1, trials_per_round=5),
        5,
    )
    assert priced is not None and priced.cost_usd == pytest.approx(0.1 - 0.09 + 0.5)


def test_a_batch_shares_the_concurrency_and_its_chain_floors_the_batch_not_each_trial():
    ckpt = baseline_checkpoint()  # a trial: 10 requests, 2 s each; the dev chain 6 requests
    one = estimate(
        ckpt, budget=8, concurrency=16, dev_units=10, test_units=15, chains=Chains(dev=6, test=3)
    )
    batched = estimate(
        ckpt,
        budget=8,
        concurrency=16,
        dev_units=10,
        test_units=15,
        chains=Chains(dev=6, test=3),
        batch=4,
    )
    trials, in_batches = one.parts[1], batched.parts[1]
    assert trials.hours == pytest.approx(8 * 6 * 2 / 3600)  # each trial floored by the chain
    # two batches of 4: 40 requests / 16 = 2.5 requests' time, under the chain of 6: the chain
    # floors each batch
    assert in_batches.hours == pytest.approx(2 * 6 * 2 / 3600) and in_batches.calls == trials.calls
    assert in_batches.part == "8 trials (4 at once)" and batched.batch == 4
    # a batch whose requests outrun the chain takes requests / N: 3 batches (4, 4, 1) at N = 2
    slow = estimate(
        ckpt,
        budget=9,
        concurrency=2,
        dev_units=10,
        test_units=15,
        chains=Chains(dev=6, test=3),
        batch=4,
    )
    assert slow.parts[1].hours == pytest.approx((2 * 40 / 2 + 6) * 2 / 3600)


def test_the_eta_starts_from_the_projection_and_follows_the_trials_timed():
    from optloop.loop.spending.eta import Eta, TrialLine

    figures = estimate(baseline_checkpoint(), budget=4, concurrency=1, dev_units=10, test_units=15)
    eta = Eta.of(figures, 4)
    trials_s, test_s = figures.parts[1].hours * 3600, figures.parts[2].hours * 3600
    assert eta.seconds_left(0) == pytest.approx(trials_s + test_s) and eta.seconds_left(
        4
    ) == pytest.approx(test_s)
    eta.trial_took(100.0)
    eta.trial_took(50.0)
    assert eta.seconds_left(2) == pytest.approx(
        2 * 75.0 + test_s
    )  # measured, the held-out test still projected
    assert Eta(3, trial_s=None, test_s=10.0).seconds_left(0) is None
    cached = Eta(
        3, trial_s=None, test_s=None
    )  # the baseline came from the LM cache: nothing timed
    assert cached.seconds_left(0) is None
    cached.trial_took(40.0)
    assert cached.seconds_left(1) == pytest.approx(2 * 40.0 + 2 * 40.0)  # test: two trials' time
    line = TrialLine(trial=3, budget=50, accuracy=0.55, best=0.65, seconds=41.2, eta_s=18 * 60)
    assert line.text() == "trial 3/50 dev 0.550 (best 0.650) 41 s, ETA 18 min"


def test_trials_that_reuse_every_store_are_projected_by_the_answer_path_alone():
    from optloop.loop.cost import LMCost
    from optloop.loop.spending.estimate import answer_path

    dev = Evaluation(
        split="dev",
        candidate="c",
        outcomes=[],
        llm_calls=100,
        model_calls=100,
        ingest_calls=80,
        tokens=84_000,
        lm_seconds=840.0,  # 0.01 s a token
        seconds=900.0,
        sites={
            "graphiti.extract_edges.edge": LMCost(calls=80, model_calls=80, tokens=80_000),
            "answer": LMCost(calls=20, model_calls=20, tokens=4_000),
        },
    )
    trial = answer_path(dev, {"graphiti.extract_edges.edge"})
    assert trial is not None
    assert (trial.llm_calls, trial.tokens) == (20, 4_000)
    assert trial.lm_seconds == pytest.approx(40.0)  # 4,000 tokens at 0.01 s
    ckpt = Checkpoint(config_digest="x", baseline_train=dev, baseline_dev=dev)
    reused = estimate(ckpt, budget=10, concurrency=1, dev_units=10, test_units=10, trial=trial)
    rebuilt = estimate(ckpt, budget=10, concurrency=1, dev_units=10, test_units=10)
    assert reused.parts[1].part == "10 trials, stores reused" and reused.parts[1].calls == 200
    assert reused.parts[1].hours == pytest.approx(10 * 40 / 3600)
    assert rebuilt.parts[1].hours == pytest.approx(10 * 840 / 3600)
    # the held-out test: the start program ingests test anew, the best answers on its stores
    assert (reused.parts[-1].evaluations, reused.parts[-1].calls) == (2, 100 + 20)
    assert reused.parts[-1].hours == pytest.approx((840 + 40) / 3600)
    assert rebuilt.parts[-1].hours == pytest.approx(2 * 840 / 3600)
    # so does the control, on dev and on test; the optimizer's runs on train answer: 2 s a call
    both = estimate(
        ckpt,
        budget=10,
        concurrency=1,
        dev_units=10,
        test_units=10,
        trial=trial,
        control=True,
        optimizer=work(optimizer="gepa", calls=50, proposer_calls=0),
    )
    parts = {p.part: p for p in both.parts}
    assert parts["control on dev, stores reused"].hours == pytest.approx(40 / 3600)
    assert parts["optimizer (gepa, modeled)"].hours == pytest.approx(50 * 2 / 3600)
    assert parts["held-out test"].hours == pytest.approx((840 + 2 * 40) / 3600)
    # Nothing computed off the ingest stage: nothing to model a trial from, unless the cache kept
    # what computing its responses took.
    cached = dev.model_copy(
        update={"sites": {"answer": LMCost(calls=20, model_calls=0, tokens=0)}}
    )
    assert answer_path(cached, {"graphiti.extract_edges.edge"}) is None
    replayed = dev.model_copy(
        update={
            "sites": {
                "answer": LMCost(calls=20, model_calls=0, replayed_calls=20, replayed_tokens=4_000)
            }
        }
    )
    again = answer_path(replayed, {"graphiti.extract_edges.edge"})
    assert again is not None and again.tokens == 4_000


# --- the trivial-instruction control in the estimate ---------------------------------------------


def test_the_estimate_counts_the_controls_two_evaluations_and_the_eta_its_test_one():
    from optloop.loop.spending.estimate import CONTROL_PART, HELD_OUT_PART
    from optloop.loop.spending.eta import Eta

    plain = estimate(baseline_checkpoint(), budget=3, concurrency=4, dev_units=10, test_units=15)
    figures = estimate(
        baseline_checkpoint(), budget=3, concurrency=4, dev_units=10, test_units=15, control=True
    )
    parts = {p.part: p for p in figures.parts}
    # before the trials, one dev evaluation (the baseline's dev, every request computed)
    assert [p.part for p in figures.parts][:2] == ["baseline (measured)", CONTROL_PART]
    assert (parts[CONTROL_PART].evaluations, parts[CONTROL_PART].calls) == (1, 10)
    # the held-out test: the start program, the best and the control, each 1.5 dev's work
    assert (parts[HELD_OUT_PART].evaluations, parts[HELD_OUT_PART].calls) == (3, 45)
    assert figures.total.evaluations == plain.total.evaluations + 2
    assert figures.total.calls == plain.total.calls + 10 + 15
    # done before the trials: the ETA leaves the control's dev evaluation out, not its test one
    eta, before = Eta.of(figures, 3), Eta.of(plain, 3)
    assert eta.held_out == 3 and eta.trial_s == pytest.approx(before.trial_s)
    assert eta.seconds_left(3) == pytest.approx(parts[HELD_OUT_PART].hours * 3600)
    assert eta.seconds_left(3) > before.seconds_left(3)
    untimed = Eta(3, trial_s=None, test_s=None, held_out=eta.held_out)
    untimed.trial_took(40.0)
    assert untimed.seconds_left(3) == pytest.approx(3 * 40.0)  # test: three trials' time


def test_a_control_the_run_has_evaluated_is_measured_in_the_estimate():
    from optloop.loop.spending.estimate import CONTROL_PART

    control_dev = measured(
        "dev", calls=7, computed=7, tokens=70, dollars=0.07, lm_seconds=7, seconds=36
    )
    figures = estimate(
        baseline_checkpoint(control_dev=control_dev),
        budget=3,
        concurrency=4,
        dev_units=10,
        test_units=15,
        control=True,
    )
    [part] = [p for p in figures.parts if p.part.startswith(CONTROL_PART)]
    assert part.part == f"{CONTROL_PART} (measured)"
    assert (part.calls, part.tokens, part.cost_usd) == (7, 70, 0.07)
    assert part.hours == pytest.approx(36 / 3600)


def test_the_controls_train_evaluation_is_priced_as_the_baselines_until_measured():
    from optloop.loop.spending.estimate import CONTROL_TRAIN_PART
    from optloop.loop.spending.eta import Eta

    ckpt = baseline_checkpoint()
    kwargs = {"budget": 3, "concurrency": 4, "dev_units": 10, "test_units": 15, "control": True}
    plain = estimate(ckpt, **kwargs)
    wider = estimate(ckpt, **kwargs, control_train=True)
    parts = {p.part: p for p in wider.parts}
    priced = parts[f"{CONTROL_TRAIN_PART} (as the baseline's)"]
    assert ckpt.baseline_train is not None
    assert (priced.evaluations, priced.calls) == (1, round(ckpt.baseline_train.llm_calls))
    assert wider.total.calls == plain.total.calls + priced.calls
    # done before the trials: the ETA leaves it out
    assert Eta.of(wider, 3).trial_s == pytest.approx(Eta.of(plain, 3).trial_s)
    control_train = measured(
        "train", calls=9, computed=9, tokens=90, dollars=0.09, lm_seconds=9, seconds=40
    )
    measured_figures = estimate(
        ckpt.model_copy(update={"control_train": control_train}), **kwargs, control_train=True
    )
    [part] = [p for p in measured_figures.parts if p.part.startswith(CONTROL_TRAIN_PART)]
    assert (part.part, part.calls) == (f"{CONTROL_TRAIN_PART} (measured)", 9)


def test_the_optimizers_measured_calls_leave_the_controls_evaluations_out():
    spent = {"llm_calls": 100, "model_calls": 100, "tokens": 4300, "cost_usd": 0.14}
    ckpt = baseline_checkpoint(trials=[trial(1, 10), trial(2, 10)], spent=spent, processes=1)
    without = measured_work(ckpt, None, 2)
    control_dev = measured(
        "dev", calls=10, computed=10, tokens=100, dollars=0.01, lm_seconds=10, seconds=10
    ).model_copy(update={"candidate": "control"})
    with_control = measured_work(ckpt.model_copy(update={"control_dev": control_dev}), None, 2)
    assert without is not None and with_control is not None
    assert with_control.calls == without.calls - 10  # the control's evaluation is not optimizer's
    # a control that is the start program took the baseline's evaluation: nothing to leave out
    same = ckpt.model_copy(update={"control_dev": ckpt.baseline_dev})
    reused = measured_work(same, None, 2)
    assert reused is not None and reused.calls == without.calls
    control_train = measured(
        "train", calls=10, computed=10, tokens=100, dollars=0.01, lm_seconds=10, seconds=10
    ).model_copy(update={"candidate": "control"})
    both = measured_work(
        ckpt.model_copy(update={"control_dev": control_dev, "control_train": control_train}),
        None,
        2,
    )
    assert both is not None and both.calls == without.calls - 20  # nor is its train one
