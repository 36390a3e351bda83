"""MEME's published episode layout (``SeokwonJung-Jay/meme-eval``): ``meme:<dir>``.

The authors publish one episode with the traces of seven systems::

    <dir>/src/data/<name>.json        episode, sessions, systems, snapshots, results, ...
    <dir>/public/<name>/snap/<system>/<k>.txt   the system's whole memory after session k
    <dir>/public/<name>/retr/<file>.txt         the context one probe retrieved

``meme:<dir>`` reads every ``src/data/*.json`` that holds ``episode``, ``sessions`` and
``results`` (others, such as ``main_results.json``, are skipped); ``meme:<file>`` reads
one. A published episode becomes two episodes, because questions are answered after
all of an episode's sessions: ``<tag>-before`` (sessions up to ``probe_before_idx``,
the before-probes) and ``<tag>-after`` (all sessions, the after-probes).

Task types map to MEME's six as the layout's ``taskTagMap`` does (Exact ->
``exact_recall``, Multi-hop -> ``aggregation``, Multiple-update -> ``tracking``,
Deletion -> ``deletion``, Cascade-D -> ``cascade``, Cascade-U -> ``absence``; a
parenthesised suffix is ignored). A question's ``meta["evidence_parts"]`` lists the
parts of its evidence (see :func:`evidence_parts`); ``evidence_ids`` are their turns.

:func:`read_published` also returns each system's probes (answer, verdict,
``failure_analysis``) for :mod:`optloop.tracing.meme_traces`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optloop.datasets._io import dataset_error, read_json, record_context, require
from optloop.datasets._model import Episode, EvidencePart, Question, Session, Turn
from optloop.datasets.meme_tasks import ABSTAIN_TASKS, TASK_SCORERS, published_task

PUBLISHED_KEYS = ("episode", "sessions", "results")
PHASES = ("before", "after")
STAGES = ("encoding", "maintenance", "retrieval", "answering")


@dataclass(frozen=True)
class Probe:
    """One system's answer to one question, as published."""

    system: str
    phase: str
    question_id: str
    task_type: str
    answer: str
    passed: bool
    context_file: str | None
    failure_stage: str | None
    analysis: dict[str, Any]
    where: str


@dataclass
class PublishedEpisode:
    """A published episode: its two episodes, the systems and every probe."""

    source: Path
    public: Path
    tag: str
    episodes: dict[str, Episode]  # phase -> episode
    systems: list[str]
    labels: dict[str, dict[str, Any]] = field(default_factory=dict)
    probes: list[Probe] = field(default_factory=list)
    # phase -> index of the conversation's last session before that phase's probes
    probe_sessions: dict[str, int] = field(default_factory=dict)

    def snapshot_path(self, system: str, idx: int) -> Path:
        return self.public / "snap" / system / f"{idx}.txt"

    def context_path(self, probe: Probe) -> Path | None:
        return self.public / "retr" / probe.context_file if probe.context_file else None


# --- finding files ------------------------------------------------------------------------


def is_published(data: Any) -> bool:
    return isinstance(data, Mapping) and all(key in data for key in PUBLISHED_KEYS)


def published_files(root: Path) -> list[Path]:
    """The published episode files under a checkout (``src/data/*.json`` holding an episode)."""
    data_dir = root / "src" / "data"
    if not data_dir.is_dir():
        raise dataset_error(
            root,
            None,
            None,
            "no src/data folder",
            "point meme: at a checkout of meme-eval, or at src/data/<name>.json",
        )
    files = [p for p in sorted(data_dir.glob("*.json")) if is_published(read_json(p))]
    if not files:
        raise dataset_error(
            data_dir,
            None,
            None,
            "no published MEME episode (a JSON with episode, sessions, results)",
        )
    return files


def public_dir(source: Path, tag: str) -> Path:
    """``public/<name>`` beside ``src/data/<name>.json``; a DatasetError naming what is missing."""
    public = source.resolve().parents[2] / "public" / source.stem
    if not public.is_dir():
        raise dataset_error(
            source,
            None,
            None,
            f"{public} not found (episode {tag}: fetch public/{source.stem} beside src/data)",
        )
    return public


