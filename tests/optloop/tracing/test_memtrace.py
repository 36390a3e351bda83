"""MemTraceBench JSON: lossless round trips, foreign files, one-line errors on malformed input."""

from __future__ import annotations

import copy
import json

import pytest

from optloop.errors import DatasetError
from optloop.tracing.graph import ExecutionGraph
from optloop.tracing.memtrace import (
    MEMTRACE_KEY,
    from_memtrace,
    load_memtrace,
    map_category,
    parse_node_id,
    save_memtrace,
    to_memtrace,
)

from .conftest import ANNOTATION, build_graph


def test_graph_json_round_trip(graph: ExecutionGraph) -> None:
    again = ExecutionGraph.from_json(json.loads(json.dumps(graph.to_json())))
    assert again == graph


def test_memtrace_layout(graph: ExecutionGraph) -> None:
    doc = to_memtrace(graph, [ANNOTATION])
    data = doc["data"]
    assert set(data) >= {"nodes", "edges", "operations", "sessions", "annotations"}
    node = next(n for n in data["nodes"] if n["full_node_id"] == "message:s1:t1@0")
    assert (node["class"], node["name"], node["version"]) == ("message", "s1:t1", 0)
    assert node["content"] == "user: I moved to Lyon in May."
    assert node["meta"]["session_id"] == "s1"
    op = data["operations"][0]
    assert {k: op[k] for k in ("op_id", "op_name", "category")} == {
        "op_id": "op00000",
        "op_name": "extract",
        "category": "ingest",
    }
    assert op["meta"]["site"] == "extract" and op["meta"]["seq"] == 0
    edges = [
        (e["op_id"], e["source_full_node_id"], e["target_full_node_id"]) for e in data["edges"]
    ]
    assert edges == list(graph.edges())
    assert ("op00000", "message:s1:t1@0", "op00000") in edges  # input: var -> op
    assert ("op00000", "op00000", "fact:op00000.facts.0@0") in edges  # output: op -> var
    assert data["sessions"] == [
        {
            "session_id": "s1",
            "timestamp": "2024-05-02",
            "message_ids": ["message:s1:t1@0", "message:s1:t2@0"],
        },
        {"session_id": "s2", "timestamp": "2024-06-10", "message_ids": ["message:s2:t1@0"]},
    ]
    assert data["annotations"] == [ANNOTATION]
    json.dumps(doc)  # JSON-ready


def test_memtrace_round_trip_is_lossless(graph: ExecutionGraph, tmp_path) -> None:
    again, notes = from_memtrace(json.loads(json.dumps(to_memtrace(graph, [ANNOTATION]))))
    assert again == graph
    assert notes == [ANNOTATION]
    path = save_memtrace(tmp_path / "sub" / "trace.json", graph, [ANNOTATION])
    loaded, loaded_notes = load_memtrace(path)
    assert loaded == graph
    assert loaded_notes == [ANNOTATION]


def test_annotations_get_defaults_and_keep_extra_keys(graph: ExecutionGraph) -> None:
    doc = to_memtrace(graph, [{"query_id": "q2", "golden_answers": "Tom", "site": "answer"}])
    (note,) = from_memtrace(doc)[1]
    assert note == {
        "query_id": "q2",
        "query": "",
        "golden_answers": ["Tom"],
        "prediction": "",
        "source_evidence_ids": [],
        "final_error_type": None,
        "final_op_id": None,
        "site": "answer",
    }


