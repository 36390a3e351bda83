"""Blame ranks targets by their failure rate given a correct input, so upstream failures do not
mask a broken downstream site (see ``optloop/attribution/blame.py``)."""

from __future__ import annotations

import pytest

from optloop import sites
from optloop.attribution import Attribution, ErrorType, blame

CURATE = "md_flat.curate"


def failures(n: int, error: ErrorType, target: str | None, start: int = 0) -> list[Attribution]:
    return [
        Attribution(question_id=f"q{start + i}", error_type=error, target=target) for i in range(n)
    ]


def test_a_broken_answer_site_behind_a_lossy_ingestion_ranks_first_by_rate():
    # 27 questions lost at ingestion, 26 of the 29 that got through failed at the answer, 3 passed
    attributions = failures(27, ErrorType.EXTRACTION, CURATE) + failures(
        26, ErrorType.RESPONSE, sites.ANSWER, 100
    )
    by_count = blame(attributions)
    by_rate = blame(attributions, passed=3)
    assert [e.target for e in by_count] == [CURATE, sites.ANSWER]
    assert [e.target for e in by_rate] == [sites.ANSWER, CURATE]
    answer, curate = by_rate
    assert (answer.failures, answer.reached) == (26, 29) and answer.rate == pytest.approx(26 / 29)
    assert (curate.failures, curate.reached) == (27, 56) and curate.rate == pytest.approx(27 / 56)
    assert curate.share == pytest.approx(27 / 53)  # the count share is unchanged


def test_a_lossy_ingestion_in_front_of_a_sound_answer_site_stays_first():
    attributions = failures(20, ErrorType.EXTRACTION, CURATE) + failures(
        3, ErrorType.RESPONSE, sites.ANSWER, 100
    )
    assert [e.target for e in blame(attributions, passed=30)] == [
        CURATE,
        sites.ANSWER,
    ]  # 20/53 vs 3/33


def test_the_stages_in_between_count_later_failures_as_got_through():
    attributions = (
        failures(4, ErrorType.EXTRACTION, CURATE)
        + failures(2, ErrorType.RETRIEVAL, "knob:top_k", 10)
        + failures(1, ErrorType.RESPONSE, sites.ANSWER, 20)
        + failures(1, ErrorType.UNKNOWN, None, 30)
    )
    entries = {e.target: e for e in blame(attributions, passed=5)}
    assert entries["knob:top_k"].reached == 5 + 2 + 1  # passes, its own, the answer's
    assert entries[CURATE].reached == 5 + 4 + 2 + 1  # the unattributed failure counts nowhere
    assert entries[sites.ANSWER].reached == 5 + 1


def test_equal_rates_keep_the_count_order_and_no_passes_given_means_by_count():
    attributions = failures(2, ErrorType.RESPONSE, sites.ANSWER) + failures(
        1, ErrorType.RESPONSE, "retrieve.query", 9
    )
    assert [e.target for e in blame(attributions, passed=0)] == [sites.ANSWER, "retrieve.query"]
    assert all(e.rate is None and e.reached is None for e in blame(attributions))
    assert blame([], passed=4) == []