# --- reading one file ---------------------------------------------------------------------


def read_published(source: Path, data: Any | None = None) -> PublishedEpisode:
    """Read one published episode file; a one-line DatasetError names the bad record and field."""
    data = read_json(source) if data is None else data
    if not is_published(data):
        raise dataset_error(
            source, None, None, f"not a published MEME episode (needs {', '.join(PUBLISHED_KEYS)})"
        )
    header = require(data, "episode", source, "", dict)
    tag = str(header.get("tag") or header.get("id") or source.stem)
    sessions, facts = _sessions(data, source)
    last = sessions[-1][0] if sessions else 0
    positions = {
        "before": _int(header, "probe_before_idx", source, last),
        "after": _int(header, "probe_after_idx", source, last),
    }
    results = require(data, "results", source, "results", dict)
    systems = [str(s) for s in data.get("systems") or results]
    for name in systems:
        if name not in results:
            raise dataset_error(
                source, "results", name, "system listed in 'systems' has no results"
            )
    root = header.get("root")
    episodes: dict[str, Episode] = {}
    probes: list[Probe] = []
    for phase in PHASES:
        if not any(results[s].get(phase) for s in systems if isinstance(results[s], Mapping)):
            continue
        idx = positions[phase]
        episode_id = f"{tag}-{phase}"
        questions = _questions(results, systems, phase, source, episode_id, facts, idx, root)
        kept = [s for i, s in sessions if i <= idx]
        meta = {
            "source": "meme-published",
            "tag": tag,
            "phase": phase,
            "domain": header.get("domain"),
            "root": root,
            "asked_after_session": f"s{idx}",
            "evidence_session_ids": [
                f"s{i}" for i in header.get("evidence_session_indices") or [] if i <= idx
            ],
        }
        with record_context(source, f"episode {episode_id}"):
            episodes[phase] = Episode(
                id=episode_id, sessions=kept, questions=[q for q, _ in questions], meta=meta
            )
        probes += [p for _, ps in questions for p in ps]
    if not episodes:
        raise dataset_error(
            source, "results", None, "no probes (neither 'before' nor 'after' results)"
        )
    return PublishedEpisode(
        source=source,
        public=public_dir(source, tag),
        tag=tag,
        episodes=episodes,
        systems=systems,
        labels=dict(data.get("systemLabels") or {}),
        probes=probes,
        probe_sessions=positions,
    )


def _int(record: Mapping[str, Any], key: str, source: Path, default: int) -> int:
    value = record.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise dataset_error(
            source, "episode", key, f"expected an integer, got {type(value).__name__}"
        )
    return value


Fact = tuple[int, int, dict[str, Any]]  # session idx, turn index, the gold fact


def _sessions(
    data: Mapping[str, Any], source: Path
) -> tuple[list[tuple[int, Session]], list[Fact]]:
    raw_sessions = require(data, "sessions", source, "sessions", list)
    sessions: list[tuple[int, Session]] = []
    facts: list[Fact] = []
    for i, raw in enumerate(raw_sessions):
        where = f"sessions[{i}]"
        idx = require(raw, "idx", source, where, int)
        if any(idx == j for j, _ in sessions):
            raise dataset_error(source, where, "idx", f"duplicate session idx {idx}")
        conversation = require(raw, "conversation", source, where, list)
        turns = []
        for j, message in enumerate(conversation):
            mprefix = f"conversation[{j}]."
            role = require(message, "role", source, where, prefix=mprefix)
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, str):
                raise dataset_error(source, where, mprefix + "content", "missing or not a string")
            turns.append(Turn(id=f"s{idx}:t{j + 1}", role=role, content=content))
        for f, fact in enumerate(raw.get("gold_facts") or []):
            fprefix = f"gold_facts[{f}]."
            require(fact, "entity", source, where, prefix=fprefix)
            turn = require(fact, "conveyed_in_turn", source, where, int, prefix=fprefix)
            if not 0 <= turn < len(turns):
                raise dataset_error(
                    source,
                    where,
                    fprefix + "conveyed_in_turn",
                    f"turn {turn} is outside the conversation (0..{len(turns) - 1})",
                )
            facts.append((idx, turn, fact))
        timestamp = raw.get("timestamp")
        sessions.append(
            (
                idx,
                Session(
                    id=f"s{idx}",
                    timestamp=None if timestamp is None else str(timestamp),
                    turns=turns,
                    kind=str(raw.get("kind") or "conversation"),
                ),
            )
        )
    sessions.sort(key=lambda pair: pair[0])
    return sessions, facts


