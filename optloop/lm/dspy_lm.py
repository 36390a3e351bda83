"""The DSPy LM: :class:`OptloopLM`, a ``dspy.LM`` over optloop's engine,
and :func:`configure_dspy`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import dspy
from dspy.utils.exceptions import LMError as DSPyLMError
from pydantic import BaseModel

from optloop.errors import LMError, LMUnreachableError
from optloop.lm.accounting import Accounting
from optloop.lm.backends import Backend
from optloop.lm.cache import LMCache
from optloop.lm.engine import CALL_OPTIONS, AsyncOptloopEngine, CallOptions, OptloopEngine
from optloop.lm.factory import make_backend
from optloop.lm.requests import openai_response_format, response_format_to_schema
from optloop.lm.settings import LMSettings, redact_url

# --concurrency auto: what the start-up probe found, per endpoint, for the process
# (optloop.lm.probe).
_DETECTED: dict[str, Any] = {}


class OptloopLM(dspy.LM):
    """A DSPy LM whose engine is :class:`~optloop.lm.engine.OptloopEngine`: cache, retries,
    accounting.

    Use it as any DSPy LM (``dspy.configure(lm=OptloopLM())``, see :func:`configure_dspy`)
    or call :meth:`complete` directly with OpenAI-style messages and an optional
    ``response_format``. Copies (``lm.copy(temperature=1.0)``, what DSPy's optimizers make)
    share the engine: one backend, one cache, one accounting, one endpoint health.

    The cache file is opened now when it exists (a corrupt one fails here) and created
    on the first cached call otherwise, so :meth:`check_endpoint` can fail before any
    file is written.
    """

    def __init__(
        self, settings: LMSettings | None = None, *, accounting: Accounting | None = None
    ):
        settings = settings or LMSettings.from_spec()
        backend = make_backend(settings)
        if settings.concurrency_auto and (found := _DETECTED.get(backend.identity)) is not None:
            settings = settings.model_copy(update={"concurrency": found.concurrency})
        cache = LMCache(settings.resolved_cache_path(), lazy=True) if settings.cache else None
        engine = OptloopEngine(settings, backend, accounting, cache)
        super().__init__(
            model=backend.identity,
            model_type="chat",
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
            cache=False,  # our own persistent cache, in the engine; DSPy's would double-store
            num_retries=0,  # our own retries, in the engine: bounded, logged, accounted
            engine=engine,
            async_engine=AsyncOptloopEngine(engine),
        )
        self.settings = settings

    # --- what the rest of optloop reads, all held by the shared engine --------------------

    @property
    def optloop_engine(self) -> OptloopEngine:
        return self.engine

    @property
    def backend(self) -> Backend:
        return self.optloop_engine.backend

    @property
    def accounting(self) -> Accounting:
        return self.optloop_engine.accounting

    @accounting.setter
    def accounting(self, value: Accounting) -> None:
        self.optloop_engine.accounting = value

    @property
    def watchers(self) -> list[Callable[[str | None, list[dict[str, Any]]], None]]:
        return self.optloop_engine.watchers

    @property
    def endpoint_down(self) -> str | None:
        """Why the endpoint is taken as unreachable: the last call failed so and none succeeded
        since."""
        return self.optloop_engine.health.down

    # --- DSPy's calls: the shim for what DSPy 3.4.1 does not pass to engines -----------------

    def __call__(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        with self._call_options(prompt, kwargs), _optloop_errors():
            return super().__call__(prompt, messages=messages, **kwargs)

    async def acall(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        with self._call_options(prompt, kwargs), _optloop_errors():
            return await super().acall(prompt, messages=messages, **kwargs)

    def provider_response(self, prompt: Any = None, messages: Any = None, **kwargs: Any) -> Any:
        """What ``dspy.LM.forward`` returns (an OpenAI-shaped response), through the shim
        of :meth:`__call__`.

        For LM wrappers that still speak DSPy's legacy ``forward()`` interface and delegate
        to this LM (an optimizer's wrapper): ``dspy.LM.forward`` itself would
        skip the shim, losing the rollout (every SIMBA proposal sampled with one seed).
        """
        with self._call_options(prompt, kwargs), _optloop_errors():
            return super().forward(prompt, messages, **kwargs)

    @contextlib.contextmanager
    def _call_options(self, prompt: Any, kwargs: dict[str, Any]) -> Iterator[None]:
        """Carry ``rollout_id`` and ``cache`` to the engine; hand DSPy a schema it will not
        rewrite.

        ``kwargs`` is changed in place: a ``response_format`` becomes the OpenAI dict of the
        same schema (DSPy rewrites a pydantic class into its strict form, see
        :mod:`optloop.lm.engine`), a text one is dropped.
        """
        if "response_format" in kwargs:
            fmt = openai_response_format(*response_format_to_schema(kwargs.pop("response_format")))
            if fmt is not None:
                kwargs["response_format"] = fmt
        rollout = kwargs.get("rollout_id", self.kwargs.get("rollout_id"))
        token = CALL_OPTIONS.set(
            CallOptions(rollout_id=rollout, cache=kwargs.get("cache", True) is not False)
        )
        try:
            yield
        finally:
            CALL_OPTIONS.reset(token)

    async def to_thread(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``asyncio.to_thread`` on this LM's own pool: for an async library's blocking work that
        calls the LM.

        asyncio's default pool has ``min(32, cpu_count + 4)`` threads (6 on 2 cores), fewer than
        ``--concurrency`` may ask for; this one has ``max(32, 4 x concurrency)`` (shared with
        :meth:`acall`). The calling task's context (prompt site, collectors) goes with ``fn``.
        """
        engine: AsyncOptloopEngine = self._async_engine_spec
        return await engine.run(fn, *args, **kwargs)

    # --- optloop's direct calls -------------------------------------------------------------

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        response_format: Any = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        stop: list[str] | str | None = None,
        rollout_id: Any = None,
        cache: bool | None = None,
        **ignored: Any,
    ) -> dict[str, Any]:
        """One chat completion; returns the OpenAI chat-completion dict.

        ``rollout_id`` (DSPy's way to ask for a distinct sample of the same
        prompt) enters the cache key and the sampling seed.
        """
        engine = self.optloop_engine
        request = engine.request(
            messages,
            response_format=response_format,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
            stop=stop,
            rollout_id=rollout_id,
        )
        return engine.call(request, rollout_id=rollout_id, cache=cache is not False)

    def text(self, messages: list[dict[str, Any]] | str, **kwargs: Any) -> str:
        """Convenience: the content of one completion."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self.complete(messages, **kwargs)["choices"][0]["message"]["content"] or ""

    def json(
        self,
        messages: list[dict[str, Any]] | str,
        schema: dict[str, Any] | type[BaseModel],
        **kwargs: Any,
    ) -> Any:
        """Convenience: a schema-constrained completion, parsed."""
        fmt = schema if isinstance(schema, type) else {"type": "json_object", "schema": schema}
        return json.loads(self.text(messages, response_format=fmt, **kwargs))

    def check_endpoint(self) -> list[str]:
        """Fail now if the endpoint cannot serve the run; nothing cached, nothing written.

        One uncached 1-token call; then one schema-constrained call, which settles the schema mode
        (``--lm-schema-mode``: ``auto`` picks the first mode the endpoint takes, an explicit mode
        is checked); then, under ``--concurrency auto``, the concurrency probe
        (:mod:`optloop.lm.probe`). Both are remembered per endpoint for the process (an LM built
        later on the same endpoint starts from them). Returns the lines that say what was chosen
        and why.

        Raises :class:`~optloop.errors.LMUnreachableError` (exit code 75) when the endpoint
        is unreachable or answers only server errors (HTTP 5xx), :class:`~optloop.errors.LMError`
        (exit code 2) when it refuses the key, the model or the schema mode. The embedded model
        needs no check (and loading it is not one).
        """
        if self.settings.backend == "local":
            return []
        backend = self.backend
        try:
            self.text("ping", max_tokens=1, cache=False)
            lines = [backend.choose_schema_mode().line]  # type: ignore[attr-defined]
            if self.settings.concurrency_auto:
                lines.append(self._settle_concurrency())
        except LMUnreachableError:
            raise
        except LMError as exc:
            if exc.__cause__ is not None and backend.is_server_error(exc.__cause__):
                raise LMUnreachableError(str(exc)) from exc.__cause__
            raise
        return lines

    def _settle_concurrency(self) -> str:
        """``--concurrency auto``: the endpoint's measured concurrency, now this LM's (and its
        throttle's)."""
        from optloop.lm.limits import shared_throttle
        from optloop.lm.probe import detect_concurrency

        identity = self.backend.identity
        found = _DETECTED.get(identity)
        if found is None:
            try:
                found = detect_concurrency(self.backend, self.settings.concurrency or 1)
            except Exception as exc:  # noqa: BLE001 - one line, as any other call's failure
                raise self.backend.describe_failure(exc) from exc
            _DETECTED[identity] = found
        settings, engine = self.settings, self.optloop_engine
        settings.concurrency = found.concurrency
        engine.throttle = shared_throttle(
            identity, rpm=settings.rpm, tpm=settings.tpm, concurrency=found.concurrency
        )
        return found.line

    # --- state and copies ---------------------------------------------------------------------

    def dump_state(self) -> dict[str, Any]:
        """What DSPy saves with a program: the settings (they name the key's variable, never the
        key)."""
        settings = self.settings.model_dump(mode="json")
        settings["base_url"] = redact_url(settings["base_url"])
        return {"settings": settings}

    def copy(self, **kwargs: Any) -> OptloopLM:
        """A sibling with other call defaults (``temperature``, ``rollout_id``): same engine,
        cache, accounting.

        DSPy's optimizers copy LMs to sample (SIMBA: ``lm.copy(rollout_id=r, temperature=1.0)``);
        a deep copy would duplicate the loaded model.
        """
        return super().copy(**kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> OptloopLM:
        return self.copy()


def forget_endpoints() -> None:
    """Forget every endpoint's schema mode and detected concurrency (a server restarted with other
    flags)."""
    from optloop.lm import endpoint

    with endpoint._CHOSEN_LOCK:
        endpoint._CHOSEN.clear()
    _DETECTED.clear()


@contextlib.contextmanager
def _optloop_errors() -> Iterator[None]:
    """Re-raise optloop's own LM error where DSPy wrapped it (``LMUnexpectedError`` from our
    engine)."""
    try:
        yield
    except DSPyLMError as exc:
        cause = exc.__cause__
        if isinstance(cause, LMError):
            # the chain as the engine raised it, without DSPy's wrapper
            raise cause from cause.__cause__
        raise


def configure_dspy(lm: OptloopLM | None = None, **settings_overrides: Any) -> OptloopLM:
    """Make ``lm`` DSPy's default LM with the JSONAdapter, so every DSPy call is
    schema-constrained."""
    lm = lm or OptloopLM(LMSettings.from_spec(None, **settings_overrides))
    dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
    return lm
