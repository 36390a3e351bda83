"""The decisive-error walk: each error type on a run whose fault is known."""

from __future__ import annotations

import pytest

from optloop.attribution import ErrorType, attribute, blame, default_judges
from optloop.attribution.evidence import find_evidence, hybrid_search
from optloop.tracing.graph import ExecutionGraph, Variable
from tests.optloop.tracing.test_recorder import (
    EPISODE,
    MarkdownFlatSystem,
    record_episode,
    scripted_lm,
)

Q1, Q2 = EPISODE.questions


@pytest.fixture(scope="module")
def embedder():
    from optloop.embed import get_embedder

    return get_embedder("local")


def attribute_run(tmp_path, embedder, *answers, knobs=None):
    system = MarkdownFlatSystem(
        scripted_lm(*answers), tmp_path / "md", embedder=embedder, knobs=knobs
    )
    graph, predictions = record_episode(system, EPISODE)
    judges = default_judges(embedder)
    return graph, {
        q.id: attribute(graph, q, predictions[q.id], judges, embedder=embedder)
        for q in EPISODE.questions
    }


def test_response_error_when_the_answer_ignores_retrieved_evidence(tmp_path, embedder):
    _, result = attribute_run(
        tmp_path,
        embedder,
        {"facts": ["User's dog is named Biscuit."]},
        {"facts": ["User's dog is named Biscuit.", "User moved to Austin."]},
        {"answer": "Rex"},
        {"answer": "Austin"},
    )
    a = result["q1"]
    assert (a.error_type, a.target, a.evidence_source) == (ErrorType.RESPONSE, "answer", "dataset")
    assert a.memfail_label == "reasoning_error" and "Biscuit" in a.explanation


def test_extraction_error_when_the_session_yields_nothing(tmp_path, embedder):
    _, result = attribute_run(
        tmp_path,
        embedder,
        {"facts": ["User lives in Denver."]},
        {"facts": ["User lives in Denver.", "User moved to Austin."]},
        {"answer": "unknown"},
        {"answer": "Austin"},
    )
    a = result["q1"]
    assert (a.error_type, a.target) == (ErrorType.EXTRACTION, "md_flat.curate")
    assert a.op_id == "op00000"


def dropped_in_session_2(tmp_path, embedder):
    """The dog's name is stored in session 1 and dropped from the memory in session 2; the answers
    miss it."""
    return attribute_run(
        tmp_path,
        embedder,
        {"facts": ["User's dog is named Biscuit."]},
        {"facts": ["User moved to Austin."]},
        {"answer": "unknown"},
        {"answer": "Austin"},
    )


def test_deletion_error_when_a_later_session_drops_the_fact(tmp_path, embedder):
    _, result = dropped_in_session_2(tmp_path, embedder)
    a = result["q1"]
    assert (a.error_type, a.target) == (ErrorType.DELETION, "md_flat.curate")


def test_update_error_when_a_later_session_overwrites_the_fact(tmp_path, embedder):
    graph, result = attribute_run(
        tmp_path,
        embedder,
        {"facts": ["User's dog is named Biscuit."]},
        {"facts": ["User's dog is named Rex.", "User moved to Austin."]},
        {"answer": "Rex"},
        {"answer": "Austin"},
    )
    a = result["q1"]
    assert (a.error_type, a.target) == (ErrorType.UPDATE, "md_flat.curate")
    assert graph.op(a.op_id).name == "update" and graph.op(a.op_id).session_id == "s2"


def test_retrieval_error_blames_top_k_when_a_wider_search_finds_it(embedder):
    g = _query_graph("my dog's name", wide=["x", "y", "m1"], rewrite=False)
    a = attribute(g, Q1, "unknown", default_judges(embedder))
    assert (a.error_type, a.target, a.details["rank"]) == (ErrorType.RETRIEVAL, "knob:top_k", 3)
    assert "top_k=1" in a.explanation


