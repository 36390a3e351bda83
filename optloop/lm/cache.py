"""The persistent LM call cache: responses in SQLite, keyed by everything that shapes the
answer."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from optloop.errors import ConfigError

CACHE_FORMAT = 1


class LMCache:
    """Responses keyed by (model, messages, schema, sampling params, decoding settings), in SQLite.

    SQLite gives atomic writes and safe concurrent readers, so a killed process
    never leaves a half-written entry and a restart finds every finished call.

    ``lazy=True`` opens an existing file now (a corrupt one fails here, before a run
    writes anything) but creates a missing one only on first use, so an LM whose
    endpoint turns out to be unreachable at startup leaves no empty cache file behind.
    """

    def __init__(self, path: Path, *, lazy: bool = False):
        self.path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        if not lazy or path.exists():
            self._connect()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        try:
            # quick_check reads every page once (milliseconds for a cache of some MB): a truncated
            # or overwritten file fails here, before a run writes anything, not in its 500th call.
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check and check[0] != "ok":
                raise sqlite3.DatabaseError(str(check[0]))
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, response TEXT "
                "NOT NULL, created REAL, seconds REAL)"
            )
            columns = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
            if "seconds" not in columns:  # a cache written before responses kept their time
                conn.execute("ALTER TABLE responses ADD COLUMN seconds REAL")
            conn.commit()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._corrupt(exc) from None
        self._conn = conn
        return conn

    @property
    def opened(self) -> bool:
        return self._conn is not None

    def _corrupt(self, exc: Exception) -> ConfigError:
        return ConfigError(
            f"the LM cache {self.path} is corrupt ({exc}); delete it (or pass --no-cache) "
            "and rerun"
        )

    @staticmethod
    def key(payload: dict[str, Any]) -> str:
        blob = json.dumps(
            {"v": CACHE_FORMAT, **payload}, sort_keys=True, ensure_ascii=False, default=str
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        hit = self.get_timed(key)
        return None if hit is None else hit[0]

    def get_timed(self, key: str) -> tuple[dict[str, Any], float | None] | None:
        """The response stored under ``key`` and the seconds the model took to compute it
        (``None`` for a response stored without them)."""
        try:
            with self._lock:
                row = (
                    self._connect()
                    .execute("SELECT response, seconds FROM responses WHERE key = ?", (key,))
                    .fetchone()
                )
            return (json.loads(row[0]), row[1]) if row else None
        except (sqlite3.DatabaseError, json.JSONDecodeError) as exc:
            raise self._corrupt(exc) from None

    def put(self, key: str, response: dict[str, Any], seconds: float | None = None) -> None:
        """Store ``response`` under ``key`` with the ``seconds`` the model took to compute it
        (what a replay of it reports: :attr:`~optloop.lm.accounting.CallRecord.replayed_s`)."""
        try:
            with self._lock:
                conn = self._connect()
                conn.execute(
                    "INSERT OR REPLACE INTO responses (key, response, created, seconds) "
                    "VALUES (?, ?, ?, ?)",
                    (key, json.dumps(response), time.time(), seconds),
                )
                conn.commit()
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None

    def __len__(self) -> int:
        with self._lock:
            return self._connect().execute("SELECT COUNT(*) FROM responses").fetchone()[0]
