"""Import MEME's published traces as execution graphs: one per system and episode, nothing run.

The published layout (:mod:`optloop.datasets.meme_published`) gives, per system, the
whole memory after every session and, per probe, the retrieved context, the agent's
answer and the authors' verdict. :func:`import_traces` turns that into one
:class:`~optloop.tracing.graph.ExecutionGraph` per system and episode:

* every turn is a ``message`` variable, as the recorder makes them;
* each snapshot is cut into the units the system stores (:func:`unit_format`): a wiki
  by section (``KIND (name):`` headers), a chunk store by ``---``-separated block,
  anything else by non-blank line, a leading ``[hex id]`` being the unit's identity.
  The unit diff of consecutive snapshots becomes the session's operations: a ``store``
  of the new units (always recorded, the session's messages as inputs), an ``update``
  per unit whose text changed under the same identity or that replaced a removed one
  (token Jaccard >= 0.5, the recorder's rule), a ``delete`` of the other removed units;
* each probe is a ``question`` variable, a ``retrieve`` operation whose ``retrieved``
  variable lists the published context as items (blocks of a chunk store, lines
  otherwise; a ``[score=x]`` prefix is the item's score), and an ``answer`` operation
  whose ``answer`` variable is the agent's answer.

No operation has a prompt site: the systems' own LLM calls were not published. Missing
snapshot or context files raise a one-line :class:`~optloop.errors.DatasetError`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optloop.datasets._io import dataset_error
from optloop.datasets._model import Episode, Question, Session
from optloop.datasets.meme_published import Probe, PublishedEpisode, read_all
from optloop.tracing.graph import ExecutionGraph, Variable
from optloop.tracing.recorder import question_variable, similar

logger = logging.getLogger(__name__)

SOURCE = "meme-published"
REPLACED = 0.5  # a removed unit replaced by one this similar was updated, not deleted
_WIKI_HEADER = re.compile(r"^[A-Z][A-Z_]+(?: \([^)\n]*\))?:$", re.M)
_SEPARATOR = re.compile(r"^---$", re.M)
_LINE_ID = re.compile(r"^\[([0-9a-f]{6,})\]\s")
_SCORE = re.compile(r"^\[score=([-+0-9.eE]+)\]\s*")


# --- units --------------------------------------------------------------------------------


def unit_format(snapshots: Iterable[str]) -> str:
    """``wiki``, ``chunks`` or ``lines``: how a system's snapshots are cut into units."""
    texts = list(snapshots)
    if any(_WIKI_HEADER.search(t) for t in texts):
        return "wiki"
    if any(_SEPARATOR.search(t) for t in texts):
        return "chunks"
    return "lines"


