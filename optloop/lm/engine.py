"""optloop's DSPy engine: ``complete(lm15.Request) -> lm15.Response`` over one backend.

DSPy 3.4 runs a custom model through an *engine* passed to ``dspy.LM(engine=...,
async_engine=...)``: one canonical ``dspy.lm15.Request`` in per attempt, one
``dspy.lm15.Response`` out. optloop's engine keeps what optloop needs in one place, for DSPy's
calls and optloop's own direct calls (:meth:`OptloopEngine.call`) alike: the persistent cache
(:class:`~optloop.lm.cache.LMCache`) with single-flight misses, retries with jittered backoff
(HTTP 429 on a budget of its own), fault labels and the endpoint's health, the process's
``--rpm`` / ``--tpm`` / ``--concurrency`` throttle (:mod:`optloop.lm.limits`), one
:class:`~optloop.lm.accounting.CallRecord` per call charged to the calling prompt site with its
dollar cost, and the request watchers. DSPy's own retries and cache are off for this LM. What
DSPy's engine interface cannot carry (``rollout_id``, ``cache=``, a pydantic
``response_format``, optloop's own errors) is bridged in :class:`~optloop.lm.dspy_lm.OptloopLM`,
through :data:`CALL_OPTIONS`; ``docs/architecture.md`` ("The LM layer") says how.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, cast

from tenacity import RetryCallState, RetryError, Retrying, retry_if_exception

from optloop.errors import LMError, LMUnreachableError
from optloop.lm.accounting import Accounting, CallRecord, current_site
from optloop.lm.backends import Backend
from optloop.lm.cache import LMCache
from optloop.lm.limits import Backoff, estimate_tokens, shared_throttle
from optloop.lm.pricing import ModelPrice
from optloop.lm.requests import (
    Request,
    check_json,
    mix_seed,
    plain_message,
    response_format_to_schema,
    truncated,
)
from optloop.lm.settings import LMSettings

logger = logging.getLogger(__name__)

# Calls in a row that end on HTTP 5xx (after their retries) before the endpoint is taken as down.
SERVER_ERRORS_DOWN = 3


@dataclass(frozen=True)
class CallOptions:
    """What a DSPy call asked for that DSPy does not pass to engines (see the module docstring)."""

    rollout_id: Any = None
    cache: bool = True


CALL_OPTIONS: contextvars.ContextVar[CallOptions] = contextvars.ContextVar(
    "optloop_call_options", default=CallOptions()
)


@dataclass
class EndpointHealth:
    """What an LM's calls have shown of its endpoint; one object, shared by the LM and its
    copies."""

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

    def __init__(
        self,
        settings: LMSettings,
        backend: Backend,
        accounting: Accounting | None = None,
        cache: LMCache | None = None,
    ):
        self.settings = settings
        self.backend = backend
        self.accounting = accounting or Accounting()
        self.cache = cache
        self.health = EndpointHealth()
        self._health_lock = threading.Lock()
        # Load: one throttle per endpoint and limits, process-wide; the price of the model, if it
        # has one.
        self.throttle = shared_throttle(
            backend.identity,
            rpm=settings.rpm,
            tpm=settings.tpm,
            concurrency=settings.concurrency or 1,
        )
        self.price: ModelPrice | None = settings.price()
        self.backoff = Backoff(random.Random())
        # Single flight: concurrent calls with one cache key wait for the first one and get its
        # answer from the cache, so N threads record exactly what one thread calling in turn would.
        self._inflight: dict[str, list[Any]] = {}
        self._inflight_lock = threading.Lock()
        # Called with (site, messages) before every request, cached or not. A benchmark's
        # witness (e.g. that a text never reaches the proposer), not a way to change requests.
        self.watchers: list[Callable[[str | None, list[dict[str, Any]]], None]] = []

    # --- optloop's own calls ----------------------------------------------------------------

    def request(
        self,
        messages: list[Any],
        *,
        response_format: Any = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        stop: list[str] | str | None = None,
        rollout_id: Any = None,
    ) -> Request:
        """optloop's :class:`Request` for these arguments; unset ones take the settings' values.

        ``rollout_id`` (DSPy's way to ask for a distinct sample of the same prompt) changes the
        seed.
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

    def call(
        self, request: Request, *, rollout_id: Any = None, cache: bool = True
    ) -> dict[str, Any]:
        """One chat completion through the cache and the retries; returns the OpenAI
        chat-completion dict.

        Safe to call from many threads (and, through :class:`AsyncOptloopEngine`, many tasks) at
        once:
        concurrent calls with one cache key make one model call between them (the others wait
        for it and are served from the cache, as they would be one after another).
        """
        for watch in self.watchers:
            watch(current_site(), request.messages)
        payload = {"model": self.backend.identity, **asdict(request), "rollout_id": rollout_id}
        started = time.perf_counter()
        try:
            # may probe the endpoint once (the schema mode)
            decoding = self.backend.decoding(request)
        except LMError as exc:  # the probe's failure is this call's
            self._record(request, None, started, cached=False, error=str(exc))
            if isinstance(exc, LMUnreachableError):
                with self._health_lock:
                    self.health.down = str(exc)
            raise
        if decoding is not None:
            payload["decoding"] = decoding
        key = LMCache.key(payload)
        if self.cache is None or not cache:
            return self._call_model(request, key, started, store=False)
        if (timed := self.cache.get_timed(key)) is not None:
            self._record(request, timed[0], started, cached=True, key=key, replayed=timed[1])
            return timed[0]
        with self._single_flight(key):
            # another thread's call for this key just finished
            if (timed := self.cache.get_timed(key)) is not None:
                self._record(request, timed[0], started, cached=True, key=key, replayed=timed[1])
                return timed[0]
            return self._call_model(request, key, started, store=True)

    @contextlib.contextmanager
    def _single_flight(self, key: str) -> Any:
        with self._inflight_lock:
            entry = self._inflight.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._inflight_lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._inflight[key]

    def _call_model(
        self, request: Request, key: str, started: float, *, store: bool
    ) -> dict[str, Any]:
        """The model call with its retries (see the module docstring of :mod:`optloop.lm.limits`
        for the waits).

        Two budgets, kept apart: transient faults (5xx, dropped connections, bad bodies,
        timeouts) get ``max_retries`` retries, and a second timed-out attempt ends the call;
        HTTP 429 is retried for as long as the call's total sleep on 429s stays within
        ``rate_limit_wait_s`` (beyond it, or if one ``Retry-After`` alone exceeds it, the
        endpoint is taken as down: :class:`~optloop.errors.LMUnreachableError`, the run stops
        resumable, no question is failed).
        """
        backend, settings = self.backend, self.settings
        attempts = timeouts = rate_limited = 0
        faults: list[str] = []
        queued = throttled = limit_wait = 0.0
        last_retry_after: float | None = None
        estimate = (
            estimate_tokens(request.messages, request.schema, request.max_tokens)
            if self.throttle.tokens is not None
            else 0
        )

        def attempt() -> dict[str, Any]:
            nonlocal attempts, timeouts, queued, throttled, rate_limited
            attempts += 1
            with self.throttle.attempt(estimate) as waited:
                try:
                    response = backend.complete(request)
                    if request.json_mode:
                        check_json(response)
                except Exception as exc:
                    if backend.is_rate_limited(exc):
                        rate_limited += 1
                        # refused: nothing of the estimate was spent
                        self.throttle.settle(estimate, 0)
                    else:
                        faults.append(backend.fault_label(exc))
                        timeouts += backend.is_timeout(exc)
                    raise
                finally:
                    queued += backend.queued_s()
                    throttled += waited[0]
            usage = response.get("usage") or {}
            spent = usage.get("total_tokens")
            if spent is None and usage:
                spent = int(usage.get("prompt_tokens") or 0) + int(
                    usage.get("completion_tokens") or 0
                )
            self.throttle.settle(estimate, spent)
            return response

        def failure(rs: RetryCallState) -> BaseException:
            """The exception of the attempt that failed (tenacity waits and stops only after
            one)."""
            return cast(BaseException, rs.outcome.exception())  # type: ignore[union-attr]

        def wait(rs: RetryCallState) -> float:
            nonlocal last_retry_after
            exc = failure(rs)
            last_retry_after = backend.retry_after(exc)
            if backend.is_rate_limited(exc):
                return self.backoff.rate_limited(rate_limited, last_retry_after)
            return self.backoff.fault(len(faults), last_retry_after)

        def stop(rs: RetryCallState) -> bool:
            if timeouts >= 2:  # an endpoint that hung twice in a row is taken as unreachable
                return True
            if backend.is_rate_limited(failure(rs)):
                return limit_wait + (rs.upcoming_sleep or 0.0) > settings.rate_limit_wait_s
            return len(faults) > settings.max_retries

        def before_sleep(rs: RetryCallState) -> None:
            nonlocal limit_wait
            if backend.is_rate_limited(failure(rs)):
                limit_wait += rs.upcoming_sleep
                logger.info(
                    "LM call to %s rate limited (HTTP 429, %d in this call); retrying in %.1fs",
                    backend.identity,
                    rate_limited,
                    rs.upcoming_sleep,
                )
            else:
                logger.warning(
                    "LM call to %s failed (attempt %d: %s); retrying",
                    backend.identity,
                    rs.attempt_number,
                    faults[-1] if faults else "?",
                )

        retrying = Retrying(
            stop=stop,
            wait=wait,
            retry=retry_if_exception(backend.is_transient),
            before_sleep=before_sleep,
            reraise=True,
        )

        def record_failure(error: str) -> None:
            self._record(
                request,
                None,
                started,
                cached=False,
                attempts=attempts,
                error=error,
                key=key,
                faults=faults,
                queued=queued,
                load=self._load(rate_limited, limit_wait, throttled),
            )

        try:
            response = retrying(attempt)
        except LMError as exc:
            record_failure(str(exc))
            raise
        except (RetryError, Exception) as exc:  # noqa: BLE001 - turned into one actionable line
            if backend.is_rate_limited(exc):
                error: LMError = self._rate_limited_too_long(
                    exc, attempts, rate_limited, limit_wait, last_retry_after
                )
            else:
                error = self._persistent_server_error(exc, attempts) or backend.describe_failure(
                    exc
                )
            record_failure(str(error))
            if isinstance(error, LMUnreachableError):
                with self._health_lock:
                    self.health.down = str(error)
            raise error from exc
        with self._health_lock:
            self.health.down, self.health.server_errors = None, 0
        if store:  # with the model's own seconds: a wait for a slot or a limit left out
            spent = max(time.perf_counter() - started - queued - throttled - limit_wait, 0.0)
            self.cache.put(key, response, round(spent, 3))  # type: ignore[union-attr]
        self._record(
            request,
            response,
            started,
            cached=False,
            attempts=attempts,
            key=key,
            faults=faults,
            queued=queued,
            load=self._load(rate_limited, limit_wait, throttled),
        )
        return response

    @staticmethod
    def _load(rate_limited: int, limit_wait: float, throttled: float) -> dict[str, Any]:
        return {
            "retries_429": rate_limited,
            "rate_limited_s": limit_wait,
            "throttled_s": throttled,
        }

    def _rate_limited_too_long(
        self,
        exc: BaseException,
        attempts: int,
        rate_limited: int,
        limit_wait: float,
        retry_after: float | None,
    ) -> LMUnreachableError:
        asked = f"; it asked for {retry_after:.0f}s more" if retry_after is not None else ""
        return LMUnreachableError(
            f"LM endpoint {self.backend.where()} kept answering HTTP 429 (rate limited): "
            f"{rate_limited} times over {limit_wait:.0f}s of waiting in one call{asked}, past "
            f"the {self.settings.rate_limit_wait_s:.0f}s a call may wait; lower --rpm / --tpm / "
            "--concurrency or wait for the limit to reset"
        )

    def _persistent_server_error(
        self, exc: BaseException, attempts: int
    ) -> LMUnreachableError | None:
        """Counts calls that ended on a server error; at ``SERVER_ERRORS_DOWN`` in a row, the
        endpoint is down."""
        with self._health_lock:
            health = self.health
            health.server_errors = (
                health.server_errors + 1 if self.backend.is_server_error(exc) else 0
            )
            count = health.server_errors
        if count < SERVER_ERRORS_DOWN:
            return None
        return LMUnreachableError(
            f"LM endpoint {self.backend.where()} answered only server errors "
            f"({self.backend.fault_label(exc)}) "
            f"to {count} calls in a row, the last after {attempts} attempts; "
            "check the server and its logs"
        )

    def _record(
        self,
        request: Request,
        response: dict[str, Any] | None,
        started: float,
        *,
        cached: bool,
        attempts: int = 1,
        error: str | None = None,
        key: str = "",
        faults: list[str] | None = None,
        queued: float = 0.0,
        load: dict[str, Any] | None = None,
        replayed: float | None = None,
    ) -> None:
        usage = (response or {}).get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        cached_prompt = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        cost: float | None = None
        if self.price is not None:  # a cache hit or a failed call spent nothing
            cost = (
                0.0
                if cached or response is None
                else self.price.cost(prompt_tokens, completion_tokens, cached_prompt)
            )
        self.accounting.add(
            CallRecord(
                site=current_site(),
                model=self.backend.identity,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                seconds=time.perf_counter() - started,
                cached=cached,
                attempts=attempts,
                schema=request.schema is not None,
                error=error,
                key=key,
                faults=list(faults or []),
                queued_s=queued,
                cost_usd=cost,
                replayed_s=replayed,
                truncated=response is not None and truncated(response),
                reused_prompt_tokens=min(cached_prompt, prompt_tokens),
                **(load or {}),
            )
        )

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
        """No token streaming: the whole answer as one stream (llama.cpp runs it to the end
        anyway)."""
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        """Nothing to release: the backend lives as long as the LM (DSPy borrows custom
        engines)."""

    def from_lm15(self, request: Any, *, rollout_id: Any = None) -> Request:
        """An ``lm15.Request`` as optloop's :class:`Request`; what optloop cannot send is refused,
        never dropped."""
        from dspy.lm15 import TextPart, UnsupportedFeatureError

        def text(parts: Any, where: str) -> str:
            if isinstance(parts, str):
                return parts
            if not all(isinstance(part, TextPart) for part in parts):
                kinds = sorted(
                    {type(part).__name__ for part in parts if not isinstance(part, TextPart)}
                )
                raise UnsupportedFeatureError(
                    f"optloop's LM sends text only; {where} carries {kinds}", feature=where
                )
            return "".join(part.text for part in parts)

        if request.tools:
            raise UnsupportedFeatureError("optloop's LM does not call tools", feature="tools")
        config = request.config
        unsupported = [
            name
            for name in (
                "top_p",
                "top_k",
                "tool_choice",
                "reasoning",
                "cache",
                "frequency_penalty",
                "presence_penalty",
                "service_tier",
                "user_id",
                "store",
                "logprobs",
                "probabilities",
                "extensions",
            )
            if getattr(config, name, None) is not None
        ]
        if unsupported:
            raise UnsupportedFeatureError(
                f"optloop's LM does not take {unsupported}", feature=f"config.{unsupported[0]}"
            )
        messages: list[dict[str, Any]] = []
        if request.system is not None:
            messages.append({"role": "system", "content": text(request.system, "system")})
        for i, message in enumerate(request.messages):
            role = "system" if message.role == "developer" else message.role
            messages.append({"role": role, "content": text(message.parts, f"messages[{i}]")})
        return self.request(
            messages,
            response_format=config.response_format,
            temperature=config.temperature,
            max_tokens=config.max_tokens,
            seed=config.seed,
            stop=list(config.stop) or None,
            rollout_id=rollout_id,
        )


class AsyncOptloopEngine:
    """The async counterpart DSPy awaits in ``lm.acall``: the sync engine on a worker thread.

    The cache (SQLite), the retry loop and llama.cpp all block, so each call runs on a thread
    of this engine's own pool, in a copy of the awaiting task's context (so its prompt site,
    collectors and call options reach the engine). The pool is not asyncio's default one
    (``min(32, cpu_count + 4)`` threads: 6 on a 2-core machine), which would cap an async
    library's parallel calls below ``--concurrency``; it has ``max(32, 4 x concurrency)``
    threads, started as needed, and the engine's throttle bounds the requests in flight.
    """

    def __init__(self, sync: OptloopEngine):
        self.sync = sync
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    supports_response_schema = OptloopEngine.supports_response_schema
    supports_function_calling = OptloopEngine.supports_function_calling
    supports_reasoning = OptloopEngine.supports_reasoning
    supported_params = OptloopEngine.supported_params

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                workers = max(32, 4 * (self.sync.settings.concurrency or 1))
                self._pool = ThreadPoolExecutor(
                    max_workers=workers, thread_name_prefix="optloop-lm"
                )
            return self._pool

    async def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the engine's pool, in a copy of the calling task's
        context."""
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor(), call)

    async def complete(self, request: Any) -> Any:
        return await self.run(self.sync.complete, request)

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        from dspy.lm15 import response_to_events

        for event in response_to_events(await self.complete(request)):
            yield event

    async def aclose(self) -> None:
        """Nothing to release (see :meth:`OptloopEngine.close`); the pool's idle threads outlive an
        event loop."""
