"""The endpoint backend: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, a
llama.cpp server).

Two things differ between such servers and are settled per endpoint, once per process:

* the **schema mode** (``--lm-schema-mode``, :data:`~optloop.lm.requests.SCHEMA_MODES`): how a
  response schema is sent. ``auto`` (the default) asks the endpoint one small schema-constrained
  question (:data:`SCHEMA_PROBE`) in ``json_schema``, then ``json_object`` + schema, then ``none``,
  and keeps the first mode the endpoint accepts and honours (its answer follows the probe's
  schema). The mode chosen is part of every cache key (:meth:`OpenAICompatibleBackend.decoding`),
  as an explicit one is;
* a **request error** (:func:`request_error`): a body the server refuses for a field of the request
  (a validation error, an unsupported parameter, a prompt longer than the server's context) fails
  the call at once, with the field and what to change, instead of being retried as a server fault.

In ``json_object`` mode (llama.cpp's servers, which decode under a grammar built from the schema,
as the embedded model does) a JSON answer cut at ``max_tokens`` is asked for again under tighter
string and array bounds (:data:`~optloop.lm.requests.TIGHTEN`), as the embedded model's is: the
same request again would decode the same cut answer.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import re
import threading
from dataclasses import dataclass, replace
from typing import Any

from optloop.errors import ConfigError, LMError, LMUnreachableError
from optloop.lm.backends import Backend
from optloop.lm.limits import parse_retry_after
from optloop.lm.requests import (
    SCHEMA_MODES,
    MalformedResponse,
    Request,
    SchemaMode,
    asked_until_whole,
    bound_schema,
    chat_kwargs,
    check_json,
    check_schema,
    openai_response_format,
    with_schema_instruction,
)
from optloop.lm.settings import LMSettings, redact_url

logger = logging.getLogger(__name__)

SCHEMA_PROBE = "optloop schema-mode probe: which of these is a city?"
"""The user message of the schema-mode probe (a test server recognizes it by this text)."""
_PROBE_SCHEMA: dict[str, Any] = {
    "title": "Probe",
    "type": "object",
    "additionalProperties": False,
    "required": ["city"],
    "properties": {"city": {"type": "string", "enum": ["Lisbon", "Tuesday", "Blue"]}},
}
_PROBE_MESSAGES = [
    {"role": "system", "content": "Answer in JSON."},
    {"role": "user", "content": f"{SCHEMA_PROBE} Lisbon, Tuesday, Blue."},
]


class LMRequestError(LMError):
    """The endpoint refused a call for the request itself (a field, the prompt's size): retrying
    cannot help.

    Exit code 2: something in the command (or the server's start-up flags) must change.
    """


@dataclass(frozen=True)
class SchemaChoice:
    """The schema mode an endpoint gets for this process, and the line that says why."""

    mode: SchemaMode
    line: str


_CHOSEN: dict[str, SchemaChoice] = {}
_CHOSEN_LOCK = threading.Lock()


class OpenAICompatibleBackend(Backend):
    """Any OpenAI-compatible chat-completions endpoint."""

    def __init__(self, settings: LMSettings):
        import openai

        self.model = settings.model
        self.base_url = settings.base_url
        self.schema_setting = settings.schema_mode
        self.max_chars, self.max_items = settings.max_string_chars, settings.max_array_items
        key = os.environ.get(settings.api_key_env)
        if not key:
            if not settings.base_url:
                raise ConfigError(
                    f"{settings.api_key_env} is not set; export it, or point --lm-base-url / "
                    "OPENAI_BASE_URL at a local OpenAI-compatible server"
                )
            key = "not-needed"  # vLLM, Ollama and llama.cpp servers accept any key
        # Retries are ours (bounded, logged, accounted), not the SDK's. The timeout is one HTTP
        # request's:
        # it starts when the request is sent, after the wait for a --concurrency slot
        # (optloop.lm.limits).
        self.client = openai.OpenAI(
            base_url=settings.base_url, api_key=key, timeout=settings.timeout_s, max_retries=0
        )

    @property
    def identity(self) -> str:
        return f"openai:{self.model}@{redact_url(self.base_url) or 'api.openai.com'}"

    # --- schema mode ------------------------------------------------------------------------

    @property
    def schema_mode(self) -> SchemaMode:
        """The mode requests are sent in: the setting, or for ``auto`` the
        one :meth:`choose_schema_mode` found."""
        if self.schema_setting != "auto":
            return self.schema_setting
        return self.choose_schema_mode().mode

    def choose_schema_mode(self) -> SchemaChoice:
        """The endpoint's schema mode for this process, probed once (``auto``) and remembered per
        endpoint.

        An explicit mode is checked with the same probe, so a start-up check fails on a mode the
        endpoint refuses (with what to set instead) rather than on the run's first question.
        """
        key = f"{self.identity}|{self.schema_setting}"
        with _CHOSEN_LOCK:
            if key not in _CHOSEN:
                _CHOSEN[key] = self._probe_schema_modes()
                logger.info("%s", _CHOSEN[key].line)
            return _CHOSEN[key]

    def _probe_schema_modes(self) -> SchemaChoice:
        where = self.where()
        modes: tuple[SchemaMode, ...] = (
            SCHEMA_MODES if self.schema_setting == "auto" else (self.schema_setting,)
        )
        refused: list[str] = []
        for mode in modes:
            request = Request(
                messages=_PROBE_MESSAGES,
                schema=_PROBE_SCHEMA,
                json_mode=True,
                temperature=0.0,
                max_tokens=16,
                seed=0,
            )
            try:
                answer = self._send(request, mode)
                check_json(answer)
                check_schema(answer, _PROBE_SCHEMA)
            except MalformedResponse as exc:
                refused.append(f"{mode}: accepted but not honoured ({exc})")
                continue
            # a refusal of the mode, or a failure to report as such
            except Exception as exc:  # noqa: BLE001
                why = self.request_error(exc)
                if why is None:
                    raise self.describe_failure(exc) from exc
                refused.append(f"{mode}: refused ({self.fault_label(exc)}: {_short(exc)})")
                continue
            if self.schema_setting != "auto":
                return SchemaChoice(
                    mode, f"LM endpoint {where}: schema mode {mode} (--lm-schema-mode)"
                )
            why = f"; {'; '.join(refused)}" if refused else " (the first tried)"
            return SchemaChoice(
                mode,
                f"LM endpoint {where}: schema mode {mode}, chosen by --lm-schema-mode auto{why}",
            )
        if self.schema_setting != "auto":
            raise LMRequestError(
                f"LM endpoint {where} does not take --lm-schema-mode {self.schema_setting} "
                f"({refused[0].split(': ', 1)[1]}); use --lm-schema-mode auto"
            )
        # Mode none always sends a valid request; its answers are checked against each call's
        # schema.
        return SchemaChoice(
            "none",
            f"LM endpoint {where}: schema mode none, the schema written into the "
            f"instructions and each answer checked against it ({'; '.join(refused)})",
        )

    def decoding(self, request: Request) -> str | None:
        return f"schema_mode:{self.schema_mode}" if request.json_mode and request.schema else None

    def _response_format(
        self, request: Request, mode: SchemaMode | None = None
    ) -> dict[str, Any] | None:
        return openai_response_format(request.schema, request.json_mode, mode or self.schema_mode)

    # --- one attempt -------------------------------------------------------------------------

    def complete(self, request: Request) -> dict[str, Any]:
        mode = self.schema_mode if request.json_mode and request.schema else "json_schema"
        response = self._send(request, mode)
        if mode == "json_object" and request.json_mode and request.schema:
            response = self._tightened(request, response)
        if mode == "none" and request.json_mode:
            _unwrap_json(response)
            check_json(response)
            if request.schema:
                check_schema(response, request.schema)
        return response

    def _tightened(self, request: Request, response: dict[str, Any]) -> dict[str, Any]:
        """``response``, or where it was cut at ``max_tokens``, the answer to the same request
        under tighter bounds (:func:`~optloop.lm.requests.asked_until_whole`), with the tokens of
        every try."""
        schema = request.schema
        assert schema is not None

        def send(max_chars: int, max_items: int) -> dict[str, Any]:
            bounded = bound_schema(schema, max_chars=max_chars, max_items=max_items)
            return self._send(replace(request, schema=bounded), "json_object")

        def tightening(max_chars: int, max_items: int) -> None:
            logger.info(
                "LM endpoint %s: a JSON answer was cut at %d tokens; asking again with at most "
                "%d items of %d chars",
                self.where(),
                request.max_tokens,
                max_items,
                max_chars,
            )

        return asked_until_whole(
            send, self.max_chars, self.max_items, first=response, tightening=tightening
        )

    def _send(self, request: Request, mode: SchemaMode) -> dict[str, Any]:
        messages = (
            with_schema_instruction(request.messages, request.schema)
            if mode == "none" and request.json_mode
            else None
        )
        kwargs = chat_kwargs(request, self._response_format(request, mode), messages=messages)
        try:
            response = self.client.chat.completions.create(model=self.model, **kwargs)
        except json.JSONDecodeError as exc:  # the SDK could not parse the body at all
            # a body that starts as JSON and stops (not one that goes wrong) was cut short
            doc = exc.doc.strip()
            cut = doc[:1] in ("{", "[") and (
                exc.msg.startswith("Unterminated string") or exc.pos >= len(doc)
            )
            raise MalformedResponse(
                f"endpoint returned a body that is not JSON: {exc}",
                label="body truncated" if cut else "body not JSON",
            ) from exc
        data = response.model_dump() if hasattr(response, "model_dump") else response
        if not isinstance(data, dict) or not data.get("choices"):
            raise MalformedResponse(
                f"endpoint returned no choices: {str(data)[:200]}", label="no choices"
            )
        return data

    # --- what a failed attempt was -------------------------------------------------------------

    def is_transient(self, exc: BaseException) -> bool:
        import openai

        if self.request_error(exc) is not None:
            return False
        transient = (openai.APIConnectionError, MalformedResponse)
        return isinstance(exc, transient) or self.is_server_error(exc) or self.is_rate_limited(exc)

    def request_error(self, exc: BaseException) -> str | None:
        return request_error(exc, schema_setting=self.schema_setting)

    @staticmethod
    def _quota_exhausted(exc: BaseException) -> bool:
        """OpenAI answers 429 ``insufficient_quota`` when the account is out of credit: no wait
        cures that."""
        import openai

        return (
            isinstance(exc, openai.APIStatusError)
            and exc.status_code == 429
            and "insufficient_quota"
            in (str(getattr(exc, "code", "") or ""), str(getattr(exc, "type", "") or ""))
        )

    def is_rate_limited(self, exc: BaseException) -> bool:
        import openai

        return (
            isinstance(exc, openai.APIStatusError)
            and exc.status_code == 429
            and not self._quota_exhausted(exc)
        )

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

        return (
            isinstance(exc, openai.APIStatusError)
            and exc.status_code >= 500
            and self.request_error(exc) is None
        )

    def where(self) -> str:
        return redact_url(self.base_url) or "https://api.openai.com/v1"

    def describe_failure(self, exc: BaseException) -> LMError:
        import openai

        where = self.where()
        if (fix := self.request_error(exc)) is not None:
            return LMRequestError(
                f"LM endpoint {where} refused the request ({self.fault_label(exc)}): {fix}"
            )
        if isinstance(exc, openai.APITimeoutError):
            return LMUnreachableError(
                f"LM endpoint {where} did not answer in time; check the server, raise "
                "--lm-timeout, or lower --concurrency if the server answers one request at a "
                "time (--concurrency auto detects it)"
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            return LMUnreachableError(
                f"cannot reach LM endpoint {where} ({type(cause).__name__}); "
                "check --lm-base-url / OPENAI_BASE_URL and that the server is running"
            )
        if self._quota_exhausted(exc):
            return LMUnreachableError(
                f"LM endpoint {where} refused the call: the account's quota is exhausted "
                "(HTTP 429 insufficient_quota); add credit or raise the limit, then rerun"
            )
        if isinstance(exc, openai.AuthenticationError):
            return LMError(
                f"LM endpoint {where} rejected the API key (401); check the key in the environment"
            )
        if isinstance(exc, openai.NotFoundError):
            return LMError(
                f"LM endpoint {where} does not serve model {self.model!r} (404); check --lm"
            )
        if isinstance(exc, openai.APIStatusError):
            return LMError(
                f"LM endpoint {where} answered HTTP {exc.status_code}: {str(exc)[:200]}"
            )
        return super().describe_failure(exc)


# --- request errors ----------------------------------------------------------------------------

# HTTP statuses that mean "this request" rather than "this server" or "this account".
_REQUEST_STATUSES = {400, 413, 422}
_CONTEXT = re.compile(
    r"context[ _](length|window|size)|maximum context|too many tokens|n_ctx|prompt is too long",
    re.IGNORECASE,
)
_NUMBERS = (
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"context window of (\d+)", re.I),
    re.compile(r"n_ctx[^\d]{0,20}(\d+)", re.I),
    re.compile(r"max_model_len[^\d]{0,20}(\d+)", re.I),
)
_ASKED = (
    re.compile(r"you requested (\d+) tokens", re.I),
    re.compile(r"requested tokens \((\d+)\)", re.I),
    re.compile(r"\((\d+)\) exceed", re.I),
)
_IN_MESSAGES = re.compile(r"(\d+) in the messages", re.I)
_LOC = re.compile(r"""['"]loc['"]\s*:\s*(\([^)]*\)|\[[^\]]*\])""")
_MSG = re.compile(r"""['"]msg['"]\s*:\s*(['"])(.*?)\1""")
_PARAM = re.compile(r"[Uu]nsupported (?:parameter|value)[^'\"]*['\"]([\w.\[\]]+)['\"]")


def _body(exc: BaseException) -> tuple[str, dict[str, Any]]:
    """The error's text and, where the body is OpenAI's ``{"error": {...}}`` or FastAPI's
    ``{"detail": ...}``, that object."""
    body = getattr(exc, "body", None)
    error: dict[str, Any] = {}
    if isinstance(body, dict):
        inner = body.get("error")
        error = inner if isinstance(inner, dict) else body
    text = str(error.get("message") or "") if error else ""
    if not text and isinstance(body, dict) and "detail" in body:
        text = json.dumps(body["detail"])
    return text or str(exc), error


def request_error(exc: BaseException, *, schema_setting: str = "auto") -> str | None:
    """What to change when ``exc`` is an endpoint's refusal of the request itself, in one line;
    None when it is not one (a server fault, a connection, a rate limit, a key, a model name).

    Recognized: a prompt longer than the server's context (OpenAI ``context_length_exceeded``,
    llama.cpp, vLLM, Ollama wording) with the server's window and the prompt's size; a validation
    error naming a field (FastAPI 422, or llama.cpp's Python server, which answers HTTP 500 with
    pydantic's error text); an unsupported parameter (OpenAI's ``param``).
    """
    import openai

    if not isinstance(exc, openai.APIStatusError):
        return None
    status = exc.status_code
    text, error = _body(exc)
    code = str(error.get("code") or "")
    if code == "context_length_exceeded" or _CONTEXT.search(text):
        return _context_fix(text, error)
    names_field = bool(
        _LOC.search(text)
        or "validation error" in text.lower()
        or error.get("param")
        or _PARAM.search(text)
    )
    if status not in _REQUEST_STATUSES and not (status >= 500 and names_field):
        return None
    field = _field(text, error)
    reason = _reason(text)
    if field.startswith("response_format"):
        fix = (
            "set --lm-schema-mode json_object (llama.cpp's servers) or none, or leave it at auto"
            if schema_setting != "auto"
            else "set --lm-schema-mode none"
        )
        return f"the server does not take this response_format ({field}: {reason}); {fix}"
    if field:
        return (
            f"the server refuses the request's {field} ({reason}); check the flag that sets it "
            "or the server"
        )
    return f"the server refuses the request ({reason[:200]})"


def _field(text: str, error: dict[str, Any]) -> str:
    if error.get("param"):
        return str(error["param"])
    if (loc := _LOC.search(text)) is not None:
        try:
            parts = ast.literal_eval(loc.group(1))
        except (ValueError, SyntaxError):
            parts = ()
        return ".".join(str(p) for p in parts if p != "body")
    if (param := _PARAM.search(text)) is not None:
        return param.group(1)
    return ""


def _reason(text: str) -> str:
    if (msg := _MSG.search(text)) is not None:
        return msg.group(2)
    return " ".join(text.split())[:200]


def _context_fix(text: str, error: dict[str, Any]) -> str:
    window = next((int(m.group(1)) for p in _NUMBERS if (m := p.search(text))), None)
    asked = next((int(m.group(1)) for p in _ASKED if (m := p.search(text))), None)
    prompt = int(m.group(1)) if (m := _IN_MESSAGES.search(text)) else None
    # llama.cpp's C++ llama-server puts the sizes in the error object itself.
    window = window or _whole(error.get("n_ctx"))
    prompt = prompt or _whole(error.get("n_prompt_tokens"))
    sizes = []
    if prompt is not None:
        sizes.append(f"a {prompt}-token prompt")
    if asked is not None:
        sizes.append(f"{asked} tokens with the answer")
    if window is not None:
        sizes.append(f"the server's context is {window}")
    told = f" ({', '.join(sizes)})" if sizes else ""
    total = asked or prompt
    need = f" to at least {2 ** math.ceil(math.log2(total))}" if total else ""
    return (
        f"the prompt does not fit the server's context window{told}; restart the server with a "
        f"larger context{need} (llama.cpp's Python server: --n_ctx; llama-server: -c per "
        "--parallel slot; vLLM: --max-model-len; Ollama: OLLAMA_CONTEXT_LENGTH) or shorten the "
        "prompt"
    )


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _short(exc: BaseException) -> str:
    text, _ = _body(exc)
    return _reason(text)[:160]


def _unwrap_json(response: dict[str, Any]) -> None:
    """Schema mode ``none``: an answer that wraps its JSON object in prose or a code fence is cut
    to the object (from the first ``{`` to the last ``}``) when the object parses."""
    message = (response.get("choices") or [{}])[0].get("message") or {}
    content = message.get("content") or ""
    start, end = content.find("{"), content.rfind("}")
    if start < 0 or end <= start or (start == 0 and end == len(content) - 1):
        return
    try:
        json.loads(content[start : end + 1])
    except json.JSONDecodeError:
        return
    message["content"] = content[start : end + 1]
