"""The SQLite file of ``tiered``: its schema, its rows, and every read and write of them.

Everything lives in ``<run_dir>/tiered.sqlite`` (:data:`DB_FILE`): ``stm`` (the current
conversation's turns), ``mtm`` (one summary per past conversation, with its expiry),
``ltm`` (key/value facts with their embeddings, history kept), ``sessions``,
``extractions`` (what the extraction stage wrote and what was stored, per user message),
``forgotten`` (forget requests: the keys, never the values) and ``meta``.
:class:`TieredStore` owns the connection, the live facts' vectors and the invariants the
file itself enforces: one live row per key (a unique index), a superseded row pointing at
the row that replaced it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel

from optloop.errors import ConfigError
from systems.base import MemoryItem
from systems.tiered.keys import normalize_value, slug

if TYPE_CHECKING:
    from optloop.embed import Embedder
    from systems.tiered.extraction import Fact

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: the extraction stage answers {key, value, category} objects
DB_FILE = "tiered.sqlite"
MTM_TTL_DAYS = 30

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (        -- conversations ingested, in order
    id        TEXT PRIMARY KEY,
    seq       INTEGER NOT NULL,
    timestamp TEXT,
    turns     INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS stm (             -- short term: the current conversation
    turn_id    TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    role       TEXT NOT NULL,
    speaker    TEXT,
    content    TEXT NOT NULL,
    timestamp  TEXT,
    extraction TEXT NOT NULL                 -- what the extraction stage did with the turn
);
CREATE TABLE IF NOT EXISTS mtm (             -- mid term: one summary per past conversation
    session_id TEXT PRIMARY KEY,
    seq        INTEGER NOT NULL,
    summary    TEXT NOT NULL,
    categories TEXT NOT NULL,                -- JSON list
    turn_ids   TEXT NOT NULL,                -- JSON list
    created_at TEXT,
    expires_at TEXT
);
CREATE TABLE IF NOT EXISTS ltm (             -- long term: key/value facts, history kept
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    key           TEXT NOT NULL,             -- as stored (normalized in code)
    label         TEXT NOT NULL,
    value         TEXT NOT NULL,
    category      TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('live', 'superseded')),
    superseded_by INTEGER REFERENCES ltm(id),
    session_id    TEXT,
    turn_id       TEXT,
    timestamp     TEXT,
    grounded      INTEGER NOT NULL,          -- the value's words occur in the message or its \
context
    written_keys  TEXT NOT NULL DEFAULT '[]', -- JSON: the keys as the extraction stage wrote them
    embedding     BLOB NOT NULL              -- float32, the embedder named in meta
);
CREATE UNIQUE INDEX IF NOT EXISTS ltm_live_key ON ltm(key) WHERE status = 'live';
CREATE TABLE IF NOT EXISTS forgotten (       -- forget requests: the keys removed, never the values
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    request        TEXT NOT NULL,
    what           TEXT NOT NULL,
    keys           TEXT NOT NULL,                -- JSON list of the LTM keys removed
    session_id     TEXT,
    turn_id        TEXT,
    timestamp      TEXT,
    rows_removed   INTEGER NOT NULL,
    texts_redacted INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS extractions (     -- every extraction-stage decision, per user message
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    turn_id    TEXT NOT NULL,
    status     TEXT NOT NULL,                -- extracted | nothing | skipped
    written    TEXT NOT NULL,                -- JSON: the objects the site wrote, as written
    stored     TEXT NOT NULL,                -- JSON: [{key, value, category, action, ...}]
    refused    TEXT NOT NULL                 -- JSON: [{item, reason}]
);
"""

Action = Literal["stored", "superseded", "unchanged"]


def parse_date(timestamp: str | None) -> dt.date | None:
    """A session's date from its timestamp string (ISO first, then anything dateutil reads)."""
    if not timestamp:
        return None
    try:
        return dt.datetime.fromisoformat(timestamp.strip()).date()
    except ValueError:
        pass
    try:
        from dateutil import parser as date_parser

        return date_parser.parse(timestamp, fuzzy=True).date()
    except (ValueError, OverflowError):
        return None


# ---------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------


