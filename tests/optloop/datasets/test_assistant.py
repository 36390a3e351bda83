"""builtin:assistant: 20 hand-written personal-assistant probes, two of each kind."""

from __future__ import annotations

import re
from collections import Counter

from optloop.datasets import load_dataset, score, split_episodes
from optloop.datasets.assistant import PROBES


def test_twenty_probes_two_of_each_kind_over_several_sessions() -> None:
    dataset = load_dataset("builtin:assistant")

    assert dataset.name == "builtin:assistant" and len(dataset.episodes) == 6
    assert Counter(q.task_type for _, q in dataset.questions()) == dict.fromkeys(PROBES, 2)
    assert all(len(e.sessions) >= 2 for e in dataset.episodes)
    for episode in dataset.episodes:
        for session in episode.sessions:
            assert [t.role for t in session.turns] == ["user", "assistant"] * (
                len(session.turns) // 2
            )
    train, dev, test = split_episodes(dataset)
    assert (
        train.episodes and dev.episodes and test.episodes
    )  # enough episodes for the loop's three splits


def test_every_answerable_probe_is_answered_by_its_evidence() -> None:
    for episode, question in load_dataset("builtin:assistant").questions():
        if question.abstain:
            continue
        support = " ".join(episode.turn(t).content for t in question.evidence_ids)
        # A selective-recall message names the forbidden neighbours too; the gold is what must be
        # there.
        assert score(question.model_copy(update={"forbidden": []}), support) == 1.0, question.id
        if question.task_type == "selective_recall":
            assert score(question, question.gold) == 1.0 and score(question, support) == 0.0


def test_same_and_cross_session_probes_sit_where_their_names_say() -> None:
    for episode, question in load_dataset("builtin:assistant").questions():
        sessions = {episode.session_of(t).id for t in question.evidence_ids}
        last = episode.sessions[-1].id
        if question.task_type == "same_session_recall":
            assert sessions == {last} == {question.meta["asked_in_session"]}
        if question.task_type == "cross_session_recall":
            assert last not in sessions


def test_update_and_forget_probes_forbid_the_old_value_which_was_really_said() -> None:
    for episode, question in load_dataset("builtin:assistant").questions():
        said = " ".join(t.content for t in episode.all_turns())
        if question.task_type == "update":
            assert question.forbidden and all(v in said for v in question.forbidden)
            evidence_session = episode.session_of(question.evidence_ids[0])
            assert evidence_session.id != episode.sessions[0].id  # the new value comes later
        if question.task_type == "forget":
            assert question.abstain and question.scorer == "abstain"
            assert question.forbidden and all(v in said for v in question.forbidden)
            request = episode.turn(question.evidence_ids[0]).content
            assert re.match(r"please forget", request, re.IGNORECASE)
            # Abstaining passes; naming the forgotten value fails even when it sounds like an
            # abstention.
            assert score(question, "I don't know.") == 1.0
            assert score(question, f"I don't know, maybe {question.forbidden[0]}?") == 0.0


def test_absent_people_are_never_mentioned() -> None:
    for episode, question in load_dataset("builtin:assistant?tasks=absent_person").questions():
        assert question.abstain and not question.evidence_ids
        name = re.findall(r"\b[A-Z][a-z]+\b", question.question.split(" ", 1)[1])[0]
        assert name not in " ".join(t.content for t in episode.all_turns())
