"""One chat request as optloop's backends take it, and the JSON rules around it.

:class:`Request` is optloop's own request (plain OpenAI-style messages, a JSON schema
or none, sampling settings); DSPy's ``lm15.Request`` is converted into it at the
engine boundary (:mod:`optloop.lm.engine`). Its fields are what the cache key is
made of, so they stay as they are across DSPy versions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

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
            if "json_schema" not in response_format and isinstance(
                response_format.get("schema"), dict
            ):
                return response_format["schema"], True  # lm15's canonical form
            inner = response_format.get("json_schema") or {}
            return inner.get("schema") or inner, True
        if kind == "json_object":
            return response_format.get("schema"), True
        if kind == "text":
            return None, False
    raise ConfigError(f"unsupported response_format {response_format!r}")


SchemaMode = Literal["json_schema", "json_object", "none"]
SCHEMA_MODES: tuple[SchemaMode, ...] = ("json_schema", "json_object", "none")
"""How a response schema reaches an endpoint, most constrained first (``auto`` tries them in this
order).

``json_schema``: OpenAI's ``{"type": "json_schema", "json_schema": {"name", "schema"}}`` (OpenAI,
vLLM, Ollama); ``json_object``: ``{"type": "json_object", "schema": ...}`` (llama.cpp's servers);
``none``: no ``response_format``, the schema written into the instructions
(:func:`schema_instruction`) and the answer checked against it (:func:`check_schema`)."""


def openai_response_format(
    schema: dict[str, Any] | None, json_mode: bool, mode: SchemaMode = "json_schema"
) -> dict[str, Any] | None:
    """(schema, json_mode) as the ``response_format`` of schema mode ``mode`` (the inverse of
    :func:`response_format_to_schema`); None when nothing is asked for, or in mode ``none``."""
    if not json_mode or mode == "none":
        return None
    if schema is None:
        return {"type": "json_object"}
    if mode == "json_object":
        return {"type": "json_object", "schema": schema}
    name = str(schema.get("title") or "response")[:64]
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def schema_instruction(schema: dict[str, Any] | None) -> str:
    """What schema mode ``none`` appends to the system message in place of a
    ``response_format``."""
    if schema is None:
        return "Answer with one JSON object and nothing else."
    return (
        "Answer with one JSON object and nothing else, valid under this JSON schema:\n"
        + json.dumps(schema, ensure_ascii=False, sort_keys=True)
    )


def with_schema_instruction(
    messages: list[dict[str, Any]], schema: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """``messages`` with :func:`schema_instruction` at the end of the system message (one added if
    none)."""
    note = schema_instruction(schema)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{note}"
    else:
        out.insert(0, {"role": "system", "content": note})
    return out


def chat_kwargs(
    request: Request,
    response_format: dict[str, Any] | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The one mapping of a :class:`Request` to chat-completion keyword arguments, for llama.cpp's
    ``create_chat_completion`` and an OpenAI-compatible client alike (the model name is the
    caller's)."""
    kwargs: dict[str, Any] = dict(
        messages=request.messages if messages is None else messages,
        temperature=request.temperature,
        max_tokens=request.max_tokens,
        seed=request.seed,
    )
    if request.stop:
        kwargs["stop"] = request.stop
    if response_format is not None:
        kwargs["response_format"] = response_format
    return kwargs


def check_schema(response: dict[str, Any], schema: dict[str, Any]) -> None:
    """An answer decoded without a grammar (schema mode ``none``) must still follow the schema:
    one that does not is a :class:`MalformedResponse` (retried like a body that does not parse)."""
    import jsonschema

    content = ((response.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    try:
        jsonschema.validate(json.loads(content), schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(map(str, exc.absolute_path)) or "the answer"
        raise MalformedResponse(
            f"answer does not follow the schema at {where}: {exc.message[:200]}",
            label="content off schema",
        ) from None


# A JSON answer cut at max_tokens under a grammar (the embedded model, a llama.cpp server in
# json_object mode) is asked for again at the same token budget, under a schema whose string and
# array bounds are TIGHTEN times tighter, twice at most (16 items x 400 chars, then 4 x 100, then
# 1 x 25). The answer it ends with is shorter and still satisfies the schema, and a failing call
# generates at most 3 x max_tokens. (Growing the budget instead cost minutes per call on a rambling
# model: decoding slows with the context, and each try ran out again.)
TIGHTEN = 4
MAX_TIGHTENINGS = 2


def tighter(max_chars: int, max_items: int) -> tuple[int, int]:
    """The next bounds after ``max_chars`` x ``max_items`` (:data:`TIGHTEN` times tighter)."""
    return max(1, max_chars // TIGHTEN), max(1, max_items // TIGHTEN)


CUT_BY_BOUND = "optloop_cut_by_bound"
"""The key :func:`asked_until_whole` sets on an answer whose JSON a decoding bound cut short."""


def ran_out(response: dict[str, Any]) -> bool:
    """Whether the answer stopped at ``max_tokens`` (``finish_reason`` ``length``)."""
    return bool((response.get("choices") or [{}])[0].get("finish_reason") == "length")


def truncated(response: dict[str, Any]) -> bool:
    """Whether the answer's text ends where a limit fell rather than where the model meant it to:
    it stopped at ``max_tokens``, or a decoding bound closed its JSON (:data:`CUT_BY_BOUND`)."""
    return ran_out(response) or bool(response.get(CUT_BY_BOUND))


def at_bound(response: dict[str, Any], max_chars: int, max_items: int) -> bool:
    """Whether the answer's JSON holds a string of ``max_chars`` characters or an array of
    ``max_items`` items: the grammar closed it there, so it was cut where the bound fell."""
    content = ((response.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    try:
        document = json.loads(content, strict=False)
    except (json.JSONDecodeError, TypeError):
        return False

    def full(node: Any) -> bool:
        if isinstance(node, str):
            return len(node) >= max_chars
        if isinstance(node, list):
            return len(node) >= max_items or any(full(item) for item in node)
        if isinstance(node, dict):
            return any(full(item) for item in node.values())
        return False

    return full(document)


def add_usage(spent: dict[str, Any], response: dict[str, Any]) -> None:
    """Add ``response``'s token counts to ``spent`` (each try of one call is paid for), the
    prompt tokens a server reused from its cache (``prompt_tokens_details.cached_tokens``)
    among them."""
    usage = response.get("usage") or {}
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        spent[name] = spent.get(name, 0) + int(usage.get(name) or 0)
    reused = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if reused is not None:
        details = spent.setdefault("prompt_tokens_details", {"cached_tokens": 0})
        details["cached_tokens"] += int(reused)


def asked_until_whole(
    send: Callable[[int, int], dict[str, Any]],
    max_chars: int,
    max_items: int,
    *,
    first: dict[str, Any] | None = None,
    tightening: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The answer of ``send(max_chars, max_items)``, asked again under :func:`tighter` bounds while
    it is cut at ``max_tokens`` (at most :data:`MAX_TIGHTENINGS` more tries), with the tokens of
    every try in its ``usage``. ``first``: the first try's answer, already sent (an endpoint sends
    it without bounds); ``tightening(max_chars, max_items)`` hears of each new try.

    An answer given under tighter bounds than the first try's, or one whose JSON fills a bound
    (:func:`at_bound`), is whole JSON but not the whole text the model was writing: it is marked
    :data:`CUT_BY_BOUND`, so its call record says ``truncated`` (a proposal cut there is refused
    as cut off, :mod:`optloop.loop.proposals.gate`, not judged as the model's own text)."""
    spent: dict[str, Any] = {}
    bounded = first is None
    response = send(max_chars, max_items) if first is None else first
    add_usage(spent, response)
    tightened = False
    for _ in range(MAX_TIGHTENINGS):
        if not ran_out(response):
            break
        max_chars, max_items = tighter(max_chars, max_items)
        if tightening is not None:
            tightening(max_chars, max_items)
        response = send(max_chars, max_items)
        bounded = tightened = True
        add_usage(spent, response)
    if tightened or (bounded and at_bound(response, max_chars, max_items)):
        response[CUT_BY_BOUND] = True
    response["usage"] = spent
    return response


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
        if (
            "string" in kinds
            and not {"enum", "const", "maxLength", "format", "pattern"} & out.keys()
        ):
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
    """The sampling seed of rollout ``rollout_id`` (DSPy's way to ask for another sample of one
    prompt)."""
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
        choice["message"]["content"] = json.dumps(
            json.loads(content, strict=False), ensure_ascii=False
        )
    except json.JSONDecodeError as exc:
        reason = (
            "truncated at max_tokens" if choice.get("finish_reason") == "length" else "not JSON"
        )
        raise MalformedResponse(
            f"response {reason}: {exc.msg} at char {exc.pos}", label=f"content {reason}"
        ) from None
