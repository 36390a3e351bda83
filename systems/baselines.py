"""Baseline memory systems: long context, BM25 RAG, embedding RAG and MEME's MD-flat.

Each keeps its whole state as plain files under ``run_dir`` (so a new instance
on the same directory picks it up, and ``reset()`` empties it):

``long_context``
    every raw turn (``turns.jsonl``); ``retrieve`` returns the most recent
    turns, in chronological order, that fit ``max_context_tokens``, and reports
    what it dropped. No LLM at ingest, no query.
``rag_bm25``
    raw turns ranked by BM25 (rank-bm25) against the query; ``top_k``.
``rag_embedding``
    raw turns embedded with optloop's embedder (``vectors.npy`` beside
    ``turns.jsonl``), ranked by cosine; ``top_k`` and ``threshold``.
``md_flat``
    MEME's MD-flat: one markdown file of facts (``memory.md``), rewritten by the
    ``md_flat.curate`` prompt site after each session from the current file and
    the session transcript. ``retrieve`` returns the whole file, as MD-flat puts
    it all in context, or the ``top_k`` facts closest to the query when that knob
    (or an explicit ``k``) is positive.

Every :class:`~systems.base.MemoryItem` carries its provenance in ``metadata``:
``kind`` (``turn`` or ``fact``), ``turn_ids``, ``session_id`` and ``timestamp``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import re
import threading
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rank_bm25 import BM25Okapi

from optloop.errors import ConfigError
from optloop.paths import write_atomic as _write_atomic
from optloop.sites import MD_FLAT_CURATE
from optloop.text import words
from signatures.baselines import CurateMarkdownMemory
from systems.base import MemoryItem, MemorySystem, PromptSite

if TYPE_CHECKING:
    from optloop.datasets import Session
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4  # a cheap, tokenizer-free estimate; English runs 3.5-4.5 characters a token


# ---------------------------------------------------------------------------
# Plain-file state
# ---------------------------------------------------------------------------


def _read_jsonl(path: Path, model: type[BaseModel]) -> list[Any]:
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(model.model_validate_json(line))
        except ValidationError as exc:
            raise ConfigError(
                f"{path}:{lineno} is not a valid {model.__name__} record "
                f"({exc.errors()[0]['msg']}); reset() the system or delete {path.parent}"
            ) from None
    return records


def _write_jsonl(path: Path, records: Iterable[BaseModel]) -> None:
    _write_atomic(path, "".join(record.model_dump_json() + "\n" for record in records))


class StoredTurn(BaseModel):
    """One raw turn as the baselines store it, with the session it came from."""

    model_config = ConfigDict(frozen=True)

    id: str
    session_id: str
    timestamp: str | None = None
    role: str
    speaker: str | None = None
    content: str

    @property
    def text(self) -> str:
        """What is shown, searched and embedded: ``speaker: content``."""
        return f"{self.speaker or self.role}: {self.content}"

    def to_item(self, score: float | None = None, **extra: Any) -> MemoryItem:
        return MemoryItem(
            id=self.id,
            text=self.text,
            score=score,
            metadata={
                "kind": "turn",
                "turn_id": self.id,
                "turn_ids": [self.id],
                "session_id": self.session_id,
                "timestamp": self.timestamp,
                "role": self.role,
                "speaker": self.speaker,
                **extra,
            },
        )


class _TurnLog:
    """Raw turns in ingestion order, persisted as ``turns.jsonl``."""

    FILE = "turns.jsonl"

    def __init__(self, run_dir: Path):
        self.path = run_dir / self.FILE
        self.turns: list[StoredTurn] = _read_jsonl(self.path, StoredTurn)

    def session_ids(self) -> set[str]:
        return {turn.session_id for turn in self.turns}

    def new_sessions(self, sessions: Sequence[Session]) -> list[Session]:
        """The sessions not stored yet; ingesting a session twice would duplicate its turns."""
        stored = self.session_ids()
        fresh = []
        for session in sessions:
            if session.id in stored:
                logger.info("session %s is already stored; skipping it", session.id)
                continue
            stored.add(session.id)
            fresh.append(session)
        return fresh

    def add(self, sessions: Sequence[Session]) -> list[StoredTurn]:
        new = [
            StoredTurn(
                id=turn.id,
                session_id=session.id,
                timestamp=session.timestamp,
                role=turn.role,
                speaker=turn.speaker,
                content=turn.content,
            )
            for session in sessions
            for turn in session.turns
        ]
        if new:
            self.turns.extend(new)
            _write_jsonl(self.path, self.turns)
        return new


class _FileBackedSystem(MemorySystem):
    """A system whose state is files under ``run_dir``: loaded at construction, emptied by
    ``reset``."""

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
        self._load()

    @abstractmethod
    def _load(self) -> None:
        """Read the state under ``run_dir`` (empty when the directory is)."""

    def reset(self) -> None:
        self._clear_run_dir()
        self._load()


# ---------------------------------------------------------------------------
# Raw-turn systems
# ---------------------------------------------------------------------------


class _RawTurnSystem(_FileBackedSystem):
    """Stores every turn verbatim; subclasses add an index over them."""

    def _load(self) -> None:
        self._log = _TurnLog(self.run_dir)
        self._load_index()

    def _load_index(self) -> None:
        """Rebuild or read the index over ``self._log.turns``."""

    def _index(self, new: list[StoredTurn]) -> None:
        """Add freshly stored turns to the index."""

    def ingest(self, sessions: Sequence[Session]) -> None:
        new = self._log.add(self._log.new_sessions(sessions))
        if new:
            self._index(new)

    def all_memories(self) -> list[MemoryItem]:
        return [turn.to_item() for turn in self._log.turns]

    def delete_memory(self, memory_id: str) -> None:
        self._rewrite([t for t in self._log.turns if t.id != memory_id])

    def update_memory(self, memory_id: str, text: str) -> None:
        self._rewrite(
            [
                t.model_copy(update={"content": text}) if t.id == memory_id else t
                for t in self._log.turns
            ]
        )

    def _rewrite(self, turns: list[StoredTurn]) -> None:
        """Replace the stored turns and rebuild the index from them."""
        _write_jsonl(self._log.path, turns)
        for name in ("vectors.npy", "vectors.json"):
            (self.run_dir / name).unlink(missing_ok=True)
        self._load()


def estimate_tokens(text: str) -> int:
    """Tokens ``text`` costs in a prompt, estimated from its length (no tokenizer needed)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


