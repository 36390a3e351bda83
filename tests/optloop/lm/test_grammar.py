"""optloop's schema grammar: llama-cpp-python's, with whitespace that may hold a newline."""

from __future__ import annotations

import json

from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

from optloop.lm.grammar import SPACE_RULE, schema_gbnf, schema_grammar, with_schema_grammar

SCHEMA = {
    "type": "object",
    "properties": {
        "memory": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "maxItems": 16},
        "note": {"type": "string", "maxLength": 40},
    },
    "required": ["memory", "note"],
    "$defs": {
        "Item": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "text": {"type": "string"}},
            "required": ["id", "text"],
        }
    },
}


def rules(gbnf: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in gbnf.splitlines() if " ::= " in line)


def test_the_grammar_is_llama_cpp_pythons_with_only_the_whitespace_rule_changed():
    ours, theirs = rules(schema_gbnf(SCHEMA)), rules(json_schema_to_gbnf(json.dumps(SCHEMA)))
    assert theirs["space"] == '" "?'  # what refused the newline
    assert ours["space"] == SPACE_RULE == '| " " | "\\n" [ \\t]{0,20}'
    assert {k: v for k, v in ours.items() if k != "space"} == {
        k: v for k, v in theirs.items() if k != "space"
    }


def test_the_whitespace_is_the_one_llama_cpp_pythons_json_grammar_allows():
    from llama_cpp.llama_grammar import JSON_GBNF

    assert f"ws ::= {SPACE_RULE}" in JSON_GBNF.replace("\\\\", "\\")


def test_properties_keep_the_order_the_schema_lists_them_in():
    reordered = {**SCHEMA, "properties": dict(reversed(list(SCHEMA["properties"].items())))}
    root = rules(schema_gbnf(reordered))["root"]
    assert root.index("note") < root.index("memory")
    assert rules(schema_gbnf(SCHEMA))["root"].index("memory") < rules(schema_gbnf(SCHEMA))[
        "root"
    ].index("note")


def test_the_schema_is_not_changed_and_each_call_builds_the_same_grammar():
    before = json.dumps(SCHEMA)
    assert schema_gbnf(SCHEMA) == schema_gbnf(json.loads(before))  # $refs resolved on a copy
    assert json.dumps(SCHEMA) == before


def test_llama_cpp_parses_the_grammar():
    grammar = schema_grammar(SCHEMA)
    assert isinstance(grammar, LlamaGrammar) and grammar._root == "root"


def test_a_json_object_schema_request_is_decoded_under_the_grammar_and_others_pass_unchanged():
    kwargs = {
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0.0,
        "response_format": {"type": "json_object", "schema": SCHEMA},
    }
    out = with_schema_grammar(kwargs)
    assert "response_format" not in out and out["messages"] == kwargs["messages"]
    assert out["grammar"]._grammar == LlamaGrammar.from_string(schema_gbnf(SCHEMA))._grammar
    assert "response_format" in kwargs  # the caller's arguments are not changed
    for unchanged in (
        {"messages": []},
        {"messages": [], "response_format": {"type": "json_object"}},
        {"messages": [], "response_format": None},
    ):
        assert with_schema_grammar(unchanged) is unchanged
