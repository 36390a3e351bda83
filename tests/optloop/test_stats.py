"""Bootstrap intervals on cases whose answer is known."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from optloop.stats import Interval, bootstrap_mean, paired_bootstrap_delta, recovered_share


def test_identical_vectors_give_a_zero_interval():
    scores = [1, 0, 1, 1, 0, 0, 1, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the degenerate case never reaches scipy's warnings
        delta = paired_bootstrap_delta(scores, scores)
    assert (delta.estimate, delta.low, delta.high, delta.n) == (0, 0, 0, 8)
    assert not delta.excludes_zero and not delta.above_zero
    assert str(delta) == "+0.000 [+0.000, +0.000] (n=8)"


def test_every_question_improved_gives_one_with_a_point_interval():
    delta = paired_bootstrap_delta([0] * 12, [1] * 12)
    assert (delta.estimate, delta.low, delta.high) == (1, 1, 1)
    assert delta.above_zero and delta.excludes_zero


def test_thirty_of_forty_improved_none_worse_excludes_zero():
    before, after = [0] * 40, [1] * 30 + [0] * 10
    delta = paired_bootstrap_delta(before, after)
    assert delta.estimate == pytest.approx(0.75) and delta.n == 40
    assert 0 < delta.low < 0.75 < delta.high <= 1
    assert delta.above_zero


def test_three_better_three_worse_of_twenty_includes_zero():
    before = [0, 0, 0, 1, 1, 1] + [1] * 7 + [0] * 7
    after = [1, 1, 1, 0, 0, 0] + [1] * 7 + [0] * 7
    delta = paired_bootstrap_delta(before, after)
    assert delta.estimate == 0 and delta.low < 0 < delta.high
    assert not delta.excludes_zero and not delta.above_zero


def test_the_same_seed_gives_the_same_interval_and_another_seed_may_not():
    values = list(np.random.default_rng(7).normal(size=30))
    assert bootstrap_mean(values, seed=3) == bootstrap_mean(values, seed=3)
    assert len({(i.low, i.high) for i in (bootstrap_mean(values, seed=s) for s in range(4))}) > 1
    before, after = [0] * 20 + [1] * 20, [1] * 15 + [0] * 5 + [1] * 20
    assert paired_bootstrap_delta(before, after, seed=5) == paired_bootstrap_delta(
        before, after, seed=5
    )


def test_a_mean_interval_is_scipys_percentile_interval():
    from scipy import stats

    values = np.random.default_rng(1).normal(size=25)
    ours = bootstrap_mean(values, seed=11, n_resamples=999)
    theirs = stats.bootstrap(
        (values,), np.mean, n_resamples=999, method="percentile", rng=np.random.default_rng(11)
    ).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high))


def test_accuracy_interval_and_its_format():
    acc = bootstrap_mean([1] * 11 + [0] * 13)
    assert acc.estimate == pytest.approx(11 / 24) and acc.low < acc.estimate < acc.high
    assert acc.format(signed=False).startswith("0.458 [") and acc.format(signed=False).endswith(
        "] (n=24)"
    )


def test_no_question_says_n_zero():
    for interval in (bootstrap_mean([]), paired_bootstrap_delta([], [])):
        assert (interval.estimate, interval.low, interval.high, interval.n) == (0, 0, 0, 0)
        assert "n=0" in str(interval)


def test_negative_numbers_print_a_minus_sign():
    assert (
        str(Interval(estimate=0.083, low=-0.167, high=0.333, n=12))
        == "+0.083 [\u22120.167, +0.333] (n=12)"
    )


def test_unpaired_lengths_are_refused():
    with pytest.raises(ValueError, match="one before and one after"):
        paired_bootstrap_delta([1, 0], [1])


def _programs(recovered: int) -> tuple[list[int], list[int], list[int]]:
    """40 questions: clean passes 30, the sabotage loses 20 of them, ``after`` wins back
    ``recovered``."""
    clean = [1] * 30 + [0] * 10
    sabotaged = [0] * 20 + [1] * 10 + [0] * 10
    after = [1] * recovered + [0] * (20 - recovered) + [1] * 10 + [0] * 10
    return clean, sabotaged, after


def test_recovered_share_is_one_when_after_is_clean_and_zero_when_it_is_sabotaged():
    clean, sabotaged, _ = _programs(0)
    full = recovered_share(clean, sabotaged, clean)
    assert (full.estimate, full.low, full.high) == (1, 1, 1)
    none = recovered_share(clean, sabotaged, sabotaged)
    assert (none.estimate, none.low, none.high) == (0, 0, 0)


def test_recovered_share_half():
    share = recovered_share(*_programs(10), seed=0)
    assert share.estimate == pytest.approx(0.5) and share.low < 0.5 < share.high and share.n == 40
    assert share == recovered_share(*_programs(10), seed=0)


def test_recovered_share_drops_resamples_where_the_sabotage_cost_nothing():
    # 6 questions, one lost: about a third of the resamples miss it (0/0) and must not make the
    # interval nan
    share = recovered_share([1, 1, 0, 0, 1, 0], [0, 1, 0, 0, 1, 0], [1, 1, 0, 0, 1, 0])
    assert (share.estimate, share.low, share.high) == (1, 1, 1)
    share = recovered_share([1, 1, 0, 1, 1, 0], [0, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 0])
    assert (
        share.estimate == pytest.approx(0.5)
        and math.isfinite(share.low)
        and math.isfinite(share.high)
    )


def test_recovered_share_is_undefined_when_the_sabotage_cost_nothing():
    share = recovered_share([1, 0, 1], [1, 1, 1], [0, 0, 1])
    assert math.isnan(share.estimate) and math.isnan(share.low) and "cost nothing" in share.note
    assert str(share).startswith("n/a (n=3; ")
    again = Interval.model_validate(
        json.loads(share.model_dump_json())
    )  # NaN survives a JSON round trip
    assert math.isnan(again.estimate)
