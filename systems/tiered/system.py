"""The ``tiered`` system: the ingestion flow (STM, extraction, MTM) and the protocol over the
store."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pydantic

from optloop.errors import ConfigError
from optloop.sites import QUERY_REWRITE, TIERED_EXTRACT, TIERED_SUMMARIZE
from signatures.tiered import ExtractKeyValueFacts, SummarizeConversation
from systems.base import MemoryItem, MemorySystem, PromptSite
from systems.tiered import retrieval
from systems.tiered.extraction import Fact, as_object, parse_facts
from systems.tiered.forgetting import forget, forget_request
from systems.tiered.keys import GENERAL, category_of, grounded, label_of
from systems.tiered.store import DB_FILE, TieredStore, parse_date

if TYPE_CHECKING:
    from optloop.datasets import Session, Turn
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM

logger = logging.getLogger(__name__)

EXTRACT_CONTEXT_TURNS = 4  # STM turns shown to the extraction stage before the message
MAX_KNOWN_KEYS = 40


class TieredSystem(MemorySystem):
    """STM / MTM / LTM in one SQLite file (``store``); see :mod:`systems.tiered`."""

    name: ClassVar[str] = "tiered"
    default_knobs: ClassVar[dict[str, Any]] = {
        "top_k": 5,
        "threshold": 0.1,
        "mtm_summaries": 2,
        "stm_turns": 6,
        "search_recipe": "similarity",
    }
    # The values an optimizer may try per knob (the protocol's knob spaces).
    knob_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "top_k": (1, 3, 5, 10, 20),
        "threshold": (0.0, 0.1, 0.2, 0.3, 0.4),
        "mtm_summaries": (0, 1, 2, 3, 5),
        "stm_turns": (0, 2, 6, 12),
        "search_recipe": ("similarity", "category"),
    }
    # The knob that decides what a search returns: a fact outside the recipe's categories is never
    # found.
    search_knob: ClassVar[str | None] = "search_recipe"
    # At most four short facts a message and a few-sentence summary: bounds that keep a local
    # model's answers closed (a 135M model repeats one object until the array's bound).
    local_decoding: ClassVar[dict[str, int]] = {"max_array_items": 4, "max_string_chars": 160}
    RECIPES: ClassVar[tuple[str, ...]] = retrieval.RECIPES

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
            self._check_knob(name, value)
        self.store = TieredStore(self.db_path, self.embedder)

    def _build_sites(self) -> None:
        self._sites[TIERED_EXTRACT] = PromptSite.from_signature(
            TIERED_EXTRACT,
            "ingest",
            ExtractKeyValueFacts,
            op_kinds=("extract", "store", "update"),
            layout="dspy",
        )
        self._sites[TIERED_SUMMARIZE] = PromptSite.from_signature(
            TIERED_SUMMARIZE,
            "ingest",
            SummarizeConversation,
            op_kinds=("summarize", "store"),
            layout="dspy",
        )

    @property
    def db_path(self) -> Path:
        return self.run_dir / DB_FILE

    def close(self) -> None:
        self.store.close()

    def reset(self) -> None:
        self.store.close()
        self._clear_run_dir()
        self.store.open()

    def all_memories(self) -> list[MemoryItem]:
        return (
            [fact.to_item() for fact in self.store.live_facts()]
            + [summary.to_item() for summary in self.store.summaries()]
            + [turn.to_item() for turn in self.store.stm_turns()]
        )

    def retrievable_kinds(self) -> set[str] | None:
        return {"fact", "summary"}  # STM turns are the conversation itself, not stored memory

    # --- ingestion ------------------------------------------------------------------------

    def ingest(self, sessions: Sequence[Session]) -> None:
        for session in sessions:
            if self.store.has_session(session.id):
                logger.info("tiered: session %s is already stored; skipping it", session.id)
                continue
            self._ingest_session(session)

    def _ingest_session(self, session: Session) -> None:
        gone, expired = self.store.begin_conversation(session.id, parse_date(session.timestamp))
        logger.debug(
            "tiered: session %s begins (%d STM turns rotated out, %d summaries expired)",
            session.id,
            gone,
            expired,
        )
        base = self.store.next_turn_seq()
        stored_categories: set[str] = set()
        for offset, turn in enumerate(session.turns, 1):
            self.store.add_turn(
                turn_id=turn.id,
                session_id=session.id,
                seq=base + offset,
                role=turn.role,
                speaker=turn.speaker,
                content=turn.content,
                timestamp=session.timestamp,
                extraction="not a user message" if turn.role != "user" else "pending",
            )
            if turn.role == "user":
                stored_categories |= self._after_user_message(session, turn)
        self._end_conversation(session, stored_categories)

    def _after_user_message(self, session: Session, turn: Turn) -> set[str]:
        """The extraction stage for one user message (or the forget rule); the categories it
        stored."""
        what = forget_request(turn.content)
        if what is not None:
            keys = forget(
                self.store,
                what,
                request=turn.content,
                session_id=session.id,
                turn_id=turn.id,
                timestamp=session.timestamp,
            )
            status = (
                f"skipped: forget request ({', '.join(keys) if keys else 'no stored key matched'})"
            )
            self.store.record_extraction(session.id, turn.id, status, [], [], [])
            return set()
        context = [t for t in self.store.stm_turns() if t.turn_id != turn.id][
            -EXTRACT_CONTEXT_TURNS:
        ]
        conversation = "\n".join(t.text for t in context) or "(start of conversation)"
        known = [fact.key for fact in self.store.live_facts()][-MAX_KNOWN_KEYS:]
        prediction = self._sites[TIERED_EXTRACT](
            self.lm,
            known_keys=", ".join(known) or "(none)",
            conversation=conversation,
            message=turn.content,
        )
        raw = prediction.facts
        items = list(raw) if isinstance(raw, list) else ([] if raw is None else [raw])
        parsed = parse_facts(items, known)
        source = f"{conversation}\n{turn.content}"
        stored = []
        for fact in parsed.facts:
            is_grounded = grounded(fact.value, source)
            action = self.store.store_fact(
                fact,
                session_id=session.id,
                turn_id=turn.id,
                timestamp=session.timestamp,
                is_grounded=is_grounded,
            )
            if not is_grounded:
                logger.info(
                    "tiered: %s=%r is not in the message it was extracted from",
                    fact.key,
                    fact.value,
                )
            stored.append(
                {
                    "key": fact.key,
                    "value": fact.value,
                    "category": fact.category,
                    "action": action,
                    "written_keys": fact.written_keys,
                }
            )
        for bad in parsed.refused:
            logger.info(
                "tiered: extraction item refused for %s (%s): %r", turn.id, bad.reason, bad.item
            )
        changed = [s for s in stored if s["action"] != "unchanged"]
        status = f"extracted: {len(changed)} fact(s)" if changed else "nothing new"
        if parsed.refused:
            status += f", {len(parsed.refused)} item(s) refused"
        written = [as_object(item) or str(item) for item in items]
        self.store.record_extraction(
            session.id,
            turn.id,
            status,
            written,
            stored,
            [bad.model_dump(mode="json") for bad in parsed.refused],
        )
        return {fact.category for fact in parsed.facts}

    def _end_conversation(self, session: Session, stored_categories: set[str]) -> None:
        """The summarize site writes the conversation's MTM summary; the session is then marked
        ingested."""
        turns = [t for t in self.store.stm_turns() if t.session_id == session.id]
        header = f"Conversation {session.id}" + (
            f" ({session.timestamp})" if session.timestamp else ""
        )
        conversation = "\n".join([header, *(t.text for t in turns)])
        summary = str(
            self._sites[TIERED_SUMMARIZE](self.lm, conversation=conversation).summary or ""
        ).strip()
        categories = sorted(stored_categories | ({category_of(summary)} - {GENERAL}))
        self.store.end_conversation(
            session.id,
            session.timestamp,
            len(session.turns),
            summary,
            categories,
            [t.turn_id for t in turns],
        )

    # --- the protocol's single-unit edits (the planted store faults use them) --------------

    def delete_memory(self, memory_id: str) -> None:
        tier, _, ident = memory_id.partition(":")
        try:
            self.store.delete_unit(tier, ident)
        except KeyError:
            raise KeyError(f"tiered has no memory {memory_id!r}") from None

    def update_memory(self, memory_id: str, text: str) -> None:
        tier, _, ident = memory_id.partition(":")
        if tier == "ltm":
            label = label_of(ident)
            value = text.split(": ", 1)[1] if text.startswith(f"{label}: ") else text
            self.store.store_fact(
                Fact(key=ident, label=label, value=value, category=category_of(ident))
            )
            return
        try:
            self.store.set_text(tier, ident, text)
        except KeyError:
            raise KeyError(f"tiered has no memory {memory_id!r}") from None

    # --- retrieval ------------------------------------------------------------------------

    def retrieve(self, question: str, k: int | None = None) -> list[MemoryItem]:
        """LTM facts by similarity, then recent MTM summaries, then the current conversation."""
        query = question
        if QUERY_REWRITE in self._sites:
            query = self._sites[QUERY_REWRITE](self.lm, question=question).query or question
        top_k = int(k or self._knobs["top_k"])
        return [
            *self.search(query, top_k),
            *retrieval.recent_summaries(self.store, self._knobs, query),
            *retrieval.conversation(self.store, self._knobs),
        ]

    def search(self, query: str, k: int) -> list[MemoryItem]:
        return retrieval.search(self.store, self._knobs, query, k)

    # --- knobs and prompt packs ----------------------------------------------------------

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
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise ConfigError(
                    "tiered knob threshold must be a number (or None for no threshold), "
                    f"got {value!r}"
                )
        elif name == "search_recipe":
            ok = isinstance(value, str) and (
                value in cls.RECIPES
                or (value.startswith("category:") and bool(value.partition(":")[2].strip()))
            )
            if not ok:
                raise ConfigError(
                    f"tiered search_recipe must be one of {', '.join(cls.RECIPES)} or "
                    f"'category:<name>', got {value!r}"
                )

    def apply_pack(self, pack: dict[str, Any]) -> None:
        """Use a prompt pack (``python -m optloop export --format pack``): its instructions and
        knobs."""
        if pack.get("system") not in (None, self.name):
            raise ConfigError(f"the prompt pack is for {pack.get('system')}, not {self.name}")
        for site, text in (pack.get("prompts") or {}).items():
            if site not in self._sites:
                raise ConfigError(
                    f"the prompt pack names site {site!r}; {self.name} has "
                    f"{', '.join(self._sites)}"
                )
            self._check_pack_schema(site, (pack.get("sites") or {}).get(site))
            self._sites[site].set_instructions(text)
        for name, value in (pack.get("knobs") or {}).items():
            self.set_knob(name, value)

    def _check_pack_schema(self, site: str, fields: dict[str, Any] | None) -> None:
        """A pack's response schema for ``site`` must be the one this system decodes under (the
        product applies the same schema); a pack without one (hand-written) is taken as is."""
        signature = self._sites[site].module.signature
        for name, spec in ((fields or {}).get("outputs") or {}).items():
            field = signature.output_fields.get(name)
            if field is None or "schema" not in spec:
                continue
            if spec["schema"] != pydantic.TypeAdapter(field.annotation).json_schema():
                raise ConfigError(
                    f"the prompt pack's {site} answers another {name!r} schema than this tiered "
                    "decodes under; export the pack again from a run of this version"
                )