class LtmFact(BaseModel):
    """One live LTM row."""

    id: int
    key: str
    label: str
    value: str
    category: str
    session_id: str | None
    turn_id: str | None
    timestamp: str | None
    grounded: bool
    written_keys: list[str]
    version: int  # rows this key has had, the live one included

    @property
    def text(self) -> str:
        return f"{self.label}: {self.value}"

    def to_item(self, score: float | None = None) -> MemoryItem:
        return MemoryItem(
            id=f"ltm:{self.key}",
            text=self.text,
            score=score,
            metadata={
                "kind": "fact",
                "tier": "ltm",
                "table": "ltm",
                "row_id": self.id,
                "key": self.key,
                "written_keys": list(self.written_keys),
                "category": self.category,
                "version": self.version,
                "grounded": self.grounded,
                "session_id": self.session_id,
                "turn_ids": [self.turn_id] if self.turn_id else [],
                "timestamp": self.timestamp,
            },
        )


class MtmSummary(BaseModel):
    session_id: str
    seq: int
    summary: str
    categories: list[str]
    turn_ids: list[str]
    created_at: str | None
    expires_at: str | None

    def to_item(self) -> MemoryItem:
        return MemoryItem(
            id=f"mtm:{self.session_id}",
            text=self.summary,
            metadata={
                "kind": "summary",
                "tier": "mtm",
                "table": "mtm",
                "session_id": self.session_id,
                "categories": list(self.categories),
                "turn_ids": list(self.turn_ids),
                "timestamp": self.created_at,
                "expires_at": self.expires_at,
            },
        )


class StmTurn(BaseModel):
    turn_id: str
    session_id: str
    seq: int
    role: str
    speaker: str | None
    content: str
    timestamp: str | None
    extraction: str

    @property
    def text(self) -> str:
        return f"{self.speaker or self.role}: {self.content}"

    def to_item(self) -> MemoryItem:
        return MemoryItem(
            id=f"stm:{self.turn_id}",
            text=self.text,
            metadata={
                "kind": "turn",
                "tier": "stm",
                "table": "stm",
                "session_id": self.session_id,
                "turn_ids": [self.turn_id],
                "turn_id": self.turn_id,
                "role": self.role,
                "speaker": self.speaker,
                "timestamp": self.timestamp,
                "extraction": self.extraction,
            },
        )


# ---------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------