class LongContextSystem(_RawTurnSystem):
    """Every raw turn in context: the most recent ones that fit ``max_context_tokens``.

    ``retrieve`` ignores the question and ``k``: there is nothing to rank. When
    turns do not fit, the oldest are dropped (a contiguous recent window is
    kept) and :meth:`truncation` — also copied into each returned item's
    ``metadata["truncation"]`` — says how many were kept and dropped.
    """

    name: ClassVar[str] = "long_context"
    # The default fits the embedded LM's 8192-token window with room for the answer prompt.
    default_knobs: ClassVar[dict[str, Any]] = {"max_context_tokens": 6000}
    knob_values: ClassVar[Mapping[str, Sequence[Any]]] = {
        "max_context_tokens": (2000, 4000, 6000, 8000)
    }
    # nothing is searched: every turn that fits is in context
    search_knob: ClassVar[str | None] = None

    def __init__(
        self,
        lm: OptloopLM,
        run_dir: Path,
        *,
        embedder: Embedder | None = None,
        knobs: dict[str, Any] | None = None,
        query_site: bool = False,
    ):
        if query_site:
            raise ConfigError(
                "long_context puts every turn in context and never searches, so a query-rewrite "
                "site would change nothing; run it without query_site"
            )
        # The last search's report, per thread: an episode's questions may run at once
        # (optloop.pipeline), each reading truncation() on the thread that retrieved.
        self._last = threading.local()
        super().__init__(lm, run_dir, embedder=embedder, knobs=knobs)

    def retrieve(self, question: str, k: int | None = None) -> list[MemoryItem]:
        return self.search(question, 0)

    def search(self, query: str, k: int) -> list[MemoryItem]:
        budget = int(self._knobs["max_context_tokens"])
        turns = self._log.turns
        kept: list[StoredTurn] = []
        used = 0
        for turn in reversed(turns):
            # Charge the line as render_memories shows it, date prefix included.
            cost = estimate_tokens(
                f"- [{turn.timestamp}] {turn.text}\n" if turn.timestamp else f"- {turn.text}\n"
            )
            if used + cost > budget:
                break
            kept.append(turn)
            used += cost
        kept.reverse()
        truncation = {
            "kept": len(kept),
            "dropped": len(turns) - len(kept),
            "tokens": used,
            "budget_tokens": budget,
        }
        self._last.truncation = truncation
        if truncation["dropped"]:
            logger.info(
                "long_context: %d of %d turns do not fit %d tokens; kept the %d most recent",
                truncation["dropped"],
                len(turns),
                budget,
                len(kept),
            )
        return [turn.to_item(truncation=dict(truncation)) for turn in kept]

    def truncation(self) -> dict[str, int] | None:
        truncation = getattr(self._last, "truncation", None)
        return dict(truncation) if truncation else None