def _query_graph(
    query: str,
    wide: list[str] | None = None,
    rewrite: bool = True,
    asked: list[str] | None = None,
) -> ExecutionGraph:
    g = ExecutionGraph(
        system="toy",
        meta={"sites": {"retrieve.query": {"op_kinds": ["rewrite"]}}, "search_knob": "top_k"},
    )
    m = g.add_variable(
        Variable.make("message", "s1:t1", text="user: My dog is Biscuit.", session_id="s1")
    )
    mem = g.add_variable(
        Variable.make("memory", "m1", text="user: My dog is Biscuit.", session_id="s1")
    )
    g.add_operation("store", "ingest", inputs=[m.id], outputs=[mem.id], session_id="s1")
    q = g.add_variable(Variable.make("question", "q1", text=Q1.question, question_id="q1"))
    qv = q
    if rewrite:
        qv = g.add_variable(Variable.make("query", "q1.query", text=query, question_id="q1"))
        g.add_operation(
            "rewrite",
            "retrieve",
            inputs=[q.id],
            outputs=[qv.id],
            site="retrieve.query",
            question_id="q1",
        )
    r = g.add_variable(
        Variable.make(
            "retrieved",
            "q1",
            question_id="q1",
            data={
                "items": [{"rank": 1, "id": "x", "text": "user: I like tea."}],
                "query": query,
                "wide": wide or [],
                "asked": asked or [],
            },
        )
    )
    g.add_operation(
        "retrieve",
        "retrieve",
        inputs=[qv.id],
        outputs=[r.id],
        knobs={"top_k": 1},
        question_id="q1",
    )
    return g


def test_retrieval_error_blames_a_drifted_query_rewrite(embedder):
    a = attribute(
        _query_graph("weather forecast for the weekend"), Q1, "unknown", default_judges(embedder)
    )
    assert (a.error_type, a.target) == (ErrorType.RETRIEVAL, "retrieve.query")
    b = attribute(_query_graph("dog name"), Q1, "unknown", default_judges(embedder))
    assert (
        b.error_type is ErrorType.RETRIEVAL and b.target == "knob:top_k"
    )  # the system's search knob


def test_retrieval_error_blames_a_rewrite_that_lost_what_the_question_finds(embedder):
    # "dog name" keeps the question's words, but the search for the question as asked
    # returned the evidence and the rewrite's did not: the rewrite is decisive
    a = attribute(
        _query_graph("dog name", asked=["x", "m1"]), Q1, "unknown", default_judges(embedder)
    )
    assert (a.error_type, a.target, a.details["asked_rank"]) == (
        ErrorType.RETRIEVAL,
        "retrieve.query",
        2,
    )
    assert "question as asked ranks it 2 of 2" in a.explanation
    # neither search found it: the search knob, and the advice names the rewrite prompt
    b = attribute(_query_graph("dog name", asked=["x"]), Q1, "unknown", default_judges(embedder))
    assert b.target == "knob:top_k" and "the query-rewrite prompt" in b.explanation


def test_a_search_that_missed_blames_the_search_knob_the_system_names(embedder):
    graph = _query_graph("dog name")
    graph.meta["search_knob"] = None  # a system whose search no knob decides
    assert attribute(graph, Q1, "unknown", default_judges(embedder)).target is None
    graph.meta["search_knob"] = "threshold"  # named, but this retrieve did not run with it
    assert attribute(graph, Q1, "unknown", default_judges(embedder)).target is None


def test_evidence_falls_back_to_hybrid_search_without_dataset_ids(embedder):
    g = _query_graph("dog")
    g.add_variable(Variable.make("message", "s1:t2", text="user: I like tea.", session_id="s1"))
    q = Q1.model_copy(update={"evidence_ids": []})
    assert hybrid_search(g, "dog name Biscuit", embedder)[0] == "message:s1:t1@0"
    assert find_evidence(g, q, embedder).source == "search"


def test_blame_sums_per_target_with_shares(tmp_path, embedder):
    _, result = attribute_run(
        tmp_path,
        embedder,
        {"facts": ["User lives in Denver."]},
        {"facts": ["User lives in Denver."]},
        {"answer": "unknown"},
        {"answer": "Denver"},
    )
    entries = blame(result.values())
    assert sum(e.failures for e in entries) == 2
    assert abs(sum(e.share for e in entries) - 1) < 1e-9