def foreign_file() -> dict:
    """A file written by another tool: no meta keys, foreign categories, extra keys."""
    return {
        "data": {
            "nodes": [
                {"full_node_id": "message:D1:1@0", "content": "I adopted a dog named Rex."},
                {
                    "full_node_id": "memory:m1@0",
                    "content": "User has a dog named Rex.",
                    "score": 0.9,
                },
                {
                    "full_node_id": "memory:m1@1",
                    "class": "memory",
                    "name": "m1",
                    "version": 1,
                    "content": {"text": "User has a dog, Rex."},
                },
                {"full_node_id": "answer:q1@0", "content": "Rex"},
            ],
            "operations": [
                {
                    "op_id": "a",
                    "op_name": "add_memory",
                    "category": "memory_write",
                    "comment": "added",
                },
                {"op_id": "b", "op_name": "update", "category": "ingest"},
                {"op_id": "c", "op_name": "search", "category": "Retrieval"},
                {
                    "op_id": "d",
                    "op_name": "respond",
                    "category": "response_generation",
                    "latency_ms": 12,
                },
            ],
            "edges": [
                {
                    "op_id": "a",
                    "source_full_node_id": "message:D1:1@0",
                    "target_full_node_id": "a",
                },
                {"op_id": "a", "source_full_node_id": "a", "target_full_node_id": "memory:m1@0"},
                {"op_id": "b", "source_full_node_id": "memory:m1@0", "target_full_node_id": "b"},
                {"op_id": "b", "source_full_node_id": "b", "target_full_node_id": "memory:m1@1"},
                {"op_id": "c", "source_full_node_id": "memory:m1@1", "target_full_node_id": "c"},
                {"op_id": "d", "source_full_node_id": "d", "target_full_node_id": "answer:q1@0"},
            ],
            "sessions": [
                {"session_id": "D1", "timestamp": "1 May 2023", "message_ids": ["message:D1:1@0"]}
            ],
            "annotations": [
                {
                    "query_id": "q1",
                    "query": "Dog's name?",
                    "golden_answers": ["Rex"],
                    "prediction": "Rex",
                    "source_evidence_ids": ["D1:1"],
                    "final_error_type": None,
                    "final_op_id": None,
                }
            ],
        }
    }


def test_foreign_file_loads() -> None:
    graph, notes = from_memtrace(foreign_file())
    assert list(graph.variables) == ["message:D1:1@0", "memory:m1@0", "memory:m1@1", "answer:q1@0"]
    m = graph.variables["memory:m1@1"]
    assert (m.cls, m.name, m.version) == ("memory", "m1", 1)
    assert m.data == {"text": "User has a dog, Rex."} and json.loads(m.text) == m.data
    msg = graph.variables["message:D1:1@0"]
    assert (msg.cls, msg.name, msg.version, msg.session_id, msg.timestamp) == (
        "message",
        "D1:1",
        0,
        "D1",
        "1 May 2023",
    )
    assert [(op.id, op.category, op.seq) for op in graph.operations] == [
        ("a", "ingest", 0),
        ("b", "ingest", 1),
        ("c", "retrieve", 2),
        ("d", "answer", 3),
    ]
    assert graph.op("a").inputs == ["message:D1:1@0"] and graph.op("a").outputs == ["memory:m1@0"]
    assert graph.op("b").inputs == ["memory:m1@0"] and graph.op("b").outputs == ["memory:m1@1"]
    assert graph.ancestors("memory:m1@1") == {"memory:m1@0", "message:D1:1@0"}
    assert notes[0]["golden_answers"] == ["Rex"]
    kept = graph.meta[MEMTRACE_KEY]
    assert kept["categories"] == {
        "a": "memory_write",
        "c": "Retrieval",
        "d": "response_generation",
    }
    assert kept["node_extra"] == {"memory:m1@0": {"score": 0.9}}
    assert kept["op_extra"] == {"d": {"latency_ms": 12}}


def test_foreign_file_survives_a_round_trip() -> None:
    graph, notes = from_memtrace(foreign_file())
    doc = to_memtrace(graph, notes)
    ops = {op["op_id"]: op for op in doc["data"]["operations"]}
    assert ops["a"]["category"] == "memory_write" and ops["a"]["meta"]["category"] == "ingest"
    assert ops["d"]["latency_ms"] == 12
    assert doc["data"]["nodes"][1]["score"] == 0.9
    again, notes_again = from_memtrace(json.loads(json.dumps(doc)))
    assert again == graph
    assert notes_again == notes


