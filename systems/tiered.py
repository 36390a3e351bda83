"""``tiered``: a three-tier personal-assistant memory (short / mid / long term) in one SQLite file.

The pattern of a local personal assistant. Everything lives in ``<run_dir>/tiered.sqlite``:

**STM** (table ``stm``)
    the current conversation's turns. A new conversation (the next session) replaces
    them; until then they are the assistant's chat history, always put in context.
**MTM** (table ``mtm``)
    one summary per past conversation, written by the ``tiered.summarize`` site when the
    conversation ends, and time-limited: a summary expires ``MTM_TTL_DAYS`` after its
    conversation and is purged when a later conversation starts after that.
**LTM** (table ``ltm``)
    permanent user facts as key|value rows, each with its embedding (the project's
    embedder, MiniLM by default). The dedicated **extraction stage**, the
    ``tiered.extract`` site, runs after every user message and answers ``Key|Value``
    lines (:func:`parse_fact_lines` reads them; malformed lines are kept in the
    ``extractions`` table with the reason).

Updates and forgetting are explicit:

- *Supersede*: a new value for a key already held becomes the live row; the old row
  stays as history (``status = 'superseded'``, ``superseded_by`` the new row). Several
  values for one key in a single message are a list, not an update: they are stored
  together as one value.
- *Forget*: a deterministic rule, not the LM. A user message that starts as a request
  to forget, delete or erase something (:func:`forget_request`) removes every LTM key
  that best matches what it names, with the key's history rows, and replaces the
  removed values, and any sentence that uses every word of the request, by
  ``[forgotten]`` in the STM turns and MTM summaries (:func:`redact`); the
  ``forgotten`` table keeps the request and the keys, never a value. Such
  a message is a command, so it is **not** sent to the extraction stage: a fact stated
  in the same message is lost (the "path that skips extraction" of issue 22, which the
  graph shows as the turn's ``extraction`` status). A ``FORGET|key`` line from the
  extraction site is not obeyed: it is recorded as malformed.

Retrieval (``retrieve``) puts in context, in this order: the ``top_k`` LTM facts most
similar to the question (at least ``threshold``), the ``mtm_summaries`` most recent
conversation summaries, and the last ``stm_turns`` turns of the current conversation.
The ``search_recipe`` knob decides which facts and summaries may be searched at all:
``similarity`` (every one), ``category`` (only the category the question is routed to,
:func:`category_of`) or ``category:<name>`` (only that category). Every fact's category
is fixed from its key when it is stored.

What attribution sees: every row that retrieval can return is a memory unit
(``all_memories``): ``ltm:<key>`` (a supersede is an update of that unit, a forget its
deletion), ``mtm:<session>`` and ``stm:<turn>``, each with its table, row and
provenance in ``metadata``. STM turns are context, not stored memory: they are left out
of :meth:`TieredSystem.retrievable_kinds`, so a fact that only the conversation held is
judged never stored (and the extraction site blamed) rather than deleted when the next
conversation replaced the turns.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, Field

from optloop.errors import ConfigError
from optloop.sites import QUERY_REWRITE, TIERED_EXTRACT, TIERED_SUMMARIZE
from optloop.text import sentences, singular
from optloop.text import words as text_words
from signatures.tiered import ExtractKeyValueFacts, SummarizeConversation
from systems.base import MemoryItem, MemorySystem, PromptSite

if TYPE_CHECKING:
    from optloop.datasets import Session, Turn
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DB_FILE = "tiered.sqlite"
MTM_TTL_DAYS = 30
EXTRACT_CONTEXT_TURNS = 4  # STM turns shown to the extraction stage before the message
MAX_KNOWN_KEYS = 40
FORGOTTEN = "[forgotten]"

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
CREATE TABLE IF NOT EXISTS ltm (             -- long term: key|value facts, history kept
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    key           TEXT NOT NULL,
    label         TEXT NOT NULL,
    value         TEXT NOT NULL,
    category      TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('live', 'superseded')),
    superseded_by INTEGER REFERENCES ltm(id),
    session_id    TEXT,
    turn_id       TEXT,
    timestamp     TEXT,
    grounded      INTEGER NOT NULL,          -- the value's words occur in the message or its context
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
    lines      TEXT NOT NULL,                -- JSON: the site's raw lines
    stored     TEXT NOT NULL,                -- JSON: [{key, value, action}]
    malformed  TEXT NOT NULL                 -- JSON: [{line, reason}]
);
"""

# ---------------------------------------------------------------------------
# Words, keys and categories
# ---------------------------------------------------------------------------

_STOPWORDS = frozenset("""a an the i me my mine we our you your he she it its they them their is am are was were be
been being do does did have has had of to in on at for with from by about as and or but not no so that this these
those what which who whom when where why how please can could would will just also all any some anything everything
now then there here from user users s""".split())


