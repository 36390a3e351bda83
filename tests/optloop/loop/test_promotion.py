"""The promotion rule, the held-out intervals a LoopResult carries, and the small-split warning (no
LM)."""

from __future__ import annotations

import io
import json

import pytest
from pydantic import ValidationError
from rich.console import Console

from optloop.cli.run_tables import summary_table
from optloop.loop.evaluate import Evaluation, QuestionOutcome
from optloop.loop.runs.runner import (
    LoopConfig,
    LoopResult,
    held_out_intervals,
    promotion,
    small_split_warning,
)
from optloop.stats import Interval


def interval(estimate: float, low: float, high: float, n: int = 12) -> Interval:
    return Interval(estimate=estimate, low=low, high=high, n=n)


def test_ci_rule_moves_the_champion_only_when_the_ci_is_above_zero():
    moved, reason = promotion("ci", True, interval(0.25, 0.083, 0.417, 24))
    assert moved and reason == (
        "held-out delta +0.250 [+0.083, +0.417] (n=24): its 95% CI is above 0, "
        "champion moved (--promote-if ci)"
    )
    moved, reason = promotion("ci", True, interval(0.083, -0.167, 0.333))
    assert not moved and reason == (
        "held-out delta +0.083 [\u22120.167, +0.333] (n=12): its 95% CI includes 0, "
        "champion not moved (--promote-if ci)"
    )


def test_ci_lower_bound_exactly_zero_does_not_promote():
    moved, reason = promotion("ci", True, interval(0.25, 0.0, 0.5))
    assert not moved and "includes 0" in reason


def test_delta_rule_follows_the_point_delta_and_says_what_the_ci_says():
    moved, reason = promotion("delta", True, interval(0.083, -0.167, 0.333))
    assert moved and reason == (
        "held-out delta +0.083 [\u22120.167, +0.333] (n=12): the point delta is above 0 "
        "(its 95% CI includes 0), champion moved (--promote-if delta)"
    )
    moved, reason = promotion("delta", True, interval(0.0, -0.25, 0.25))
    assert not moved and "not above 0" in reason
    moved, reason = promotion("delta", True, interval(-0.5, -0.75, -0.25))
    assert not moved and "its 95% CI is below 0" in reason


@pytest.mark.parametrize("rule", ["ci", "delta"])
def test_an_unchanged_candidate_never_promotes(rule):
    moved, reason = promotion(rule, False, interval(1.0, 1.0, 1.0))
    assert not moved and "baseline stayed best" in reason


def evaluation(passes: dict[tuple[str, str], bool]) -> Evaluation:
    return Evaluation(
        split="test",
        candidate="c",
        outcomes=[
            QuestionOutcome(
                episode_id=ep,
                question_id=q,
                task_type="t",
                question="?",
                gold="g",
                prediction="p",
                score=float(ok),
                passed=ok,
            )
            for (ep, q), ok in passes.items()
        ],
    )


def test_held_out_intervals_pair_questions_by_episode_and_id():
    keys = [(f"e{i // 4}", f"q{i % 4}") for i in range(24)]
    before = evaluation({k: i < 6 for i, k in enumerate(keys)})  # 6 of 24 pass
    after_passes = {k: i < 6 or i >= 18 for i, k in enumerate(keys)}  # the same 6, and 6 more
    after = evaluation(
        dict(reversed(list(after_passes.items())))
    )  # another order: pairing is by key
    acc_before, acc_after, delta = held_out_intervals(before, after, seed=0)
    assert acc_before.estimate == pytest.approx(0.25) and acc_before.n == 24
    assert acc_after.estimate == pytest.approx(0.5) and acc_after.low < 0.5 < acc_after.high
    assert delta.estimate == pytest.approx(0.25) and delta.n == 24 and delta.above_zero
    assert held_out_intervals(before, after, seed=0) == (acc_before, acc_after, delta)
    same = held_out_intervals(before, before, seed=0)[2]
    assert (same.estimate, same.low, same.high) == (0, 0, 0)


def result(before: Evaluation, after: Evaluation, **config) -> LoopResult:
    acc_before, acc_after, delta = held_out_intervals(before, after, seed=0)
    promoted, reason = promotion("ci", True, delta)
    return LoopResult(
        config=LoopConfig(system="rag_bm25", run_name="r", **config),
        parent_run_id="p",
        targets=["answer"],
        tunable_sites=["answer"],
        tunable_knobs=[],
        baseline_dev=0.25,
        best_dev=0.5,
        best_trial=1,
        test_before=before.accuracy,
        test_after=after.accuracy,
        evaluations=3,
        changed_sites=["answer"],
        changed_knobs={},
        promoted=promoted,
        promotion_reason=reason,
        registered={},
        n_dev=8,
        n_test=before.n,
        cost={"llm_calls": 112, "model_calls": 31, "tokens": 21481, "seconds": 55.0},
        test_before_ci=acc_before,
        test_after_ci=acc_after,
        delta_test_ci=delta,
    )


def test_loop_result_carries_the_intervals_through_json_and_the_summary_shows_them():
    keys = [("e", f"q{i}") for i in range(12)]
    res = result(
        evaluation({k: i < 3 for i, k in enumerate(keys)}),
        evaluation({k: i < 4 for i, k in enumerate(keys)}),
    )
    again = LoopResult.model_validate(json.loads(res.model_dump_json()))
    assert (
        again == res
        and again.delta_test_ci.estimate == pytest.approx(1 / 12)
        and not again.promoted
    )
    assert isinstance(again.cost["llm_calls"], int)
    out = io.StringIO()
    Console(file=out, width=250).print(summary_table(res))
    text = out.getvalue()
    assert "0.250 [" in text and "] n=12" in text and "(n=12)" in text and "] n=8" in text
    assert "112 LLM calls (31 computed), 21481 tokens, 55.0 s" in text
    assert "its 95% CI includes 0, champion not moved (--promote-if ci)" in text


def test_small_split_warning():
    assert small_split_warning(6, 6) == (
        "dev has 6 questions, test 6: a 95% CI this small spans about \u00b10.4; "
        "use more episodes (?limit=) or --split"
    )
    assert small_split_warning(40, 12) is not None
    assert small_split_warning(20, 20) is None


@pytest.mark.parametrize("fractions", [(0.5, 0.5, 0.0), (0.5, 0.3, 0.3), (-0.5, 1.0, 0.5)])
def test_loop_config_refuses_bad_fractions(fractions):
    with pytest.raises(ValidationError):
        LoopConfig(system="rag_bm25", run_name="r", fractions=fractions)


def test_loop_config_promotes_on_the_ci_by_default():
    config = LoopConfig(system="rag_bm25", run_name="r")
    assert config.promote_if == "ci" and config.fractions == (0.5, 0.25, 0.25)
