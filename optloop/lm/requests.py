"""One chat request as optloop's backends take it, and the JSON rules around it.

:class:`Request` is optloop's own request (plain OpenAI-style messages, a JSON schema
or none, sampling settings); DSPy's ``lm15.Request`` is converted into it at the
engine boundary (:mod:`optloop.lm.engine`). Its fields are what the cache key is
made of, so they stay as they are across DSPy versions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pydantic

from optloop.errors import ConfigError


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
    ``{"type": "json_object", "schema": ...}``, lm15's canonical
    ``{"type": "json_schema", "schema": ...}`` and plain ``{"type": "json_object"}``.
    """
    if response_format is None:
        return None, False
    if isinstance(response_format, type) and issubclass(response_format, pydantic.BaseModel):
        return response_format.model_json_schema(), True
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_schema":
            if "json_schema" not in response_format and isinstance(response_format.get("schema"), dict):
                return response_format["schema"], True  # lm15's canonical form
            inner = response_format.get("json_schema") or {}
            return inner.get("schema") or inner, True
        if kind == "json_object":
            return response_format.get("schema"), True
        if kind == "text":
            return None, False
    raise ConfigError(f"unsupported response_format {response_format!r}")


def openai_response_format(schema: dict[str, Any] | None, json_mode: bool) -> dict[str, Any] | None:
    """(schema, json_mode) as an OpenAI ``response_format`` (the inverse of :func:`response_format_to_schema`)."""
    if not json_mode:
        return None
    if schema is None:
        return {"type": "json_object"}
    name = str(schema.get("title") or "response")[:64]
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


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


def plain_message(message: Any) -> dict[str, Any]:
    if isinstance(message, dict):
        return dict(message)
    return dict(getattr(message, "model_dump", lambda: vars(message))())


def mix_seed(seed: int, rollout_id: Any) -> int:
    """The sampling seed of rollout ``rollout_id`` (DSPy's way to ask for another sample of one prompt)."""
    digest = hashlib.sha256(f"{seed}:{rollout_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def check_json(response: dict[str, Any]) -> None:
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