def words(text: str) -> set[str]:
    """Content words (the one tokenizer, optloop.text.words, singular, stop words out); ``_`` splits words."""
    return {singular(t) for t in text_words(text.replace("_", " ")) if t not in _STOPWORDS}


def normalize_value(value: str) -> str:
    return " ".join(value.lower().split()).strip(" .")


def slug(key: str) -> str:
    """A key as stored: lower case, words joined by ``_``, without a leading ``my_`` / ``user_``."""
    text = re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")
    for prefix in ("user_s_", "users_", "user_", "my_", "the_"):
        if text.startswith(prefix) and len(text) > len(prefix):
            text = text[len(prefix):]
    return text


def label_of(key: str) -> str:
    """A stored key as words: ``sister_name`` -> ``sister name``."""
    return key.replace("_", " ")


CATEGORIES: dict[str, frozenset[str]] = {
    "pets": frozenset("pet dog cat puppy kitten hamster parrot rabbit horse fish vet groomer".split()),
    "family": frozenset("""family sister brother sibling mother mom mum father dad parent niece nephew cousin aunt uncle
        grandmother grandma grandfather grandpa grandparent son daughter child kid baby wife husband partner spouse
        fiance fiancee""".split()),
    "people": frozenset("friend neighbour neighbor roommate flatmate birthday anniversary".split()),
    "work": frozenset("""work job career manager boss colleague coworker office employer company team project salary
        occupation profession role client""".split()),
    "health": frozenset("""health allergy allergic doctor dentist medication medicine gluten vegan vegetarian diet
        blood condition therapist""".split()),
    "travel": frozenset("""travel trip flight seat gate train platform airport hotel passport ticket vacation holiday
        departure depart""".split()),
    "home": frozenset("""home address city town live flat apartment house street neighbourhood neighborhood storage
        garage parking car moved""".split()),
    "food": frozenset("food tea coffee drink dish meal cuisine restaurant fruit snack dessert wine beer".split()),
    "finance": frozenset("bank account card budget rent loan pin savings".split()),
    "schedule": frozenset("appointment meeting schedule class lesson deadline".split()),
}
GENERAL = "general"


def category_of(text: str) -> str:
    """The first category (in :data:`CATEGORIES` order) one of whose words ``text`` uses, else ``general``."""
    tokens = words(text)
    return next((name for name, vocabulary in CATEGORIES.items() if tokens & vocabulary), GENERAL)


# ---------------------------------------------------------------------------
# The extraction stage's answer: Key|Value lines
# ---------------------------------------------------------------------------


class FactLine(BaseModel):
    """One fact the extraction stage wrote, as parsed (several lines for one key already merged)."""

    key: str
    label: str
    value: str
    lines: list[str]
    separator: str = "|"  # "|" as asked; ":" or "=" when a line was repaired


class MalformedLine(BaseModel):
    line: str
    reason: str


class ParsedExtraction(BaseModel):
    facts: list[FactLine] = Field(default_factory=list)
    malformed: list[MalformedLine] = Field(default_factory=list)


_BULLET = re.compile(r"^\s*(?:[-*\u2022]+|\d+[.)])\s+")
_PLACEHOLDERS = frozenset({"", "value", "values", "unknown", "none", "n/a", "na", "null", "nil", "?", "-", "...",
                           "tbd", "not mentioned", "not given"})
_TEMPLATE_KEYS = frozenset({"key", "keys", "attribute", "fact", "name_of_attribute"})
MAX_KEY_WORDS = 6
MAX_KEY_CHARS = 60
MAX_VALUE_CHARS = 200


def _parse_line(line: str) -> FactLine | MalformedLine | None:
    text = _BULLET.sub("", line).strip().strip("`\"'").strip()
    if not text:
        return None
    separator = "|"
    if "|" in text:
        parts = [part.strip() for part in text.split("|")]
        parts = [part for part in parts if part]  # "| key | value |", "key||value"
        if len(parts) < 2:
            return MalformedLine(line=line, reason="nothing on one side of '|'")
        key, value = parts[0], ", ".join(parts[1:])
    else:
        match = re.match(rf"^([^:=]{{1,{MAX_KEY_CHARS}}})\s*[:=]\s*(.+)$", text)
        if match is None or len(match[1].split()) > MAX_KEY_WORDS:
            return MalformedLine(line=line, reason="no '|' between a key and a value")
        key, value, separator = match[1].strip(), match[2].strip(), "=" if "=" in text[:len(match[1]) + 2] else ":"
    key_slug = slug(key)
    value = value.strip().rstrip(".").strip()
    if not key_slug:
        return MalformedLine(line=line, reason="empty key")
    if key_slug == "forget":
        return MalformedLine(line=line,
                             reason="FORGET lines are not obeyed: forgetting is the deterministic rule's job")
    if key_slug in _TEMPLATE_KEYS:
        return MalformedLine(line=line, reason="the key is the format's placeholder")
    if len(key_slug.split("_")) > MAX_KEY_WORDS or len(key_slug) > MAX_KEY_CHARS:
        return MalformedLine(line=line, reason="the key is a sentence, not an attribute name")
    if normalize_value(value) in _PLACEHOLDERS:
        return MalformedLine(line=line, reason="no value (empty or a placeholder)")
    if len(value) > MAX_VALUE_CHARS:
        return MalformedLine(line=line, reason=f"the value is longer than {MAX_VALUE_CHARS} characters")
    return FactLine(key=key_slug, label=label_of(key_slug), value=value, lines=[line], separator=separator)


