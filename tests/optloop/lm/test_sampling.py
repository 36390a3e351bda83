"""The grammar-first greedy sampler writes what llama-cpp-python's own sampler writes (the bundled
model, three schemas, three prompts)."""

from __future__ import annotations

import pytest

from optloop.lm.machine import MachineSlots
from optloop.lm.requests import bound_schema
from optloop.lm.settings import bundled_model_path

pytestmark = pytest.mark.integration

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "entities": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "type_id": {"type": "integer"}},
                    "required": ["name", "type_id"],
                },
            }
        },
        "required": ["entities"],
    },
    {
        "type": "object",
        "properties": {
            "key": {"type": "string"},
            "category": {"type": "string", "enum": ["profile", "preference", "event"]},
        },
        "required": ["key", "category"],
    },
    {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "confident": {"type": "boolean"}},
        "required": ["answer", "confident"],
    },
]
TEXTS = [
    "Alice met Bob at the cafe in Paris on Tuesday.",
    "My sister Maya lives in Lisbon and I prefer green tea.",
    "Where does Ana live? The memories say Paris.",
]


def test_grammar_first_greedy_answers_are_llama_cpps_own():
    from llama_cpp import Llama

    from optloop.lm.grammar import with_schema_grammar
    from optloop.lm.sampling import GrammarFirstLlama

    path = str(bundled_model_path())
    plain = Llama(model_path=path, n_ctx=2048, n_threads=2, verbose=False, seed=0)
    fast = GrammarFirstLlama(model_path=path, n_ctx=2048, n_threads=2, verbose=False, seed=0)
    checked = 0
    for schema in SCHEMAS:
        for text in TEXTS:
            kwargs = {
                "messages": [
                    {"role": "system", "content": "Answer in JSON."},
                    {"role": "user", "content": text},
                ],
                "temperature": 0.0,
                "max_tokens": 96,
                "seed": 0,
                "response_format": {
                    "type": "json_object",
                    "schema": bound_schema(schema, max_chars=40, max_items=3),
                },
            }
            with MachineSlots().hold():
                # the same grammar (optloop's), sampled by llama-cpp-python's own chain
                want = plain.create_chat_completion(**with_schema_grammar(kwargs))["choices"][0][
                    "message"
                ]
                got = fast.create_chat_completion(**kwargs)["choices"][0]["message"]
            assert got["content"] == want["content"], (schema, text)
            checked += 1
    assert checked == 9
