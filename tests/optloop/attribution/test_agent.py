"""The LLM agent's control flow: earliest operation first, bounded, the walk kept when nothing is
found.

The agent's LM is DSPy's ``DummyLM`` (scripted verdicts), so these tests check
how the graph is explored, not what a real model decides.
"""

from __future__ import annotations

import dspy
import pytest
from dspy.utils import DummyLM

from optloop.attribution import ErrorType
from optloop.attribution.agent import AttributionAgent, refine_ambiguous

# embedder is a fixture, used as a test parameter
from tests.optloop.attribution.test_decisive import (  # noqa: F401
    EPISODE,
    attribute_run,
    dropped_in_session_2,
    embedder,
)

OK = {"faulty": False, "error_type": "response", "explanation": "kept the evidence"}


def verdicts(*answers):
    return DummyLM(list(answers), adapter=dspy.JSONAdapter())


@pytest.fixture
def deleted(tmp_path, embedder):  # noqa: F811 - the fixture
    """The dog's name is stored in session 1 and deleted in session 2; the walk says
    DeletionError."""
    graph, result = dropped_in_session_2(tmp_path, embedder)
    return graph, result["q1"].model_copy(update={"ambiguous": True})


def test_agent_inspects_earliest_first_and_returns_the_first_faulty_operation(deleted, embedder):
    graph, walk = deleted
    lm = verdicts(OK, {"faulty": True, "error_type": "deletion", "explanation": "dropped the dog"})
    agent = AttributionAgent(lm)
    q1 = EPISODE.questions[0]
    result = agent.refine(graph, q1, walk, embedder=embedder)
    steps = result.details["agent_steps"]
    assert agent.calls == 2 and len(steps) == 2
    seqs = [graph.op(s).seq for s in steps]
    assert seqs == sorted(seqs)  # earliest first
    assert graph.op(steps[0]).session_id == "s1"  # it starts where the evidence entered
    assert (result.op_id, result.error_type, result.ambiguous) == (
        steps[1],
        ErrorType.DELETION,
        False,
    )
    assert result.target is not None and "dropped the dog" in result.explanation
    assert result.details["walk_error_type"] == walk.error_type.value


def test_agent_stops_at_its_step_bound_and_keeps_the_walk(deleted, embedder):  # noqa: F811
    graph, walk = deleted
    agent = AttributionAgent(verdicts(*[OK] * 10), max_steps=3)
    result = agent.refine(graph, EPISODE.questions[0], walk, embedder=embedder)
    assert agent.calls == 3 and len(result.details["agent_steps"]) == 3
    assert (result.error_type, result.op_id, result.ambiguous) == (
        walk.error_type,
        walk.op_id,
        True,
    )
    assert result.details["agent_verdict"] == "none"


def test_only_ambiguous_cases_reach_the_agent(deleted, embedder):  # noqa: F811
    graph, walk = deleted
    clear = walk.model_copy(update={"ambiguous": False})
    agent = AttributionAgent(verdicts())  # no scripted answer: any call would fail
    out = refine_ambiguous(
        agent, graph, {q.id: q for q in EPISODE.questions}, [clear], embedder=embedder
    )
    assert out == [clear] and agent.calls == 0


@pytest.mark.integration
def test_agent_on_the_embedded_lm_returns_a_parsed_verdict(deleted, embedder, tmp_path):
    """The real SmolLM2 answers the agent's schema; whatever it decides, the result is well
    formed."""
    from optloop.lm import LMSettings, OptloopLM

    graph, walk = deleted
    lm = OptloopLM(
        LMSettings.from_spec("local", cache_path=tmp_path / "cache.sqlite", max_string_chars=120)
    )
    agent = AttributionAgent(lm, max_steps=2)
    result = agent.refine(graph, EPISODE.questions[0], walk, embedder=embedder)
    assert 1 <= agent.calls <= 2 and lm.accounting.totals().calls == agent.calls
    assert result.details["agent_steps"] and result.question_id == "q1"
    if not result.ambiguous:  # the agent named an operation: it must exist and carry a type
        assert (
            result.op_id in {op.id for op in graph.operations}
            and result.error_type is not ErrorType.UNKNOWN
        )
