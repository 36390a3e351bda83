"""Scorers: each question is graded by its own scorer, deterministically unless a judge is
given."""

from __future__ import annotations

import pytest

from optloop.datasets import Question, pass_threshold, passed, score
from optloop.datasets.scorers import (
    contains_all,
    is_abstention,
    multi_f1,
    normalize_answer,
    parse_choice,
    parse_yes_no,
    token_f1,
)

OPTIONS = ["Porto", "Lisbon", "Madrid", "New York", "New York City"]


def q(scorer: str, gold: str, **kw: object) -> Question:
    return Question(  # type: ignore[arg-type]
        id="q", question="?", gold=gold, task_type="t", scorer=scorer, **kw
    )


def test_normalize_answer_drops_case_punctuation_articles_and_accents() -> None:
    assert normalize_answer("The  Café, in Zürich!") == "cafe in zurich"
    assert normalize_answer("Don’t") == normalize_answer("don't") == "dont"


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("the cat sat", "cat sat", 1.0),
        ("red blue green", "red blue yellow", 2 / 3),
        ("Paris France", "Paris", 2 / 3),
        ("Berlin", "Paris", 0.0),
        ("", "Paris", 0.0),
    ],
)
def test_token_f1_values(prediction: str, gold: str, expected: float) -> None:
    assert token_f1(prediction, gold) == pytest.approx(expected)


def test_f1_scorer_passes_at_half() -> None:
    question = q("f1", "7 May 2023")
    assert score(question, "on 7 May 2023") == pytest.approx(2 * 0.75 / 1.75)
    assert passed(question, "7 May") is True  # F1 = 0.8
    assert passed(question, "June") is False
    assert pass_threshold(question) == 0.5


def test_multi_f1_averages_best_match_per_gold_part() -> None:
    assert multi_f1("counseling, psychology", "psychology, counseling") == pytest.approx(1.0)
    assert multi_f1("psychology", "psychology, counseling") == pytest.approx(0.5)
    assert score(q("f1_multi", "psychology, counseling"), "psychology") == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Yes — finding the album triggers her nostalgia", "yes"),
        ("No.", "no"),
        ("Answer: no, because it is too warm", "no"),
        ("Yeah, she would.", "yes"),
        ("She would not do that now.", "no"),
        ("It depends on the weather.", None),
    ],
)
def test_parse_yes_no(text: str, expected: str | None) -> None:
    assert parse_yes_no(text) == expected


def test_yes_no_scorer_uses_gold_polarity_not_wording() -> None:
    question = q("yes_no", "No — Pip refuses breakfast during thunderstorms.")
    assert score(question, "no") == 1.0
    assert score(question, "Yes, he will eat.") == 0.0
    assert score(question, "Hard to say.") == 0.0


@pytest.mark.parametrize(
    ("prediction", "letter"),
    [
        ("(B)", "B"),
        ("Answer: b", "B"),
        ("b", "B"),
        ("B) Lisbon", "B"),
        ("The correct answer is C.", "C"),
        ("I think it is Lisbon.", "B"),
        ("It's New York City", "E"),  # the longer option wins over the one it contains
        ("the answer is a guess", None),  # lower-case 'a' in prose is not option A
        ("Porto or Madrid", None),  # two options named: no choice
        ("no idea", None),
    ],
)
def test_parse_choice(prediction: str, letter: str | None) -> None:
    assert parse_choice(prediction, OPTIONS) == letter


def test_multiple_choice_scorer_compares_letters() -> None:
    question = q("multiple_choice", "B", options=OPTIONS)
    assert score(question, "(B)") == 1.0
    assert score(question, "Lisbon") == 1.0
    assert score(question, "A") == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "I don't know.",
        "I don’t know",
        "I don't have information about Noah Brooks.",
        "Not mentioned in the conversation",
        "There is no information available about that.",
        "You no longer have a gym membership; you cancelled it.",
        "Unknown",
        "None",
    ],
)
def test_abstention_phrases_are_recognised(text: str) -> None:
    assert is_abstention(text)


@pytest.mark.parametrize(
    "text", ["Paris", "You live in Austin.", "Bring a brass sextant.", "Nonetheless, Tuesday."]
)
def test_answers_are_not_abstentions(text: str) -> None:
    assert not is_abstention(text)


def test_abstain_scorer() -> None:
    question = q("abstain", "I don't have information about Ava.", abstain=True)
    assert score(question, "I have no information about Ava Thompson.") == 1.0
    assert score(question, "She should bring a compass.") == 0.0


def test_contains_matches_whole_words_only() -> None:
    question = q("contains", "Tom")
    assert score(question, "It's Tom.") == 1.0
    assert score(question, "Tomorrow") == 0.0


def test_contains_all_scores_the_fraction_of_items() -> None:
    gold = "fedora, beanie, bucket hat"
    assert contains_all("Bring a fedora and bucket hats", gold) == pytest.approx(2 / 3)
    question = q("contains_all", gold)
    assert passed(question, "fedora, beanie and a bucket hat") is True
    assert passed(question, "Bring a fedora and bucket hats") is False


def test_exact_scorer() -> None:
    question = q("exact", "The Blue Whale")
    assert score(question, "blue whale!") == 1.0
    assert score(question, "a blue whale calf") == 0.0


def test_forbidden_value_zeroes_any_scorer() -> None:
    question = q("contains", "Lisbon", forbidden=["Porto"])
    assert score(question, "Lisbon") == 1.0
    assert score(question, "Lisbon, previously Porto") == 0.0


def test_llm_judge_uses_the_callable_and_falls_back_without_it() -> None:
    calls: list[tuple[str, str, str]] = []

    def judge(question: str, gold: str, prediction: str) -> bool:
        calls.append((question, gold, prediction))
        return prediction.startswith("ok")

    question = Question(
        id="q",
        question="What to bring?",
        gold="a sextant",
        task_type="persona",
        scorer="llm_judge",
    )
    assert score(question, "ok whatever", judge=judge) == 1.0
    assert calls == [("What to bring?", "a sextant", "ok whatever")]
    assert score(question, "Bring a sextant.") == 1.0  # no judge: containment
    assert score(question, "Bring a compass.") == pytest.approx(
        token_f1("Bring a compass.", "a sextant")
    )


def test_judge_is_ignored_by_deterministic_scorers() -> None:
    question = q("contains", "Lisbon")
    assert score(question, "Porto", judge=lambda *_: True) == 0.0
