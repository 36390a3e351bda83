"""MEME episodes as episodes: ``meme:<path>``.

The authors' published layout (``SeokwonJung-Jay/meme-eval``: ``src/data/<name>.json`` and
``public/<name>/``) is read by :mod:`optloop.datasets.meme_published` when the path is a checkout
directory or such a file. Otherwise the file holds this project's records (the generator
``synthetic:meme`` produces the same): a JSON list, ``{"episodes": [records]}`` or JSONL, each
record an ``episode`` header, its ``sessions`` (``idx``, ``kind``, ``conversation``,
``gold_facts``) and its ``questions`` (``task_type``, ``question``, ``gold_answer``, optional
evidence). Session ``idx`` k becomes ``s<k>`` and its j-th message (0-based) turn ``s<k>:t<j+1>``;
each task type has its scorer (``contains``, ``contains_all`` or ``abstain``). The record's every
field, the evidence rule and the scorers: ``docs/systems.md`` ("MEME records").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

from optloop.datasets._io import (
    dataset_error,
    existing_file,
    read_json,
    read_json_records,
    record_context,
    require,
)
from optloop.datasets._model import Episode, Question, ScorerName, Session, Turn
from optloop.datasets.meme_published import is_published, load_published
from optloop.datasets.meme_tasks import ABSTAIN_TASKS, TASK_SCORERS, task_name

SESSION_KINDS = frozenset({"filler", "evidence", "probe-before", "probe-after"})


def _int_list(value: Any, source: Path, where: str, field: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise dataset_error(source, where, field, "expected a list of integers")
    return value


def episode_from_record(record: Any, source: str | Path, where: str, default_id: str) -> Episode:
    """Build one episode from a MEME record; a DatasetError names the bad field."""
    source = Path(source)
    header = require(record, "episode", source, where, dict)
    episode_id = str(header.get("id") or default_id)
    raw_sessions = require(record, "sessions", source, where, list)
    raw_questions = require(record, "questions", source, where, list)

    sessions: list[Session] = []
    by_index: dict[int, tuple[Session, list[tuple[dict[str, Any], str]]]] = {}
    for i, raw in enumerate(raw_sessions):
        prefix = f"sessions[{i}]."
        idx = require(raw, "idx", source, where, int, prefix=prefix)
        if idx in by_index:
            raise dataset_error(source, where, prefix + "idx", f"duplicate session idx {idx}")
        kind = require(raw, "kind", source, where, prefix=prefix)
        if kind not in SESSION_KINDS:
            raise dataset_error(
                source,
                where,
                prefix + "kind",
                f"unknown kind {kind!r} (one of {sorted(SESSION_KINDS)})",
            )
        conversation = require(raw, "conversation", source, where, list, prefix=prefix)
        turns = []
        for j, message in enumerate(conversation):
            mprefix = f"{prefix}conversation[{j}]."
            role = require(message, "role", source, where, prefix=mprefix)
            content = require(message, "content", source, where, prefix=mprefix)
            turns.append(Turn(id=f"s{idx}:t{j + 1}", role=role, content=content))
        facts: list[tuple[dict[str, Any], str]] = []
        for f, fact in enumerate(raw.get("gold_facts") or []):
            fprefix = f"{prefix}gold_facts[{f}]."
            turn_index = require(fact, "conveyed_in_turn", source, where, int, prefix=fprefix)
            if not 0 <= turn_index < len(turns):
                raise dataset_error(
                    source,
                    where,
                    fprefix + "conveyed_in_turn",
                    f"turn {turn_index} is outside the conversation (0..{len(turns) - 1})",
                )
            facts.append((fact, turns[turn_index].id))
        timestamp = raw.get("timestamp")
        session = Session(
            id=f"s{idx}",
            timestamp=None if timestamp is None else str(timestamp),
            turns=turns,
            kind=kind,
        )
        sessions.append(session)
        by_index[idx] = (session, facts)

    episode_evidence = _int_list(
        header.get("evidence_session_indices"), source, where, "episode.evidence_session_indices"
    )
    questions = []
    for q, raw in enumerate(raw_questions):
        prefix = f"questions[{q}]."
        raw_task = require(raw, "task_type", source, where, prefix=prefix)
        task = task_name(raw_task)
        if task is None:
            raise dataset_error(
                source,
                where,
                prefix + "task_type",
                f"unknown task {raw_task!r} (one of {', '.join(TASK_SCORERS)})",
            )
        text = require(raw, "question", source, where, prefix=prefix)
        gold = require(raw, "gold_answer", source, where, prefix=prefix)
        evidence = _question_evidence(raw, by_index, episode_evidence, source, where, prefix)
        scorer = raw.get("scorer") or TASK_SCORERS[task]
        if scorer not in get_args(ScorerName):
            raise dataset_error(
                source,
                where,
                prefix + "scorer",
                f"unknown scorer {scorer!r} (one of {', '.join(get_args(ScorerName))})",
            )
        meta = dict(raw.get("meta") or {})
        meta.update({"domain": header.get("domain"), "root": header.get("root")})
        questions.append(
            Question(
                id=str(raw.get("id") or f"{episode_id}:q{q + 1}"),
                question=text,
                gold=gold,
                evidence_ids=evidence,
                task_type=task,
                scorer=scorer,
                abstain=task in ABSTAIN_TASKS,
                forbidden=list(raw.get("forbidden") or []),
                meta=meta,
            )
        )
    meta = {
        "source": "meme",
        "domain": header.get("domain"),
        "root": header.get("root"),
        "evidence_session_ids": [f"s{i}" for i in episode_evidence],
        **(header.get("meta") or {}),
    }
    return Episode(id=episode_id, sessions=sessions, questions=questions, meta=meta)


def _question_evidence(
    raw: dict[str, Any],
    by_index: dict[int, tuple[Session, list[tuple[dict[str, Any], str]]]],
    episode_evidence: list[int],
    source: Path,
    where: str,
    prefix: str,
) -> list[str]:
    explicit = raw.get("evidence_turns")
    if explicit is not None:
        if not isinstance(explicit, list):
            raise dataset_error(
                source,
                where,
                prefix + "evidence_turns",
                "expected a list of [session idx, turn index]",
            )
        ids = []
        for k, pair in enumerate(explicit):
            field = f"{prefix}evidence_turns[{k}]"
            if not (
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, int) for v in pair)
            ):
                raise dataset_error(source, where, field, "expected [session idx, turn index]")
            session_idx, turn_index = pair
            if session_idx not in by_index or not 0 <= turn_index < len(
                by_index[session_idx][0].turns
            ):
                raise dataset_error(
                    source, where, field, f"no turn {turn_index} in session idx {session_idx}"
                )
            ids.append(by_index[session_idx][0].turns[turn_index].id)
        return ids
    indices = _int_list(
        raw.get("evidence_session_indices"), source, where, prefix + "evidence_session_indices"
    )
    indices = indices or episode_evidence
    entity = raw.get("entity")
    ids = []
    for idx in indices:
        if idx not in by_index:
            raise dataset_error(
                source, where, prefix + "evidence_session_indices", f"no session with idx {idx}"
            )
        session, facts = by_index[idx]
        chosen = [
            turn_id for fact, turn_id in facts if entity is None or fact.get("entity") == entity
        ]
        if not facts:
            chosen = [t.id for t in session.turns if t.role == "user"]
        ids.extend(t for t in chosen if t not in ids)
    return ids


def load_meme(rest: str, params: dict[str, str]) -> tuple[str, list[Episode]]:
    """Load a MEME JSON/JSONL file, or the authors' published layout (a checkout directory
    or its ``src/data/<name>.json``, see :mod:`optloop.datasets.meme_published`)."""
    if rest and Path(rest).expanduser().is_dir():
        return load_published(Path(rest).expanduser())
    path = existing_file(rest, "meme")
    if path.suffix == ".json":
        data = read_json(path)
        if is_published(data):
            return load_published(path, data)
    episodes = []
    for n, (where, record) in enumerate(read_json_records(path, container_key="episodes")):
        with record_context(path, where):
            episodes.append(episode_from_record(record, path, where, f"meme-{n:04d}"))
    if not episodes:
        raise dataset_error(path, None, None, "no episodes")
    return f"meme:{path.stem}", episodes
