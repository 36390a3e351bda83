"""Generators: gold answers re-derived from the generated text, and seeded reproducibility."""

from __future__ import annotations

import re

import pytest

from optloop.datasets import Episode, Question, load_dataset, score
from optloop.datasets.meme_tasks import MEME_TASKS
from optloop.datasets.synthetic import SUITE_CHECKS
from optloop.errors import DatasetError

URI = "synthetic:meme?seed=11&episodes=6&fillers=3"


@pytest.fixture(scope="module")
def episodes() -> list[Episode]:
    return load_dataset(URI).episodes


def by_task(episode: Episode) -> dict[str, Question]:
    return {q.task_type: q for q in episode.questions}


def user_lines(episode: Episode) -> list[str]:
    """User statements in ingestion (chronological) order."""
    return [t.content for t in episode.all_turns() if t.role == "user"]


def test_every_episode_asks_all_six_tasks_in_both_domains(episodes: list[Episode]) -> None:
    assert len(episodes) == 6
    assert {e.meta["domain"] for e in episodes} == {"workplace", "household"}
    for episode in episodes:
        assert sorted(by_task(episode)) == sorted(MEME_TASKS)
        assert sum(s.kind == "filler" for s in episode.sessions) == 3
        evidence_sessions = {
            episode.session_of(t).id for q in episode.questions for t in q.evidence_ids
        }
        assert all(episode.sessions[int(sid[1:])].kind == "evidence" for sid in evidence_sessions)
        stamps = [s.timestamp for s in episode.sessions]
        assert stamps == sorted(stamps)


def replay_cascade(episode: Episode) -> tuple[str, str]:
    """Re-derive the cascade answer by reading the statements in order; returns (answer, first
    value)."""
    lead: str | None = None
    home: dict[str, str] = {}
    first: str | None = None
    for line in user_lines(episode):
        if m := re.fullmatch(
            r"(.+), who lives in (.+), (?:has taken over as lead of project .+|hosts the "
            r"reunion)\.",
            line,
        ):
            name = m[1].removeprefix("From now on my cousin ")
            lead, home[name] = name, m[2]
        elif m := re.fullmatch(
            r"(?:My aunt )?(.+) is (?:the lead of project|hosting the) .+\.", line
        ):
            lead = m[1]
        elif m := re.fullmatch(
            r"(?:Big news: |Guess what, )?(.+?) (?:lives in|just moved to|moved to) "
            r"(.+?)(?: last week)?\.",
            line,
        ):
            home[m[1]] = m[2]
        if first is None and lead in home:
            first = home[lead]
    assert lead is not None and first is not None
    return home[lead], first


def test_cascade_gold_follows_the_rule_after_the_root_changes(episodes: list[Episode]) -> None:
    for episode in episodes:
        question = by_task(episode)["cascade"]
        expected, before = replay_cascade(episode)
        assert question.gold == expected != before
        assert question.meta["stale_values"] == [before]
        evidence_text = " ".join(episode.turn(t).content for t in question.evidence_ids)
        assert "always" in evidence_text and expected in evidence_text  # the rule and the new root
        assert score(question, f"It is in {expected}.") == 1.0


def test_tracking_gold_is_the_latest_value(episodes: list[Episode]) -> None:
    for episode in episodes:
        question = by_task(episode)["tracking"]
        pattern = r"(?:.*my manager is(?: now)? |.*license plate is(?: now)? )(.+)\."
        values = [
            m[1]
            for line in user_lines(episode)
            if (m := re.fullmatch(pattern, line, flags=re.IGNORECASE))
        ]
        assert len(values) >= 2
        assert question.gold == values[-1] and question.meta["stale_values"] == values[:-1]
        assert episode.turn(question.evidence_ids[-1]).content.endswith(f"{values[-1]}.")


def test_deletion_yields_nothing(episodes: list[Episode]) -> None:
    for episode in episodes:
        question = by_task(episode)["deletion"]
        assert question.abstain and question.scorer == "abstain"
        (turn_id,) = question.evidence_ids
        assert "cancelled" in episode.turn(turn_id).content
        deleted = question.meta["stale_values"][0]
        assert any(
            deleted in line for line in user_lines(episode)
        )  # it was stated before it was retracted
        assert (
            score(question, deleted) == 0.0
            and score(question, "You don't have one anymore.") == 1.0
        )


def test_absence_yields_abstention_about_something_never_said(episodes: list[Episode]) -> None:
    for episode in episodes:
        question = by_task(episode)["absence"]
        assert question.abstain and question.evidence_ids == [] and question.scorer == "abstain"
        attribute = "budget code" if episode.meta["domain"] == "workplace" else "phone number"
        assert attribute in question.question
        assert not any(attribute in t.content for t in episode.all_turns())


