"""MemFail loaders: the four shipped CSVs (skipped without shared data) and a Long-Hop fixture."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from optloop.datasets import load_dataset, score
from optloop.datasets.scorers import parse_yes_no
from optloop.errors import DatasetError

FILES = {
    "coexisting": "coexisting_facts_dataset.csv",
    "conditional_easy": "conditional_facts_dataset_easy.csv",
    "conditional_hard": "conditional_facts_dataset_hard.csv",
    "persona": "persona_dataset.csv",
}


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def shipped(memfail_dir: Path, task: str) -> Path:
    path = memfail_dir / FILES[task]
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


def test_coexisting_puts_each_preference_fact_in_its_own_session(memfail_dir: Path) -> None:
    path = shipped(memfail_dir, "coexisting")
    rows = csv_rows(path)
    dataset = load_dataset(f"memfail:coexisting:{path}")
    assert dataset.name == "memfail:coexisting" and len(dataset.episodes) == len(rows)
    for row, episode in zip(rows, dataset.episodes):
        facts = json.loads(row["preference_facts"])
        (question,) = episode.questions
        assert [t.content for t in episode.all_turns()] == [f.strip() for f in facts]
        assert len(episode.sessions) == len(facts)
        assert question.scorer == "contains_all" and question.task_type == "coexisting"
        assert question.evidence_ids == [t.id for t in episode.all_turns()]
        assert score(question, " and ".join(json.loads(row["preferences"]))) == 1.0


@pytest.mark.parametrize("task", ["conditional_easy", "conditional_hard"])
def test_conditional_questions_are_yes_no_with_the_gold_polarity(
    memfail_dir: Path, task: str
) -> None:
    path = shipped(memfail_dir, task)
    rows = csv_rows(path)
    dataset = load_dataset(f"memfail:{task}:{path}")
    assert len(dataset.episodes) == len(rows)
    for row, episode in zip(rows, dataset.episodes):
        (question,) = episode.questions
        assert question.scorer == "yes_no" and question.task_type == "conditional"
        assert question.meta["difficulty"] == task.split("_")[1]
        expected = parse_yes_no(row["ground_truth_answer"])
        assert expected in {"yes", "no"}
        assert score(question, expected) == 1.0
        assert score(question, "no" if expected == "yes" else "yes") == 0.0
        assert episode.all_turns()[0].content == json.loads(row["entity_facts"])[0].strip()


def test_persona_misleading_questions_abstain(memfail_dir: Path) -> None:
    path = shipped(memfail_dir, "persona")
    rows = csv_rows(path)
    dataset = load_dataset(f"memfail:persona:{path}")
    records = [r for row in rows for r in json.loads(row["questions"])]
    questions = [q for e in dataset.episodes for q in e.questions]
    assert len(questions) == len(records)
    for record, question in zip(records, questions):
        assert question.question == record["text"]
        assert question.abstain is record["is_misleading"]
        if question.abstain:
            assert question.scorer == "abstain" and question.evidence_ids == []
            assert score(question, record["ground_truth_answer"]) == 1.0
        else:
            assert question.scorer == "llm_judge" and question.evidence_ids
    assert any(q.abstain for q in questions) and not all(q.abstain for q in questions)


def test_default_path_comes_from_the_shared_data_env(
    memfail_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped(memfail_dir, "persona")
    monkeypatch.setenv("OPTLOOP_SHARED_DATA", str(memfail_dir.parent))
    assert len(load_dataset("memfail:persona?limit=3").episodes) == 3


def test_missing_default_data_says_to_pass_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPTLOOP_SHARED_DATA", str(tmp_path))
    with pytest.raises(DatasetError, match=r"memfail:coexisting: no CSV found in .*pass a path"):
        load_dataset("memfail:coexisting")


LONG_HOP_HEADER = [
    "id",
    "hop_count",
    *[f"fact_{k}" for k in range(1, 5)],
    *[f"chain_{k}" for k in range(1, 6)],
    "graded_question",
    "ground_truth_answer",
    *[f"choice_{c}" for c in "abcde"],
    "correct_choice",
]


def long_hop_rows() -> list[dict[str, str]]:
    return [
        {
            "id": "lh1",
            "hop_count": "2",
            "fact_1": "Ada's mentor is Bo.",
            "fact_2": "Bo was born in Quito.",
            "chain_1": "Ada",
            "chain_2": "Bo",
            "chain_3": "Quito",
            "graded_question": "Where was Ada's mentor born?",
            "ground_truth_answer": "Quito",
            "choice_a": "Lima",
            "choice_b": "Quito",
            "choice_c": "Bogota",
            "choice_d": "Cusco",
            "choice_e": "Cali",
            "correct_choice": "B",
        },
        {
            "id": "lh2",
            "hop_count": "4",
            "fact_1": "Cy owns the red boat.",
            "fact_2": "The red boat is docked at Pier 9.",
            "fact_3": "Pier 9 is run by Dee.",
            "fact_4": "Dee's sister is Eve.",
            "chain_1": "Cy",
            "chain_2": "red boat",
            "chain_3": "Pier 9",
            "chain_4": "Dee",
            "chain_5": "Eve",
            "graded_question": "Who is the sister of the person running the pier where Cy's "
            "boat docks?",
            "ground_truth_answer": "Eve",
            "choice_a": "Ann",
            "choice_b": "Bea",
            "choice_c": "Eve",
            "choice_d": "Fay",
            "choice_e": "Gil",
            "correct_choice": "choice_c",
        },
        {
            "id": "lh3",
            "hop_count": "3",
            "fact_1": "Fin plays for the Owls.",
            "fact_2": "The Owls train in Brno.",
            "fact_3": "Brno hosts the cup final.",
            "graded_question": "Which event is hosted where Fin's team trains?",
            "ground_truth_answer": "the cup final",
            "choice_a": "the cup final",
            "choice_b": "a marathon",
            "choice_c": "a fair",
            "choice_d": "a concert",
            "choice_e": "an expo",
            "correct_choice": "the cup final",
        },
    ]


def test_long_hop_spreads_each_chain_over_sessions_with_five_options(
    write_csv,
) -> None:  # type: ignore[no-untyped-def]
    path = write_csv("long_hop_dataset.csv", long_hop_rows(), LONG_HOP_HEADER)
    dataset = load_dataset(f"memfail:long_hop:{path}")
    assert [e.id for e in dataset.episodes] == ["long_hop-lh1", "long_hop-lh2", "long_hop-lh3"]
    for row, episode in zip(long_hop_rows(), dataset.episodes):
        facts = [row[f"fact_{k}"] for k in range(1, 5) if row.get(f"fact_{k}")]
        (question,) = episode.questions
        fact_sessions = [episode.session_of(e).id for e in question.evidence_ids]
        assert (
            len(fact_sessions) == len(facts) == len(set(fact_sessions))
        )  # no two facts of the chain share a session
        assert [episode.turn(e).content for e in question.evidence_ids] == facts
        assert question.scorer == "multiple_choice" and len(question.options or []) == 5
        assert question.options == [row[f"choice_{c}"] for c in "abcde"]
    assert [e.questions[0].gold for e in dataset.episodes] == ["B", "C", "A"]
    assert dataset.episodes[1].questions[0].meta["chain"] == [
        "Cy",
        "red boat",
        "Pier 9",
        "Dee",
        "Eve",
    ]
    assert dataset.episodes[1].questions[0].meta["hop_count"] == 4
    question = dataset.episodes[0].questions[0]
    assert (
        score(question, "Answer: (B)") == 1.0
        and score(question, "Quito") == 1.0
        and score(question, "A") == 0.0
    )


def test_long_hop_default_lookup_finds_the_csv(
    write_csv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "memfail").mkdir()
    path = write_csv("memfail/long_hop_dataset.csv", long_hop_rows()[:1], LONG_HOP_HEADER)
    monkeypatch.setenv("OPTLOOP_SHARED_DATA", str(tmp_path))
    assert path.exists() and len(load_dataset("memfail:long_hop").episodes) == 1