def parse_fact_lines(items: Sequence[Any] | str | None) -> ParsedExtraction:
    """The extraction stage's answer as facts and malformed lines.

    Accepts a list of lines (what the site's schema asks for), a list whose items hold several
    lines, or one string. Bullets, numbering and quotes are stripped; ``key: value`` and
    ``key = value`` are accepted as repairs of ``key|value`` (the fact records its separator);
    a line with more than one ``|`` keeps the first field as key and the rest as its value.
    Several values for one key become one value, ``a, b, c`` (a list, not an update).
    """
    if items is None:
        return ParsedExtraction()
    raw_items = [items] if isinstance(items, str) else list(items)
    parsed = ParsedExtraction()
    by_key: dict[str, FactLine] = {}
    for item in raw_items:
        for line in str(item).splitlines():
            result = _parse_line(line)
            if result is None:
                continue
            if isinstance(result, MalformedLine):
                parsed.malformed.append(result)
            elif result.key in by_key:
                known = by_key[result.key]
                known.lines.append(line)
                if normalize_value(result.value) not in {normalize_value(v) for v in known.value.split(", ")}:
                    known.value = f"{known.value}, {result.value}"
            else:
                by_key[result.key] = result
                parsed.facts.append(result)
    return parsed


def grounded(value: str, source: str) -> bool:
    """Whether at least half of the value's content words occur in ``source`` (the message and its context)."""
    value_words = words(value)
    if not value_words:
        return normalize_value(value) in normalize_value(source)
    return len(value_words & words(source)) / len(value_words) >= 0.5


# ---------------------------------------------------------------------------
# The forget rule
# ---------------------------------------------------------------------------

_FORGET = re.compile(
    r"^\s*(?:(?:ok(?:ay)?|hey|also|and|so|oh|hi|right|actually|please)\b[\s,!.]*)*"
    r"(?:(?:can|could|would|will)\s+you\s+)?(?:please\s+)?"
    r"(?:forget|delete|erase|remove|wipe)\b\s*(?P<what>.*)$",
    re.IGNORECASE | re.DOTALL)
_WHAT_END = re.compile(r"[,.;!?]|\s-\s|\bbecause\b|\bsince\b|\bas\s+i\b|\bi\s+(?:don'?t|do\s+not)\b", re.IGNORECASE)
_WHAT_FILLER = re.compile(r"\b(?:about|all|everything|anything|please|from|your|memory|that|what|you\s+know)\b",
                          re.IGNORECASE)


def forget_request(message: str) -> str | None:
    """What a "forget ..." request names (``"code for my storage unit"``), or ``None`` if the message is not one.

    Only a message that *starts* as a request counts ("Please forget my locker code",
    "Could you delete my old address?"); "I always forget my keys" does not.
    """
    match = _FORGET.match(message)
    if match is None:
        return None
    what = _WHAT_END.split(match["what"], maxsplit=1)[0]
    what = " ".join(_WHAT_FILLER.sub(" ", what).split())
    return what


# ---------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------


def _parse_date(timestamp: str | None) -> dt.date | None:
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
    version: int  # rows this key has had, the live one included

    @property
    def text(self) -> str:
        return f"{self.label}: {self.value}"

    def to_item(self, score: float | None = None) -> MemoryItem:
        return MemoryItem(id=f"ltm:{self.key}", text=self.text, score=score, metadata={
            "kind": "fact", "tier": "ltm", "table": "ltm", "row_id": self.id, "key": self.key,
            "category": self.category, "version": self.version, "grounded": self.grounded,
            "session_id": self.session_id, "turn_ids": [self.turn_id] if self.turn_id else [],
            "timestamp": self.timestamp})


class MtmSummary(BaseModel):
    session_id: str
    seq: int
    summary: str
    categories: list[str]
    turn_ids: list[str]
    created_at: str | None
    expires_at: str | None

    def to_item(self) -> MemoryItem:
        return MemoryItem(id=f"mtm:{self.session_id}", text=self.summary, metadata={
            "kind": "summary", "tier": "mtm", "table": "mtm", "session_id": self.session_id,
            "categories": list(self.categories), "turn_ids": list(self.turn_ids), "timestamp": self.created_at,
            "expires_at": self.expires_at})


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
        return MemoryItem(id=f"stm:{self.turn_id}", text=self.text, metadata={
            "kind": "turn", "tier": "stm", "table": "stm", "session_id": self.session_id,
            "turn_ids": [self.turn_id], "turn_id": self.turn_id, "role": self.role, "speaker": self.speaker,
            "timestamp": self.timestamp, "extraction": self.extraction})


