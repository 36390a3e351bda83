"""MemFail's five tasks as episodes: ``memfail:<task>[:path]``.

Tasks and the CSV columns they need (extra columns are kept in ``meta``):

``coexisting``        preference_category, preferences (JSON list), preference_facts
                      (JSON list), question, ground_truth_answer. Several preferences of
                      one category must coexist in memory; scorer ``contains_all`` over
                      the comma-separated gold.
``conditional_easy``  entity, behavior, condition, entity_facts (JSON list), question,
``conditional_hard``  condition_met, ground_truth_answer ("Yes — ..." / "No — ...").
                      Scorer ``yes_no``; the gold's polarity is the answer
                      (``condition_met`` says whether the condition holds, which is not
                      the same thing when the behaviour is a refusal).
``persona``           entity, entity_facts (JSON list), questions (JSON list of {text,
                      is_misleading, distractor, ground_truth_answer}). A misleading
                      question asks about someone never described: the right answer is to
                      abstain (scorer ``abstain``, no evidence); the others use
                      ``llm_judge`` (contains/F1 without a judge).
``long_hop``          id, hop_count, fact_1..fact_4, chain_1..chain_5, graded_question,
                      ground_truth_answer, choice_a..choice_e, correct_choice. Each fact is
                      its own session, so no two facts of one chain share a conversation;
                      the question is a 5-way multiple choice with the letter as gold.

Every fact becomes one user turn ``s<k>:t1`` of session ``s<k>`` (kind ``"fact"``),
and the evidence of a question is the fact turns it depends on (MemFail gives no
finer evidence). Without a path the CSV is looked up in ``$OPTLOOP_SHARED_DATA/memfail``
or ``../shared/data/memfail``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from optloop.datasets._io import (
    SHARED_DATA_ENV,
    dataset_error,
    existing_file,
    json_cell,
    read_csv,
    record_context,
    shared_data_dirs,
)
from optloop.datasets._model import LETTERS, Episode, Question, Session, Turn
from optloop.datasets.scorers import parse_yes_no
from optloop.errors import DatasetError

logger = logging.getLogger(__name__)

RowBuilder = Callable[[str, Path, str, dict[str, str]], Episode]


@dataclass(frozen=True)
class _Task:
    patterns: tuple[str, ...]
    required: tuple[str, ...]
    build: RowBuilder


def _fact_sessions(facts: list[str], source: Path, where: str, field: str) -> list[Session]:
    """One session of one user turn per fact: ``s<k>`` / ``s<k>:t1``."""
    sessions = []
    for k, fact in enumerate(facts, start=1):
        if not isinstance(fact, str) or not fact.strip():
            raise dataset_error(source, where, f"{field}[{k - 1}]", "expected a non-empty string")
        sessions.append(
            Session(
                id=f"s{k}",
                kind="fact",
                turns=[Turn(id=f"s{k}:t1", role="user", content=fact.strip())],
            )
        )
    if not sessions:
        raise dataset_error(source, where, field, "no facts")
    return sessions


def _text(row: dict[str, str], field: str, source: Path, where: str) -> str:
    value = (row.get(field) or "").strip()
    if not value:
        raise dataset_error(source, where, field, "empty")
    return value


def _coexisting(episode_id: str, source: Path, where: str, row: dict[str, str]) -> Episode:
    preferences = json_cell(row["preferences"], source, where, "preferences")
    facts = json_cell(row["preference_facts"], source, where, "preference_facts")
    sessions = _fact_sessions(facts, source, where, "preference_facts")
    question = Question(
        id=f"{episode_id}:q1",
        question=_text(row, "question", source, where),
        gold=_text(row, "ground_truth_answer", source, where),
        evidence_ids=[s.turns[0].id for s in sessions],
        task_type="coexisting",
        scorer="contains_all",
        meta={"preferences": preferences, "category": row.get("preference_category", "")},
    )
    return Episode(
        id=episode_id, sessions=sessions, questions=[question], meta={"task": "coexisting"}
    )


def _conditional(difficulty: str) -> RowBuilder:
    def build(episode_id: str, source: Path, where: str, row: dict[str, str]) -> Episode:
        facts = json_cell(row["entity_facts"], source, where, "entity_facts")
        sessions = _fact_sessions(facts, source, where, "entity_facts")
        gold = _text(row, "ground_truth_answer", source, where)
        if parse_yes_no(gold) is None:
            raise dataset_error(
                source,
                where,
                "ground_truth_answer",
                f"does not start with yes or no: {gold[:40]!r}",
            )
        keep = (
            "entity",
            "entity_category",
            "behavior",
            "condition_type",
            "condition",
            "question_context",
            "condition_met",
        )
        question = Question(
            id=f"{episode_id}:q1",
            question=_text(row, "question", source, where),
            gold=gold,
            evidence_ids=[s.turns[0].id for s in sessions],
            task_type="conditional",
            scorer="yes_no",
            meta={"difficulty": difficulty, **{k: row[k] for k in keep if k in row}},
        )
        return Episode(
            id=episode_id,
            sessions=sessions,
            questions=[question],
            meta={"task": f"conditional_{difficulty}"},
        )

    return build


def _persona(episode_id: str, source: Path, where: str, row: dict[str, str]) -> Episode:
    facts = json_cell(row["entity_facts"], source, where, "entity_facts")
    sessions = _fact_sessions(facts, source, where, "entity_facts")
    records = json_cell(row["questions"], source, where, "questions")
    if not records:
        raise dataset_error(source, where, "questions", "no questions")
    questions = []
    for i, record in enumerate(records):
        field = f"questions[{i}]"
        if not isinstance(record, dict):
            raise dataset_error(source, where, field, "expected a JSON object")
        for key in ("text", "ground_truth_answer"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise dataset_error(source, where, f"{field}.{key}", "missing or empty")
        misleading = bool(record.get("is_misleading", False))
        questions.append(
            Question(
                id=f"{episode_id}:q{i + 1}",
                question=record["text"],
                gold=record["ground_truth_answer"],
                evidence_ids=[] if misleading else [s.turns[0].id for s in sessions],
                task_type="persona_misleading" if misleading else "persona",
                scorer="abstain" if misleading else "llm_judge",
                abstain=misleading,
                meta={"entity": row.get("entity", ""), "distractor": record.get("distractor")},
            )
        )
    return Episode(
        id=episode_id,
        sessions=sessions,
        questions=questions,
        meta={"task": "persona", "entity": row.get("entity", "")},
    )


_CHOICES = [f"choice_{c}" for c in "abcde"]


def _choice_letter(raw: str, options: list[str], source: Path, where: str) -> str:
    text = raw.strip()
    match = re.fullmatch(r"(?:choice[_ ]?)?\(?([a-eA-E])\)?[.)]?", text)
    if match:
        return match.group(1).upper()
    for i, option in enumerate(options):
        if text.lower() == option.strip().lower():
            return LETTERS[i]
    raise dataset_error(
        source, where, "correct_choice", f"expected a letter A-E (or choice_x), got {raw!r}"
    )


def _long_hop(episode_id: str, source: Path, where: str, row: dict[str, str]) -> Episode:
    episode_id = f"long_hop-{row['id'].strip()}" if row.get("id", "").strip() else episode_id
    facts = [row[f"fact_{k}"].strip() for k in range(1, 5) if (row.get(f"fact_{k}") or "").strip()]
    sessions = _fact_sessions(facts, source, where, "fact_1")
    options = [_text(row, c, source, where) for c in _CHOICES]
    gold = _choice_letter(row["correct_choice"], options, source, where)
    hop_text = (row.get("hop_count") or "").strip()
    hop_count: int | None = None
    if hop_text:
        try:
            hop_count = int(float(hop_text))
        except ValueError:
            raise dataset_error(
                source, where, "hop_count", f"expected an integer, got {hop_text!r}"
            ) from None
    chain = [
        row[f"chain_{k}"].strip() for k in range(1, 6) if (row.get(f"chain_{k}") or "").strip()
    ]
    question = Question(
        id=f"{episode_id}:q1",
        question=_text(row, "graded_question", source, where),
        gold=gold,
        options=options,
        evidence_ids=[s.turns[0].id for s in sessions],
        task_type="long_hop",
        scorer="multiple_choice",
        meta={
            "hop_count": hop_count,
            "chain": chain,
            "answer_text": (row.get("ground_truth_answer") or "").strip(),
        },
    )
    return Episode(
        id=episode_id,
        sessions=sessions,
        questions=[question],
        meta={"task": "long_hop", "hop_count": hop_count},
    )


TASKS: dict[str, _Task] = {
    "coexisting": _Task(
        ("coexisting*.csv",),
        ("preferences", "preference_facts", "question", "ground_truth_answer"),
        _coexisting,
    ),
    "conditional_easy": _Task(
        ("conditional*easy*.csv",),
        ("entity", "entity_facts", "question", "ground_truth_answer"),
        _conditional("easy"),
    ),
    "conditional_hard": _Task(
        ("conditional*hard*.csv",),
        ("entity", "entity_facts", "question", "ground_truth_answer"),
        _conditional("hard"),
    ),
    "persona": _Task(("persona*.csv",), ("entity", "entity_facts", "questions"), _persona),
    "long_hop": _Task(
        ("*long*hop*.csv",),
        ("id", "fact_1", "graded_question", *_CHOICES, "correct_choice"),
        _long_hop,
    ),
}


def default_path(task: str) -> Path:
    """The task's CSV in the shared data folder; a DatasetError saying to pass a path."""
    searched = []
    for base in shared_data_dirs():
        folder = base / "memfail"
        searched.append(str(folder))
        for pattern in TASKS[task].patterns:
            hits = sorted(folder.glob(pattern)) if folder.is_dir() else []
            if hits:
                return hits[0]
    raise DatasetError(
        f"memfail:{task}: no CSV found in {', '.join(searched)}; "
        f"pass a path (memfail:{task}:<file.csv>) or set {SHARED_DATA_ENV}"
    )


def load_memfail(rest: str, params: dict[str, str]) -> tuple[str, list[Episode]]:
    """Load ``<task>[:path]``; returns the dataset name and its episodes."""
    task, _, path_text = rest.partition(":")
    task = task.strip().lower().replace("-", "_")
    if task not in TASKS:
        raise DatasetError(
            f"memfail:{rest}: unknown task {task!r} (choose one of: {', '.join(TASKS)})"
        )
    spec = TASKS[task]
    path = existing_file(path_text, f"memfail:{task}") if path_text else default_path(task)
    episodes = []
    for n, (line, row) in enumerate(read_csv(path, spec.required)):
        where = f"line {line}"
        with record_context(path, where):
            episodes.append(spec.build(f"{task}-{n:03d}", path, where, row))
    if not episodes:
        raise dataset_error(path, None, None, "no rows")
    logger.info("loaded %d memfail:%s episodes from %s", len(episodes), task, path)
    return f"memfail:{task}", episodes
