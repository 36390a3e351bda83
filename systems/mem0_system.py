"""mem0 (``mem0ai`` 2.2.1) as an optloop memory system: the real library, its LLM calls routed to
prompt sites.

What is mem0's own and what is ours:

- storage and retrieval are mem0's: ``Memory.add`` (one extraction call per
  session, hash dedup, history DB), ``Memory.search`` (vector similarity, the
  optional LLM reranker), ``Memory.get_all``; qdrant runs embedded on disk and
  the history DB is SQLite, both under ``run_dir``;
- mem0's embedder is replaced by :class:`OptloopEmbedding` (optloop's embedder);
- mem0's LLM client is replaced by :class:`SiteDispatchLLM`, which recognizes
  each call by its system message and runs the prompt site for it, passing
  mem0's user message through verbatim and handing mem0 back the JSON (or, for
  the reranker, the number) it parses.

The sites' instructions start as mem0's own prompts (:mod:`signatures.mem0`),
so with seed instructions the messages are byte-identical to vanilla mem0's.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import dspy

from optloop.errors import OptloopError
from optloop.lm import prompt_site
from optloop.sites import MEM0_EXTRACT, MEM0_RERANK
from signatures.mem0 import (  # imported first: it sets MEM0_DIR before mem0 loads
    ADDITIVE_EXTRACTION_PROMPT,
    AGENT_CONTEXT_SUFFIX,
    RERANK_SYSTEM_PROMPT,
    Mem0Extract,
    Mem0Rerank,
)
from systems.base import MemoryItem, MemorySystem, PromptSite

from mem0.configs.embeddings.base import BaseEmbedderConfig  # isort: skip
from mem0.configs.llms.base import BaseLlmConfig  # isort: skip
from mem0.embeddings.base import EmbeddingBase  # isort: skip
from mem0.exceptions import LLMError as Mem0LLMError  # isort: skip
from mem0.llms.base import LLMBase  # isort: skip

if TYPE_CHECKING:
    from mem0 import Memory

    from optloop.datasets import Session
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM

USER_ID = "optloop-user"
"""The one mem0 user every memory of a system instance belongs to (instances never share a
store)."""

COLLECTION = "mem0"
# get_all() returns at most top_k memories; "all memories" asks for more than any run stores.
ALL_MEMORIES_LIMIT = 100_000
# mem0 builds an LLM, an embedder and a reranker LLM from its config, and optloop replaces all
# three before any call. Built as OpenAI clients they would cost about 40 ms of CPU each (an SSL
# context apiece), two thirds of a store's construction, paid again for every episode's store and
# serialized on the GIL when episodes run at once. So the config names PLACEHOLDER_PROVIDER, whose
# clients are inert stand-ins (:class:`UnwiredLLM`, :class:`UnwiredEmbedding`) that fail loudly if
# a replacement is ever missed. mem0 validates provider names against a fixed list, so the config
# is written with "openai" and the name swapped after validation (see
# ``Mem0System._build_memory``).
PLACEHOLDER_PROVIDER = "optloop-unwired"


class UnknownPromptError(OptloopError):
    """mem0 sent a prompt that no site of :class:`Mem0System` models."""


# --- mem0's clients, replaced ------------------------------------------------------------


class UnwiredLLM(LLMBase):
    """What mem0 builds for its LLM and reranker LLM; replaced by :class:`SiteDispatchLLM` before
    any call."""

    def generate_response(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        raise OptloopError(
            "mem0 called an LLM client optloop did not wire (Mem0System._build_memory missed one)"
        )


class UnwiredEmbedding(EmbeddingBase):
    """What mem0 builds for its embedder; replaced by :class:`OptloopEmbedding` before any call."""

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        raise OptloopError(
            "mem0 called an embedder optloop did not wire (Mem0System._build_memory missed it)"
        )


def _register_placeholders() -> None:
    """Make :data:`PLACEHOLDER_PROVIDER` a provider mem0's factories build (idempotent)."""
    from mem0.utils.factory import EmbedderFactory, LlmFactory

    LlmFactory.register_provider(PLACEHOLDER_PROVIDER, f"{__name__}.UnwiredLLM", BaseLlmConfig)
    # EmbedderFactory has no register_provider; its table is the same kind of name -> class path
    # map.
    EmbedderFactory.provider_to_class[PLACEHOLDER_PROVIDER] = f"{__name__}.UnwiredEmbedding"


