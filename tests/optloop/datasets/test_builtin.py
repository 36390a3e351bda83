"""builtin: datasets ship in code and need no files."""

from __future__ import annotations

import pytest

from optloop.datasets import load_dataset, score
from optloop.errors import DatasetError


def test_empty_name_means_tiny() -> None:
    assert load_dataset("builtin:").model_dump(exclude={"uri"}) == load_dataset(
        "builtin:tiny"
    ).model_dump(exclude={"uri"})


def test_tiny_is_small_and_mixes_tasks() -> None:
    dataset = load_dataset("builtin:tiny")
    assert dataset.name == "builtin:tiny" and 3 <= len(dataset.episodes) <= 6
    for episode in dataset.episodes:
        assert len(episode.sessions) == 2 and 2 <= len(episode.questions) <= 3
        for question in episode.questions:
            support = " ".join(episode.turn(t).content for t in question.evidence_ids)
            assert score(question, support) == 1.0  # the evidence really contains the answer
    tasks = {q.task_type for e in dataset.episodes for q in e.questions}
    assert {"exact_recall", "update", "multi_session"} <= tasks


def test_update_questions_cite_the_latest_session() -> None:
    for episode in load_dataset("builtin:tiny?tasks=update").episodes:
        for question in episode.questions:
            assert all(episode.session_of(t).id == "s2" for t in question.evidence_ids)


@pytest.mark.parametrize(("name", "episodes"), [("suite", 9), ("meme", 2)])
def test_other_builtins_are_seed_zero_generators(name: str, episodes: int) -> None:
    assert len(load_dataset(f"builtin:{name}").episodes) == episodes


def test_unknown_builtin_lists_the_choices() -> None:
    with pytest.raises(
        DatasetError,
        match=r"unknown built-in dataset 'huge' \(one of: tiny, suite, meme, assistant\)",
    ):
        load_dataset("builtin:huge")
