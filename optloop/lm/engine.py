"""optloop's DSPy engine: ``complete(lm15.Request) -> lm15.Response`` over one backend.

DSPy 3.4 runs a custom model through an *engine* passed to ``dspy.LM(engine=...,
async_engine=...)``: the engine gets one canonical ``dspy.lm15.Request`` per attempt
and returns one ``dspy.lm15.Response`` (``dspy/clients/engines/base.py``). optloop's
engine keeps what optloop needs in one place, for DSPy's calls and optloop's own
direct calls (:meth:`OptloopEngine.call`) alike:

* the persistent cache (:class:`~optloop.lm.cache.LMCache`), keyed as before the
  engine existed, so caches written by earlier versions still answer;
* retries with backoff, fault labels, the endpoint's health (DSPy's own retries
  and cache are off for this LM: ``num_retries=0``, ``cache=False``);
* one :class:`~optloop.lm.accounting.CallRecord` per call, charged to the
  :func:`~optloop.lm.accounting.prompt_site` of the calling thread or task;
* the request watchers (a benchmark's witness of what reaches the model).

What DSPy 3.4.1's engine interface cannot carry, and how the gap is bridged
(:class:`~optloop.lm.dspy_lm.OptloopLM` is the whole shim):

* ``rollout_id`` and a call's ``cache=`` flag stop at DSPy's own cache and never
  reach an engine (``Config.extensions`` refuses them), yet optloop keys its cache
  and seeds its sampling with the rollout. ``OptloopLM.__call__``/``acall`` put
  them in a context variable (:data:`CALL_OPTIONS`) that :meth:`complete` reads.
* A pydantic ``response_format`` is rewritten by DSPy into OpenAI's strict form
  (every property required, ``None`` defaults dropped) before an engine sees it;
  the local model would then decode under another grammar than the library's own
  schema. ``OptloopLM`` hands DSPy the schema as a dict, which it passes on as is.
* An exception an engine raises that is not a DSPy/lm15 error reaches the caller
  as ``dspy.utils.exceptions.LMUnexpectedError``; ``OptloopLM`` re-raises optloop's
  own :class:`~optloop.errors.LMError` (its cause), which the pipeline handles.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from optloop.errors import LMError, LMUnreachableError
from optloop.lm.accounting import Accounting, CallRecord, current_site
from optloop.lm.backends import Backend
from optloop.lm.cache import LMCache
from optloop.lm.requests import Request, check_json, mix_seed, plain_message, response_format_to_schema
from optloop.lm.settings import LMSettings

logger = logging.getLogger(__name__)

# Calls in a row that end on HTTP 5xx (after their retries) before the endpoint is taken as down.
SERVER_ERRORS_DOWN = 3


@dataclass(frozen=True)
class CallOptions:
    """What a DSPy call asked for that DSPy does not pass to engines (see the module docstring)."""

    rollout_id: Any = None
    cache: bool = True


CALL_OPTIONS: contextvars.ContextVar[CallOptions] = contextvars.ContextVar("optloop_call_options",
                                                                           default=CallOptions())


@dataclass
class EndpointHealth:
    """What an LM's calls have shown of its endpoint; one object, shared by the LM and its copies."""

    down: str | None = None  # why the endpoint is taken as unreachable, until a call succeeds
    server_errors: int = 0  # calls in a row that ended on HTTP 5xx after their retries


