"""The Episode model enforces its id and task contracts when built."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from optloop.datasets import Episode, Question, Session, Turn


def make_episode(**question_kw: object) -> Episode:
    sessions = [
        Session(
            id="s1",
            timestamp="2024-01-01",
            turns=[Turn(id="s1:t1", role="user", content="I live in Oslo.")],
        ),
        Session(
            id="s2",
            timestamp=None,
            turns=[Turn(id="s2:t1", role="user", content="I moved to Bergen.", speaker="Ann")],
        ),
    ]
    fields: dict[str, object] = dict(
        id="q1",
        question="Where do I live?",
        gold="Bergen",
        evidence_ids=["s2:t1"],
        task_type="update",
        scorer="contains",
    )
    fields.update(question_kw)
    return Episode(  # type: ignore[arg-type]
        id="e1", sessions=sessions, questions=[Question(**fields)]
    )


def test_helpers_find_turns_and_sessions() -> None:
    episode = make_episode()
    assert [t.id for t in episode.all_turns()] == ["s1:t1", "s2:t1"]
    assert episode.turn("s2:t1").speaker == "Ann"
    assert episode.session_of("s2:t1").id == "s2"
    with pytest.raises(KeyError, match="s9:t1"):
        episode.turn("s9:t1")


def test_json_round_trip_is_lossless() -> None:
    episode = make_episode(meta={"k": [1, 2]})
    assert Episode.model_validate_json(episode.model_dump_json()) == episode


def test_duplicate_turn_ids_are_rejected() -> None:
    turns = [Turn(id="t1", role="user", content="a"), Turn(id="t1", role="user", content="b")]
    with pytest.raises(ValidationError, match="duplicate turn id 't1'"):
        Episode(id="e", sessions=[Session(id="s1", turns=turns)], questions=[])


def test_evidence_must_name_a_turn() -> None:
    with pytest.raises(
        ValidationError, match=r"questions\[0\]\.evidence_ids: unknown turn ids \['s3:t1'\]"
    ):
        make_episode(evidence_ids=["s3:t1"])


def test_multiple_choice_needs_options_and_a_letter_gold() -> None:
    with pytest.raises(ValidationError, match="needs 2 to 26 options"):
        make_episode(scorer="multiple_choice", gold="A")
    with pytest.raises(ValidationError, match="must be one of the option letters AB"):
        make_episode(scorer="multiple_choice", gold="C", options=["Oslo", "Bergen"])
    assert (
        make_episode(scorer="multiple_choice", gold="B", options=["Oslo", "Bergen"])
        .questions[0]
        .gold
        == "B"
    )


def test_abstain_questions_use_the_abstain_scorer() -> None:
    with pytest.raises(ValidationError, match="scorer='abstain'"):
        make_episode(abstain=True)


def test_unknown_fields_and_scorers_are_rejected() -> None:
    with pytest.raises(ValidationError):
        make_episode(scorer="fuzzy")
    with pytest.raises(ValidationError):
        Turn(id="t", role="user", content="x", speeker="typo")  # type: ignore[call-arg]