def test_aggregation_and_exact_recall_golds_come_from_their_turns(episodes: list[Episode]) -> None:
    for episode in episodes:
        tasks = by_task(episode)
        aggregation = tasks["aggregation"]
        items = aggregation.gold.split(", ")
        assert len(items) == len(aggregation.evidence_ids) == 3
        for item, turn_id in zip(items, aggregation.evidence_ids):
            assert item in episode.turn(turn_id).content
        recall = tasks["exact_recall"]
        (turn_id,) = recall.evidence_ids
        assert episode.turn(turn_id).content.endswith(f"{recall.gold}.")


def test_same_seed_is_identical_and_other_seeds_differ() -> None:
    a = load_dataset("synthetic:meme?seed=4&episodes=2")
    b = load_dataset("synthetic:meme?seed=4&episodes=2")
    c = load_dataset("synthetic:meme?seed=5&episodes=2")
    assert a.model_dump() == b.model_dump()
    assert [e.model_dump() for e in a.episodes] != [e.model_dump() for e in c.episodes]
    assert [q.gold for q in a.episodes[0].questions] != [q.gold for q in c.episodes[0].questions]


def test_domain_and_fillers_parameters() -> None:
    dataset = load_dataset("synthetic:meme?domain=household&episodes=3&fillers=0")
    assert {e.meta["domain"] for e in dataset.episodes} == {"household"}
    assert all(s.kind == "evidence" for e in dataset.episodes for s in e.sessions)
    with pytest.raises(DatasetError, match="field 'domain': unknown domain 'garden'"):
        load_dataset("synthetic:meme?domain=garden")


def test_suite_covers_every_check_deterministically() -> None:
    dataset = load_dataset("synthetic:suite?seed=2")
    checks = {e.meta["check"]: e for e in dataset.episodes}
    assert list(checks) == list(SUITE_CHECKS)
    assert dataset.model_dump() == load_dataset("synthetic:suite?seed=2").model_dump()
    assert dataset.model_dump() != load_dataset("synthetic:suite?seed=3").model_dump()
    for episode in dataset.episodes:
        for question in episode.questions:
            assert question.task_type == episode.meta["check"]
            if not question.abstain:
                support = " ".join(episode.turn(t).content for t in question.evidence_ids)
                assert (
                    score(question, support) == 1.0 or question.forbidden
                )  # the gold is in its evidence
    update = checks["update"].questions[0]
    (old_city,) = update.forbidden
    assert (
        score(update, update.gold) == 1.0
        and score(update, f"{update.gold}, before that {old_city}") == 0.0
    )
    forget = checks["forget"].questions[0]
    assert (
        forget.abstain
        and score(forget, forget.forbidden[0]) == 0.0
        and score(forget, "I don't know it.") == 1.0
    )
    assert (
        len(checks["cross_session_recall"].sessions) == 2
        and len(checks["same_session_recall"].sessions) == 1
    )
    assert checks["multi_fact"].questions[0].scorer == "contains_all"
    selective = checks["selective_recall"].questions[0]
    assert (
        score(selective, selective.gold) == 1.0
        and score(selective, " ".join([selective.gold, *selective.forbidden])) == 0.0
    )


def test_recall_is_seeded_and_every_gold_is_stated_in_its_evidence_turn():
    dataset = load_dataset("synthetic:recall?seed=1&episodes=30")
    assert dataset.uri == "synthetic:recall?seed=1&episodes=30"
    assert dataset.model_dump() == load_dataset("synthetic:recall?seed=1&episodes=30").model_dump()
    assert dataset.model_dump() != load_dataset("synthetic:recall?seed=2&episodes=30").model_dump()
    assert len(dataset.episodes) == 30 and all(len(e.questions) == 2 for e in dataset.episodes)
    golds = []
    for episode in dataset.episodes:
        turns = {f"{s.id}:{t.id.split(':')[1]}": t for s in episode.sessions for t in s.turns}
        assert [len(s.turns) for s in episode.sessions] == [6, 2]
        for q in episode.questions:
            [evidence] = q.evidence_ids
            assert (
                turns[evidence].role == "user"
                and q.gold in turns[evidence].content
                and q.scorer == "contains"
            )
            golds.append(q.gold.lower())
    assert all(a not in b for a in golds for b in golds if a != b)  # no value is part of another


@pytest.mark.parametrize(
    "uri, message",
    [
        ("synthetic:recall?episodes=0", "expected an integer >= 1"),
        ("synthetic:recall?fillers=2", r"unknown query parameter \(accepted: episodes, seed\)"),
    ],
)
def test_recall_refuses_bad_parameters(uri, message):
    with pytest.raises(DatasetError, match=message):
        load_dataset(uri)