class TieredStore:
    """The connection to one ``tiered.sqlite`` and the live facts' vectors (by row id)."""

    def __init__(self, path: Path, embedder: Embedder):
        self.path = Path(path)
        self.embedder = embedder
        self.lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self.vectors: dict[int, np.ndarray] = {}
        self.open()

    # --- the connection --------------------------------------------------------------------

    def open(self) -> None:
        self._conn = sqlite3.connect(self.path, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        # a forgotten value is overwritten on disk, not just unlinked
        self._conn.execute("PRAGMA secure_delete = ON")
        with self._conn:
            self._conn.executescript(SCHEMA)
            version = self.meta("schema_version")
            if version is None:
                self.set_meta("schema_version", str(SCHEMA_VERSION))
            elif int(version) != SCHEMA_VERSION:
                raise ConfigError(
                    f"{self.path} has tiered schema {version}, this code reads {SCHEMA_VERSION}; "
                    "reset() the system or delete the file"
                )
        self._load_vectors()

    @property
    def db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ConfigError(f"the tiered store {self.path} is closed")
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.lock, self.db:
            yield self.db

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row["value"]

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = ?",
            (key, value, value),
        )

    def _load_vectors(self) -> None:
        """Live facts' embeddings into memory; re-embedded when another embedder wrote them."""
        with self.lock:
            rows = self.db.execute(
                "SELECT id, label, value, embedding FROM ltm WHERE status = 'live'"
            ).fetchall()
            stored_by = self.meta("embedder")
            if rows and stored_by != self.embedder.name:
                logger.warning(
                    "%s was embedded with %s, not %s; re-embedding %d facts",
                    self.path,
                    stored_by,
                    self.embedder.name,
                    len(rows),
                )
                vectors = self.embedder.embed([f"{row['label']}: {row['value']}" for row in rows])
                with self.db:
                    for row, vector in zip(rows, vectors, strict=True):
                        self.db.execute(
                            "UPDATE ltm SET embedding = ? WHERE id = ?",
                            (vector.tobytes(), row["id"]),
                        )
                    self.set_meta("embedder", self.embedder.name)
                self.vectors = {
                    row["id"]: vector for row, vector in zip(rows, vectors, strict=True)
                }
                return
            self.vectors = {
                row["id"]: np.frombuffer(row["embedding"], dtype=np.float32) for row in rows
            }

    # --- reading the tiers -------------------------------------------------------------------

    def live_facts(self) -> list[LtmFact]:
        """LTM's live rows, in the order they were written."""
        with self.lock:
            rows = self.db.execute("""
                SELECT l.*, (SELECT COUNT(*) FROM ltm h WHERE h.key = l.key) AS version
                FROM ltm l WHERE l.status = 'live' ORDER BY l.id""").fetchall()
        return [
            LtmFact(
                id=r["id"],
                key=r["key"],
                label=r["label"],
                value=r["value"],
                category=r["category"],
                session_id=r["session_id"],
                turn_id=r["turn_id"],
                timestamp=r["timestamp"],
                grounded=bool(r["grounded"]),
                written_keys=json.loads(r["written_keys"]),
                version=r["version"],
            )
            for r in rows
        ]

    def history(self, key: str) -> list[dict[str, Any]]:
        """Every row a key has had, oldest first: ``value``, ``status``, ``superseded_by``,
        ``session_id``."""
        with self.lock:
            rows = self.db.execute(
                "SELECT id, value, status, superseded_by, session_id, turn_id, timestamp FROM ltm "
                "WHERE key = ? ORDER BY id",
                (slug(key),),
            ).fetchall()
        return [dict(row) for row in rows]

    def summaries(self) -> list[MtmSummary]:
        with self.lock:
            rows = self.db.execute("SELECT * FROM mtm ORDER BY seq").fetchall()
        return [
            MtmSummary(
                session_id=r["session_id"],
                seq=r["seq"],
                summary=r["summary"],
                categories=json.loads(r["categories"]),
                turn_ids=json.loads(r["turn_ids"]),
                created_at=r["created_at"],
                expires_at=r["expires_at"],
            )
            for r in rows
        ]

    def stm_turns(self) -> list[StmTurn]:
        with self.lock:
            rows = self.db.execute("SELECT * FROM stm ORDER BY seq").fetchall()
        return [StmTurn(**dict(row)) for row in rows]

    def extractions(self) -> list[dict[str, Any]]:
        """One row per user message: what the site wrote, the facts stored, the items refused."""
        with self.lock:
            rows = self.db.execute("SELECT * FROM extractions ORDER BY id").fetchall()
        return [
            {
                **dict(r),
                "written": json.loads(r["written"]),
                "stored": json.loads(r["stored"]),
                "refused": json.loads(r["refused"]),
            }
            for r in rows
        ]

    def forgotten(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                dict(r) for r in self.db.execute("SELECT * FROM forgotten ORDER BY id").fetchall()
            ]

    def has_session(self, session_id: str) -> bool:
        with self.lock:
            return (
                self.db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
                is not None
            )

    # --- writing the conversation ----------------------------------------------------------

    def begin_conversation(self, session_id: str, day: dt.date | None) -> tuple[int, int]:
        """A new conversation: the previous one leaves STM, summaries expired by ``day`` leave MTM.
        Returns (turns rotated out, summaries expired)."""
        with self.transaction() as db:
            gone = db.execute("DELETE FROM stm WHERE session_id != ?", (session_id,)).rowcount
            expired = 0
            if day is not None:
                expired = db.execute(
                    "DELETE FROM mtm WHERE expires_at IS NOT NULL AND expires_at < ?",
                    (day.isoformat(),),
                ).rowcount
                self.set_meta("clock", day.isoformat())
            self.set_meta("current_session", session_id)
        return gone, expired

    def next_turn_seq(self) -> int:
        with self.lock:
            return int(self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM stm").fetchone()[0])

    def add_turn(
        self,
        *,
        turn_id: str,
        session_id: str,
        seq: int,
        role: str,
        speaker: str | None,
        content: str,
        timestamp: str | None,
        extraction: str,
    ) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO stm(turn_id, session_id, seq, role, speaker, content, "
                "timestamp, extraction) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (turn_id, session_id, seq, role, speaker, content, timestamp, extraction),
            )

    def record_extraction(
        self,
        session_id: str,
        turn_id: str,
        status: str,
        written: list[Any],
        stored: list[dict[str, Any]],
        refused: list[dict[str, Any]],
    ) -> None:
        kind = "skipped" if status.startswith("skipped") else "extracted" if written else "nothing"
        with self.transaction() as db:
            db.execute(
                "INSERT INTO extractions(session_id, turn_id, status, written, stored, refused) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    turn_id,
                    kind,
                    json.dumps(written),
                    json.dumps(stored),
                    json.dumps(refused),
                ),
            )
            db.execute("UPDATE stm SET extraction = ? WHERE turn_id = ?", (status, turn_id))

    def end_conversation(
        self,
        session_id: str,
        timestamp: str | None,
        turns: int,
        summary: str,
        categories: list[str],
        turn_ids: list[str],
    ) -> None:
        """The conversation's MTM summary (none when empty), then the session marked ingested."""
        day = parse_date(timestamp)
        expires = (day + dt.timedelta(days=MTM_TTL_DAYS)).isoformat() if day else None
        with self.transaction() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM sessions").fetchone()[0]
            if summary:
                db.execute(
                    "INSERT OR REPLACE INTO mtm(session_id, seq, summary, categories, turn_ids, "
                    "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        session_id,
                        seq,
                        summary,
                        json.dumps(categories),
                        json.dumps(turn_ids),
                        timestamp,
                        expires,
                    ),
                )
            else:
                logger.info("tiered: session %s got an empty summary; no MTM row", session_id)
            # Last: a session counts as ingested once its facts and summary are stored.
            db.execute(
                "INSERT INTO sessions(id, seq, timestamp, turns) VALUES (?, ?, ?, ?)",
                (session_id, seq, timestamp, turns),
            )

    # --- writing LTM ----------------------------------------------------------------------

    def store_fact(
        self,
        fact: Fact,
        *,
        session_id: str | None = None,
        turn_id: str | None = None,
        timestamp: str | None = None,
        is_grounded: bool = True,
    ) -> Action:
        """Write one fact: a new key is stored, a new value for a held key supersedes the old
        row."""
        with self.lock:
            live = self.db.execute(
                "SELECT id, value FROM ltm WHERE key = ? AND status = 'live'", (fact.key,)
            ).fetchone()
        if live is not None and normalize_value(live["value"]) == normalize_value(fact.value):
            return "unchanged"
        vector = self.embedder.embed_one(f"{fact.label}: {fact.value}").astype(np.float32)
        with self.transaction() as db:
            if live is not None:
                db.execute("UPDATE ltm SET status = 'superseded' WHERE id = ?", (live["id"],))
            row = (
                fact.key,
                fact.label,
                fact.value,
                fact.category,
                session_id,
                turn_id,
                timestamp,
                int(is_grounded),
                json.dumps(fact.written_keys),
                vector.tobytes(),
            )
            new_id = db.execute(
                "INSERT INTO ltm(key, label, value, category, status, session_id, turn_id, "
                "timestamp, grounded, written_keys, embedding) "
                "VALUES (?, ?, ?, ?, 'live', ?, ?, ?, ?, ?, ?)",
                row,
            ).lastrowid
            assert new_id is not None  # an INSERT's row id
            if live is not None:
                db.execute("UPDATE ltm SET superseded_by = ? WHERE id = ?", (new_id, live["id"]))
                self.vectors.pop(live["id"], None)
            self.set_meta("embedder", self.embedder.name)
            self.vectors[new_id] = vector
        return "superseded" if live is not None else "stored"

    def delete_keys(self, keys: list[str]) -> list[sqlite3.Row]:
        """Remove every row (live and history) of ``keys``; returns the rows removed (``id``,
        ``value``). Call inside :meth:`transaction`."""
        if not keys:
            return []
        marks = ",".join("?" * len(keys))
        rows = self.db.execute(
            f"SELECT id, value FROM ltm WHERE key IN ({marks})", keys
        ).fetchall()
        self.db.execute(f"DELETE FROM ltm WHERE key IN ({marks})", keys)
        for row in rows:
            self.vectors.pop(row["id"], None)
        return rows

    def set_text(self, tier: str, ident: str, text: str) -> None:
        """Replace an MTM summary's or an STM turn's text."""
        with self.transaction() as db:
            if tier == "mtm":
                db.execute("UPDATE mtm SET summary = ? WHERE session_id = ?", (text, ident))
            elif tier == "stm":
                db.execute("UPDATE stm SET content = ? WHERE turn_id = ?", (text, ident))
            else:
                raise KeyError(f"tiered has no tier {tier!r} with text to set")

    def delete_unit(self, tier: str, ident: str) -> None:
        """Remove one memory unit: an LTM key (with its history), an MTM summary or an STM turn."""
        with self.transaction() as db:
            if tier == "ltm":
                self.delete_keys([ident])
            elif tier == "mtm":
                db.execute("DELETE FROM mtm WHERE session_id = ?", (ident,))
            elif tier == "stm":
                db.execute("DELETE FROM stm WHERE turn_id = ?", (ident,))
            else:
                raise KeyError(f"tiered has no tier {tier!r}")
