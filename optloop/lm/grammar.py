"""The GBNF grammar a JSON-schema answer is decoded under, on llama.cpp.

llama-cpp-python turns a JSON schema into a grammar whose whitespace between JSON tokens is
one optional space (``space ::= " "?``). Its own grammar for any JSON (``json_object`` without a
schema) and llama.cpp's C++ converter allow a newline and indentation there. A model that lays
out its JSON over several lines, as instruct models do for a list of objects, is refused the
newline it wants after ``[`` and takes the best token the grammar still allows, which can be
``]``: Qwen2.5-Coder-0.5B, under mem0's extraction prompt, answers ``{"memory": []}`` with the
single-space grammar and the facts with this one (``experiments/results/mem0_qwen_exported.md``).

:func:`schema_grammar` is llama-cpp-python's converter with the whitespace of its JSON grammar:
a space, or a newline and at most 20 spaces or tabs. Every document either grammar accepts
parses to the same JSON, so the schema's constraint is unchanged; only the layout the model may
choose widens. :data:`SPACE_RULE` is part of the cache key of every grammar-decoded answer.
"""

from __future__ import annotations

import functools
import json
from typing import Any

SPACE_RULE = '| " " | "\\n" [ \\t]{0,20}'
"""Whitespace between JSON tokens: what llama-cpp-python's own JSON grammar allows (``ws``)."""

SPACE_KEY = "space:nl20"
"""The name :data:`SPACE_RULE` goes by in cache keys (answers decoded under another whitespace
rule are never served for it)."""


def schema_gbnf(schema: dict[str, Any]) -> str:
    """The GBNF text of ``schema`` with :data:`SPACE_RULE` as its whitespace."""
    # Key order is kept: the grammar asks for properties in the order the schema lists them.
    return _gbnf(json.dumps(schema))


@functools.lru_cache(maxsize=64)
def _gbnf(schema_json: str) -> str:
    from llama_cpp.llama_grammar import SchemaConverter

    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter._rules["space"] = SPACE_RULE
    schema = converter.resolve_refs(json.loads(schema_json), "stdin")
    converter.visit(schema, "")
    return str(converter.format_grammar())


def schema_grammar(schema: dict[str, Any]) -> Any:
    """``schema`` as the ``LlamaGrammar`` ``create_chat_completion(grammar=...)`` takes."""
    from llama_cpp.llama_grammar import LlamaGrammar

    return LlamaGrammar.from_string(schema_gbnf(schema), verbose=False)


def with_schema_grammar(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``create_chat_completion`` keyword arguments whose ``json_object`` + schema
    ``response_format`` is replaced by that schema's :func:`schema_grammar` (llama-cpp-python
    would build its own grammar from the response format and ignore a ``grammar`` beside it).
    Other arguments come back unchanged."""
    response_format = kwargs.get("response_format") or {}
    if response_format.get("type") != "json_object" or "schema" not in response_format:
        return kwargs
    out = {key: value for key, value in kwargs.items() if key != "response_format"}
    out["grammar"] = schema_grammar(response_format["schema"])
    return out
