"""LongMemEval loader on a fixture in the official layout."""

from __future__ import annotations

import pytest

from optloop.datasets import load_dataset, score
from optloop.errors import DatasetError


def instance(qid: str, **extra: object) -> dict:
    record = {
        "question_id": qid,
        "question_type": "single-session-user",
        "question": "What degree did I graduate with?",
        "answer": "Business Administration",
        "question_date": "2023/05/30 (Tue) 23:40",
        "haystack_session_ids": ["sharegpt_a", "answer_b"],
        "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 10:00"],
        "haystack_sessions": [
            [
                {"role": "user", "content": "Help me plan a trip."},
                {"role": "assistant", "content": "Sure."},
            ],
            [
                {
                    "role": "user",
                    "content": "I graduated with a degree in Business Administration.",
                    "has_answer": True,
                },
                {"role": "assistant", "content": "Congratulations!"},
            ],
        ],
        "answer_session_ids": ["answer_b"],
    }
    record.update(extra)
    return record


def test_longmemeval_evidence_is_has_answer_turns(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    path = write_json(
        "longmemeval_s.json",
        [instance("q1"), instance("q2_abs", question="What degree did my brother get?")],
    )
    dataset = load_dataset(f"longmemeval:{path}")
    first, abstention = dataset.episodes
    (question,) = first.questions
    assert question.evidence_ids == ["s2:t1"] and question.task_type == "single-session-user"
    assert question.scorer == "llm_judge" and not question.abstain
    assert score(question, "You graduated in business administration.") == 1.0
    assert [s.timestamp for s in first.sessions] == [
        "2023/05/20 (Sat) 02:21",
        "2023/05/21 (Sun) 10:00",
    ]
    assert first.meta["session_ids"] == {"s1": "sharegpt_a", "s2": "answer_b"}
    assert [t.role for t in first.all_turns()] == ["user", "assistant", "user", "assistant"]
    (abs_question,) = abstention.questions
    assert (
        abs_question.abstain
        and abs_question.scorer == "abstain"
        and abs_question.evidence_ids == []
    )
    assert abs_question.meta["distractor_evidence"] == ["s2:t1"]


def test_longmemeval_integer_answer_becomes_text(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    path = write_json("lme.json", [instance("q3", answer=3)])
    assert load_dataset(f"longmemeval:{path}").episodes[0].questions[0].gold == "3"


def test_longmemeval_mismatched_dates_name_the_field(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    path = write_json("lme.json", [instance("q1"), instance("q4", haystack_dates=["2023/05/20"])])
    with pytest.raises(DatasetError) as err:
        load_dataset(f"longmemeval:{path}")
    message = str(err.value)
    assert (
        str(path) in message
        and "record 1 (question_id=q4)" in message
        and "field 'haystack_dates'" in message
    )