class OptloopEmbedding(EmbeddingBase):
    """mem0's embedder interface over an optloop :class:`~optloop.embed.Embedder`."""

    def __init__(self, embedder: Embedder):
        super().__init__(BaseEmbedderConfig(embedding_dims=embedder.dim))
        self.embedder = embedder

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        return self.embedder.embed([text])[0].tolist()

    def embed_batch(self, texts: list[str], memory_action: str = "add") -> list[list[float]]:
        return self.embedder.embed(list(texts)).tolist()


class SiteDispatchLLM(LLMBase):
    """mem0's LLM client: every call is run by the prompt site its system message names."""

    def __init__(self, system: Mem0System):
        super().__init__(BaseLlmConfig(model=system.lm.model))
        self.system = system

    def generate_response(
        self,
        messages: list[dict[str, str]],
        response_format: Any = None,
        tools: list[dict] | None = None,
        tool_choice: str = "auto",
        **kwargs: Any,
    ) -> str:
        # mem0's response_format ({"type": "json_object"}) is not forwarded: the site sends
        # its own response schema, the exact shape mem0 parses.
        if tools:
            raise UnknownPromptError(
                "mem0 asked for tool calls "
                f"({[t.get('function', {}).get('name') for t in tools]}); "
                "mem0ai 2.2.1 never does, so this mem0ai differs from the one optloop models"
            )
        roles = [m.get("role") for m in messages]
        if roles != ["system", "user"]:
            raise UnknownPromptError(
                f"mem0 sent messages with roles {roles}; every prompt optloop models is "
                "[system, user] (is mem0ai 2.2.1 installed?)"
            )
        return self.system.run_library_prompt(messages[0]["content"], messages[1]["content"])


# --- the system --------------------------------------------------------------------------


def session_messages(session: Session) -> list[dict[str, str]]:
    """The messages ``Memory.add`` gets for one session: role and content per turn.

    A turn with a named speaker (LoCoMo's two-person dialogues) gets the name in
    front of its content, ``"Caroline: ..."``, as mem0's own LoCoMo evaluation
    does; mem0's prompt builder keeps only role and content.
    """
    return [
        {
            "role": turn.role,
            "content": f"{turn.speaker}: {turn.content}" if turn.speaker else turn.content,
        }
        for turn in session.turns
    ]


