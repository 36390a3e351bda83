"""The single LM layer: every LLM call optloop makes goes through :class:`OptloopLM`.

``OptloopLM`` is a ``dspy.LM`` whose engine (``dspy.LM(engine=...)``, DSPy 3.4's custom-model
interface) is optloop's own: DSPy programs, the memory systems' prompt sites and the optimizers'
proposers all share one place for caching, retries, timeouts, load limits and accounting. A
backend is picked with a spec string (``--lm`` or ``OPTLOOP_LM``: ``local``, ``local:<name>``,
``local:/path/model.gguf``, ``openai:<model>``); each call is recorded as a :class:`CallRecord`
charged to the prompt site active in its thread or task (:func:`prompt_site`).

The contract: a transient fault is retried, a request error (:class:`LMRequestError`) is not, an
endpoint taken as down raises :class:`~optloop.errors.LMUnreachableError` (exit 75); HTTP 429
waits and fails no question; concurrent calls with one cache key make one model call, so N threads
leave the serial run's cache, records and totals; secrets never leave the HTTP client
(:func:`redact_url`). ``docs/architecture.md`` ("The LM layer") has the module of each part, the
backends, schema-constrained decoding, retries, load, cost and concurrency.
"""

from __future__ import annotations

from optloop.lm.accounting import (
    Accounting,
    CallRecord,
    Usage,
    collect_calls,
    current_site,
    prompt_site,
    start_collecting,
    stop_collecting,
)
from optloop.lm.backends import Backend
from optloop.lm.cache import CACHE_FORMAT, LMCache
from optloop.lm.dspy_lm import OptloopLM, configure_dspy, forget_endpoints
from optloop.lm.endpoint import LMRequestError, OpenAICompatibleBackend, request_error
from optloop.lm.engine import SERVER_ERRORS_DOWN, AsyncOptloopEngine, EndpointHealth, OptloopEngine
from optloop.lm.factory import make_backend
from optloop.lm.limits import Throttle, TokenBucket, parse_retry_after, shared_throttle
from optloop.lm.llama import LocalLlamaBackend
from optloop.lm.machine import MachineSlots, llama_slots, lock_dir, threads_per_slot
from optloop.lm.models import MODELS, LocalModel, models_dir
from optloop.lm.pricing import ModelPrice, model_price, price_source
from optloop.lm.requests import (
    SCHEMA_MODES,
    MalformedResponse,
    Request,
    SchemaMode,
    bound_schema,
    chat_kwargs,
    check_json,
    openai_response_format,
    response_format_to_schema,
)
from optloop.lm.settings import (
    BUNDLED_GGUF,
    CONCURRENCY_ENV,
    SCHEMA_MODE_ENV,
    LMSettings,
    bundled_model_path,
    redact_url,
)

_check_json = check_json  # the name tests knew before the package split

__all__ = [
    "BUNDLED_GGUF",
    "CACHE_FORMAT",
    "CONCURRENCY_ENV",
    "MODELS",
    "SCHEMA_MODES",
    "SCHEMA_MODE_ENV",
    "SERVER_ERRORS_DOWN",
    "Accounting",
    "AsyncOptloopEngine",
    "Backend",
    "CallRecord",
    "EndpointHealth",
    "LMCache",
    "LMRequestError",
    "LMSettings",
    "LocalLlamaBackend",
    "LocalModel",
    "MachineSlots",
    "MalformedResponse",
    "ModelPrice",
    "OpenAICompatibleBackend",
    "OptloopEngine",
    "OptloopLM",
    "Request",
    "SchemaMode",
    "Throttle",
    "TokenBucket",
    "Usage",
    "bound_schema",
    "bundled_model_path",
    "chat_kwargs",
    "check_json",
    "collect_calls",
    "configure_dspy",
    "current_site",
    "forget_endpoints",
    "llama_slots",
    "lock_dir",
    "make_backend",
    "model_price",
    "models_dir",
    "openai_response_format",
    "parse_retry_after",
    "price_source",
    "prompt_site",
    "redact_url",
    "request_error",
    "response_format_to_schema",
    "shared_throttle",
    "start_collecting",
    "stop_collecting",
    "threads_per_slot",
]
