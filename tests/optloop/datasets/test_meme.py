"""MEME loader on fixtures in the documented layout (JSON list, {"episodes": [...]}, JSONL)."""

from __future__ import annotations

import pytest

from optloop.datasets import load_dataset, score
from optloop.errors import DatasetError


def record() -> dict:
    return {
        "episode": {
            "id": "m1",
            "domain": "workplace",
            "root": "project Orla",
            "evidence_session_indices": [1, 3],
        },
        "sessions": [
            {
                "idx": 0,
                "kind": "filler",
                "timestamp": "2024-01-01",
                "conversation": [
                    {"role": "user", "content": "Nice weather."},
                    {"role": "assistant", "content": "Indeed."},
                ],
                "gold_facts": [],
            },
            {
                "idx": 1,
                "kind": "evidence",
                "timestamp": "2024-01-03",
                "conversation": [
                    {"role": "user", "content": "Orla's lead is Kai."},
                    {"role": "assistant", "content": "Noted."},
                    {"role": "user", "content": "Kai lives in Brask."},
                ],
                "gold_facts": [
                    {
                        "entity": "Orla lead",
                        "value": "Kai",
                        "fact_text": "Orla's lead is Kai.",
                        "conveyed_in_turn": 0,
                    },
                    {
                        "entity": "Kai",
                        "value": "Brask",
                        "fact_text": "Kai lives in Brask.",
                        "conveyed_in_turn": 2,
                    },
                ],
            },
            {
                "idx": 2,
                "kind": "probe-before",
                "conversation": [{"role": "user", "content": "Where is Orla's office?"}],
            },
            {
                "idx": 3,
                "kind": "evidence",
                "timestamp": "2024-01-09",
                "conversation": [{"role": "user", "content": "Kai moved to Velt."}],
                "gold_facts": [
                    {
                        "entity": "Kai",
                        "value": "Velt",
                        "fact_text": "Kai moved to Velt.",
                        "conveyed_in_turn": 0,
                    }
                ],
            },
            {
                "idx": 4,
                "kind": "probe-after",
                "conversation": [{"role": "user", "content": "And now?"}],
            },
        ],
        "questions": [
            {
                "task_type": "cascade",
                "question": "Where is Orla's office?",
                "gold_answer": "Velt",
                "entity": "Kai",
                "evidence_session_indices": [3],
            },
            {
                "task_type": "Exact recall",
                "question": "Who leads Orla?",
                "gold_answer": "Kai",
                "evidence_turns": [[1, 0]],
            },
            {
                "task_type": "absence",
                "question": "What is Orla's budget?",
                "gold_answer": "unknown",
                "evidence_turns": [],
            },
            {
                "task_type": "aggregation",
                "question": "Which cities has Kai lived in?",
                "gold_answer": "Brask, Velt",
                "entity": "Kai",
            },
        ],
    }


def test_meme_maps_sessions_kinds_and_gold_fact_evidence(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    path = write_json("meme.json", [record()])
    (episode,) = load_dataset(f"meme:{path}").episodes
    assert (
        episode.id == "m1"
        and episode.meta["domain"] == "workplace"
        and episode.meta["root"] == "project Orla"
    )
    assert [s.kind for s in episode.sessions] == [
        "filler",
        "evidence",
        "probe-before",
        "evidence",
        "probe-after",
    ]
    assert [s.id for s in episode.sessions] == ["s0", "s1", "s2", "s3", "s4"]
    assert episode.turn("s1:t3").content == "Kai lives in Brask."
    cascade, recall, absence, aggregation = episode.questions
    assert (cascade.task_type, cascade.scorer, cascade.evidence_ids) == (
        "cascade",
        "contains",
        ["s3:t1"],
    )
    assert (recall.task_type, recall.evidence_ids) == ("exact_recall", ["s1:t1"])
    assert absence.abstain and absence.scorer == "abstain" and absence.evidence_ids == []
    # No explicit evidence: the episode's evidence sessions, narrowed to the question's entity.
    assert (aggregation.scorer, aggregation.evidence_ids) == ("contains_all", ["s1:t3", "s3:t1"])
    assert score(aggregation, "Brask and later Velt") == 1.0
    assert cascade.meta["domain"] == "workplace"


def test_meme_accepts_an_episodes_object_and_jsonl(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    second = record()
    second["episode"].pop("id")
    as_object = write_json("meme_obj.json", {"episodes": [record(), second]})
    as_lines = write_json("meme.jsonl", [record(), second])
    ids_object = [e.id for e in load_dataset(f"meme:{as_object}").episodes]
    ids_lines = [e.id for e in load_dataset(f"meme:{as_lines}").episodes]
    assert ids_object == ids_lines == ["m1", "meme-0001"]


def test_meme_out_of_range_fact_turn_names_the_field(  # type: ignore[no-untyped-def]
    write_json,
) -> None:
    bad = record()
    bad["sessions"][1]["gold_facts"][1]["conveyed_in_turn"] = 7
    path = write_json("meme.jsonl", [record(), bad])
    with pytest.raises(DatasetError) as err:
        load_dataset(f"meme:{path}")
    message = str(err.value)
    assert message.startswith(
        f"{path}: line 2: field 'sessions[1].gold_facts[1].conveyed_in_turn'"
    )
    assert "outside the conversation (0..2)" in message
