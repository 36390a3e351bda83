"""A failed LM call is never a measured answer: the threshold that withholds figures, the count
beside the rest."""

from __future__ import annotations

import pytest

from optloop.errors import CallsFailedError
from optloop.failures import ALLOWED_SHARE, check, first_error, mark, too_many
from optloop.lm import CallRecord


def test_up_to_five_percent_of_the_calls_may_fail():
    assert ALLOWED_SHARE == 0.05
    assert not too_many(0, 0) and not too_many(1, 20) and too_many(2, 20) and too_many(1, 10)
    assert too_many(29, 29) and too_many(3, 0)  # failures with no successful call at all


def test_past_the_threshold_the_error_names_the_figure_and_the_first_failure():
    records = [
        CallRecord(
            site="answer",
            model="m",
            prompt_tokens=1,
            completion_tokens=1,
            seconds=0.1,
            cached=False,
        ),
        CallRecord(
            site="mem0.extract",
            model="m",
            prompt_tokens=0,
            completion_tokens=0,
            seconds=0.1,
            cached=False,
            error="the prompt does not fit the server's context window",
        ),
    ]
    with pytest.raises(CallsFailedError) as info:
        check(1, 2, what="the dev evaluation of candidate baseline", first=first_error(records))
    assert info.value.exit_code == 4
    assert str(info.value).startswith(
        "1 of 2 LM calls failed after their retries in the dev evaluation of "
        "candidate baseline, more than 5%"
    )
    assert str(info.value).endswith(
        "the first: the prompt does not fit the server's context window"
    )
    check(1, 40, what="x", first=None)  # under the threshold: no error


def test_a_figure_with_failures_carries_their_count():
    assert mark("0.650 [0.450, 0.850] n=20", 0) == "0.650 [0.450, 0.850] n=20"
    assert mark("0.650 [0.450, 0.850] n=20", 1) == "0.650 [0.450, 0.850] n=20 (1 failed call)"
    assert mark("0.600", 3) == "0.600 (3 failed calls)"


def test_max_failed_share_is_parsed_into_the_limits_default_five_percent():
    """``--max-failed-share`` is this process's allowance (like --max-calls): parsed into the
    limits, default 5 %."""
    from optloop.cli.run_args import build_parser
    from optloop.loop.spending.limits import SpendingLimits

    assert build_parser().parse_args([]).max_failed_share == ALLOWED_SHARE
    args = build_parser().parse_args(["--max-failed-share", "0.25"])
    assert SpendingLimits(max_failed_share=args.max_failed_share).max_failed_share == 0.25
    assert SpendingLimits().max_failed_share == ALLOWED_SHARE
