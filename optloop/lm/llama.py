"""The embedded backend: llama.cpp in-process, a few contexts per model file (one per prompt
site), calls serialized machine-wide."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optloop.errors import ConfigError, LMError
from optloop.lm.backends import Backend
from optloop.lm.grammar import SPACE_KEY
from optloop.lm.machine import MachineSlots, count_from_env, threads_per_slot
from optloop.lm.requests import (
    Request,
    add_usage,
    asked_until_whole,
    bound_schema,
    chat_kwargs,
    openai_response_format,
)

logger = logging.getLogger(__name__)

CONTEXTS_ENV = "OPTLOOP_LLAMA_CONTEXTS"
DEFAULT_CONTEXTS = 8


def llama_contexts() -> int:
    """How many llama.cpp contexts a process keeps per model file (``OPTLOOP_LLAMA_CONTEXTS``,
    default :data:`DEFAULT_CONTEXTS`); 1 gives every prompt site one context."""
    return count_from_env(CONTEXTS_ENV, DEFAULT_CONTEXTS)


class Context:
    """One llama.cpp context (a ``Llama`` object) and the prompt prefix it last evaluated."""

    def __init__(self, llama: Any):
        self.llama = llama
        self.lock = threading.Lock()
        self.prefix = ""  # digest of the system message of its last call
        self.used = 0


class ContextPool:
    """Up to ``size`` llama.cpp contexts on one model file, one per prompt site.

    llama.cpp skips evaluating the part of a prompt its context already holds (the longest
    shared token prefix with the previous call), and evaluating the prompt is most of a call's
    time on a CPU. A memory system's calls alternate between prompt sites (graphiti: extract
    nodes, dedupe, extract edges, ... for every episode), so one context would hold the
    previous site's prompt and re-evaluate each call whole. The pool routes each call to the
    context that last served the same system message (the site's instruction, which leads its
    prompt), so a call re-evaluates only what differs from that site's previous call. A system
    message no context holds takes a new context while there are fewer than ``size``, else the
    one used longest ago. The weights are memory-mapped once by the OS; each context adds its
    own key/value cache (``n_ctx`` tokens).

    Routing changes which tokens are evaluated, not what is computed from them: greedy
    decoding gives the same answer (llama.cpp's numerics aside, which ``bench.profile``
    compares).
    """

    def __init__(self, load: Callable[[], Any], size: int):
        self.load = load
        self.size = size
        self.contexts: list[Context] = []
        self._lock = threading.Lock()
        self._tick = 0

    def take(self, prefix: str) -> Context:
        """The context for a call whose system message has digest ``prefix``."""
        with self._lock:
            self._tick += 1
            chosen = next((c for c in self.contexts if c.prefix == prefix), None)
            if chosen is None:
                if len(self.contexts) < self.size:
                    chosen = Context(self.load())
                    self.contexts.append(chosen)
                else:
                    chosen = min(self.contexts, key=lambda c: c.used)
                chosen.prefix = prefix
            chosen.used = self._tick
            return chosen


def prefix_of(messages: list[dict[str, Any]]) -> str:
    """The routing key of a call: a digest of its system message ("" without one)."""
    first = messages[0] if messages else {}
    text = str(first.get("content") or "") if first.get("role") == "system" else ""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


_LOADED: dict[tuple[str, int, int], ContextPool] = {}
_LOADED_LOCK = threading.Lock()


class LocalLlamaBackend(Backend):
    """llama.cpp in-process. A pool of contexts per file (:class:`ContextPool`), shared, calls
    serialized.

    The model loads on the first call that misses the cache, so a fully
    cached run never loads it. Each model call holds one of the machine's
    llama.cpp slots (:mod:`optloop.lm.machine`), so runs on one machine take
    turns on the CPU instead of oversubscribing it.
    """

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int | None,
        n_threads: int | None,
        max_chars: int,
        max_items: int,
        slots: MachineSlots | None = None,
    ):
        if not path.is_file():
            raise ConfigError(
                f"GGUF model file not found: {path}; pass an existing file with --lm "
                "local:/path.gguf"
            )
        self.path = path
        self.n_ctx = n_ctx or 0  # 0: llama.cpp takes the training context from the GGUF's metadata
        self.slots = slots or MachineSlots()
        self.n_threads = n_threads or threads_per_slot(self.slots.slots)
        self.max_chars = max_chars
        self.max_items = max_items
        self._waits = threading.local()

    @property
    def identity(self) -> str:
        stat = self.path.stat()  # name + size tell models apart without hashing 100 MB
        return f"local:{self.path.name}:{stat.st_size}"

    def decoding(self, request: Request) -> str | None:
        if request.json_mode and request.schema:
            return f"bounds:{self.max_items}x{self.max_chars};{SPACE_KEY}"
        return None

    def queued_s(self) -> float:
        return getattr(self._waits, "seconds", 0.0)

    @property
    def loaded(self) -> bool:
        return (str(self.path), self.n_ctx, self.n_threads) in _LOADED

    def _model(self) -> ContextPool:
        key = (str(self.path), self.n_ctx, self.n_threads)
        with _LOADED_LOCK:
            if key not in _LOADED:
                _LOADED[key] = ContextPool(self._load, llama_contexts())
            return _LOADED[key]

    def _load(self) -> Any:
        from optloop.lm.sampling import GrammarFirstLlama

        started = time.perf_counter()
        llama = GrammarFirstLlama(
            model_path=str(self.path),
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            verbose=False,
            seed=0,
        )
        logger.info(
            "loaded %s in %.2fs (%d threads, context %d tokens)",
            self.path.name,
            time.perf_counter() - started,
            self.n_threads,
            llama.n_ctx(),
        )
        return llama

    def complete(self, request: Request) -> dict[str, Any]:
        context = self._model().take(prefix_of(request.messages))
        self._waits.seconds = 0.0

        def send(max_chars: int, max_items: int) -> dict[str, Any]:
            # llama.cpp takes a schema as json_object + schema (optloop.lm.requests.SCHEMA_MODES);
            # GrammarFirstLlama decodes it under optloop's grammar (optloop.lm.grammar)
            schema = (
                bound_schema(request.schema, max_chars=max_chars, max_items=max_items)
                if request.schema
                else None
            )
            kwargs = chat_kwargs(
                request, openai_response_format(schema, request.json_mode, "json_object")
            )
            with context.lock, self.slots.hold() as waited:
                self._waits.seconds += waited
                try:
                    response: dict[str, Any] = context.llama.create_chat_completion(**kwargs)
                # e.g. "Requested tokens (9000) exceed context window of 8192"
                except ValueError as exc:
                    raise LMError(
                        f"local model {self.path.name}: {exc}; shorten the prompt or raise n_ctx"
                    ) from None
            return response

        def tightening(max_chars: int, max_items: int) -> None:
            logger.debug(
                "JSON answer truncated at %d tokens; asking again with at most %d items of "
                "%d chars",
                request.max_tokens,
                max_items,
                max_chars,
            )

        if request.json_mode and request.schema:
            # A truncated JSON answer is asked again under tighter bounds (requests.TIGHTEN).
            return asked_until_whole(send, self.max_chars, self.max_items, tightening=tightening)
        response = send(self.max_chars, self.max_items)
        spent: dict[str, Any] = {}
        add_usage(spent, response)
        response["usage"] = spent
        return response

    def is_transient(self, exc: BaseException) -> bool:
        # Decoding is deterministic for a given request and seed, and truncation was already
        # handled above by tightening the schema: asking again would repeat the same answer.
        return False
