"""Malformed sources fail at load time with one line naming file, line or record, and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optloop.datasets import load_dataset
from optloop.errors import DatasetError

from .test_locomo import locomo_fixture
from .test_longmemeval import instance
from .test_meme import record as meme_record
from .test_memfail import LONG_HOP_HEADER, long_hop_rows


def error_for(uri: str) -> str:
    with pytest.raises(DatasetError) as err:
        load_dataset(uri)
    message = str(err.value)
    assert "\n" not in message
    return message


def coexisting_row(facts: str = '["I like tea.", "I like coffee."]') -> dict[str, str]:
    return {
        "preference_category": "drinks",
        "preferences": '["tea", "coffee"]',
        "preference_facts": facts,
        "question": "What do I drink?",
        "ground_truth_answer": "tea, coffee",
    }


def test_missing_csv_column_names_header_line_and_column(  # type: ignore[no-untyped-def]
    write_csv,
) -> None:
    path = write_csv("persona.csv", [{"entity": "Yuki", "entity_facts": '["Yuki maps wrecks."]'}])
    assert error_for(f"memfail:persona:{path}") == (
        f"{path}: line 1 (header): field 'questions': missing column (found columns: "
        "entity, entity_facts)"
    )


def test_bad_json_cell_names_the_rows_first_line(  # type: ignore[no-untyped-def]
    write_csv,
) -> None:
    multiline = coexisting_row()
    multiline["question"] = (
        "What do I\ndrink?"  # a quoted cell spanning two lines shifts the next row
    )
    path = write_csv("coexisting.csv", [multiline, coexisting_row(facts="[not json")])
    assert error_for(f"memfail:coexisting:{path}").startswith(
        f"{path}: line 4: field 'preference_facts': invalid JSON in cell"
    )


def test_short_csv_row_names_the_missing_cell(tmp_path: Path) -> None:
    path = tmp_path / "coexisting.csv"
    path.write_text(
        "preference_category,preferences,preference_facts,question,ground_truth_answer\n"
        'drinks,"[]"\n',
        encoding="utf-8",
    )
    assert (
        error_for(f"memfail:coexisting:{path}")
        == f"{path}: line 2: field 'preference_facts': missing value (row has too few cells)"
    )


def test_conditional_gold_without_polarity_is_rejected(  # type: ignore[no-untyped-def]
    write_csv,
) -> None:
    row = {
        "entity": "Pip",
        "entity_facts": '["Pip eats at dawn."]',
        "question": "Will Pip eat?",
        "ground_truth_answer": "Probably.",
    }
    path = write_csv("conditional_easy.csv", [row])
    message = error_for(f"memfail:conditional_easy:{path}")
    assert message.startswith(
        f"{path}: line 2: field 'ground_truth_answer': does not start with yes or no"
    )


def test_persona_question_record_missing_text(write_csv) -> None:  # type: ignore[no-untyped-def]
    questions = [
        {"text": "Q?", "is_misleading": False, "ground_truth_answer": "A"},
        {"is_misleading": True, "ground_truth_answer": "I don't know"},
    ]
    path = write_csv(
        "persona.csv",
        [
            {
                "entity": "Yuki",
                "entity_facts": '["Yuki maps wrecks."]',
                "questions": json.dumps(questions),
            }
        ],
    )
    assert (
        error_for(f"memfail:persona:{path}")
        == f"{path}: line 2: field 'questions[1].text': missing or empty"
    )


def test_long_hop_bad_choice_and_missing_choice_column(  # type: ignore[no-untyped-def]
    write_csv,
) -> None:
    rows = long_hop_rows()
    rows[1]["correct_choice"] = "F"
    path = write_csv("long_hop.csv", rows, LONG_HOP_HEADER)
    assert error_for(f"memfail:long_hop:{path}").startswith(
        f"{path}: line 3: field 'correct_choice': expected a letter A-E"
    )
    header = [c for c in LONG_HOP_HEADER if c != "choice_e"]
    path = write_csv("long_hop_4.csv", long_hop_rows(), header)
    assert error_for(f"memfail:long_hop:{path}").startswith(
        f"{path}: line 1 (header): field 'choice_e': missing column"
    )


def test_bad_json_file_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "locomo10.json"
    path.write_text('[\n  {"sample_id": "a",\n   "qa": [}\n]', encoding="utf-8")
    assert error_for(f"locomo:{path}").startswith(f"{path}: line 3: invalid JSON")


def valid_episode_line() -> str:
    return load_dataset("builtin:tiny").episodes[0].model_dump_json() + "\n"


@pytest.mark.parametrize(
    ("tail", "column"),
    [
        ('{"id": "e2", "sessions": [\n', 26),  # cut between values
        ('{"id": "e2", "sess\n', 18),  # cut inside a key
        ('{"id": "e2", "sess', 18),  # cut inside a key, no newline at the end of the file
    ],
)
def test_a_jsonl_line_cut_off_at_its_end_is_reported_where_it_ends(
    tmp_path: Path, tail: str, column: int
) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text(valid_episode_line() + tail, encoding="utf-8")
    assert error_for(f"jsonl:{path}") == (
        f"{path}: line 2: invalid JSON: the line ends after column {column}, "
        "before its JSON value is complete (cut off?)"
    )


def test_a_json_file_cut_off_is_reported_at_its_last_line(tmp_path: Path) -> None:
    path = tmp_path / "locomo10.json"
    path.write_text('[\n  {"sample_id": "a",\n   "qa": [\n', encoding="utf-8")
    assert error_for(f"locomo:{path}") == (
        f"{path}: line 3: invalid JSON: the file ends after column 10, before its "
        "JSON value is complete (cut off?)"
    )


def test_bad_json_inside_a_jsonl_line_keeps_its_column(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text(valid_episode_line() + '{"id" "e2"}\n', encoding="utf-8")
    assert (
        error_for(f"jsonl:{path}")
        == f"{path}: line 2: invalid JSON: Expecting ':' delimiter at column 7"
    )


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s["qa"][0].pop("answer"), "field 'qa[0].answer': missing"),
        (lambda s: s["qa"][1].update(category=7), "field 'qa[1].category': expected 1-5, got 7"),
        (
            lambda s: s["conversation"]["session_1"][0].pop("speaker"),
            "field 'conversation.session_1[0].speaker': missing",
        ),
        (lambda s: s["qa"][2].update(evidence="D1:2"), "field 'qa[2].evidence': expected a list"),
    ],
)
def test_locomo_record_errors_name_sample_and_field(write_json, mutate, expected: str) -> None:
    samples = locomo_fixture()
    mutate(samples[0])
    path = write_json("locomo10.json", samples)
    assert error_for(f"locomo:{path}").startswith(
        f"{path}: record 0 (sample_id=conv-x): {expected}"
    )


def test_longmemeval_missing_field(write_json) -> None:  # type: ignore[no-untyped-def]
    bad = instance("q2")
    del bad["question"]
    path = write_json("lme.json", [instance("q1"), bad])
    assert (
        error_for(f"longmemeval:{path}")
        == f"{path}: record 1 (question_id=q2): field 'question': missing"
    )


def test_meme_unknown_task(write_json) -> None:  # type: ignore[no-untyped-def]
    bad = meme_record()
    bad["questions"][0]["task_type"] = "telepathy"
    path = write_json("meme.json", [bad])
    assert error_for(f"meme:{path}").startswith(
        f"{path}: record 0: field 'questions[0].task_type': unknown task 'telepathy'"
    )


def test_jsonl_errors_name_line_and_field(tmp_path: Path) -> None:
    good = load_dataset("builtin:tiny").episodes[0]
    record = json.loads(good.model_dump_json())
    path = tmp_path / "user.jsonl"

    path.write_text(good.model_dump_json() + "\n{oops\n", encoding="utf-8")
    assert error_for(f"jsonl:{path}").startswith(f"{path}: line 2: invalid JSON")

    del record["questions"][1]["gold"]
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    assert (
        error_for(f"jsonl:{path}") == f"{path}: line 1: field 'questions[1].gold': Field required"
    )

    record = json.loads(good.model_dump_json())
    record["questions"][0]["evidence_ids"] = ["s9:t9"]
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    assert (
        error_for(f"jsonl:{path}")
        == f"{path}: line 1: field 'questions[0].evidence_ids': unknown turn ids ['s9:t9']"
    )

    record = json.loads(good.model_dump_json())
    record["questions"][0].update(scorer="multiple_choice", options=["x", "y"], gold="Z")
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    assert (
        error_for(f"jsonl:{path}")
        == f"{path}: line 1: field 'questions[0].gold': 'Z' must be one of the option letters AB"
    )

    path.write_text("[1, 2]\n", encoding="utf-8")
    assert (
        error_for(f"jsonl:{path}")
        == f"{path}: line 1: expected a JSON object (one Episode), got list"
    )
