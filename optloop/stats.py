"""Honest numbers: a point estimate with its bootstrap confidence interval over questions.

Every number here is over *questions* (0/1 scores, or per-question differences), resampled with
replacement by :func:`scipy.stats.bootstrap` (method ``percentile``: BCa fails on the degenerate
samples that small 0/1 vectors often are). The same ``seed`` gives the same interval.

============================================  =====================================================
``paired_bootstrap_delta(before, after)``     mean of after - before per question, e.g.
                                              ``+0.167 [−0.083, +0.417] (n=24)``
``bootstrap_mean(values)``                    an accuracy with its interval
``recovered_share(clean, sabotaged, after)``  how much of a sabotage's damage an optimizer undid
============================================  =====================================================
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import stats


class Interval(BaseModel):
    """A point estimate and its ``confidence`` interval over ``n`` questions."""

    # NaN (an undefined recovered share) survives a JSON round trip instead of becoming null
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="constants")

    estimate: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    note: str = ""

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def above_zero(self) -> bool:
        return self.low > 0

    def format(self, *, signed: bool = True) -> str:
        """``+0.167 [−0.083, +0.417] (n=24)``; unsigned for an accuracy:
        ``0.458 [0.250, 0.667] (n=24)``."""
        if math.isnan(self.estimate):
            return f"n/a (n={self.n}" + (f"; {self.note})" if self.note else ")")
        est, low, high = (_number(x, signed) for x in (self.estimate, self.low, self.high))
        return f"{est} [{low}, {high}] (n={self.n})"

    def __str__(self) -> str:
        return self.format()


def _number(x: float, signed: bool) -> str:
    x = round(x, 3) + 0.0  # no "-0.000"
    return (f"{x:+.3f}" if signed else f"{x:.3f}").replace("-", "\u2212")


def bootstrap_mean(
    values: Sequence[float], *, seed: int = 0, confidence: float = 0.95, n_resamples: int = 9999
) -> Interval:
    """The mean of ``values`` (an accuracy, for 0/1 scores) with its bootstrap interval."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return Interval(estimate=0.0, low=0.0, high=0.0, n=0, confidence=confidence)
    estimate = float(data.mean())
    # every resample is the same sample: scipy would warn and answer nan
    if np.all(data == data[0]):
        return Interval(
            estimate=estimate, low=estimate, high=estimate, n=data.size, confidence=confidence
        )
    low, high = _percentile_interval(
        (data,), np.mean, seed=seed, confidence=confidence, n_resamples=n_resamples
    )
    return Interval(estimate=estimate, low=low, high=high, n=data.size, confidence=confidence)


def paired_bootstrap_delta(
    before: Sequence[float],
    after: Sequence[float],
    *,
    seed: int = 0,
    confidence: float = 0.95,
    n_resamples: int = 9999,
) -> Interval:
    """The mean of ``after - before`` per question with a paired bootstrap interval (questions are
    resampled, each keeping its before and after score together)."""
    if len(before) != len(after):
        raise ValueError(
            f"paired scores need one before and one after per question; got {len(before)} before "
            f"and {len(after)} after"
        )
    diffs = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    return bootstrap_mean(diffs, seed=seed, confidence=confidence, n_resamples=n_resamples)


def recovered_share(
    clean: Sequence[float],
    sabotaged: Sequence[float],
    after: Sequence[float],
    *,
    seed: int = 0,
    confidence: float = 0.95,
    n_resamples: int = 9999,
) -> Interval:
    """``(mean(after) - mean(sabotaged)) / (mean(clean) - mean(sabotaged))``: the share of the
    accuracy a sabotage cost that the optimized program won back (1 = all of it, 0 = none, below
    0 = worse still).

    The three vectors score the same questions, in the same order, under three programs; the
    interval resamples questions jointly. Undefined (estimate nan, with a note) when the sabotage
    cost nothing on the full sample."""
    c, s, a = (np.asarray(v, dtype=float) for v in (clean, sabotaged, after))
    if not c.size == s.size == a.size:
        raise ValueError(
            f"recovered share needs the same questions under each program; got {c.size} clean, "
            f"{s.size} sabotaged, {a.size} after"
        )
    nan = float("nan")
    if c.size == 0 or c.mean() - s.mean() <= 0:
        note = (
            "no question"
            if c.size == 0
            else f"the sabotage cost nothing (clean {c.mean():.3f}, sabotaged {s.mean():.3f}): "
            "nothing to recover"
        )
        return Interval(
            estimate=nan, low=nan, high=nan, n=c.size, confidence=confidence, note=note
        )
    estimate = float(_share(c, s, a, axis=-1))
    rows = np.stack([c, s, a], axis=1)
    if np.all(rows == rows[0]):  # every question scored alike: every resample is the full sample
        return Interval(
            estimate=estimate, low=estimate, high=estimate, n=c.size, confidence=confidence
        )
    low, high = _percentile_interval(
        (c, s, a), _share, seed=seed, confidence=confidence, n_resamples=n_resamples, paired=True
    )
    return Interval(estimate=estimate, low=low, high=high, n=c.size, confidence=confidence)


def _share(
    clean: np.ndarray, sabotaged: np.ndarray, after: np.ndarray, axis: int = -1
) -> np.ndarray:
    """The recovered share, vectorized over resamples; nan (or inf) where a resample's sabotage
    cost nothing."""
    lost = clean.mean(axis=axis) - sabotaged.mean(axis=axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (after.mean(axis=axis) - sabotaged.mean(axis=axis)) / lost


def _percentile_interval(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., np.ndarray],
    *,
    seed: int,
    confidence: float,
    n_resamples: int,
    paired: bool = False,
) -> tuple[float, float]:
    """The percentile interval over the *finite* values of scipy's bootstrap distribution.

    scipy resamples (``rng=default_rng(seed)``: the same seed, the same resamples) but takes its
    percentiles over every resample, so one resample whose statistic is undefined (a recovered
    share whose resampled questions show no sabotage loss: 0/0) makes its interval nan. The
    bootstrap distribution it returns is kept instead, and its undefined resamples are dropped
    here before the percentiles. For a mean every resample is finite and this is scipy's own
    percentile interval."""
    with warnings.catch_warnings():
        # scipy's warning about the nan interval dropped below
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.bootstrap(
            data,
            statistic,
            n_resamples=n_resamples,
            vectorized=True,
            paired=paired,
            axis=-1,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    distribution = np.asarray(result.bootstrap_distribution)
    finite = distribution[np.isfinite(distribution)]
    if finite.size == 0:
        return float("nan"), float("nan")
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)
