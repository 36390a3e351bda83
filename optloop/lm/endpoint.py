"""The endpoint backend: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, a llama.cpp server)."""

from __future__ import annotations

import json
import os
from typing import Any

from optloop.errors import ConfigError, LMError, LMUnreachableError
from optloop.lm.backends import Backend
from optloop.lm.limits import parse_retry_after
from optloop.lm.requests import MalformedResponse, Request
from optloop.lm.settings import LMSettings, redact_url


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

        transient = (openai.APIConnectionError, MalformedResponse)
        return isinstance(exc, transient) or self.is_server_error(exc) or self.is_rate_limited(exc)

    @staticmethod
    def _quota_exhausted(exc: BaseException) -> bool:
        """OpenAI answers 429 ``insufficient_quota`` when the account is out of credit: no wait cures that."""
        import openai

        return (isinstance(exc, openai.APIStatusError) and exc.status_code == 429
                and "insufficient_quota" in (str(getattr(exc, "code", "") or ""), str(getattr(exc, "type", "") or "")))

    def is_rate_limited(self, exc: BaseException) -> bool:
        import openai

        return isinstance(exc, openai.APIStatusError) and exc.status_code == 429 and not self._quota_exhausted(exc)

    def retry_after(self, exc: BaseException) -> float | None:
        import openai

        if not isinstance(exc, openai.APIStatusError):
            return None
        return parse_retry_after(exc.response.headers)

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
        if self._quota_exhausted(exc):
            return LMUnreachableError(f"LM endpoint {where} refused the call: the account's quota is exhausted "
                                      "(HTTP 429 insufficient_quota); add credit or raise the limit, then rerun")
        if isinstance(exc, openai.AuthenticationError):
            return LMError(f"LM endpoint {where} rejected the API key (401); check the key in the environment")
        if isinstance(exc, openai.NotFoundError):
            return LMError(f"LM endpoint {where} does not serve model {self.model!r} (404); check --lm")
        if isinstance(exc, openai.APIStatusError):
            return LMError(f"LM endpoint {where} answered HTTP {exc.status_code}: {str(exc)[:200]}")
        return super().describe_failure(exc)
