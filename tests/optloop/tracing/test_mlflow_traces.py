"""Question traces in MLflow: span tree, inputs/outputs, the decisive op, tags; fetched back from
sqlite."""

from __future__ import annotations

import mlflow
import pytest
from mlflow import MlflowClient

from optloop.tracing.graph import ExecutionGraph, Variable
from optloop.tracing.mlflow_traces import (
    TEXT_LIMIT,
    log_graph_traces,
    log_question_trace,
    question_operations,
    tracking_uri,
)

from .conftest import ANNOTATION


@pytest.fixture(scope="module")
def tracking_store(tmp_path_factory):
    """One sqlite store for the module (creating its tables takes seconds)."""
    root = tmp_path_factory.mktemp("mlflow")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlflow.db")
    yield root
    mlflow.set_tracking_uri(previous)


@pytest.fixture
def experiment_id(tracking_store, request) -> str:
    name = request.node.name
    return MlflowClient().create_experiment(name, artifact_location=str(tracking_store / name))


def spans_by_name(trace) -> dict:
    return {span.name: span for span in trace.data.spans}


def test_question_trace_span_tree(graph: ExecutionGraph, experiment_id: str) -> None:
    trace_id = log_question_trace(graph, "q1", attribution=ANNOTATION, experiment_id=experiment_id)
    assert trace_id
    trace = mlflow.get_trace(trace_id)
    assert trace is not None
    assert trace.info.experiment_id == experiment_id
    root = next(s for s in trace.data.spans if s.parent_id is None)
    assert root.name == "question q1"
    assert root.inputs == {"question_id": "q1", "question": "Where does the user live?"}
    assert root.outputs == {"prediction": "Paris", "gold": ["Lyon"]}
    assert root.attributes["passed"] is False
    assert root.attributes["error_type"] == "answer_error"
    assert root.attributes["blamed_op_id"] == "op00004"
    assert root.attributes["site"] == "answer"
    children = [s for s in trace.data.spans if s.parent_id is not None]
    # the s2 store (op00002) and q2's retrieve (op00005) are not q1's business
    assert [s.name for s in sorted(children, key=lambda s: s.start_time_ns)] == [
        "extract [extract] op00000",
        "store [no LLM] op00001",
        "retrieve [no LLM] op00003",
        "answer [answer] op00004",
    ]
    assert all(s.parent_id == root.span_id for s in children)
    spans = spans_by_name(trace)
    answer = spans["answer [answer] op00004"]
    assert answer.attributes["decisive"] is True
    assert answer.span_type == "LLM"
    assert answer.attributes["site"] == "answer"
    assert answer.attributes["llm_calls"] == 2 and answer.attributes["retries"] == 1
    assert answer.attributes["error"].startswith("1 LM call")
    assert answer.inputs == {
        "question:q1@0": "Where does the user live?",
        "retrieved:q1@0": "1. User lives in Lyon since May.",
    }
    assert answer.outputs == {"answer:q1.answer@0": "Paris"}
    assert answer.end_time_ns - answer.start_time_ns == 1_250_000_000
    assert sum(1 for s in children if s.attributes.get("decisive")) == 1
    retrieve = spans["retrieve [no LLM] op00003"]
    assert retrieve.span_type == "RETRIEVER"
    assert retrieve.attributes["knobs"] == {"top_k": 5}
    assert "memory:mem1@0" in retrieve.inputs
    store = spans["store [no LLM] op00001"]
    assert store.outputs == {"memory:mem1@0": "User lives in Lyon since May."}
    assert store.attributes["session_id"] == "s1"
    assert spans["extract [extract] op00000"].span_type == "LLM"
    assert trace.info.tags["optloop.question_id"] == "q1"
    assert trace.info.tags["optloop.system"] == "toy"
    assert trace.info.tags["optloop.error_type"] == "answer_error"
    assert trace.info.tags["optloop.passed"] == "false"


def test_traces_are_searchable(graph: ExecutionGraph, experiment_id: str) -> None:
    q2 = {"query_id": "q2", "final_error_type": None, "prediction": "Tom"}
    ids = log_graph_traces(
        graph, ["q1", "q2", "nope"], {"q1": ANNOTATION, "q2": q2}, experiment_id=experiment_id
    )
    assert len(ids) == 2
    found = MlflowClient().search_traces(
        locations=[experiment_id], filter_string="tags.`optloop.question_id` = 'q2'"
    )
    assert [t.info.trace_id for t in found] == [ids[1]]
    trace = mlflow.get_trace(ids[1])
    names = {s.name for s in trace.data.spans}
    assert names == {"question q2", "store [no LLM] op00002", "retrieve [no LLM] op00005"}
    root = next(s for s in trace.data.spans if s.parent_id is None)
    assert root.attributes["passed"] is True
    assert trace.info.tags["optloop.error_type"] == "none"
    assert not any(s.attributes.get("decisive") for s in trace.data.spans)
    assert len(MlflowClient().search_traces(locations=[experiment_id])) == 2


def test_unknown_question_logs_nothing(graph: ExecutionGraph, experiment_id: str) -> None:
    assert log_question_trace(graph, "nope", experiment_id=experiment_id) is None
    assert MlflowClient().search_traces(locations=[experiment_id]) == []


def test_long_texts_are_cut(graph: ExecutionGraph, experiment_id: str) -> None:
    graph.variables["answer:q1.answer@0"].text = "x" * (TEXT_LIMIT * 3)
    trace = mlflow.get_trace(log_question_trace(graph, "q1", experiment_id=experiment_id))
    (text,) = spans_by_name(trace)["answer [answer] op00004"].outputs.values()
    assert len(text) == TEXT_LIMIT and text.endswith("…")


def test_relevant_operations(graph: ExecutionGraph) -> None:
    assert [op.id for op in question_operations(graph, "q1")] == [
        "op00000",
        "op00001",
        "op00003",
        "op00004",
    ]
    assert [op.id for op in question_operations(graph, "q2")] == ["op00002", "op00005"]
    # the evidence pulls in the ingest ops that processed it, even when nothing retrieved their
    # output
    evidence = ["message:s1:t1@0"]
    assert [op.id for op in question_operations(graph, "q2", evidence)] == [
        "op00000",
        "op00001",
        "op00002",
        "op00005",
    ]


def test_evidence_from_the_question_variable(graph: ExecutionGraph, experiment_id: str) -> None:
    graph.add_variable(
        Variable.make(
            "question",
            "q3",
            text="Where did the user move?",
            question_id="q3",
            data={"evidence_ids": ["s1:t1"]},
        )
    )
    trace = mlflow.get_trace(log_question_trace(graph, "q3", experiment_id=experiment_id))
    assert {s.name for s in trace.data.spans} == {
        "question q3",
        "extract [extract] op00000",
        "store [no LLM] op00001",
    }


def test_tracking_uri_follows_optloop_mlruns(tmp_path) -> None:
    assert tracking_uri() == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
