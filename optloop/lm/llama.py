"""The embedded backend: llama.cpp in-process, one model object per file, calls serialized
machine-wide."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from optloop.errors import ConfigError, LMError
from optloop.lm.backends import Backend
from optloop.lm.machine import MachineSlots, threads_per_slot
from optloop.lm.requests import (
    MAX_TIGHTENINGS,
    Request,
    add_usage,
    bound_schema,
    chat_kwargs,
    openai_response_format,
    tighter,
    truncated,
)

logger = logging.getLogger(__name__)

_LOADED: dict[tuple[str, int, int], tuple[Any, threading.Lock]] = {}
_LOADED_LOCK = threading.Lock()


class LocalLlamaBackend(Backend):
    """llama.cpp in-process. One model object per file, shared, calls serialized.

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
            return f"bounds:{self.max_items}x{self.max_chars}"
        return None

    def queued_s(self) -> float:
        return getattr(self._waits, "seconds", 0.0)

    @property
    def loaded(self) -> bool:
        return (str(self.path), self.n_ctx, self.n_threads) in _LOADED

    def _model(self) -> tuple[Any, threading.Lock]:
        key = (str(self.path), self.n_ctx, self.n_threads)
        with _LOADED_LOCK:
            if key not in _LOADED:
                from llama_cpp import Llama

                started = time.perf_counter()
                llama = Llama(
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
                _LOADED[key] = (llama, threading.Lock())
            return _LOADED[key]

    def complete(self, request: Request) -> dict[str, Any]:
        llama, lock = self._model()
        spent: dict[str, int] = {}
        self._waits.seconds = 0.0
        max_chars, max_items = self.max_chars, self.max_items
        # A truncated JSON answer is asked again under tighter bounds (requests.TIGHTEN).
        for tightening in range(MAX_TIGHTENINGS + 1):
            # llama.cpp takes a schema as json_object + schema (see
            # optloop.lm.requests.SCHEMA_MODES).
            schema = (
                bound_schema(request.schema, max_chars=max_chars, max_items=max_items)
                if request.schema
                else None
            )
            kwargs = chat_kwargs(
                request, openai_response_format(schema, request.json_mode, "json_object")
            )
            with lock, self.slots.hold() as waited:
                self._waits.seconds += waited
                try:
                    response = llama.create_chat_completion(**kwargs)
                except (
                    ValueError
                ) as exc:  # e.g. "Requested tokens (9000) exceed context window of 8192"
                    raise LMError(
                        f"local model {self.path.name}: {exc}; shorten the prompt or raise n_ctx"
                    ) from None
            add_usage(spent, response)
            if (
                not (request.json_mode and request.schema and truncated(response))
                or tightening == MAX_TIGHTENINGS
            ):
                break
            max_chars, max_items = tighter(max_chars, max_items)
            logger.debug(
                "JSON answer truncated at %d tokens; asking again with at most %d items of "
                "%d chars",
                request.max_tokens,
                max_items,
                max_chars,
            )
        response["usage"] = spent
        return response

    def is_transient(self, exc: BaseException) -> bool:
        # Decoding is deterministic for a given request and seed, and truncation was already
        # handled above by tightening the schema: asking again would repeat the same answer.
        return False