class _LuceneIdfBM25(BM25Okapi):
    """BM25Okapi with Lucene's idf, ``log(1 + (N - n + 0.5) / (n + 0.5))``, which is never
    negative.

    rank-bm25's Okapi idf is negative for a term in more than half the documents
    and zero in exactly half; on a small store (one short episode) it then
    ranks a turn that contains the query word *below* one that does not.
    """

    def _calc_idf(self, nd: dict[str, int]) -> None:
        for word, freq in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))
        self.average_idf = sum(self.idf.values()) / max(len(self.idf), 1)


class BM25RagSystem(_RawTurnSystem):
    """Raw turns ranked by BM25 against the query; the ``top_k`` best with any word in common."""

    name: ClassVar[str] = "rag_bm25"
    default_knobs: ClassVar[dict[str, Any]] = {"top_k": 5}

    def _load_index(self) -> None:
        self._bm25: _LuceneIdfBM25 | None = None  # built on the first search; cheap to rebuild

    def _index(self, new: list[StoredTurn]) -> None:
        self._bm25 = None

    def search(self, query: str, k: int) -> list[MemoryItem]:
        turns = self._log.turns
        terms = words(query)  # the terms BM25 indexes and queries with
        if not turns or not terms:
            return []
        if self._bm25 is None:
            self._bm25 = _LuceneIdfBM25([words(turn.text) for turn in turns])
        scores = self._bm25.get_scores(terms)
        # Ties go to the earlier turn, so results are deterministic.
        order = sorted(range(len(turns)), key=lambda i: (-scores[i], i))
        # A turn that shares no term with the query scores 0: that is no match, not a weak one.
        return [turns[i].to_item(score=float(scores[i])) for i in order[:k] if scores[i] > 0]


class EmbeddingRagSystem(_RawTurnSystem):
    """Raw turns embedded once at ingest; ``top_k`` by cosine, at least ``threshold``.

    Vectors live in ``vectors.npy`` (row i = turn i of ``turns.jsonl``) with the
    embedder's name in ``vectors.json``; a new instance on the same directory
    reads them back, and re-embeds only what is missing or was embedded by a
    different model.
    """

    name: ClassVar[str] = "rag_embedding"
    default_knobs: ClassVar[dict[str, Any]] = {"top_k": 5, "threshold": 0.0}
    knob_values: ClassVar[Mapping[str, Sequence[Any]]] = {
        **MemorySystem.knob_values,
        "threshold": (0.0, 0.1, 0.2, 0.3),
    }
    search_knob: ClassVar[str | None] = "threshold"
    VECTORS = "vectors.npy"
    META = "vectors.json"

    def _load_index(self) -> None:
        self._vectors: np.ndarray | None = None
        vectors_path, meta_path = self.run_dir / self.VECTORS, self.run_dir / self.META
        if vectors_path.exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("embedder") != self.embedder.name:
                logger.warning(
                    "%s was embedded with %s, not %s; re-embedding every turn",
                    self.run_dir,
                    meta.get("embedder"),
                    self.embedder.name,
                )
            else:
                self._vectors = np.load(vectors_path)
        stored = 0 if self._vectors is None else len(self._vectors)
        if stored > len(self._log.turns):
            logger.warning(
                "%s holds more vectors than turns; re-embedding every turn", self.run_dir
            )
            self._vectors, stored = None, 0
        if stored < len(self._log.turns):  # e.g. a run killed between storing turns and vectors
            self._index(self._log.turns[stored:])

    def _index(self, new: list[StoredTurn]) -> None:
        vectors = self.embedder.embed([turn.text for turn in new])
        self._vectors = (
            vectors if self._vectors is None else np.concatenate([self._vectors, vectors])
        )
        buffer = io.BytesIO()
        np.save(buffer, self._vectors)
        _write_atomic(self.run_dir / self.VECTORS, buffer.getvalue())
        _write_atomic(
            self.run_dir / self.META,
            json.dumps(
                {
                    "embedder": self.embedder.name,
                    "dim": int(self._vectors.shape[1]),
                    "count": len(self._vectors),
                }
            ),
        )

    def search(self, query: str, k: int) -> list[MemoryItem]:
        turns = self._log.turns
        if not turns or self._vectors is None:
            return []
        similarities = self._vectors @ self.embedder.embed_one(query)
        threshold = self._knobs["threshold"]
        order = sorted(range(len(turns)), key=lambda i: (-similarities[i], i))
        hits = [i for i in order if threshold is None or similarities[i] >= threshold][:k]
        return [turns[i].to_item(score=float(similarities[i])) for i in hits]


