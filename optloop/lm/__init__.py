"""The single LM layer: every LLM call optloop makes goes through :class:`OptloopLM`.

``OptloopLM`` is a ``dspy.LM`` whose engine (``dspy.LM(engine=...)``, DSPy 3.4's
custom-model interface) is optloop's own: DSPy programs, the memory systems'
prompt sites and the optimizers' proposers all share one place for caching,
retries, timeouts and accounting. See ``docs/architecture.md`` (the LM layer).

Modules:

=====================  ==================================================================
``settings``           :class:`LMSettings` (spec strings, flags), :func:`redact_url`
``models``             the registry of GGUF models (:data:`MODELS`), the bundled model, where
                       downloaded ones live; ``install`` assembles and verifies them
``accounting``         :func:`prompt_site`, :func:`collect_calls` (per
thread/task), :class:`CallRecord`,
                       :class:`Usage`, :class:`Accounting`
``cache``              :class:`LMCache`, the persistent SQLite call cache
``requests``           optloop's :class:`Request`, response formats, schema bounds, JSON checks
``backends``           the :class:`Backend` contract (one attempt)
``factory``            :func:`make_backend`: the backend a setting names
``llama``              :class:`LocalLlamaBackend`, llama.cpp in-process
``endpoint``           :class:`OpenAICompatibleBackend`, any OpenAI-compatible endpoint: schema
modes,
                       request errors (:class:`LMRequestError`)
``probe``              ``--concurrency auto``: how many requests an endpoint serves at once
``machine``            :class:`MachineSlots`, the machine-wide budget of llama.cpp threads
``limits``             :class:`Throttle` (``--rpm``/``--tpm`` token buckets, ``--concurrency``),
``Retry-After``,
                       jittered backoff
``pricing``            :func:`model_price`: dollars per token from litellm's bundled cost map,
offline ``engine``             :class:`OptloopEngine` / :class:`AsyncOptloopEngine`: cache,
retries, health,
                       accounting; ``complete(lm15.Request) -> lm15.Response``
``dspy_lm``            :class:`OptloopLM` (the ``dspy.LM``), :func:`configure_dspy`
=====================  ==================================================================

Backends (pick one with a spec string, ``--lm`` or ``OPTLOOP_LM``):

``local`` (default)
    llama.cpp in-process on the bundled SmolLM2-135M-Instruct GGUF.
``local:<name>``
    llama.cpp in-process on a model of the registry (:mod:`optloop.lm.models`) by name:
    ``qwen2.5-coder-0.5b``, ``qwen2.5-coder-1.5b`` (``python -m optloop models install``),
    ``smollm2-135m`` (the bundled one).
``local:/path/model.gguf`` or ``/path/model.gguf``
    llama.cpp in-process on any GGUF file.
``openai:<model>`` (also ``openai/<model>``)
    any OpenAI-compatible chat-completions endpoint: OpenAI, vLLM, Ollama, a
    llama.cpp server. Base URL from ``--lm-base-url`` / ``OPENAI_BASE_URL``, key
    from ``OPENAI_API_KEY`` (optional when a base URL is given).

Schema-constrained decoding: a call that carries a response schema (DSPy's
JSONAdapter passes the signature's output model; a memory library passes its
``response_format``) is decoded under that schema by llama.cpp, with every
unbounded string and array given a bound (``max_string_chars``,
``max_array_items``), so its output closes. An answer that still runs out of
``max_tokens`` is asked again under 4x, then 16x, tighter bounds at the same
budget: a shorter answer that satisfies the schema, and a failing call that
generates at most 3 x ``max_tokens``. Remote endpoints get the schema in the endpoint's
schema mode (``--lm-schema-mode``: ``json_schema``, ``json_object`` + schema for llama.cpp's
servers, ``none`` for servers that take neither; ``auto``, the default, probes once per endpoint
and process), and a body that does not parse is retried like any transient fault. A request
error (a field the server refuses, a prompt longer than its context) is not retried: the call
fails at once with :class:`LMRequestError`, naming the field and what to change.

Call records: each request appends a :class:`CallRecord` to ``lm.accounting``
with the prompt site active at that moment in the calling thread or task (see
:func:`prompt_site`), so later code can charge calls, tokens and seconds to the
site that made them.

Faults and retries: a transient fault (HTTP 5xx, a refused or dropped connection,
a truncated or non-JSON body, a timed-out attempt) is retried with exponential
backoff, ``max_retries`` times at most; a second timed-out attempt ends the call
(an endpoint that hung twice in a row is taken as unreachable). Every failed
attempt is named in its record's ``faults`` (``HTTP 503``, ``timeout``,
``body truncated``), so a retry that cured a fault is as visible as one that did
not; the tracer copies them onto the operation that made the call. After a call
fails with :class:`~optloop.errors.LMUnreachableError` (exit code 75), ``lm.endpoint_down``
holds its message until a later call succeeds. An endpoint that answers, but only with
server errors (HTTP 5xx through every retry of ``SERVER_ERRORS_DOWN`` calls in a
row, none succeeding in between), is taken as down too: the third such call
raises :class:`~optloop.errors.LMUnreachableError` instead of failing one more
question. :meth:`OptloopLM.check_endpoint` probes an endpoint at startup, before
the cache file exists.

Load: ``rpm``, ``tpm`` and ``concurrency`` (``--rpm``, ``--tpm``, ``--concurrency``,
``OPTLOOP_CONCURRENCY``; concurrency defaults to 1 on the embedded model, 8 on an
endpoint) are enforced by one :class:`~optloop.lm.limits.Throttle` per endpoint, shared by
every thread and task of the process. HTTP 429 is not a fault: it is retried apart from
``max_retries``, after the server's ``Retry-After`` (seconds or an HTTP date) or a
jittered exponential backoff, for as long as the call's total sleep on 429s stays within
``rate_limit_wait_s`` (default one hour); a 429 storm slows the run and fails no question.
Records count ``retries_429``, ``rate_limited_s`` and ``throttled_s``. OpenAI's
``insufficient_quota`` 429 (no credit) is not retried: the endpoint is taken as down.

Cost: a call to a model that litellm's bundled price table knows (``gpt-4o-mini``) carries
``cost_usd``; :attr:`Usage.cost_usd` totals it (None for a model without a price), and
:meth:`Accounting.by_site` splits it by prompt site (``optloop.loop.cost`` makes MLflow metrics of
that).

Concurrency: the cache (one SQLite connection behind a lock), the accounting (a locked
log), the prompt site and the collectors (context variables) are safe from many threads
and tasks; concurrent calls with one cache key make one model call between them, so N
threads leave the same cache, records and totals as one thread calling in turn.

Secrets: the API key is read from the environment into the HTTP client only.
Identities, records and error messages show the base URL with any user info and
query string masked (:func:`redact_url`).
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
