"""A small hand-built execution graph: two sessions, extract + store, a second question."""

from __future__ import annotations

import pytest

from optloop.tracing.graph import ExecutionGraph, Variable


def build_graph() -> ExecutionGraph:
    """Messages -> extract (LLM) -> facts -> store -> memories; then retrieve and answer for q1.

    Session s2 is ingested too but q1 never reads from it; q2 has its own retrieve.
    """
    g = ExecutionGraph(
        system="toy", episode_id="ep1", dataset="builtin:tiny", meta={"sites": {"extract": {}}}
    )
    m1 = g.add_variable(
        Variable.make(
            "message",
            "s1:t1",
            text="user: I moved to Lyon in May.",
            session_id="s1",
            timestamp="2024-05-02",
            data={"role": "user", "speaker": None},
        )
    )
    m2 = g.add_variable(
        Variable.make(
            "message",
            "s1:t2",
            text="assistant: Nice!",
            session_id="s1",
            timestamp="2024-05-02",
            data={"role": "assistant", "speaker": None},
        )
    )
    m3 = g.add_variable(
        Variable.make(
            "message",
            "s2:t1",
            text="user: My cat is called Tom.",
            session_id="s2",
            timestamp="2024-06-10",
        )
    )
    prompt = g.add_variable(
        Variable.make("prompt", "extract", text="Extract facts.", data={"sha1": "abc"})
    )
    fact = g.add_variable(
        Variable.make(
            "fact",
            "op00000.facts.0",
            text="User lives in Lyon since May.",
            data="User lives in Lyon since May.",
            session_id="s1",
        )
    )
    g.add_operation(
        "extract",
        "ingest",
        inputs=[m1.id, m2.id, prompt.id],
        outputs=[fact.id],
        site="extract",
        session_id="s1",
        comment="LLM call of prompt site extract",
        llm_calls=1,
        seconds=0.5,
    )
    mem = g.add_variable(
        Variable.make(
            "memory",
            "mem1",
            text="User lives in Lyon since May.",
            session_id="s1",
            timestamp="2024-05-02",
            provenance=[m1.id],
            data={"metadata": {"k": 1}},
        )
    )
    g.add_operation(
        "store",
        "ingest",
        inputs=[fact.id],
        outputs=[mem.id],
        knobs={"session": "s1"},
        session_id="s1",
        comment="1 new memory unit(s)",
    )
    mem2 = g.add_variable(
        Variable.make("memory", "mem2", text="Cat: Tom.", session_id="s2", provenance=[m3.id])
    )
    g.add_operation(
        "store",
        "ingest",
        inputs=[m3.id],
        outputs=[mem2.id],
        knobs={"session": "s2"},
        session_id="s2",
    )
    q = g.add_variable(
        Variable.make(
            "question",
            "q1",
            text="Where does the user live?",
            question_id="q1",
            data={"gold": "Lyon", "evidence_ids": ["s1:t1"], "task_type": "single"},
        )
    )
    retrieved = g.add_variable(
        Variable.make(
            "retrieved",
            "q1",
            text="1. User lives in Lyon since May.",
            question_id="q1",
            data={"items": [{"rank": 1, "id": "mem1", "var": mem.id}]},
        )
    )
    g.add_operation(
        "retrieve",
        "retrieve",
        inputs=[q.id, mem.id],
        outputs=[retrieved.id],
        knobs={"top_k": 5},
        question_id="q1",
        seconds=0.01,
        comment="1 memories",
    )
    answer = g.add_variable(Variable.make("answer", "q1.answer", text="Paris", question_id="q1"))
    g.add_operation(
        "answer",
        "answer",
        inputs=[q.id, retrieved.id],
        outputs=[answer.id],
        site="answer",
        question_id="q1",
        llm_calls=2,
        retries=1,
        error="1 LM call(s) failed and were retried",
        seconds=1.25,
    )
    q2 = g.add_variable(Variable.make("question", "q2", text="Cat's name?", question_id="q2"))
    r2 = g.add_variable(Variable.make("retrieved", "q2", text="1. Cat: Tom.", question_id="q2"))
    g.add_operation(
        "retrieve", "retrieve", inputs=[q2.id, mem2.id], outputs=[r2.id], question_id="q2"
    )
    return g


ANNOTATION = {
    "query_id": "q1",
    "query": "Where does the user live?",
    "golden_answers": ["Lyon"],
    "prediction": "Paris",
    "source_evidence_ids": ["s1:t1"],
    "final_error_type": "answer_error",
    "final_op_id": "op00004",
    "site": "answer",
    "explanation": "the right memory was retrieved but the answer ignored it",
}


@pytest.fixture
def graph() -> ExecutionGraph:
    return build_graph()