Action = Literal["stored", "superseded", "unchanged"]


# ---------------------------------------------------------------------------
# The system
# ---------------------------------------------------------------------------


class TieredSystem(MemorySystem):
    """STM / MTM / LTM in one SQLite file; see the module docstring."""

    name: ClassVar[str] = "tiered"
    default_knobs: ClassVar[dict[str, Any]] = {"top_k": 5, "threshold": 0.1, "mtm_summaries": 2, "stm_turns": 6,
                                               "search_recipe": "similarity"}
    # The values an optimizer may try per knob (the protocol's knob spaces).
    knob_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "top_k": (1, 3, 5, 10, 20), "threshold": (0.0, 0.1, 0.2, 0.3, 0.4), "mtm_summaries": (0, 1, 2, 3, 5),
        "stm_turns": (0, 2, 6, 12), "search_recipe": ("similarity", "category")}
    # The knob that decides what a search returns: a fact outside the recipe's categories is never found.
    search_knob: ClassVar[str | None] = "search_recipe"
    # Short Key|Value lines and a few-sentence summary: bounds that keep a local model's answers closed.
    local_decoding: ClassVar[dict[str, int]] = {"max_array_items": 6, "max_string_chars": 160}
    RECIPES: ClassVar[tuple[str, ...]] = ("similarity", "category")

    def __init__(self, lm: OptloopLM, run_dir: Path, *, embedder: Embedder | None = None,
                 knobs: dict[str, Any] | None = None, query_site: bool = False):
        super().__init__(lm, run_dir, embedder=embedder, knobs=knobs, query_site=query_site)
        for name, value in self._knobs.items():
            self._check_knob(name, value)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._vectors: dict[int, np.ndarray] = {}
        self._open()

    def _build_sites(self) -> None:
        self._sites[TIERED_EXTRACT] = PromptSite.from_signature(
            TIERED_EXTRACT, "ingest", ExtractKeyValueFacts, op_kinds=("extract", "store", "update"), layout="dspy")
        self._sites[TIERED_SUMMARIZE] = PromptSite.from_signature(
            TIERED_SUMMARIZE, "ingest", SummarizeConversation, op_kinds=("summarize", "store"), layout="dspy")

    # --- the database ---------------------------------------------------------------------

    @property
    def db_path(self) -> Path:
        return self.run_dir / DB_FILE

    def _open(self) -> None:
        self._conn = sqlite3.connect(self.db_path, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA secure_delete = ON")  # a forgotten value is overwritten on disk, not just unlinked
        with self._conn:
            self._conn.executescript(SCHEMA)
            version = self._meta("schema_version")
            if version is None:
                self._set_meta("schema_version", str(SCHEMA_VERSION))
            elif int(version) != SCHEMA_VERSION:
                raise ConfigError(f"{self.db_path} has tiered schema {version}, this code reads {SCHEMA_VERSION}; "
                                  "reset() the system or delete the file")
        self._load_vectors()

    @property
    def db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ConfigError(f"tiered system on {self.run_dir} is closed")
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self.db:
            yield self.db

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row["value"]

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = ?",
                        (key, value, value))

    def _load_vectors(self) -> None:
        """Live facts' embeddings into memory; re-embedded when another embedder wrote them."""
        with self._lock:
            rows = self.db.execute("SELECT id, label, value, embedding FROM ltm WHERE status = 'live'").fetchall()
            stored_by = self._meta("embedder")
            if rows and stored_by != self.embedder.name:
                logger.warning("%s was embedded with %s, not %s; re-embedding %d facts", self.db_path, stored_by,
                               self.embedder.name, len(rows))
                vectors = self.embedder.embed([f"{row['label']}: {row['value']}" for row in rows])
                with self.db:
                    for row, vector in zip(rows, vectors, strict=True):
                        self.db.execute("UPDATE ltm SET embedding = ? WHERE id = ?", (vector.tobytes(), row["id"]))
                    self._set_meta("embedder", self.embedder.name)
                self._vectors = {row["id"]: vector for row, vector in zip(rows, vectors, strict=True)}
                return
            self._vectors = {row["id"]: np.frombuffer(row["embedding"], dtype=np.float32) for row in rows}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def reset(self) -> None:
        self.close()
        self._clear_run_dir()
        self._open()

    # --- reading the tiers ----------------------------------------------------------------

    def live_facts(self) -> list[LtmFact]:
        """LTM's live rows, in the order they were written."""
        with self._lock:
            rows = self.db.execute("""
                SELECT l.*, (SELECT COUNT(*) FROM ltm h WHERE h.key = l.key) AS version
                FROM ltm l WHERE l.status = 'live' ORDER BY l.id""").fetchall()
        return [LtmFact(id=r["id"], key=r["key"], label=r["label"], value=r["value"], category=r["category"],
                        session_id=r["session_id"], turn_id=r["turn_id"], timestamp=r["timestamp"],
                        grounded=bool(r["grounded"]), version=r["version"]) for r in rows]

    def history(self, key: str) -> list[dict[str, Any]]:
        """Every row a key has had, oldest first: ``value``, ``status``, ``superseded_by``, ``session_id``."""
        with self._lock:
            rows = self.db.execute("SELECT id, value, status, superseded_by, session_id, turn_id, timestamp FROM ltm "
                                   "WHERE key = ? ORDER BY id", (slug(key),)).fetchall()
        return [dict(row) for row in rows]

    def summaries(self) -> list[MtmSummary]:
        with self._lock:
            rows = self.db.execute("SELECT * FROM mtm ORDER BY seq").fetchall()
        return [MtmSummary(session_id=r["session_id"], seq=r["seq"], summary=r["summary"],
                           categories=json.loads(r["categories"]), turn_ids=json.loads(r["turn_ids"]),
                           created_at=r["created_at"], expires_at=r["expires_at"]) for r in rows]

    def stm_turns(self) -> list[StmTurn]:
        with self._lock:
            rows = self.db.execute("SELECT * FROM stm ORDER BY seq").fetchall()
        return [StmTurn(**dict(row)) for row in rows]

    def extractions(self) -> list[dict[str, Any]]:
        """The ``extractions`` table: one row per user message, with its lines, stored facts and malformed lines."""
        with self._lock:
            rows = self.db.execute("SELECT * FROM extractions ORDER BY id").fetchall()
        return [{**dict(r), "lines": json.loads(r["lines"]), "stored": json.loads(r["stored"]),
                 "malformed": json.loads(r["malformed"])} for r in rows]

    def forgotten(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self.db.execute("SELECT * FROM forgotten ORDER BY id").fetchall()]

    def all_memories(self) -> list[MemoryItem]:
        return ([fact.to_item() for fact in self.live_facts()] + [summary.to_item() for summary in self.summaries()]
                + [turn.to_item() for turn in self.stm_turns()])

    def retrievable_kinds(self) -> set[str] | None:
        return {"fact", "summary"}  # STM turns are the conversation itself, not stored memory

    # --- ingestion ------------------------------------------------------------------------

    def ingest(self, sessions: Sequence[Session]) -> None:
        for session in sessions:
            with self._lock:
                done = self.db.execute("SELECT 1 FROM sessions WHERE id = ?", (session.id,)).fetchone()
            if done:
                logger.info("tiered: session %s is already stored; skipping it", session.id)
                continue
            self._ingest_session(session)

    def _ingest_session(self, session: Session) -> None:
        self._begin_conversation(session)
        with self._lock:
            base = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM stm").fetchone()[0]
        stored_categories: set[str] = set()
        for offset, turn in enumerate(session.turns, 1):
            with self._transaction() as db:
                db.execute("INSERT OR REPLACE INTO stm(turn_id, session_id, seq, role, speaker, content, timestamp, "
                           "extraction) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           (turn.id, session.id, base + offset, turn.role, turn.speaker, turn.content,
                            session.timestamp, "not a user message" if turn.role != "user" else "pending"))
            if turn.role == "user":
                stored_categories |= self._after_user_message(session, turn)
        self._end_conversation(session, stored_categories)

    def _begin_conversation(self, session: Session) -> None:
        """A new conversation: the previous one leaves STM; summaries past their expiry leave MTM."""
        today = _parse_date(session.timestamp)
        with self._transaction() as db:
            gone = db.execute("DELETE FROM stm WHERE session_id != ?", (session.id,)).rowcount
            expired = 0
            if today is not None:
                expired = db.execute("DELETE FROM mtm WHERE expires_at IS NOT NULL AND expires_at < ?",
                                     (today.isoformat(),)).rowcount
            self._set_meta("current_session", session.id)
            if today is not None:
                self._set_meta("clock", today.isoformat())
        logger.debug("tiered: session %s begins (%d STM turns rotated out, %d summaries expired)", session.id, gone,
                     expired)

    def _after_user_message(self, session: Session, turn: Turn) -> set[str]:
        """The extraction stage for one user message (or the forget rule); the categories it stored."""
        what = forget_request(turn.content)
        if what is not None:
            keys = self.forget(what, request=turn.content, session=session, turn_id=turn.id)
            status = f"skipped: forget request ({', '.join(keys) if keys else 'no stored key matched'})"
            self._record_extraction(session, turn, status, [], [], [])
            return set()
        context = [t for t in self.stm_turns() if t.turn_id != turn.id][-EXTRACT_CONTEXT_TURNS:]
        conversation = "\n".join(t.text for t in context) or "(start of conversation)"
        known = [fact.key for fact in self.live_facts()][-MAX_KNOWN_KEYS:]
        prediction = self._sites[TIERED_EXTRACT](self.lm, known_keys=", ".join(known) or "(none)",
                                                 conversation=conversation, message=turn.content)
        raw = prediction.facts
        lines = [str(x) for x in raw] if isinstance(raw, list) else ([] if raw is None else [str(raw)])
        parsed = parse_fact_lines(lines)
        source = f"{conversation}\n{turn.content}"
        stored = []
        for fact in parsed.facts:
            action = self.store_fact(fact, session=session, turn_id=turn.id, is_grounded=grounded(fact.value, source))
            stored.append({"key": fact.key, "value": fact.value, "action": action, "separator": fact.separator})
        for bad in parsed.malformed:
            logger.info("tiered: malformed extraction line for %s (%s): %r", turn.id, bad.reason, bad.line)
        changed = [s for s in stored if s["action"] != "unchanged"]
        status = f"extracted: {len(changed)} fact(s)" if changed else "nothing new"
        if parsed.malformed:
            status += f", {len(parsed.malformed)} malformed line(s)"
        self._record_extraction(session, turn, status, lines, stored,
                                [bad.model_dump() for bad in parsed.malformed])
        return {category_of(fact.key) for fact in parsed.facts}

    def _record_extraction(self, session: Session, turn: Turn, status: str, lines: list[str],
                           stored: list[dict[str, Any]], malformed: list[dict[str, Any]]) -> None:
        kind = "skipped" if status.startswith("skipped") else "extracted" if lines else "nothing"
        with self._transaction() as db:
            db.execute("INSERT INTO extractions(session_id, turn_id, status, lines, stored, malformed) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       (session.id, turn.id, kind, json.dumps(lines), json.dumps(stored), json.dumps(malformed)))
            db.execute("UPDATE stm SET extraction = ? WHERE turn_id = ?", (status, turn.id))

    def _end_conversation(self, session: Session, stored_categories: set[str]) -> None:
        """The summarize site writes the conversation's MTM summary; the session is then marked ingested."""
        turns = [t for t in self.stm_turns() if t.session_id == session.id]
        header = f"Conversation {session.id}" + (f" ({session.timestamp})" if session.timestamp else "")
        conversation = "\n".join([header, *(t.text for t in turns)])
        summary = str(self._sites[TIERED_SUMMARIZE](self.lm, conversation=conversation).summary or "").strip()
        day = _parse_date(session.timestamp)
        expires = (day + dt.timedelta(days=MTM_TTL_DAYS)).isoformat() if day else None
        categories = sorted(stored_categories | ({category_of(summary)} - {GENERAL}))
        with self._transaction() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM sessions").fetchone()[0]
            if summary:
                db.execute("INSERT OR REPLACE INTO mtm(session_id, seq, summary, categories, turn_ids, created_at, "
                           "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (session.id, seq, summary, json.dumps(categories), json.dumps([t.turn_id for t in turns]),
                            session.timestamp, expires))
            else:
                logger.info("tiered: session %s got an empty summary; no MTM row", session.id)
            # Last: a session counts as ingested once its facts and summary are stored.
            db.execute("INSERT INTO sessions(id, seq, timestamp, turns) VALUES (?, ?, ?, ?)",
                       (session.id, seq, session.timestamp, len(session.turns)))

    # --- writing LTM ----------------------------------------------------------------------

    def store_fact(self, fact: FactLine, *, session: Session | None = None, turn_id: str | None = None,
                   is_grounded: bool = True) -> Action:
        """Write one fact: a new key is stored, a new value for a held key supersedes the old row."""
        with self._lock:
            live = self.db.execute("SELECT id, value FROM ltm WHERE key = ? AND status = 'live'",
                                   (fact.key,)).fetchone()
        if live is not None and normalize_value(live["value"]) == normalize_value(fact.value):
            return "unchanged"
        vector = self.embedder.embed_one(f"{fact.label}: {fact.value}")
        with self._transaction() as db:
            if live is not None:
                db.execute("UPDATE ltm SET status = 'superseded' WHERE id = ?", (live["id"],))
            new_id = db.execute(
                "INSERT INTO ltm(key, label, value, category, status, session_id, turn_id, timestamp, grounded, "
                "embedding) VALUES (?, ?, ?, ?, 'live', ?, ?, ?, ?, ?)",
                (fact.key, fact.label, fact.value, category_of(fact.key), session.id if session else None, turn_id,
                 session.timestamp if session else None, int(is_grounded), vector.astype(np.float32).tobytes()),
            ).lastrowid
            assert new_id is not None  # an INSERT's row id
            if live is not None:
                db.execute("UPDATE ltm SET superseded_by = ? WHERE id = ?", (new_id, live["id"]))
                self._vectors.pop(live["id"], None)
            self._set_meta("embedder", self.embedder.name)
            self._vectors[int(new_id)] = vector.astype(np.float32)
        if not is_grounded:
            logger.info("tiered: %s=%r is not in the message it was extracted from", fact.key, fact.value)
        return "superseded" if live is not None else "stored"

    def match_keys(self, what: str) -> list[str]:
        """The live keys a forget request's words name best (key and value words); ties all match."""
        wanted = words(what)
        facts = self.live_facts()
        if not wanted or not facts:
            return []
        scores = {fact.key: len(wanted & (words(fact.label) | words(fact.value))) / len(wanted) for fact in facts}
        best = max(scores.values())
        if best >= 0.5:
            return [key for key, score in scores.items() if score == best]
        query = self.embedder.embed_one(what)
        similarity = {fact.key: float(self._vectors[fact.id] @ query) for fact in facts if fact.id in self._vectors}
        key, score = max(similarity.items(), key=lambda pair: pair[1], default=(None, 0.0))
        return [key] if key is not None and score >= 0.6 else []

    def forget(self, what: str, *, request: str = "", session: Session | None = None,
               turn_id: str | None = None) -> list[str]:
        """Forget what ``what`` names: the best-matching LTM keys go (live row and history), and their values,
        and every sentence using all of ``what``'s words, become ``[forgotten]`` in STM and MTM (the request's
        own turn excepted). Returns the keys removed; the ``forgotten`` table records the request."""
        keys = self.match_keys(what)
        what_words = subject_words(what)
        with self._transaction() as db:
            rows = db.execute(f"SELECT id, value FROM ltm WHERE key IN ({','.join('?' * len(keys))})",
                              keys).fetchall() if keys else []
            values = sorted({row["value"] for row in rows}, key=len, reverse=True)
            if keys:
                db.execute(f"DELETE FROM ltm WHERE key IN ({','.join('?' * len(keys))})", keys)
            for row in rows:
                self._vectors.pop(row["id"], None)
            redacted = 0
            for table, id_column, text_column in (("stm", "turn_id", "content"), ("mtm", "session_id", "summary")):
                for row in db.execute(f"SELECT {id_column} AS id, {text_column} AS text FROM {table}").fetchall():
                    if table == "stm" and row["id"] == turn_id:
                        continue
                    text = redact(row["text"], values, what_words)
                    if text != row["text"]:
                        db.execute(f"UPDATE {table} SET {text_column} = ? WHERE {id_column} = ?", (text, row["id"]))
                        redacted += 1
            # The extraction log keeps what the site wrote; the forgotten values go from it too.
            for row in db.execute("SELECT id, lines, stored, malformed FROM extractions").fetchall():
                cleaned = [redact(row[column], values) for column in ("lines", "stored", "malformed")]
                if cleaned != [row["lines"], row["stored"], row["malformed"]]:
                    db.execute("UPDATE extractions SET lines = ?, stored = ?, malformed = ? WHERE id = ?",
                               (*cleaned, row["id"]))
            db.execute("INSERT INTO forgotten(request, what, keys, session_id, turn_id, timestamp, rows_removed, "
                       "texts_redacted) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (request or f"forget {what}", what, json.dumps(keys), session.id if session else None, turn_id,
                        session.timestamp if session else None, len(rows), redacted))
        logger.info("tiered: forget %r removed keys %s (%d rows) and redacted %d texts", what, keys, len(rows),
                    redacted)
        return keys

    # --- the protocol's single-unit edits (the planted store faults use them) --------------

    def delete_memory(self, memory_id: str) -> None:
        tier, _, ident = memory_id.partition(":")
        with self._transaction() as db:
            if tier == "ltm":
                for row in db.execute("SELECT id FROM ltm WHERE key = ?", (ident,)).fetchall():
                    self._vectors.pop(row["id"], None)
                db.execute("DELETE FROM ltm WHERE key = ?", (ident,))
            elif tier == "mtm":
                db.execute("DELETE FROM mtm WHERE session_id = ?", (ident,))
            elif tier == "stm":
                db.execute("DELETE FROM stm WHERE turn_id = ?", (ident,))
            else:
                raise KeyError(f"tiered has no memory {memory_id!r}")

    def update_memory(self, memory_id: str, text: str) -> None:
        tier, _, ident = memory_id.partition(":")
        if tier == "ltm":
            label = label_of(ident)
            value = text.split(": ", 1)[1] if text.startswith(f"{label}: ") else text
            self.store_fact(FactLine(key=ident, label=label, value=value, lines=[]))
            return
        with self._transaction() as db:
            if tier == "mtm":
                db.execute("UPDATE mtm SET summary = ? WHERE session_id = ?", (text, ident))
            elif tier == "stm":
                db.execute("UPDATE stm SET content = ? WHERE turn_id = ?", (text, ident))
            else:
                raise KeyError(f"tiered has no memory {memory_id!r}")

    # --- retrieval ------------------------------------------------------------------------

    def retrieve(self, question: str, k: int | None = None) -> list[MemoryItem]:
        """LTM facts by similarity, then recent MTM summaries, then the current conversation."""
        query = question
        if QUERY_REWRITE in self._sites:
            query = self._sites[QUERY_REWRITE](self.lm, question=question).query or question
        top_k = int(k or self._knobs["top_k"])
        return [*self.search(query, top_k), *self.recent_summaries(query), *self.conversation()]

    def search(self, query: str, k: int) -> list[MemoryItem]:
        """The ``k`` live LTM facts most similar to ``query`` within the recipe's categories, at least ``threshold``."""
        allowed = self.allowed_categories(query)
        facts = [f for f in self.live_facts() if f.id in self._vectors and (allowed is None or f.category in allowed)]
        if k <= 0 or not facts:
            return []
        query_vector = self.embedder.embed_one(query)
        scored = sorted(((float(self._vectors[f.id] @ query_vector), f) for f in facts),
                        key=lambda pair: (-pair[0], pair[1].id))
        threshold = self._knobs["threshold"]
        return [fact.to_item(score) for score, fact in scored if threshold is None or score >= threshold][:k]

    def recent_summaries(self, query: str) -> list[MemoryItem]:
        """The ``mtm_summaries`` most recent conversation summaries the recipe allows, oldest first."""
        limit = int(self._knobs["mtm_summaries"])
        if limit <= 0:
            return []
        allowed = self.allowed_categories(query)
        kept = [s for s in self.summaries() if allowed is None or allowed & set(s.categories)]
        return [summary.to_item() for summary in kept[-limit:]]

    def conversation(self) -> list[MemoryItem]:
        """The last ``stm_turns`` turns of the current conversation."""
        limit = int(self._knobs["stm_turns"])
        return [turn.to_item() for turn in self.stm_turns()[-limit:]] if limit > 0 else []

    def allowed_categories(self, query: str) -> set[str] | None:
        """The categories the ``search_recipe`` lets a search see (``None``: every one)."""
        recipe = str(self._knobs["search_recipe"])
        if recipe == "similarity":
            return None
        if recipe == "category":
            routed = category_of(query)
            return None if routed == GENERAL else {routed}
        return {recipe.partition(":")[2]}

    # --- knobs ----------------------------------------------------------------------------

    def set_knob(self, name: str, value: Any) -> None:
        if name in self._knobs:
            self._check_knob(name, value)
        super().set_knob(name, value)

    @classmethod
    def _check_knob(cls, name: str, value: Any) -> None:
        if name in ("top_k", "mtm_summaries", "stm_turns"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"tiered knob {name} must be a whole number >= 0, got {value!r}")
        elif name == "threshold":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ConfigError(f"tiered knob threshold must be a number (or None for no threshold), got {value!r}")
        elif name == "search_recipe":
            ok = isinstance(value, str) and (value in cls.RECIPES or (value.startswith("category:")
                                                                      and bool(value.partition(":")[2].strip())))
            if not ok:
                raise ConfigError(f"tiered search_recipe must be one of {', '.join(cls.RECIPES)} or "
                                  f"'category:<name>', got {value!r}")

    # --- prompt packs ---------------------------------------------------------------------

    def apply_pack(self, pack: dict[str, Any]) -> None:
        """Use a prompt pack (``python -m optloop.export --format pack``): its instructions and knobs."""
        if pack.get("system") not in (None, self.name):
            raise ConfigError(f"the prompt pack is for {pack.get('system')}, not {self.name}")
        for site, text in (pack.get("prompts") or {}).items():
            if site not in self._sites:
                raise ConfigError(f"the prompt pack names site {site!r}; {self.name} has {', '.join(self._sites)}")
            self._sites[site].set_instructions(text)
        for name, value in (pack.get("knobs") or {}).items():
            self.set_knob(name, value)