def test_helpers() -> None:
    assert parse_node_id("message:s1:t2@0") == ("message", "s1:t2", 0)
    assert parse_node_id("memory:3f2a@12") == ("memory", "3f2a", 12)
    for bad in ("memory3f2a@1", "memory:3f2a", "memory:3f2a@x", ":x@1"):
        with pytest.raises(ValueError):
            parse_node_id(bad)
    assert map_category("judge") == "judge"
    assert map_category("RETRIEVAL") == "retrieve"
    assert map_category("answer_generation") == "answer"
    assert map_category("memory_update") == "ingest"


def error_for(data: object) -> str:
    with pytest.raises(DatasetError) as err:
        from_memtrace(data)  # type: ignore[arg-type]
    message = str(err.value)
    assert "\n" not in message
    return message


def mutated(change) -> dict:
    doc = to_memtrace(build_graph(), [ANNOTATION])
    change(doc["data"])
    return doc


def test_malformed_files_raise_one_line_errors() -> None:
    assert "field 'data'" in error_for({"nodes": []})
    assert "field 'data'" in error_for({"data": []})
    assert "field 'nodes'" in error_for({"data": {"operations": []}})

    def unknown_target(d: dict) -> None:
        d["edges"][3]["target_full_node_id"] = "fact:nope@0"

    msg = error_for(mutated(unknown_target))
    assert "edges[3] (op op00000)" in msg and "target_full_node_id" in msg and "fact:nope@0" in msg

    def unknown_source(d: dict) -> None:
        d["edges"][0]["source_full_node_id"] = "message:gone@0"

    assert "source_full_node_id" in error_for(mutated(unknown_source))

    def unknown_op(d: dict) -> None:
        d["edges"][0]["op_id"] = "op99999"

    assert "field 'op_id'" in error_for(mutated(unknown_op))

    def bad_node_id(d: dict) -> None:
        d["nodes"][2]["full_node_id"] = "message-s2-t1"

    msg = error_for(mutated(bad_node_id))
    assert (
        "nodes[2] (message-s2-t1)" in msg and "full_node_id" in msg and "class:name@version" in msg
    )

    def duplicate_node(d: dict) -> None:
        d["nodes"].append(copy.deepcopy(d["nodes"][0]))

    assert "duplicate node id" in error_for(mutated(duplicate_node))

    def bad_status(d: dict) -> None:
        d["nodes"][0]["meta"]["status"] = "alive"

    msg = error_for(mutated(bad_status))
    assert "nodes[0] (message:s1:t1@0)" in msg and "status" in msg

    def no_op_name(d: dict) -> None:
        del d["operations"][1]["op_name"]

    assert "operations[1] (op00001): field 'op_name'" in error_for(mutated(no_op_name))

    def bad_annotation(d: dict) -> None:
        d["annotations"][0]["golden_answers"] = {"a": 1}

    assert "annotations[0] (q1): field 'golden_answers'" in error_for(mutated(bad_annotation))

    def bad_session(d: dict) -> None:
        d["sessions"][0]["message_ids"].append("message:ghost@0")

    assert "sessions[0] (s1): field 'message_ids'" in error_for(mutated(bad_session))


def test_load_errors_name_the_file(tmp_path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(DatasetError, match="broken.json: not valid JSON"):
        load_memtrace(path)
    with pytest.raises(DatasetError, match="missing.json: cannot read"):
        load_memtrace(tmp_path / "missing.json")
    path.write_text(
        json.dumps({"data": {"nodes": [{"full_node_id": "x"}], "operations": []}}),
        encoding="utf-8",
    )
    with pytest.raises(DatasetError) as err:
        load_memtrace(path)
    assert str(err.value).startswith(f"{path}: nodes[0] (x): field 'full_node_id'")