# ---------------------------------------------------------------------------
# MD-flat
# ---------------------------------------------------------------------------


class Fact(BaseModel):
    """One line of ``memory.md`` and where it came from (the session whose curation wrote it)."""

    text: str
    timestamp: str | None = None
    session_id: str | None = None
    turn_ids: list[str] = Field(default_factory=list)

    @property
    def id(self) -> str:
        # Derived from the text, so a fact kept through later curations keeps its id.
        return "fact-" + hashlib.sha1(_normalize(self.text).encode()).hexdigest()[:12]

    def line(self) -> str:
        return f"- [{self.timestamp}] {self.text}" if self.timestamp else f"- {self.text}"

    def to_item(self, score: float | None = None) -> MemoryItem:
        return MemoryItem(
            id=self.id,
            text=self.text,
            score=score,
            metadata={
                "kind": "fact",
                "turn_ids": list(self.turn_ids),
                "session_id": self.session_id,
                "timestamp": self.timestamp,
            },
        )


class Curation(BaseModel):
    """One ``md_flat.curate`` call: the file before and after a session (``curations.jsonl``)."""

    session_id: str
    before: list[str]
    after: list[str]
    added: list[str]
    removed: list[str]


_LINE = re.compile(r"^\s*(?:[-*]\s+)?(?:\[(?P<date>[^\]]*)\]\s*)?(?P<text>.*?)\s*$")


def _parse_line(line: str) -> tuple[str | None, str]:
    """``- [date] text`` (bullet and date optional) -> (date, text).

    A fact is one line of ``memory.md``: line breaks inside what the model wrote become spaces
    (written as they came, the fact would be cut in two on the next load)."""
    match = _LINE.match(" ".join(line.splitlines()))
    assert match is not None  # the pattern matches every string
    return match["date"] or None, match["text"]