# Words that name which attribute of a thing is meant ("my cousin's *name*", "the *code* for my unit"): a
# sentence that stores the attribute gives its value ("my cousin, Leocadia"), not the word, so a sentence to
# forget needs only the other words of the request. (Found by the embedded-LM test: a summary held "my
# cousin, Leocadia" and survived "forget my cousin's name".)
_ATTRIBUTE_WORDS = frozenset({"name", "code", "number", "value", "detail", "info", "information", "address"})


def subject_words(what: str) -> set[str]:
    """The words a sentence must all use to be about what a forget request names: its content words less the
    attribute words, unless that leaves none."""
    content = words(what)
    return (content - _ATTRIBUTE_WORDS) or content


def redact(text: str, values: Sequence[str], what_words: set[str] | frozenset[str] = frozenset()) -> str:
    """``text`` with each value (as whole words) and each sentence using all of ``what_words`` replaced by
    ``[forgotten]``."""
    for value in values:
        if value.strip():
            text = re.sub(rf"(?<!\w){re.escape(value.strip())}(?!\w)", FORGOTTEN, text, flags=re.IGNORECASE)
    if what_words:
        parts = sentences(text)
        if any(what_words <= words(sentence) for sentence in parts):
            text = " ".join(FORGOTTEN if what_words <= words(sentence) else sentence for sentence in parts)
    return text
