"""LoCoMo loader: the shared dev file (skipped without it) and a small fixture."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from optloop.datasets import load_dataset, score
from optloop.datasets.locomo import CATEGORIES
from optloop.errors import DatasetError


def test_shared_locomo_maps_sessions_turns_and_evidence(locomo_file: Path) -> None:
    raw = json.loads(locomo_file.read_text(encoding="utf-8"))
    dataset = load_dataset(f"locomo:{locomo_file}")
    assert len(dataset.episodes) == len(raw)
    for sample, episode in zip(raw, dataset.episodes):
        conversation = sample["conversation"]
        assert episode.id == sample["sample_id"]
        n_sessions = len([k for k in conversation if re.fullmatch(r"session_\d+", k)])
        assert len(episode.sessions) == n_sessions
        assert episode.sessions[0].timestamp == conversation["session_1_date_time"]
        first = conversation["session_1"][0]
        assert episode.turn("s1:t1").content.startswith(first["text"])
        assert episode.turn("s1:t1").speaker == first["speaker"]
        assert len(episode.questions) == len(sample["qa"])
        for record, question in zip(sample["qa"], episode.questions):
            assert question.task_type == CATEGORIES[record["category"]]
            if record["category"] == 5:
                assert (
                    question.abstain
                    and question.scorer == "abstain"
                    and question.evidence_ids == []
                )
            else:
                assert question.gold.startswith(str(record["answer"]).split(";")[0].strip())
                # Each well-formed evidence id names the turn with that dia_id.
                for ev in record["evidence"]:
                    m = re.fullmatch(r"D(\d+):(\d+)", ev)
                    if m and f"s{m[1]}:t{m[2]}" in question.evidence_ids:
                        dia = next(t for t in conversation[f"session_{m[1]}"] if t["dia_id"] == ev)
                        assert episode.turn(f"s{m[1]}:t{m[2]}").content.startswith(dia["text"])
    categories = {q.task_type for e in dataset.episodes for q in e.questions}
    assert categories == set(CATEGORIES.values())


def locomo_fixture() -> list[dict]:
    return [
        {
            "sample_id": "conv-x",
            "conversation": {
                "speaker_a": "Ann",
                "speaker_b": "Ben",
                "session_1_date_time": "1:00 pm on 1 May, 2023",
                "session_1": [
                    {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a puppy called Rex."},
                    {
                        "speaker": "Ben",
                        "dia_id": "D1:2",
                        "text": "Look at my garden!",
                        "blip_caption": "a photo of tulips",
                    },
                ],
                "session_2_date_time": "2:00 pm on 9 May, 2023",
                "session_2": [
                    {
                        "speaker": "Ann",
                        "dia_id": "D2:1",
                        "text": "Rex learned to sit, and I started pottery.",
                    }
                ],
            },
            "qa": [
                {
                    "question": "What is Ann's puppy called?",
                    "answer": "Rex",
                    "evidence": ["D1:1"],
                    "category": 4,
                },
                {
                    "question": "What did Ann start and adopt?",
                    "answer": "pottery, puppy",
                    "evidence": ["D1:1; D2:1"],
                    "category": 1,
                },
                {
                    "question": "What flowers does Ann grow?",
                    "adversarial_answer": "tulips",
                    "evidence": ["D1:2"],
                    "category": 5,
                },
                {
                    "question": "What year?",
                    "answer": 2023,
                    "evidence": ["D:9:9", "D"],
                    "category": 2,
                },
            ],
        }
    ]


def test_fixture_maps_lenient_evidence_captions_and_categories(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    path = write_json("locomo10.json", locomo_fixture())
    dataset = load_dataset(f"locomo:{path}")
    assert dataset.name == "locomo:locomo10"
    (episode,) = dataset.episodes
    assert [t.id for t in episode.all_turns()] == ["s1:t1", "s1:t2", "s2:t1"]
    assert all(t.role == "user" for t in episode.all_turns())
    assert (
        episode.turn("s1:t2").content == "Look at my garden! [shared a photo: a photo of tulips]"
    )
    single, multi, adversarial, temporal = episode.questions
    assert (single.task_type, single.scorer, single.evidence_ids) == (
        "single_hop",
        "f1",
        ["s1:t1"],
    )
    assert (multi.task_type, multi.scorer, multi.evidence_ids) == (
        "multi_hop",
        "f1_multi",
        ["s1:t1", "s2:t1"],
    )
    assert adversarial.abstain and adversarial.meta["distractor_evidence"] == ["s1:t2"]
    assert adversarial.meta["adversarial_answer"] == "tulips"
    assert (
        score(adversarial, "Not mentioned in the conversation") == 1.0
        and score(adversarial, "tulips") == 0.0
    )
    assert temporal.gold == "2023" and temporal.evidence_ids == []
    assert episode.meta["dropped_evidence"] == 2
    assert episode.sessions[1].timestamp == "2:00 pm on 9 May, 2023"


def test_sessions_keeps_the_first_sessions_and_the_questions_they_answer(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    path = write_json("locomo10.json", locomo_fixture())
    dataset = load_dataset(f"locomo:{path}?sessions=1")
    assert dataset.name == "locomo:locomo10[sessions=1]"
    (episode,) = dataset.episodes
    assert [s.id for s in episode.sessions] == ["s1"]
    # the multi-hop question cites session 2; the temporal one cites no turn
    assert [q.task_type for q in episode.questions] == ["single_hop", "adversarial"]


def test_questions_is_a_seeded_sample_stratified_by_category(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    sample = locomo_fixture()[0]
    sample["qa"] = [
        {
            "question": f"q{i}?",
            "answer": f"a{i}",
            "evidence": ["D1:1"],
            "category": 4 if i < 30 else 2,
        }
        for i in range(40)
    ]
    path = write_json("locomo10.json", [sample])
    uri = f"locomo:{path}?questions=8"
    picked = load_dataset(uri).episodes[0].questions
    assert [q.task_type for q in picked].count("single_hop") == 6
    assert [q.task_type for q in picked].count("temporal") == 2
    assert [q.id for q in picked] == sorted(
        (q.id for q in picked), key=lambda i: int(i.split("q")[-1])
    )
    assert [q.id for q in load_dataset(uri).episodes[0].questions] == [q.id for q in picked]
    other = load_dataset(f"{uri}&seed=1").episodes[0].questions
    assert [q.id for q in other] != [q.id for q in picked]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sessions=0", "field 'sessions': expected an integer >= 1"),
        (
            "turns=3",
            "field 'turns': unknown query parameter (accepted: sessions, questions, seed)",
        ),
    ],
)
def test_bad_locomo_parameters_name_the_parameter(  # type: ignore[no-untyped-def]
    write_json, query: str, message: str
) -> None:
    path = write_json("locomo10.json", locomo_fixture())
    with pytest.raises(DatasetError, match=re.escape(message)):
        load_dataset(f"locomo:{path}?{query}")