class OptloopEngine:
    """The synchronous engine: one backend with cache, retries, health and accounting.

    DSPy reads the capability hints below from a custom engine (``dspy/clients/capabilities.py``):
    JSONAdapter then sends each signature's output model as the response schema.
    """

    supports_response_schema = True
    supports_function_calling = False
    supports_reasoning = False
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "seed", "stop"})

    def __init__(self, settings: LMSettings, backend: Backend, accounting: Accounting | None = None,
                 cache: LMCache | None = None):
        self.settings = settings
        self.backend = backend
        self.accounting = accounting or Accounting()
        self.cache = cache
        self.health = EndpointHealth()
        # Called with (site, messages) before every request, cached or not. A benchmark's
        # witness (e.g. that a text never reaches the proposer), not a way to change requests.
        self.watchers: list[Callable[[str | None, list[dict[str, Any]]], None]] = []

    # --- optloop's own calls ----------------------------------------------------------------

    def request(self, messages: list[Any], *, response_format: Any = None, temperature: float | None = None,
                max_tokens: int | None = None, seed: int | None = None, stop: list[str] | str | None = None,
                rollout_id: Any = None) -> Request:
        """optloop's :class:`Request` for these arguments; unset ones take the settings' values.

        ``rollout_id`` (DSPy's way to ask for a distinct sample of the same prompt) changes the seed.
        """
        schema, json_mode = response_format_to_schema(response_format)
        base_seed = self.settings.seed if seed is None else seed
        return Request(
            messages=[plain_message(m) for m in messages],
            schema=schema,
            json_mode=json_mode,
            temperature=self.settings.temperature if temperature is None else temperature,
            max_tokens=self.settings.max_tokens if max_tokens is None else max_tokens,
            seed=base_seed if rollout_id is None else mix_seed(base_seed, rollout_id),
            stop=[stop] if isinstance(stop, str) else (list(stop) if stop else None),
        )

    def call(self, request: Request, *, rollout_id: Any = None, cache: bool = True) -> dict[str, Any]:
        """One chat completion through the cache and the retries; returns the OpenAI chat-completion dict."""
        for watch in self.watchers:
            watch(current_site(), request.messages)
        payload = {"model": self.backend.identity, **asdict(request), "rollout_id": rollout_id}
        if (decoding := self.backend.decoding(request)) is not None:
            payload["decoding"] = decoding
        key = LMCache.key(payload)
        use_cache = self.cache is not None and cache
        started = time.perf_counter()
        if use_cache and (hit := self.cache.get(key)) is not None:  # type: ignore[union-attr]
            self._record(request, hit, started, cached=True, key=key)
            return hit
        attempts = 0
        faults: list[str] = []
        timeouts = 0
        queued = 0.0

        def attempt() -> dict[str, Any]:
            nonlocal attempts, timeouts, queued
            attempts += 1
            try:
                response = self.backend.complete(request)
                if request.json_mode:
                    check_json(response)
            except Exception as exc:
                faults.append(self.backend.fault_label(exc))
                timeouts += self.backend.is_timeout(exc)
                raise
            finally:
                queued += self.backend.queued_s()
            return response

        retrying = Retrying(
            # Bounded twice: by attempts, and by time (a second timed-out attempt ends the call).
            stop=stop_after_attempt(self.settings.max_retries + 1) | (lambda rs: timeouts >= 2),
            wait=wait_exponential(multiplier=0.5, max=8),
            retry=retry_if_exception(self.backend.is_transient),
            before_sleep=lambda rs: logger.warning(
                "LM call to %s failed (attempt %d: %s); retrying",
                self.backend.identity, rs.attempt_number, faults[-1] if faults else "?",
            ),
            reraise=True,
        )
        try:
            response = retrying(attempt)
        except LMError as exc:
            self._record(request, None, started, cached=False, attempts=attempts, error=str(exc), key=key,
                         faults=faults, queued=queued)
            raise
        except (RetryError, Exception) as exc:  # noqa: BLE001 - turned into one actionable line
            error = self._persistent_server_error(exc, attempts) or self.backend.describe_failure(exc)
            self._record(request, None, started, cached=False, attempts=attempts, error=str(error), key=key,
                         faults=faults, queued=queued)
            if isinstance(error, LMUnreachableError):
                self.health.down = str(error)
            raise error from exc
        self.health.down, self.health.server_errors = None, 0
        if use_cache:
            self.cache.put(key, response)  # type: ignore[union-attr]
        self._record(request, response, started, cached=False, attempts=attempts, key=key, faults=faults,
                     queued=queued)
        return response

    def _persistent_server_error(self, exc: BaseException, attempts: int) -> LMUnreachableError | None:
        """Counts calls that ended on a server error; at ``SERVER_ERRORS_DOWN`` in a row, the endpoint is down."""
        health = self.health
        health.server_errors = health.server_errors + 1 if self.backend.is_server_error(exc) else 0
        if health.server_errors < SERVER_ERRORS_DOWN:
            return None
        return LMUnreachableError(
            f"LM endpoint {self.backend.where()} answered only server errors ({self.backend.fault_label(exc)}) "
            f"to {health.server_errors} calls in a row, the last after {attempts} attempts; "
            "check the server and its logs"
        )

    def _record(self, request: Request, response: dict[str, Any] | None, started: float, *, cached: bool,
                attempts: int = 1, error: str | None = None, key: str = "", faults: list[str] | None = None,
                queued: float = 0.0) -> None:
        usage = (response or {}).get("usage") or {}
        self.accounting.add(CallRecord(
            site=current_site(),
            model=self.backend.identity,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            seconds=time.perf_counter() - started,
            cached=cached,
            attempts=attempts,
            schema=request.schema is not None,
            error=error,
            key=key,
            faults=list(faults or []),
            queued_s=queued,
        ))

    # --- the DSPy engine interface (dspy/clients/engines/base.py: Engine) -------------------

    def complete(self, request: Any) -> Any:
        """DSPy's call: an ``lm15.Request`` in, an ``lm15.Response`` out, through :meth:`call`."""
        from dspy.clients.engines.base import validate_request
        from dspy.lm15 import response_from_openai_chat

        validate_request(request)
        options = CALL_OPTIONS.get()
        ours = self.from_lm15(request, rollout_id=options.rollout_id)
        data = self.call(ours, rollout_id=options.rollout_id, cache=options.cache)
        return response_from_openai_chat(data, model=self.backend.identity)

    def stream(self, request: Any) -> Iterator[Any]:
        """No token streaming: the whole answer as one stream (llama.cpp runs it to the end anyway)."""
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to release: the backend lives as long as the LM (DSPy borrows custom engines)."""

    def from_lm15(self, request: Any, *, rollout_id: Any = None) -> Request:
        """An ``lm15.Request`` as optloop's :class:`Request`; what optloop cannot send is refused, never dropped."""
        from dspy.lm15 import TextPart, UnsupportedFeatureError

        def text(parts: Any, where: str) -> str:
            if isinstance(parts, str):
                return parts
            if not all(isinstance(part, TextPart) for part in parts):
                kinds = sorted({type(part).__name__ for part in parts if not isinstance(part, TextPart)})
                raise UnsupportedFeatureError(f"optloop's LM sends text only; {where} carries {kinds}",
                                              feature=where)
            return "".join(part.text for part in parts)

        if request.tools:
            raise UnsupportedFeatureError("optloop's LM does not call tools", feature="tools")
        config = request.config
        unsupported = [name for name in ("top_p", "top_k", "tool_choice", "reasoning", "cache", "frequency_penalty",
                                         "presence_penalty", "service_tier", "user_id", "store", "logprobs",
                                         "probabilities", "extensions") if getattr(config, name, None) is not None]
        if unsupported:
            raise UnsupportedFeatureError(f"optloop's LM does not take {unsupported}",
                                          feature=f"config.{unsupported[0]}")
        messages: list[dict[str, Any]] = []
        if request.system is not None:
            messages.append({"role": "system", "content": text(request.system, "system")})
        for i, message in enumerate(request.messages):
            role = "system" if message.role == "developer" else message.role
            messages.append({"role": role, "content": text(message.parts, f"messages[{i}]")})
        return self.request(messages, response_format=config.response_format, temperature=config.temperature,
                            max_tokens=config.max_tokens, seed=config.seed, stop=list(config.stop) or None,
                            rollout_id=rollout_id)


class AsyncOptloopEngine:
    """The async counterpart DSPy awaits in ``lm.acall``: the sync engine on a worker thread.

    The cache (SQLite), the retry loop and llama.cpp all block, so each call runs in
    ``asyncio.to_thread``; that copies the caller's context, so the prompt site and the
    call options of the awaiting task reach the engine.
    """

    def __init__(self, sync: OptloopEngine):
        self.sync = sync

    supports_response_schema = OptloopEngine.supports_response_schema
    supports_function_calling = OptloopEngine.supports_function_calling
    supports_reasoning = OptloopEngine.supports_reasoning
    supported_params = OptloopEngine.supported_params

    async def complete(self, request: Any) -> Any:
        return await asyncio.to_thread(self.sync.complete, request)

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        from dspy.lm15 import response_to_events

        for event in response_to_events(await self.complete(request)):
            yield event

    async def aclose(self) -> None:
        """Nothing to release (see :meth:`OptloopEngine.close`)."""