def _normalize(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def render_session(session: Session) -> str:
    """A session as the curation prompt reads it: a dated header, then ``speaker: message``
    lines."""
    header = f"Session {session.id}" + (f" ({session.timestamp})" if session.timestamp else "")
    return "\n".join(
        [header, *(f"{turn.speaker or turn.role}: {turn.content}" for turn in session.turns)]
    )


class MarkdownFlatSystem(_FileBackedSystem):
    """MEME's MD-flat: an LLM rewrites one markdown file of facts after every session.

    Files under ``run_dir``: ``memory.md`` (the facts, ``- [date] fact`` lines;
    the source of truth), ``memory.provenance.jsonl`` (which session and turns
    each fact came from), ``curations.jsonl`` (before/after of every rewrite,
    for tracing) and ``turns.jsonl`` (the raw sessions, which mark a session
    as ingested).

    A fact the curation returns unchanged keeps its provenance; a new or
    reworded fact is attributed to the session being curated. Facts the
    curation leaves out are gone, which is how MD-flat updates and deletes.
    """

    name: ClassVar[str] = "md_flat"
    # top_k 0 = the whole file in context (MD-flat); > 0 = that many facts, closest to the query.
    default_knobs: ClassVar[dict[str, Any]] = {"top_k": 0}
    MEMORY = "memory.md"
    PROVENANCE = "memory.provenance.jsonl"
    CURATIONS = "curations.jsonl"

    def _build_sites(self) -> None:
        self._sites[MD_FLAT_CURATE] = PromptSite.from_signature(
            MD_FLAT_CURATE,
            "ingest",
            CurateMarkdownMemory,
            op_kinds=("extract", "update", "delete", "store"),
            layout="dspy",
        )

    @property
    def memory_path(self) -> Path:
        return self.run_dir / self.MEMORY

    def _load(self) -> None:
        self._log = _TurnLog(self.run_dir)
        self._fact_vectors: dict[str, np.ndarray] = {}
        self._facts: list[Fact] = []
        if not self.memory_path.exists():
            return
        provenance = {
            _normalize(f.text): f for f in _read_jsonl(self.run_dir / self.PROVENANCE, Fact)
        }
        for line in self.memory_path.read_text(encoding="utf-8").splitlines():
            if not line.lstrip().startswith(("- ", "* ")):
                continue  # headings and prose someone added by hand are not facts
            date, text = _parse_line(line)
            if text:
                known = provenance.get(_normalize(text))
                self._facts.append(
                    known.model_copy(update={"text": text, "timestamp": date})
                    if known
                    else Fact(text=text, timestamp=date)
                )

    def render_file(self) -> str:
        """``memory.md`` as it is (or would be) written."""
        return "".join(fact.line() + "\n" for fact in self._facts)

    def ingest(self, sessions: Sequence[Session]) -> None:
        for session in self._log.new_sessions(sessions):
            self._curate(session)

    def _curate(self, session: Session) -> None:
        before = self._facts
        prediction = self._sites[MD_FLAT_CURATE](
            self.lm, memory_file=self.render_file() or "(empty)", session=render_session(session)
        )
        self._facts = self._merge(prediction.facts, before, session)
        _write_atomic(self.memory_path, self.render_file())
        _write_jsonl(self.run_dir / self.PROVENANCE, self._facts)
        self._log.add([session])  # last: a session counts as ingested once its facts are on disk
        old, new = {_normalize(f.text) for f in before}, {_normalize(f.text) for f in self._facts}
        record = Curation(
            session_id=session.id,
            before=[f.text for f in before],
            after=[f.text for f in self._facts],
            added=[f.text for f in self._facts if _normalize(f.text) not in old],
            removed=[f.text for f in before if _normalize(f.text) not in new],
        )
        with (self.run_dir / self.CURATIONS).open("a", encoding="utf-8") as out:
            out.write(record.model_dump_json() + "\n")
        logger.info(
            "md_flat: session %s -> %d facts (+%d -%d)",
            session.id,
            len(self._facts),
            len(record.added),
            len(record.removed),
        )

    @staticmethod
    def _merge(raw_facts: Sequence[str], before: Sequence[Fact], session: Session) -> list[Fact]:
        """The curated list as facts: duplicates dropped, unchanged facts keep their provenance."""
        previous = {_normalize(fact.text): fact for fact in before}
        facts: list[Fact] = []
        seen: set[str] = set()
        for raw in raw_facts:
            # the model may copy the "- [date] " of the file it was shown
            _, text = _parse_line(str(raw))
            key = _normalize(text)
            if not key or key in seen:
                continue
            seen.add(key)
            facts.append(
                previous.get(key)
                or Fact(
                    text=text,
                    timestamp=session.timestamp,
                    session_id=session.id,
                    turn_ids=[turn.id for turn in session.turns],
                )
            )
        return facts

    def search(self, query: str, k: int) -> list[MemoryItem]:
        if k <= 0 or not self._facts:
            return [fact.to_item() for fact in self._facts]
        missing = [fact.text for fact in self._facts if fact.text not in self._fact_vectors]
        if missing:
            self._fact_vectors.update(zip(missing, self.embedder.embed(missing), strict=True))
        query_vector = self.embedder.embed_one(query)
        scored = [
            (float(self._fact_vectors[fact.text] @ query_vector), i)
            for i, fact in enumerate(self._facts)
        ]
        scored.sort(key=lambda pair: (-pair[0], pair[1]))
        return [self._facts[i].to_item(score=score) for score, i in scored[:k]]

    def all_memories(self) -> list[MemoryItem]:
        return [fact.to_item() for fact in self._facts]