# --- questions and probes -----------------------------------------------------------------


def _questions(
    results: Mapping[str, Any],
    systems: list[str],
    phase: str,
    source: Path,
    episode_id: str,
    facts: list[Fact],
    idx: int,
    root: str | None,
) -> list[tuple[Question, list[Probe]]]:
    """The phase's questions (from the first system) and, for each, every system's probe."""
    records = {s: _phase_records(results, s, phase, source) for s in systems}
    first = systems[0]
    out: list[tuple[Question, list[Probe]]] = []
    seen: set[str] = set()
    for i, record in enumerate(records[first]):
        where = f"results.{first}.{phase}[{i}]"
        question = _question(record, source, where, episode_id, phase, facts, idx, root)
        if question.id in seen:
            raise dataset_error(
                source, where, "task_type", f"second {question.task_type} probe in phase {phase}"
            )
        seen.add(question.id)
        probes = []
        for system in systems:
            other_where = f"results.{system}.{phase}[{i}]"
            if i >= len(records[system]):
                raise dataset_error(
                    source,
                    f"results.{system}.{phase}",
                    None,
                    f"{len(records[system])} probes, but {first} has {len(records[first])}",
                )
            other = records[system][i]
            for key in ("task_type", "question"):
                if require(other, key, source, other_where) != record[key]:
                    raise dataset_error(source, other_where, key, f"differs from {where}")
            probes.append(_probe(other, source, other_where, system, phase, question.id))
        out.append((question, probes))
    return out


def _phase_records(results: Mapping[str, Any], system: str, phase: str, source: Path) -> list[Any]:
    by_phase = results[system]
    if not isinstance(by_phase, Mapping):
        raise dataset_error(
            source, "results", system, f"expected an object, got {type(by_phase).__name__}"
        )
    records = by_phase.get(phase) or []
    if not isinstance(records, list):
        raise dataset_error(
            source, f"results.{system}", phase, f"expected a list, got {type(records).__name__}"
        )
    return records


def _question(
    record: Any,
    source: Path,
    where: str,
    episode_id: str,
    phase: str,
    facts: list[Fact],
    idx: int,
    root: str | None,
) -> Question:
    raw_task = require(record, "task_type", source, where)
    task = published_task(raw_task)
    if task is None:
        raise dataset_error(
            source,
            where,
            "task_type",
            f"unknown task {raw_task!r} (one of Exact, Multi-hop, "
            "Multiple-update, Deletion, Cascade-D, Cascade-U)",
        )
    text = require(record, "question", source, where)
    gold = require(record, "gold_answer", source, where)
    entities = record.get("entity") or []
    values = record.get("entity_values") or {}
    if not isinstance(entities, list) or not all(isinstance(e, str) for e in entities):
        raise dataset_error(source, where, "entity", "expected a list of entity names")
    if not isinstance(values, Mapping):
        raise dataset_error(
            source, where, "entity_values", f"expected an object, got {type(values).__name__}"
        )
    abstain = phase == "after" and task in ABSTAIN_TASKS
    parts = evidence_parts(task, abstain, entities, values, facts, idx, root)
    flat = [str(v) for e in entities for v in _as_list(values.get(e))]
    scorer = TASK_SCORERS[task] if abstain or task not in ABSTAIN_TASKS else "contains"
    if scorer == "contains_all" and len(flat) > 1:
        # a sentence gold splits badly on commas; the values do not
        gold_for_scoring = ", ".join(flat)
    else:
        gold_for_scoring = gold
    with record_context(source, where):
        return Question(
            id=f"{episode_id}:{task}",
            question=text,
            gold=gold_for_scoring,
            evidence_ids=list(dict.fromkeys(p.turn_id for p in parts)),
            task_type=task,
            scorer=scorer,
            abstain=abstain,
            forbidden=flat if abstain and task == "deletion" else [],
            meta={
                "phase": phase,
                "published_task": raw_task,
                "published_gold": gold,
                "entity": entities,
                "entity_values": dict(values),
                "evidence_parts": [p.to_json() for p in parts],
            },
        )


