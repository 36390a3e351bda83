"""LoCoMo (``locomo10.json`` layout) as episodes: ``locomo:<path>``.

The file is a JSON list of samples ``{sample_id, conversation, qa}``; one sample is one episode,
session ``session_<N>`` becomes ``s<N>`` and its j-th turn ``s<N>:t<j>``, both speakers
``role="user"`` with ``speaker`` set. Questions are scored as the official evaluation script
scores their category (token F1, multi-hop F1, abstention for adversarial ones, whose trap stays
in ``meta``); evidence ids ``D<session>:<turn>`` map to turn ids, malformed ones parsed leniently
or dropped with a warning. The URI's ``sessions=N``, ``questions=N`` (a seeded sample stratified
by category) and ``seed=K`` size a run per conversation. The categories, the evidence rules and
the parameters in full: ``docs/systems.md`` ("LoCoMo").
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path
from typing import Any

from optloop.datasets._io import dataset_error, int_param, load_json_episodes, require
from optloop.datasets._model import Episode, Question, Session, Turn
from optloop.datasets.split import split_counts

logger = logging.getLogger(__name__)

CATEGORIES: dict[int, str] = {
    1: "multi_hop",
    2: "temporal",
    3: "open_domain",
    4: "single_hop",
    5: "adversarial",
}
ABSTAIN_GOLD = "Not mentioned in the conversation"

_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


def _sessions(conversation: Any, source: Path, where: str) -> tuple[list[Session], dict[str, str]]:
    if not isinstance(conversation, dict):
        raise dataset_error(source, where, "conversation", "expected a JSON object")
    numbers = sorted(int(m.group(1)) for key in conversation if (m := _SESSION_KEY.fullmatch(key)))
    if not numbers:
        raise dataset_error(
            source, where, "conversation.session_1", "missing (no session_<N> lists)"
        )
    sessions: list[Session] = []
    by_dia_id: dict[str, str] = {}
    for n in numbers:
        field = f"conversation.session_{n}"
        raw_turns = conversation[f"session_{n}"]
        if not isinstance(raw_turns, list):
            raise dataset_error(source, where, field, "expected a list of turns")
        turns = []
        for j, raw in enumerate(raw_turns, start=1):
            turn_field = f"{field}[{j - 1}]"
            speaker = require(raw, "speaker", source, where, prefix=f"{turn_field}.")
            text = raw.get("text")
            if not isinstance(text, str):
                raise dataset_error(source, where, f"{turn_field}.text", "missing")
            if raw.get("blip_caption"):
                text = f"{text} [shared a photo: {raw['blip_caption']}]"
            turn_id = f"s{n}:t{j}"
            turns.append(Turn(id=turn_id, role="user", content=text, speaker=speaker))
            dia_id = raw.get("dia_id")
            if isinstance(dia_id, str) and (m := _EVIDENCE.fullmatch(dia_id.strip())):
                by_dia_id.setdefault(f"D{int(m.group(1))}:{int(m.group(2))}", turn_id)
        timestamp = conversation.get(f"session_{n}_date_time")
        sessions.append(
            Session(id=f"s{n}", timestamp=str(timestamp) if timestamp else None, turns=turns)
        )
    return sessions, by_dia_id


def _evidence(
    raw: Any, by_dia_id: dict[str, str], source: Path, where: str, field: str
) -> tuple[list[str], int]:
    if raw is None:
        return [], 0
    if not isinstance(raw, list):
        raise dataset_error(source, where, field, "expected a list of dialogue ids like 'D1:3'")
    ids: list[str] = []
    dropped = 0
    for item in raw:
        keys = [f"D{int(a)}:{int(b)}" for a, b in _EVIDENCE.findall(str(item))]
        if not keys:
            dropped += 1
        for key in keys:
            if key in by_dia_id:
                if by_dia_id[key] not in ids:
                    ids.append(by_dia_id[key])
            else:
                dropped += 1
    return ids, dropped


def _sample(where: str, sample: Any, source: Path) -> Episode:
    sample_id = require(sample, "sample_id", source, where)
    where = f"{where} (sample_id={sample_id})"
    sessions, by_dia_id = _sessions(sample.get("conversation"), source, where)
    qa = require(sample, "qa", source, where, list)
    questions = []
    dropped_total = 0
    for i, record in enumerate(qa):
        field = f"qa[{i}]"
        if not isinstance(record, dict):
            raise dataset_error(source, where, field, "expected a JSON object")
        text = require(record, "question", source, where, prefix=f"{field}.")
        category = record.get("category")
        if category not in CATEGORIES:
            raise dataset_error(
                source, where, f"{field}.category", f"expected 1-5, got {category!r}"
            )
        evidence, dropped = _evidence(
            record.get("evidence"), by_dia_id, source, where, f"{field}.evidence"
        )
        if dropped:
            logger.warning(
                "%s: %s: %s.evidence: %d id(s) name no turn, dropped",
                source,
                where,
                field,
                dropped,
            )
            dropped_total += dropped
        meta: dict[str, Any] = {"category": category}
        if category == 5:
            meta["adversarial_answer"] = (
                None
                if record.get("adversarial_answer") is None
                else str(record["adversarial_answer"])
            )
            meta["distractor_evidence"] = evidence
            gold, evidence, scorer, abstain = ABSTAIN_GOLD, [], "abstain", True
        else:
            if record.get("answer") is None:
                raise dataset_error(source, where, f"{field}.answer", "missing")
            gold = str(record["answer"]).strip()
            if category == 3:
                meta["full_answer"] = gold
                gold = gold.split(";")[0].strip() or gold
            scorer, abstain = ("f1_multi" if category == 1 else "f1"), False
        questions.append(
            Question(
                id=f"{sample_id}:q{i + 1}",
                question=text,
                gold=gold,
                evidence_ids=evidence,
                task_type=CATEGORIES[category],
                scorer=scorer,
                abstain=abstain,
                meta=meta,
            )
        )
    conversation = sample["conversation"]
    meta = {
        "source": "locomo",
        "speaker_a": conversation.get("speaker_a"),
        "speaker_b": conversation.get("speaker_b"),
        "dropped_evidence": dropped_total,
    }
    return Episode(id=str(sample_id), sessions=sessions, questions=questions, meta=meta)


PARAMS = ("sessions", "questions", "seed")
"""The query parameters the ``locomo:`` scheme reads itself (see the module docstring)."""


def _category(question: Question) -> int:
    return int(question.meta["category"])


def _cited(question: Question) -> list[str]:
    return question.evidence_ids or list(question.meta.get("distractor_evidence") or [])


def first_sessions(episode: Episode, n: int) -> Episode:
    """The episode cut to its first ``n`` sessions and the questions they answer."""
    sessions = episode.sessions[:n]
    kept = {t.id for s in sessions for t in s.turns}
    questions = [q for q in episode.questions if (c := _cited(q)) and set(c) <= kept]
    return episode.model_copy(update={"sessions": sessions, "questions": questions})


def stratified_sample(questions: list[Question], n: int, seed: int) -> list[Question]:
    """``n`` of ``questions`` drawn with ``seed``, each category keeping its share; file order."""
    if n >= len(questions):
        return list(questions)
    by_category: dict[int, list[Question]] = {}
    for q in questions:
        by_category.setdefault(_category(q), []).append(q)
    categories = sorted(by_category)
    counts = split_counts(n, [len(by_category[c]) for c in categories])
    rng = random.Random(seed)
    chosen: set[str] = set()
    for category, count in zip(categories, counts, strict=True):
        pool = by_category[category]
        chosen.update(q.id for q in rng.sample(pool, min(count, len(pool))))
    return [q for q in questions if q.id in chosen]


def load_locomo(rest: str, params: dict[str, str]) -> tuple[str, list[Episode]]:
    """Load a LoCoMo JSON file; returns the dataset name and its episodes.

    ``params`` may hold ``sessions``, ``questions`` and ``seed`` (the module docstring says
    what each does); anything else is an error naming the parameters accepted.
    """
    uri = f"locomo:{rest}"
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise dataset_error(
            uri, None, unknown[0], f"unknown query parameter (accepted: {', '.join(PARAMS)})"
        )
    sessions = int_param(uri, params, "sessions", 1)
    questions = int_param(uri, params, "questions", 1)
    seed = int_param(uri, params, "seed", 0, 0)
    name, episodes = load_json_episodes(rest, "locomo", _sample, "samples")
    if sessions is not None:
        episodes = [first_sessions(e, sessions) for e in episodes]
        name += f"[sessions={sessions}]"
    if questions is not None:
        episodes = [
            e.model_copy(update={"questions": stratified_sample(e.questions, questions, seed)})
            for e in episodes
        ]
    episodes = [e for e in episodes if e.questions]
    if not episodes:
        raise dataset_error(
            uri, None, "sessions", "no question is answered within the sessions kept"
        )
    return name, episodes
