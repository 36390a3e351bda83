"""LongMemEval (official JSON) as episodes: ``longmemeval:<path>``.

The file is a JSON list of instances ``{question_id, question_type, question, answer,
question_date, haystack_session_ids, haystack_dates, haystack_sessions,
answer_session_ids}``; each haystack session is a list of ``{role, content,
has_answer?}``. One instance is one episode with one question: the i-th haystack
session becomes ``s<i>`` (timestamp from ``haystack_dates``; its source id is kept in
``meta["session_ids"]``) and its j-th turn ``s<i>:t<j>``. Evidence is every turn with
``has_answer: true``. A ``question_id`` ending in ``_abs`` is an abstention question
(scorer ``abstain``); the others use ``llm_judge`` (LongMemEval's own metric is an LLM
judge; without one, containment of the gold, else token F1). ``question_type`` is
the task type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optloop.datasets._io import dataset_error, load_json_episodes, require
from optloop.datasets._model import Episode, Question, Session, Turn


def _instance(where: str, record: Any, source: Path) -> Episode:
    qid = require(record, "question_id", source, where)
    where = f"{where} (question_id={qid})"
    question_type = require(record, "question_type", source, where)
    text = require(record, "question", source, where)
    answer = require(record, "answer", source, where, (str, int, float))
    session_ids = require(record, "haystack_session_ids", source, where, list)
    dates = record.get("haystack_dates") or [None] * len(session_ids)
    raw_sessions = require(record, "haystack_sessions", source, where, list)
    if len(raw_sessions) != len(session_ids):
        raise dataset_error(
            source,
            where,
            "haystack_sessions",
            f"has {len(raw_sessions)} sessions but haystack_session_ids has {len(session_ids)}",
        )
    if len(dates) != len(session_ids):
        raise dataset_error(
            source,
            where,
            "haystack_dates",
            f"has {len(dates)} dates but haystack_session_ids has {len(session_ids)}",
        )
    sessions: list[Session] = []
    evidence: list[str] = []
    for i, (raw_turns, date) in enumerate(zip(raw_sessions, dates), start=1):
        field = f"haystack_sessions[{i - 1}]"
        if not isinstance(raw_turns, list):
            raise dataset_error(source, where, field, "expected a list of turns")
        turns = []
        for j, raw in enumerate(raw_turns, start=1):
            prefix = f"{field}[{j - 1}]."
            role = require(raw, "role", source, where, prefix=prefix)
            content = raw.get("content")
            if not isinstance(content, str):
                raise dataset_error(source, where, prefix + "content", "missing")
            turn = Turn(id=f"s{i}:t{j}", role=role, content=content)
            turns.append(turn)
            if raw.get("has_answer") is True:
                evidence.append(turn.id)
        sessions.append(
            Session(id=f"s{i}", timestamp=None if date is None else str(date), turns=turns)
        )
    abstain = qid.endswith("_abs")
    question = Question(
        id=qid,
        question=text,
        gold=str(answer).strip(),
        evidence_ids=[] if abstain else evidence,
        task_type=question_type,
        scorer="abstain" if abstain else "llm_judge",
        abstain=abstain,
        meta={
            "question_date": record.get("question_date"),
            "answer_session_ids": record.get("answer_session_ids", []),
            # An abstention question's has_answer turns hold the near-miss, not an answer.
            **({"distractor_evidence": evidence} if abstain else {}),
        },
    )
    meta = {
        "source": "longmemeval",
        "question_date": record.get("question_date"),
        "session_ids": {s.id: str(sid) for s, sid in zip(sessions, session_ids)},
    }
    return Episode(id=qid, sessions=sessions, questions=[question], meta=meta)


def load_longmemeval(rest: str, params: dict[str, str]) -> tuple[str, list[Episode]]:
    """Load a LongMemEval JSON file; returns the dataset name and its episodes."""
    return load_json_episodes(rest, "longmemeval", _instance, "instances")