def _probe(
    record: Any, source: Path, where: str, system: str, phase: str, question_id: str
) -> Probe:
    answer = record.get("agent_answer") if isinstance(record, Mapping) else None
    if not isinstance(answer, str):
        raise dataset_error(source, where, "agent_answer", "missing or not a string")
    verdict = record.get("u_pass")
    if not isinstance(verdict, bool):
        raise dataset_error(source, where, "u_pass", "missing or not true/false")
    context = record.get("retrieved_context_file")
    if context is not None and not isinstance(context, str):
        raise dataset_error(
            source, where, "retrieved_context_file", "expected a file name or null"
        )
    analysis = record.get("failure_analysis") or {}
    if not isinstance(analysis, Mapping):
        raise dataset_error(
            source, where, "failure_analysis", f"expected an object, got {type(analysis).__name__}"
        )
    stage = analysis.get("failure_stage")
    if stage is not None and stage not in STAGES:
        raise dataset_error(
            source,
            where,
            "failure_analysis.failure_stage",
            f"unknown stage {stage!r} (one of {', '.join(STAGES)})",
        )
    return Probe(
        system=system,
        phase=phase,
        question_id=question_id,
        task_type=record["task_type"],
        answer=answer,
        passed=verdict,
        context_file=context,
        failure_stage=stage,
        analysis=dict(analysis),
        where=where,
    )


# --- evidence parts -----------------------------------------------------------------------


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _turn(fact: Fact) -> str:
    return f"s{fact[0]}:t{fact[1] + 1}"


def _latest(facts: list[Fact], entity: str, value: str | None = None) -> Fact | None:
    """The latest fact of ``entity`` (with ``value`` when given)."""
    matching = [
        f
        for f in facts
        if f[2].get("entity") == entity
        and (value is None or value in [str(v) for v in _as_list(f[2].get("value"))])
    ]
    return max(matching, key=lambda f: (f[0], f[1]), default=None)


def evidence_parts(
    task: str,
    abstain: bool,
    entities: list[str],
    values: Mapping[str, Any],
    facts: list[Fact],
    idx: int,
    root: str | None,
) -> list[EvidencePart]:
    """What the answer needs, one part per entity value, from the gold facts up to session ``idx``.

    Each value's part is the latest fact of its entity with that value (else the latest
    fact of the entity). After a deletion the part is that fact, the retraction. For
    cascade and absence probes, a root that has taken two values by then adds its latest
    fact, the change event.
    """
    known = [f for f in facts if f[0] <= idx]
    parts: list[EvidencePart] = []
    for entity in entities:
        for value in (str(v) for v in _as_list(values.get(entity))):
            fact = _latest(known, entity, value) or _latest(known, entity)
            if fact is not None:
                kind = "retraction" if abstain and task == "deletion" else "fact"
                parts.append(EvidencePart(_turn(fact), entity, value, kind))
    if root and task in ("cascade", "absence"):
        root_facts = [f for f in known if f[2].get("entity") == root]
        if len({str(f[2].get("value")) for f in root_facts}) > 1:
            change = max(root_facts, key=lambda f: (f[0], f[1]))
            parts.append(EvidencePart(_turn(change), root, str(change[2].get("value")), "change"))
    return list({p.turn_id + p.value: p for p in parts}.values())


def load_published(path: Path, data: Any | None = None) -> tuple[str, list[Episode]]:
    """``meme:`` on a checkout directory or one published file: the dataset name and its
    episodes."""
    sources = published_files(path) if path.is_dir() else [path]
    episodes = []
    for source in sources:
        published = read_published(source, data if source == path else None)
        episodes += list(published.episodes.values())
    return f"meme:{path.stem if path.is_file() else path.name}", episodes


def read_all(path: Path) -> list[PublishedEpisode]:
    """Every published episode at ``path`` (a checkout directory or one file)."""
    return [
        read_published(source) for source in (published_files(path) if path.is_dir() else [path])
    ]
