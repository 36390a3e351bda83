"""gated: a state-aware agent memory with an admission gate in front of the answer.

The pattern of coding and ops agents. Every memory carries the state it was written in: a
**workspace** and a **path** in it, a **status** (``active``, or ``superseded`` once a later
completed run wrote a new value for the same key in the same workspace) and the **branch status**
of the run that wrote it (``completed``, ``failed`` or ``rolled_back``). Ingestion reads the agent
log format of :mod:`optloop.datasets.agentic` (any other session is stored as notes of a completed
run), into ``gated.sqlite`` under ``run_dir``; every column travels in the memory's ``metadata``,
so the execution graph shows the state.

**Retrieval** (no LLM) keeps the question's scope (knob ``scope``) and the ``top_k`` closest.
**Admission** (inside ``answer``): deterministic **floors** decide first and hold (knob
``floors``: ``strict``, ``lenient``, ``off``), then one call of the prompt site ``gated.admit``
per question (knob ``gate``: ``llm`` or ``floors_only``) gives every open candidate ``admit``,
``negative`` (shown as "this did not work: ...") or ``reject``, with its reason and who decided.
The gate is one recorded ``admit`` operation the answer consumes. Knob value spaces:
:data:`KNOB_VALUES`; the schema, the floors and the dataset: ``docs/systems.md`` (``gated``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import dspy
import numpy as np
from pydantic import BaseModel, Field

from optloop.datasets.agentic import (
    DEAD_BRANCHES,
    parse_scope,
    parse_tag,
    path_matches,
    scope_header,
)
from optloop.errors import ConfigError
from optloop.sites import ANSWER, GATED_ADMIT
from signatures.common import render_memories
from signatures.gated import AdmitMemories, Verdict
from systems.base import MemoryItem, MemorySystem, PromptSite

if TYPE_CHECKING:
    from optloop.datasets import Session
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM

logger = logging.getLogger(__name__)

DB_FILE = "gated.sqlite"
DEFAULT_WORKSPACE = "default"
BRANCH_STATUSES = ("completed", "failed", "rolled_back")
NEGATIVE_PREFIX = "this did not work: "

KNOB_VALUES: dict[str, list[Any]] = {
    "top_k": [3, 5, 8, 12],
    "scope": ["workspace_path", "workspace", "all"],
    "floors": ["strict", "lenient", "off"],
    "gate": ["llm", "floors_only"],
    "negative_evidence": [True, False],
}
"""Each knob's value space (what an optimizer may try; ``top_k`` takes any positive integer)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    session_id TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    seq INTEGER NOT NULL,
    workspace TEXT NOT NULL,
    path TEXT NOT NULL DEFAULT '',
    branch_status TEXT NOT NULL CHECK (branch_status IN ('completed', 'failed', 'rolled_back')),
    timestamp TEXT
);
CREATE TABLE IF NOT EXISTS memories (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    run TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES runs(session_id),
    timestamp TEXT,
    workspace TEXT NOT NULL,
    path TEXT NOT NULL DEFAULT '',
    key TEXT,
    value TEXT,
    content TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('active', 'superseded')),
    branch_status TEXT NOT NULL CHECK (branch_status IN ('completed', 'failed', 'rolled_back')),
    superseded_by TEXT,
    superseded_at TEXT,
    embedder TEXT,
    embedding BLOB
);
CREATE INDEX IF NOT EXISTS memories_by_key ON memories (workspace, key, status);
"""

_COLUMNS = (
    "id",
    "seq",
    "run",
    "session_id",
    "timestamp",
    "workspace",
    "path",
    "key",
    "value",
    "content",
    "status",
    "branch_status",
    "superseded_by",
    "superseded_at",
)


class MemoryRow(BaseModel):
    """One row of ``memories`` (without its embedding)."""

    id: str
    seq: int
    run: str
    session_id: str
    timestamp: str | None = None
    workspace: str
    path: str = ""
    key: str | None = None
    value: str | None = None
    content: str
    status: Literal["active", "superseded"] = "active"
    branch_status: Literal["completed", "failed", "rolled_back"] = "completed"
    superseded_by: str | None = None
    superseded_at: str | None = None

    def to_item(self, score: float | None = None) -> MemoryItem:
        metadata: dict[str, Any] = {
            "kind": "fact" if self.key else "note",
            "turn_ids": [self.id],
            "session_id": self.session_id,
            "timestamp": self.timestamp,
            "run": self.run,
            "workspace": self.workspace,
            "path": self.path,
            "key": self.key,
            "value": self.value,
            "status": self.status,
            "branch_status": self.branch_status,
            "superseded_by": self.superseded_by,
        }
        if self.status == "superseded":  # the recorder's mark of a unit that no longer holds
            metadata["invalid_at"] = self.superseded_at or "superseded"
        return MemoryItem(id=self.id, text=self.content, score=score, metadata=metadata)


class GateDecision(BaseModel):
    """The gate's decision on one retrieved candidate: what the recorded ``admit`` operation
    outputs."""

    rank: int
    memory_id: str
    verdict: Verdict
    by: Literal["floor", "llm", "default"]
    reason: str
    workspace: str | None = None
    path: str | None = None
    status: str | None = None
    branch_status: str | None = None


class Admission(BaseModel):
    """What the gate let into the answer prompt."""

    decisions: list[GateDecision] = Field(default_factory=list)
    positive: list[MemoryItem] = Field(default_factory=list)
    negative: list[MemoryItem] = Field(default_factory=list)

    def render(self) -> str:
        """The answer's ``memories`` input: positive memories, then negative evidence, one line
        each."""
        if not self.positive and not self.negative:
            return render_memories([])
        lines = [render_memories(self.positive)] if self.positive else []
        lines += [f"- {NEGATIVE_PREFIX}{item.text}" for item in self.negative]
        return "\n".join(lines)


def floor_decision(
    item: MemoryItem, rank: int, workspace: str, floors: str, negative_evidence: bool
) -> GateDecision:
    """The deterministic floors on one candidate: a final decision (``by="floor"``), or a
    provisional admit (reason ``"open"``) the LLM may change."""
    meta = item.metadata
    info = {
        "rank": rank,
        "memory_id": item.id,
        "workspace": meta.get("workspace"),
        "path": meta.get("path"),
        "status": meta.get("status"),
        "branch_status": meta.get("branch_status"),
    }
    if floors != "off" and meta.get("workspace") not in (None, workspace):
        return GateDecision(
            **info,
            verdict="reject",
            by="floor",
            reason=f"floor: written in workspace {meta.get('workspace')}, not {workspace}",
        )
    if floors == "strict":
        if meta.get("status") == "superseded":
            successor = f" by {meta['superseded_by']}" if meta.get("superseded_by") else ""
            return GateDecision(
                **info, verdict="reject", by="floor", reason=f"floor: superseded{successor}"
            )
        if meta.get("branch_status") in DEAD_BRANCHES:
            outcome = str(meta["branch_status"]).replace("_", " ")
            if negative_evidence:
                return GateDecision(
                    **info,
                    verdict="negative",
                    by="floor",
                    reason=f"floor: written by a run that {outcome}; negative evidence only",
                )
            return GateDecision(
                **info,
                verdict="reject",
                by="floor",
                reason=f"floor: written by a run that {outcome} (negative evidence is off)",
            )
    return GateDecision(**info, verdict="admit", by="floor", reason="open")


def render_candidates(pending: Sequence[tuple[GateDecision, MemoryItem]]) -> str:
    """The candidates the LLM decides, one line each:
    ``[rank] (workspace, path, status, run outcome) text``."""
    lines = []
    for decision, item in pending:
        meta = item.metadata
        where = f"workspace {meta.get('workspace', '?')}, path {meta.get('path') or '/'}"
        lines.append(
            f"[{decision.rank}] ({where}, {meta.get('status', 'active')}, run "
            f"{str(meta.get('branch_status', 'completed')).replace('_', ' ')}) {item.text}"
        )
    return "\n".join(lines) or "(none)"


class AdmissionGate(dspy.Predict):
    """The ``gated.admit`` site's module: one call per question returns every candidate's decision.

    Called by the system with the signature's inputs plus ``decided`` (the floors' final
    decisions), ``pending`` (the open candidates, provisionally admitted) and
    ``ask_llm``/``allow_negative``; it asks the LM about the pending candidates only (unless
    ``ask_llm`` is false) and returns ``decisions``: the floors' and the LLM's, by rank. Called
    with the signature's inputs alone (an optimizer replaying a demo), it is a plain
    ``dspy.Predict``.
    """

    def forward(self, **kwargs: Any) -> dspy.Prediction:
        if "pending" not in kwargs:
            return super().forward(**kwargs)
        decided: list[GateDecision] = list(kwargs.pop("decided", []))
        pending: list[GateDecision] = list(kwargs.pop("pending"))
        ask = bool(kwargs.pop("ask_llm", True))
        allow_negative = bool(kwargs.pop("allow_negative", True))
        if ask and pending:
            raw = super().forward(**kwargs)
            verdicts: dict[str, Any] = {}
            for verdict in raw.decisions or []:
                verdicts.setdefault(str(verdict.id).strip().strip("[]"), verdict)
            merged = []
            for candidate in pending:
                verdict = verdicts.get(str(candidate.rank))
                if verdict is None:
                    merged.append(
                        candidate.model_copy(
                            update={
                                "by": "default",
                                "reason": "the gate gave no verdict for this candidate; "
                                "admitted by default",
                            }
                        )
                    )
                    continue
                choice, reason = verdict.verdict, verdict.reason
                if choice == "negative" and not allow_negative:
                    choice, reason = "reject", f"{reason} (negative evidence is off)"
                merged.append(
                    candidate.model_copy(update={"verdict": choice, "by": "llm", "reason": reason})
                )
            pending = merged
        else:
            note = "no LLM asked (gate=floors_only)" if not ask else "no candidate left"
            pending = [
                c.model_copy(update={"reason": f"passed the floors; {note}"}) for c in pending
            ]
        return dspy.Prediction(decisions=sorted([*decided, *pending], key=lambda d: d.rank))

    @classmethod
    def from_predict(cls, module: dspy.Predict) -> AdmissionGate:
        """An AdmissionGate with ``module``'s signature, demos, LM and callbacks (a candidate's
        plain Predict)."""
        gate = cls(module.signature, callbacks=list(module.callbacks))
        gate.demos = list(module.demos)
        gate.lm = module.lm
        return gate


class GatedSystem(MemorySystem):
    """Workspace-, status- and branch-aware memories in SQLite; an admission gate before the
    answer."""

    name: ClassVar[str] = "gated"
    default_knobs: ClassVar[dict[str, Any]] = {
        "top_k": 5,
        "scope": "workspace_path",
        "floors": "strict",
        "gate": "llm",
        "negative_evidence": True,
    }
    knob_values: ClassVar[Mapping[str, Sequence[Any]]] = KNOB_VALUES
    # The gate lists one verdict (a short reason each) per candidate: bound both for a local model.
    local_decoding: ClassVar[dict[str, int]] = {"max_array_items": 12, "max_string_chars": 160}

    def __init__(
        self,
        lm: OptloopLM,
        run_dir: Path,
        *,
        embedder: Embedder | None = None,
        knobs: dict[str, Any] | None = None,
        query_site: bool = False,
    ):
        super().__init__(lm, run_dir, embedder=embedder, knobs=knobs, query_site=query_site)
        for name, value in self._knobs.items():
            _check_knob(name, value)
        self._lock = threading.RLock()
        # (workspace, path) of the question being retrieved for, per thread: an episode's questions
        # may run at once (optloop.pipeline), each retrieve followed by its searches on the same
        # thread.
        self._asked = _Asked()
        self.last_admission: Admission | None = None
        self._load()

    # --- sites and knobs ---------------------------------------------------------------------

    def _build_sites(self) -> None:
        self._sites[GATED_ADMIT] = PromptSite(
            name=GATED_ADMIT,
            stage="answer",
            module=AdmissionGate(AdmitMemories),
            seed_instruction=AdmitMemories.instructions,
            op_kinds=("admit",),
            layout="dspy",
        )

    def set_knob(self, name: str, value: Any) -> None:
        if name in self._knobs:
            _check_knob(name, value)
        super().set_knob(name, value)

    def use_modules(self, modules: dict[str, dspy.Predict]) -> None:
        gate = modules.get(GATED_ADMIT)
        if gate is not None and not isinstance(gate, AdmissionGate):
            modules = {**modules, GATED_ADMIT: AdmissionGate.from_predict(gate)}
        super().use_modules(modules)

    def apply_pack(self, pack: dict[str, Any]) -> None:
        """Use an exported prompt pack (``python -m optloop export --format pack``): its prompts
        and knobs."""
        if pack.get("system") not in (None, self.name):
            raise ConfigError(f"the pack holds {pack.get('system')} prompts, not {self.name}'s")
        for site, text in (pack.get("prompts") or {}).items():
            if site in self._sites:
                self._sites[site].set_instructions(text)
            else:
                logger.warning(
                    "gated has no prompt site %s; the pack's prompt for it is ignored", site
                )
        for name, value in (pack.get("knobs") or {}).items():
            self.set_knob(name, value)

    # --- storage -----------------------------------------------------------------------------

    @property
    def db_path(self) -> Path:
        return self.run_dir / DB_FILE

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.db_path, timeout=30)
        connection.executescript(SCHEMA)
        return connection

    def _load(self) -> None:
        """Read every row and vector; re-embed rows embedded by another model (or not at all)."""
        with self._lock, closing(self._connect()) as db:
            records = db.execute(
                f"SELECT {', '.join(_COLUMNS)}, embedder, embedding FROM memories ORDER BY seq"
            ).fetchall()
            latest = db.execute("SELECT workspace FROM runs ORDER BY seq DESC LIMIT 1").fetchone()
            self._sessions = {row[0] for row in db.execute("SELECT session_id FROM runs")}
            self._run_seq = db.execute("SELECT MAX(seq) FROM runs").fetchone()[0] or 0
            self._rows = [
                MemoryRow(**dict(zip(_COLUMNS, record[: len(_COLUMNS)], strict=True)))
                for record in records
            ]
            vectors: list[np.ndarray | None] = [
                np.frombuffer(record[-1], dtype=np.float32)
                if record[-1] is not None and record[-2] == self.embedder.name
                else None
                for record in records
            ]
            missing = [i for i, v in enumerate(vectors) if v is None]
            if missing:
                if len(missing) < len(records):
                    logger.warning(
                        "%s: %d memories were embedded by another model; re-embedding them",
                        self.db_path,
                        len(missing),
                    )
                fresh = self.embedder.embed([self._rows[i].content for i in missing])
                with db:
                    for i, vector in zip(missing, fresh, strict=True):
                        vectors[i] = vector
                        db.execute(
                            "UPDATE memories SET embedder = ?, embedding = ? WHERE id = ?",
                            (
                                self.embedder.name,
                                vector.astype(np.float32).tobytes(),
                                self._rows[i].id,
                            ),
                        )
            self._vectors = (
                np.stack([np.asarray(v, dtype=np.float32) for v in vectors])
                if vectors
                else np.zeros((0, self.embedder.dim), dtype=np.float32)
            )
            self._workspace = latest[0] if latest else DEFAULT_WORKSPACE

    def reset(self) -> None:
        with self._lock:
            self._clear_run_dir()
            self._asked = _Asked()
            self.last_admission = None
            self._load()

    # --- ingest ------------------------------------------------------------------------------

    def ingest(self, sessions: Sequence[Session]) -> None:
        for session in sessions:
            with self._lock:
                if session.id in self._sessions:
                    logger.info("session %s is already stored; skipping it", session.id)
                    continue
                self._ingest_session(session)

    def _ingest_session(self, session: Session) -> None:
        run = {"run": session.id, "workspace": self._workspace, "path": "", "branch": "completed"}
        notes: list[tuple[str, str, dict[str, Any]]] = []  # (turn id, text, fact tag)
        for turn in session.turns:
            text, kind, data = parse_tag(turn.content)
            if kind == "run":
                run.update(
                    {
                        k: str(data[k]).strip()
                        for k in ("run", "workspace", "path")
                        if data.get(k) is not None
                    }
                )
                run["path"] = run["path"].strip("/")
            elif kind == "end":
                branch = str(data.get("branch", "completed"))
                if branch not in BRANCH_STATUSES:
                    logger.warning(
                        "run %s ended with unknown branch status %r; stored as failed",
                        run["run"],
                        branch,
                    )
                    branch = "failed"
                run["branch"] = branch
            elif kind == "fact":
                notes.append((turn.id, text, data))
            else:
                notes.append((turn.id, f"{turn.speaker or turn.role}: {text}", {}))
        start = max((row.seq for row in self._rows), default=0)
        rows = []
        for offset, (turn_id, text, tag) in enumerate(notes, 1):
            key = str(tag["key"]).strip() if tag.get("key") else None
            status = "superseded" if tag.get("status") == "superseded" else "active"
            value = None if tag.get("value") is None else str(tag["value"])
            rows.append(
                MemoryRow(
                    id=turn_id,
                    seq=start + offset,
                    run=run["run"],
                    session_id=session.id,
                    timestamp=session.timestamp,
                    workspace=run["workspace"],
                    path=run["path"],
                    key=key,
                    value=value,
                    content=text or "(empty)",
                    status=status,
                    branch_status=run["branch"],
                )
            )
        vectors = self.embedder.embed([row.content for row in rows])
        with closing(self._connect()) as db, db:
            self._run_seq += 1
            db.execute(
                "INSERT INTO runs (session_id, run, seq, workspace, path, branch_status, "
                "timestamp) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    session.id,
                    run["run"],
                    self._run_seq,
                    run["workspace"],
                    run["path"],
                    run["branch"],
                    session.timestamp,
                ),
            )
            for row, vector in zip(rows, vectors, strict=True):
                db.execute(
                    f"INSERT INTO memories ({', '.join(_COLUMNS)}, embedder, embedding) "
                    f"VALUES ({', '.join('?' * (len(_COLUMNS) + 2))})",
                    (
                        *(getattr(row, c) for c in _COLUMNS),
                        self.embedder.name,
                        vector.astype(np.float32).tobytes(),
                    ),
                )
                if row.key and row.status == "active" and row.branch_status == "completed":
                    superseded = db.execute(
                        "UPDATE memories SET status = 'superseded', superseded_by = ?, "
                        "superseded_at = ? WHERE workspace = ? AND key = ? AND status = "
                        "'active' AND seq < ?",
                        (row.id, session.timestamp or session.id, row.workspace, row.key, row.seq),
                    ).rowcount
                    if superseded:
                        logger.debug(
                            "gated: %s supersedes %d memory(ies) of %s/%s",
                            row.id,
                            superseded,
                            row.workspace,
                            row.key,
                        )
        self._load()
        logger.info(
            "gated: run %s (%s, %s, %s) stored %d memories",
            run["run"],
            run["workspace"],
            run["path"] or "/",
            run["branch"],
            len(rows),
        )

    # --- the store as the protocol sees it ----------------------------------------------------

    def all_memories(self) -> list[MemoryItem]:
        with self._lock:
            return [row.to_item() for row in self._rows]

    def delete_memory(self, memory_id: str) -> None:
        with self._lock, closing(self._connect()) as db, db:
            db.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
        self._load()

    def update_memory(self, memory_id: str, text: str) -> None:
        vector = self.embedder.embed_one(text)
        with self._lock, closing(self._connect()) as db, db:
            db.execute(
                "UPDATE memories SET content = ?, embedder = ?, embedding = ? WHERE id = ?",
                (text, self.embedder.name, vector.astype(np.float32).tobytes(), memory_id),
            )
        self._load()

    # --- retrieval ---------------------------------------------------------------------------

    def scope_of(self, text: str) -> tuple[str, str, str]:
        """``(workspace, path, question)`` a question is asked in: its header, else the latest
        run's workspace."""
        workspace, path, rest = parse_scope(text)
        if workspace is None:
            return self._workspace, "", rest
        return workspace, path, rest

    def retrieve(self, question: str, k: int | None = None) -> list[MemoryItem]:
        workspace, path, _ = self.scope_of(question)
        self._asked.scope = (
            workspace,
            path,
        )  # a rewritten query loses the header; the search keeps the scope
        return super().retrieve(question, k)

    def search(self, query: str, k: int) -> list[MemoryItem]:
        workspace, path, text = parse_scope(query)
        if workspace is None:
            workspace, path = self._asked.scope or (self._workspace, "")
        scope = self._knobs["scope"]
        with self._lock:
            rows, vectors = self._rows, self._vectors
        keep = [
            i
            for i, row in enumerate(rows)
            if scope == "all"
            or (
                row.workspace == workspace
                and (scope == "workspace" or path_matches(row.path, path))
            )
        ]
        if not keep or k <= 0:
            return []
        similarities = vectors[keep] @ self.embedder.embed_one(text or query)
        order = sorted(range(len(keep)), key=lambda j: (-similarities[j], rows[keep[j]].seq))[:k]
        return [rows[keep[j]].to_item(score=float(similarities[j])) for j in order]

    # --- admission and answer ----------------------------------------------------------------

    def admit(self, question: str, memories: Sequence[MemoryItem]) -> Admission:
        """The gate on ``memories`` (retrieved for ``question``): floors, then the ``gated.admit``
        site."""
        if not memories:
            return Admission()
        workspace, path, text = self.scope_of(question)
        floors, negative_evidence = (
            str(self._knobs["floors"]),
            bool(self._knobs["negative_evidence"]),
        )
        decided: list[GateDecision] = []
        pending: list[tuple[GateDecision, MemoryItem]] = []
        for rank, item in enumerate(memories, 1):
            decision = floor_decision(item, rank, workspace, floors, negative_evidence)
            if decision.reason == "open":
                pending.append((decision, item))
            else:
                decided.append(decision)
        prediction = self._sites[GATED_ADMIT](
            self.lm,
            question=text,
            scope=scope_header(workspace, path),
            candidates=render_candidates(pending),
            decided=decided,
            pending=[d for d, _ in pending],
            ask_llm=self._knobs["gate"] == "llm",
            allow_negative=negative_evidence,
        )
        returned = {
            d.memory_id: d for d in (prediction.decisions or []) if isinstance(d, GateDecision)
        }
        final: list[GateDecision] = []
        for decision in decided:  # a floor holds whatever came back
            if returned.get(decision.memory_id, decision).verdict != decision.verdict:
                logger.warning(
                    "gated.admit returned %s for %s; its floor says %s",
                    returned[decision.memory_id].verdict,
                    decision.memory_id,
                    decision.verdict,
                )
            final.append(decision)
        for decision, _ in pending:
            final.append(
                returned.get(decision.memory_id)
                or decision.model_copy(
                    update={
                        "by": "default",
                        "reason": "missing from the gate's output; admitted by default",
                    }
                )
            )
        final.sort(key=lambda d: d.rank)
        items = {item.id: item for item in memories}
        return Admission(
            decisions=final,
            positive=[items[d.memory_id] for d in final if d.verdict == "admit"],
            negative=[items[d.memory_id] for d in final if d.verdict == "negative"],
        )

    def answer(self, question: str, memories: Sequence[MemoryItem]) -> str:
        admission = self.admit(question, memories)
        self.last_admission = admission
        return self._sites[ANSWER](self.lm, memories=admission.render(), question=question).answer


class _Asked(threading.local):
    """The scope of the question this thread is retrieving for (``None`` before its first
    retrieve)."""

    scope: tuple[str, str] | None = None


def _check_knob(name: str, value: Any) -> None:
    if name == "top_k":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"gated: top_k must be a positive integer, got {value!r}")
        return
    allowed = KNOB_VALUES.get(name)
    if allowed is not None and value not in allowed:
        raise ConfigError(f"gated: knob {name} must be one of {allowed}, got {value!r}")