class Mem0System(MemorySystem):
    """Real ``mem0.Memory``, fully local, with its LLM calls routed to prompt sites.

    Sites: ``mem0.extract`` (every ``Memory.add``), ``mem0.rerank`` (each
    retrieved memory, when the ``rerank`` knob is on), plus the shared ``answer``.
    Knobs: ``top_k`` and ``threshold`` (mem0's search arguments; 0.1 is mem0's
    default threshold) and ``rerank`` (mem0's LLM reranker).

    Each instance keeps its qdrant store and history DB under its own
    ``run_dir``; ``reset()`` closes them and empties the directory.
    """

    name: ClassVar[str] = "mem0"
    default_knobs: ClassVar[dict[str, Any]] = {"top_k": 5, "threshold": 0.1, "rerank": False}
    knob_values: ClassVar[Mapping[str, Sequence[Any]]] = {
        **MemorySystem.knob_values,
        "threshold": (0.0, 0.1, 0.2, 0.3),
        "rerank": (False, True),
    }
    search_knob: ClassVar[str | None] = "threshold"
    # Its extraction prompt alone is ~8.5k SmolLM2 tokens: more than the 8192 SmolLM2 was trained
    # on.
    local_decoding: ClassVar[dict[str, int]] = {"n_ctx": 12288}

    def __init__(
        self,
        lm: OptloopLM,
        run_dir: Path,
        *,
        embedder: Embedder | None = None,
        knobs: dict[str, Any] | None = None,
        query_site: bool = False,
    ):
        self._memory: Memory | None = None
        self._release_store: weakref.finalize | None = None
        super().__init__(lm, run_dir, embedder=embedder, knobs=knobs, query_site=query_site)

    def _build_sites(self) -> None:
        self._sites[MEM0_EXTRACT] = PromptSite.from_signature(
            MEM0_EXTRACT,
            "ingest",
            Mem0Extract,
            op_kinds=("extract", "store"),
            max_tokens=BaseLlmConfig().max_tokens,  # what mem0's own LLM call allows
        )
        if self._knobs["rerank"]:
            self._add_rerank_site()

    def _add_rerank_site(self) -> None:
        if MEM0_RERANK not in self._sites:
            self._sites[MEM0_RERANK] = PromptSite.from_signature(
                MEM0_RERANK, "retrieve", Mem0Rerank, op_kinds=("rerank",)
            )

    def set_knob(self, name: str, value: Any) -> None:
        super().set_knob(name, value)
        if name == "rerank" and value:
            self._add_rerank_site()

    # --- mem0 itself ---------------------------------------------------------------------

    @property
    def memory(self) -> Memory:
        """The ``mem0.Memory`` of this run directory, built on first use."""
        if self._memory is None:
            self._memory = self._build_memory()
        return self._memory

    def _build_memory(self) -> Memory:
        from mem0 import Memory
        from mem0.configs.base import MemoryConfig

        _register_placeholders()
        config = MemoryConfig(
            vector_store={
                "provider": "qdrant",
                "config": {
                    "collection_name": COLLECTION,
                    "embedding_model_dims": self.embedder.dim,
                    "path": str(self.run_dir / "qdrant"),
                    "on_disk": True,
                },
            },
            llm={"provider": "openai", "config": {}},
            embedder={"provider": "openai", "config": {"embedding_dims": self.embedder.dim}},
            history_db_path=str(self.run_dir / "history.db"),
            # Always configured (it is only called when search(rerank=True)), so the knob can flip.
            reranker={
                "provider": "llm_reranker",
                "config": {"llm": {"provider": PLACEHOLDER_PROVIDER, "config": {}}},
            },
        )
        # Validated as "openai" (mem0 checks names against a fixed list), built as placeholders.
        config.llm.provider = config.embedder.provider = PLACEHOLDER_PROVIDER
        memory = Memory(config)
        dispatch = SiteDispatchLLM(self)
        memory.llm = dispatch
        memory.reranker.llm = dispatch
        memory.embedding_model = OptloopEmbedding(self.embedder)
        # Close the embedded qdrant when the Memory goes away or the process exits; left to
        # qdrant's __del__ at interpreter shutdown, closing fails with an ImportError.
        self._release_store = weakref.finalize(memory, memory.vector_store.client.close)
        return memory

    def run_library_prompt(self, system: str, user: str) -> str:
        """Run the site for one mem0 call and return the text mem0 parses.

        ``system`` is what mem0 sent as its system message: it names the site;
        the site's own (possibly optimized) instructions replace it. ``user`` is
        passed through verbatim.
        """
        if system == ADDITIVE_EXTRACTION_PROMPT:
            prediction = self._run_site(MEM0_EXTRACT, user)
        # agent-scoped add (no user_id)
        elif system == ADDITIVE_EXTRACTION_PROMPT + AGENT_CONTEXT_SUFFIX:
            prediction = self._run_site(MEM0_EXTRACT, user, suffix=AGENT_CONTEXT_SUFFIX)
        elif system == RERANK_SYSTEM_PROMPT:
            if MEM0_RERANK not in self._sites:
                raise UnknownPromptError(
                    "mem0 called its LLM reranker but the rerank knob was off when the site "
                    "list was built; set_knob('rerank', True) adds the mem0.rerank site"
                )
            # Vanilla mem0 reads the first number of a free-text answer; a fixed-point string
            # keeps it from reading "1e-05" as 1.
            return f"{float(self._run_site('mem0.rerank', user).score):.4f}"
        else:
            head = " ".join(system.split())[:120]
            raise UnknownPromptError(
                f"mem0 sent a system prompt no mem0 site models: {head!r}... "
                "(optloop models mem0ai 2.2.1; add a signature in signatures/mem0.py)"
            )
        return json.dumps(
            {"memory": [m.model_dump() for m in prediction.memory]}, ensure_ascii=False
        )

    def _run_site(self, name: str, user: str, *, suffix: str = "") -> dspy.Prediction:
        site = self._sites[name]
        if not suffix:
            return site(self.lm, user_content=user)
        # mem0 appends AGENT_CONTEXT_SUFFIX to its prompt for agent-scoped memories; do the
        # same to the site's current instructions.
        predict = site.module.deepcopy()
        predict.signature = predict.signature.with_instructions(site.instructions + suffix)
        with prompt_site(site.name), dspy.context(lm=self.lm, adapter=site.adapter()):
            return predict(user_content=user, **site.call_config())

    # --- MemorySystem --------------------------------------------------------------------

    def reset(self) -> None:
        self.close()
        self._clear_run_dir()

    def close(self) -> None:
        """Release the qdrant store and the history DB (reopened on next use)."""
        if self._memory is None:
            return
        self._memory.close()
        if self._release_store is not None:
            self._release_store()  # closes qdrant; the entity store shares its client
        self._memory = None

    def ingest(self, sessions: Sequence[Session]) -> None:
        for session in sessions:
            messages = session_messages(session)
            if not messages:
                continue
            metadata: dict[str, Any] = {
                "session_id": session.id,
                "turn_ids": [t.id for t in session.turns],
            }
            if session.timestamp is not None:
                metadata["timestamp"] = session.timestamp
            try:
                self.memory.add(messages, user_id=USER_ID, metadata=metadata)
            except Mem0LLMError as exc:
                # mem0 wraps every LLM failure; ours already say what to fix.
                if isinstance(exc.__cause__, OptloopError):
                    raise exc.__cause__ from exc
                raise

    def search(self, query: str, k: int) -> list[MemoryItem]:
        found = self.memory.search(
            query,
            top_k=k,
            filters={"user_id": USER_ID},
            threshold=float(self._knobs["threshold"]),
            rerank=bool(self._knobs["rerank"]),
        )
        return [_memory_item(r) for r in found["results"]]

    def delete_memory(self, memory_id: str) -> None:
        self.memory.delete(memory_id)

    def update_memory(self, memory_id: str, text: str) -> None:
        self.memory.update(memory_id, text=text)

    def all_memories(self) -> list[MemoryItem]:
        listed = self.memory.get_all(filters={"user_id": USER_ID}, top_k=ALL_MEMORIES_LIMIT)
        items = [_memory_item(r) for r in listed["results"]]
        return sorted(items, key=lambda m: (m.metadata.get("created_at") or "", m.id))


def _memory_item(result: dict[str, Any]) -> MemoryItem:
    """One mem0 result dict as a :class:`MemoryItem`; our metadata and mem0's bookkeeping
    flattened."""
    metadata = dict(result.get("metadata") or {})
    for key in (
        "created_at",
        "updated_at",
        "hash",
        "attributed_to",
        "role",
        "actor_id",
        "rerank_score",
    ):
        if result.get(key) is not None:
            metadata[key] = result[key]
    return MemoryItem(
        id=str(result["id"]), text=result["memory"], score=result.get("score"), metadata=metadata
    )