def _unique(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Key -> text, a repeated key numbered (``key#2``) so that no unit is lost."""
    out: dict[str, str] = {}
    for key, text in pairs:
        name, n = key, 1
        while name in out:
            n += 1
            name = f"{key}#{n}"
        out[name] = text
    return out


def _blocks(text: str) -> list[str]:
    return [b.strip() for b in _SEPARATOR.split(text) if b.strip()]


def _sections(text: str) -> list[tuple[str, str]]:
    headers = list(_WIKI_HEADER.finditer(text))
    out = []
    if headers and text[: headers[0].start()].strip():
        out.append(("(preamble)", text[: headers[0].start()].strip()))
    for i, match in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        out.append((match.group(0), text[match.start() : end].strip()))
    return out


def split_units(text: str, fmt: str) -> dict[str, str]:
    """A snapshot's units as identity -> text, in order."""
    if fmt == "wiki":
        return _unique(_sections(text))
    if fmt == "chunks":
        return _unique((block, block) for block in _blocks(text))
    lines = (line.rstrip() for line in text.splitlines())
    return _unique(
        ((m.group(1) if (m := _LINE_ID.match(line)) else line), line)
        for line in lines
        if line.strip()
    )


def context_items(text: str, fmt: str) -> list[dict[str, Any]]:
    """A retrieved context as ranked items (``rank``, ``id``, ``var``, ``text``, ``score``)."""
    pieces = (
        _blocks(text)
        if fmt == "chunks"
        else [line.strip() for line in text.splitlines() if line.strip()]
    )
    items = []
    for rank, piece in enumerate(pieces, 1):
        match = _SCORE.match(piece)
        score = float(match.group(1)) if match else None
        body = piece[match.end() :] if match else piece
        items.append({"rank": rank, "id": None, "var": None, "text": body, "score": score})
    return items


def _bare(text: str) -> str:
    """A line without its ``[hex id]`` or ``[score=x]`` prefix (to link items to units)."""
    return _SCORE.sub("", _LINE_ID.sub("", text, count=1), count=1).strip()


# --- building one graph -------------------------------------------------------------------


class _Builder:
    """Replays one system's published snapshots and probes into a graph."""

    def __init__(self, graph: ExecutionGraph, fmt: str):
        self.graph = graph
        self.fmt = fmt
        self.live: dict[str, Variable] = {}  # unit identity -> its current version
        self.names: dict[str, str] = {}  # unit identity -> variable name

    def session(self, session: Session, snapshot: str) -> None:
        messages = [
            self.graph.add_variable(
                Variable.make(
                    "message",
                    turn.id,
                    text=f"{turn.speaker or turn.role}: {turn.content}",
                    session_id=session.id,
                    timestamp=session.timestamp,
                    data={"role": turn.role},
                )
            ).id
            for turn in session.turns
        ]
        units = split_units(snapshot, self.fmt)
        removed = [k for k in self.live if k not in units]
        added = [k for k in units if k not in self.live]
        changed = [k for k in units if k in self.live and self.live[k].text != units[k]]
        replaced = self._pair(removed, added, units)
        knobs = {"session": session.id}
        new = [
            self._unit(k, units[k], session, messages).id
            for k in added
            if k not in replaced.values()
        ]
        self.graph.add_operation(
            "store",
            "ingest",
            inputs=messages,
            outputs=new,
            knobs=knobs,
            session_id=session.id,
            comment=f"{len(new)} new memory unit(s) in the snapshot",
        )
        for old, key in [*replaced.items(), *((k, k) for k in changed)]:
            before = self.live.pop(old) if old != key else self.live[key]
            after = self._unit(key, units[key], session, messages, name=self.names[old])
            self.graph.add_operation(
                "update",
                "ingest",
                inputs=[*messages, before.id],
                outputs=[after.id],
                knobs=knobs,
                session_id=session.id,
                comment="text changed" if old == key else "unit replaced by a similar one",
            )
        gone = [k for k in removed if k not in replaced]
        olds = [self.live[k] for k in gone]
        self.graph.add_removal(
            messages, olds, [self._tombstone(k, session) for k in gone], session_id=session.id
        )

    def _pair(self, removed: list[str], added: list[str], units: dict[str, str]) -> dict[str, str]:
        """Removed unit -> the added unit that replaced it (at least REPLACED similar)."""
        pairs: dict[str, str] = {}
        for old in removed:
            free = [k for k in added if k not in pairs.values()]
            best = max(free, key=lambda k: similar(self.live[old].text, units[k]), default=None)
            if best is not None and similar(self.live[old].text, units[best]) >= REPLACED:
                pairs[old] = best
        return pairs

    def _unit(
        self, key: str, text: str, session: Session, messages: list[str], name: str | None = None
    ) -> Variable:
        name = name or self.names.get(key) or f"u{len(self.names) + 1}"
        self.names[key] = name
        var = self.graph.add_variable(
            Variable.make(
                "memory",
                name,
                self.graph.next_version("memory", name),
                text=text,
                data={"key": key[:120]},
                session_id=session.id,
                timestamp=session.timestamp,
                provenance=list(messages),
            )
        )
        self.live[key] = var
        return var

    def _tombstone(self, key: str, session: Session) -> Variable:
        old = self.live.pop(key)
        return self.graph.add_variable(
            Variable.make(
                "memory",
                old.name,
                old.version + 1,
                text="",
                session_id=session.id,
                timestamp=session.timestamp,
                provenance=old.provenance,
                status="deleted",
            )
        )

    def probe(self, question: Question, probe: Probe, context: str) -> None:
        qvar = self.graph.add_variable(question_variable(question))
        by_text = {_bare(v.text): v.id for v in self.live.values()}
        items = context_items(context, self.fmt)
        for item in items:
            item["var"] = by_text.get(_bare(item["text"]))
        retrieved = self.graph.add_variable(
            Variable.make(
                "retrieved",
                question.id,
                text=context,
                question_id=question.id,
                data={
                    "items": items,
                    "query": question.question,
                    "wide": [],
                    "truncation": None,
                    "file": probe.context_file,
                },
            )
        )
        linked = [item["var"] for item in items if item["var"]]
        self.graph.add_operation(
            "retrieve",
            "retrieve",
            inputs=dict.fromkeys([qvar.id, *linked]),
            outputs=[retrieved.id],
            question_id=question.id,
            comment=f"{len(items)} published context item(s)",
        )
        answer = self.graph.add_variable(
            Variable.make(
                "answer", f"{question.id}.answer", text=probe.answer, question_id=question.id
            )
        )
        verdict = "passed" if probe.passed else "failed"
        self.graph.add_operation(
            "answer",
            "answer",
            inputs=[qvar.id, retrieved.id],
            outputs=[answer.id],
            question_id=question.id,
            comment=f"published answer ({verdict} by the authors' judge)",
        )


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise dataset_error(path, None, None, f"{what} missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise dataset_error(path, None, None, f"cannot read {what}: {exc}") from None


def _snapshots(published: PublishedEpisode, system: str, sessions: Sequence[Session]) -> list[str]:
    return [
        _read(
            published.snapshot_path(system, int(s.id[1:])),
            f"snapshot of {system} after session {s.id}",
        )
        for s in sessions
    ]


def build_graph(
    published: PublishedEpisode,
    system: str,
    episode: Episode,
    fmt: str,
    snapshots: Sequence[str],
    dataset: str = "",
) -> ExecutionGraph:
    """The graph of ``system`` on ``episode``: sessions from ``snapshots``, then the episode's
    probes."""
    label = published.labels.get(system) or {}
    graph = ExecutionGraph(
        system=system,
        episode_id=episode.id,
        dataset=dataset,
        meta={
            "source": SOURCE,
            "unit_format": fmt,
            "label": label.get("name", system),
            "internal_llm": label.get("internalLLM"),
            "sites": {},
            "knobs": {},
        },
    )
    builder = _Builder(graph, fmt)
    for session, snapshot in zip(episode.sessions, snapshots, strict=True):
        builder.session(session, snapshot)
    probes = {p.question_id: p for p in published.probes if p.system == system}
    for question in episode.questions:
        probe = probes[question.id]
        path = published.context_path(probe)
        builder.probe(
            question, probe, _read(path, f"retrieved context of {probe.where}") if path else ""
        )
    return graph


# --- the whole layout ---------------------------------------------------------------------


@dataclass
class TraceRun:
    """One system on one episode, as published: the graph and each question's probe."""

    system: str
    episode: Episode
    graph: ExecutionGraph
    probes: dict[str, Probe]

    def failures(self) -> list[tuple[Question, Probe]]:
        """The questions the authors' judge failed, with their probes."""
        return [
            (q, self.probes[q.id]) for q in self.episode.questions if not self.probes[q.id].passed
        ]


def import_published(published: PublishedEpisode, dataset: str = "") -> list[TraceRun]:
    """Every system's run on each of the episode's episodes (before, after)."""
    runs = []
    longest = max(published.episodes.values(), key=lambda e: len(e.sessions))
    for system in published.systems:
        snapshots = _snapshots(published, system, longest.sessions)
        fmt = unit_format(snapshots)
        by_session = dict(zip((s.id for s in longest.sessions), snapshots, strict=True))
        for episode in published.episodes.values():
            graph = build_graph(
                published,
                system,
                episode,
                fmt,
                [by_session[s.id] for s in episode.sessions],
                dataset,
            )
            probes = {
                p.question_id: p
                for p in published.probes
                if p.system == system and p.question_id in {q.id for q in episode.questions}
            }
            runs.append(TraceRun(system=system, episode=episode, graph=graph, probes=probes))
            logger.debug(
                "%s on %s: %d variables, %d operations (%s units)",
                system,
                episode.id,
                len(graph.variables),
                len(graph.operations),
                fmt,
            )
    return runs


def import_traces(path: str | Path) -> list[TraceRun]:
    """Import every published episode at ``path`` (a checkout directory or
    ``src/data/<name>.json``)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise dataset_error(
            path,
            None,
            None,
            "not found",
            "give a checkout of meme-eval or its src/data/<name>.json",
        )
    dataset = f"meme:{path}"
    return [run for published in read_all(path) for run in import_published(published, dataset)]


__all__ = [
    "TraceRun",
    "build_graph",
    "context_items",
    "import_published",
    "import_traces",
    "split_units",
    "unit_format",
]
