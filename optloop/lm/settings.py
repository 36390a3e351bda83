"""Which model answers and how a call is made: :class:`LMSettings` (spec strings, flags) and URL
redaction. The models themselves, the bundled one included, are :mod:`optloop.lm.models`'."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, Field

from optloop.errors import ConfigError
from optloop.lm.models import BUNDLED_GGUF as BUNDLED_GGUF  # where they were first defined
from optloop.lm.models import bundled_model_path as bundled_model_path
from optloop.lm.models import check_spec_model
from optloop.lm.pricing import ModelPrice, model_price
from optloop.paths import state_dir

CONCURRENCY_ENV = "OPTLOOP_CONCURRENCY"
SCHEMA_MODE_ENV = "OPTLOOP_LM_SCHEMA_MODE"
# The embedded model runs one call at a time anyway (llama.cpp, one machine slot); an endpoint
# serves many (its default is auto: probed at start-up, see optloop.lm.probe).
DEFAULT_CONCURRENCY = {"local": 1, "openai": 8}


class LMSettings(BaseModel):
    """Everything that decides which model answers and how a call is made.

    Secrets are never stored here: ``api_key_env`` names the variable that
    holds the key, so settings can be logged and saved as run parameters.
    """

    backend: Literal["local", "openai"] = "local"
    model: str = Field(
        "",
        description="local: a short name (optloop.lm.models) or a GGUF path, empty = the bundled "
        "model; openai: the endpoint's model name",
    )
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    schema_mode: Literal["auto", "json_schema", "json_object", "none"] = Field(
        "auto",
        description=f"how a schema is sent to an endpoint (default ${SCHEMA_MODE_ENV}, else "
        "auto: the first of json_schema, json_object + schema, none that the endpoint takes)",
    )
    temperature: float = 0.0
    max_tokens: int = Field(512, gt=0)
    seed: int = 0
    timeout_s: float = Field(
        60.0, gt=0, description="per attempt; a call ends after its second timed-out attempt"
    )
    max_retries: int = Field(3, ge=0, le=10)
    cache: bool = True
    cache_path: Path | None = Field(None, description="default: $OPTLOOP_HOME/lm_cache.sqlite")
    # None: the model's training context, which llama.cpp reads from the GGUF's metadata (8192 for
    # SmolLM2). A larger window runs past what the model was trained on (llama.cpp warns); a system
    # whose prompts need it says so (mem0: ``Mem0System.local_decoding``).
    n_ctx: int | None = Field(
        None,
        gt=0,
        description="context window of a local model; default: its training "
        "context (GGUF metadata)",
    )
    n_threads: int | None = Field(
        None, description="llama.cpp threads; default: the machine's budget per slot"
    )
    # A tiny model can ramble inside a JSON string until max_tokens cuts it off.
    # Locally decoded schemas get these bounds (where the schema sets none), so
    # every constrained output closes; the result still satisfies the original.
    max_string_chars: int = Field(
        400, gt=0, description="longest JSON string under a grammar (--lm-max-chars)"
    )
    max_array_items: int = Field(
        16, gt=0, description="longest JSON array under a grammar (--lm-max-items)"
    )
    # Load (optloop.lm.limits): one throttle per endpoint, shared by the process's threads and
    # tasks.
    rpm: float | None = Field(
        None, gt=0, description="requests per minute to the model (None: no limit)"
    )
    tpm: int | None = Field(
        None,
        gt=0,
        description="tokens per minute to the model, prompt + max_tokens (None: no limit)",
    )
    concurrency: int | None = Field(
        None,
        ge=1,
        le=1024,
        description=f"requests in flight at once; default ${CONCURRENCY_ENV}, else 1 local, "
        "auto on an endpoint",
    )
    concurrency_auto: bool = Field(
        False,
        description="probe the endpoint at start-up (OptloopLM.check_endpoint): 1 when it "
        "answers one request at a time, else concurrency (8 unless set)",
    )
    rate_limit_wait_s: float = Field(
        3600.0,
        gt=0,
        description="one call's total sleep on HTTP 429 before the endpoint is taken as down",
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _auto_words(cls, data: Any) -> Any:
        """``concurrency="auto"`` (the flag's or the variable's word) is ``concurrency_auto``; an
        unset schema mode is ``$OPTLOOP_LM_SCHEMA_MODE``'s."""
        if isinstance(data, dict):
            data = dict(data)
            if str(data.get("concurrency", "")).strip().lower() == "auto":
                data["concurrency"], data["concurrency_auto"] = None, True
            if data.get("schema_mode") is None and (
                raw := os.environ.get(SCHEMA_MODE_ENV, "").strip()
            ):
                data["schema_mode"] = raw
        return data

    @pydantic.model_validator(mode="after")
    def _default_concurrency(self) -> LMSettings:
        """Unset: ``$OPTLOOP_CONCURRENCY`` (a number or auto), else 1 on the embedded model and
        auto on an endpoint. Auto starts from the backend's default and is settled by the start-up
        probe; the embedded model has nothing to probe."""
        if self.concurrency is None:
            raw = "" if self.concurrency_auto else os.environ.get(CONCURRENCY_ENV, "").strip()
            if raw and raw.lower() != "auto":
                try:
                    value = int(raw)
                except ValueError:
                    value = 0
                if not 1 <= value <= 1024:
                    raise ValueError(
                        f"{CONCURRENCY_ENV}={raw!r} must be auto or a whole number from 1 to 1024"
                    )
                self.concurrency = value
            else:
                self.concurrency = DEFAULT_CONCURRENCY[self.backend]
                self.concurrency_auto = self.backend == "openai"
        elif self.concurrency_auto and self.backend != "openai":
            self.concurrency_auto = False
        return self

    @classmethod
    def from_spec(
        cls,
        spec: str | None = None,
        *,
        defaults: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> LMSettings:
        """Parse a spec string (see :mod:`optloop.lm`); ``None`` reads ``OPTLOOP_LM``.

        ``overrides`` set any other field; ``None`` values are ignored so CLI
        flags left unset fall through to ``defaults`` (a system's ``local_decoding``: the fields
        it sets where the caller sets none), the environment and the fields' defaults.
        """
        spec = (spec or os.environ.get("OPTLOOP_LM") or "local").strip()
        fields: dict[str, Any] = {}
        if spec == "local":
            fields["backend"] = "local"
        elif spec.startswith("local:"):
            # A short name (local:qwen2.5-coder-0.5b) is stored as written, not as the path it
            # resolves to: a run's resume key then does not depend on where the state directory
            # is, and the cache key (the file's name and size) is the same as by path.
            fields.update(backend="local", model=check_spec_model(spec.removeprefix("local:")))
        elif spec.endswith(".gguf"):
            fields.update(backend="local", model=spec)
        elif spec.startswith(("openai:", "openai/")):
            fields.update(backend="openai", model=spec[len("openai:") :])
            fields["base_url"] = os.environ.get("OPENAI_BASE_URL") or None
        else:
            raise ConfigError(
                f"unknown LM spec {spec!r}; use 'local', 'local:<name>' (python -m optloop models "
                "list), 'local:/path/model.gguf' or 'openai:<model>' (with --lm-base-url for "
                "vLLM, Ollama or a llama.cpp server)"
            )
        fields.update({k: v for k, v in (defaults or {}).items() if v is not None})
        fields.update({k: v for k, v in overrides.items() if v is not None})
        try:
            settings = cls(**fields)
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            where = " " + ".".join(map(str, err["loc"])) if err["loc"] else ""
            raise ConfigError(
                f"invalid LM setting{where}: {err['msg'].removeprefix('Value error, ')}"
            ) from None
        if settings.backend == "openai" and not settings.model:
            raise ConfigError("an openai LM spec needs a model name, e.g. 'openai:gpt-4o-mini'")
        return settings

    def resolved_cache_path(self) -> Path:
        return self.cache_path or state_dir() / "lm_cache.sqlite"

    def price(self) -> ModelPrice | None:
        """The model's price per token (:func:`~optloop.lm.pricing.model_price`): an endpoint's
        model name looked up in litellm's table; None for the embedded model or a name the table
        lacks (vLLM, Ollama)."""
        return model_price(self.model) if self.backend == "openai" else None


def redact_url(url: str | None) -> str | None:
    """``url`` fit to show or log: a password or token in its user info and its query values
    masked.

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
    query = urllib.parse.urlencode(
        [(k, "***") for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)],
        safe="*",
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))
