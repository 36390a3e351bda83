"""ContaminationError and the admission step of the decisive walk, on recorded gated and
rag_embedding runs.

The runs are real (``GatedSystem`` / ``EmbeddingRagSystem`` recorded by the Recorder); only the LM
is scripted, so each answer is known: one that states a stale value, one that abstains, one that is
wrong without any stale value.
"""

from __future__ import annotations

import pytest

from optloop.attribution import ErrorType, attribute, default_judges
from optloop.attribution.decisive import admission, answer_context, evidence_reaches_answer
from optloop.attribution.taxonomy import MEMFAIL_LABEL, Attribution
from optloop.faults.catalogue import faults_for
from optloop.sites import ANSWER, GATED_ADMIT
from optloop.tracing.recorder import record_episode
from systems.baselines import BM25RagSystem, EmbeddingRagSystem
from systems.gated import GatedSystem
from tests.systems._gated_fakes import BowEmbedder, ScriptedLM, gate_all, small_episode

EPISODE = small_episode()
Q = {q.id: q for q in EPISODE.questions}


def run(
    tmp_path,
    question_id: str,
    answer: str,
    *,
    gate_script=None,
    cls=GatedSystem,
    question=None,
    fault=None,
    **knobs,
):
    """Record ``question_id`` on a fresh system whose answer site replies ``answer``; attribute
    it."""
    scripts = {ANSWER: [{"answer": answer}]}
    if gate_script is not None:
        scripts[GATED_ADMIT] = gate_script
    embedder = BowEmbedder()
    system = cls(ScriptedLM(scripts), tmp_path / cls.name, embedder=embedder, knobs=knobs)
    if fault is not None:
        fault.apply(system)
    q = question or Q[question_id]
    graph, predictions = record_episode(system, EPISODE, [q])
    assert predictions[q.id] == answer
    return graph, attribute(graph, q, answer, default_judges(embedder), embedder=embedder)


def op_of(graph, attribution: Attribution):
    return graph.op(attribution.op_id) if attribution.op_id else None


def test_the_type_and_its_label():
    assert ErrorType.CONTAMINATION.value == "ContaminationError"
    assert MEMFAIL_LABEL[ErrorType.CONTAMINATION] == "stale_context"
    a = Attribution(question_id="q", error_type=ErrorType.CONTAMINATION, target="knob:floors")
    assert (
        a.to_annotation()["final_error_type"] == "ContaminationError" and a.blamed.kind == "knob"
    )


def test_a_dead_branch_value_the_gate_llm_admitted_blames_the_gate_site(tmp_path):
    graph, a = run(
        tmp_path,
        "p-dead",
        "db-beta-44",
        gate_script=gate_all("admit", "looks relevant"),
        floors="lenient",
    )

    assert (a.error_type, a.target) == (ErrorType.CONTAMINATION, GATED_ADMIT)
    assert op_of(graph, a).name == "admit" and op_of(graph, a).site == GATED_ADMIT
    assert (
        a.details["contaminant"] == "f5"
        and a.details["kind"] == "distractor"
        and a.details["decided_by"] == "llm"
    )
    assert "db-beta-44" in a.explanation and "looks relevant" in a.explanation


def test_a_superseded_value_that_passed_open_floors_without_an_llm_blames_the_floors_knob(
    tmp_path,
):
    graph, a = run(tmp_path, "p-super", "21001", floors="off", gate="floors_only")

    assert (a.error_type, a.target) == (ErrorType.CONTAMINATION, "knob:floors")
    assert a.details["contaminant"] == "f1" and a.details["decided_by"] == "floor"
    assert "floors='off'" in a.explanation


def test_another_workspaces_value_is_contamination_too(tmp_path):
    _, a = run(tmp_path, "p-super", "22002", floors="off", gate="floors_only", scope="all")
    assert (a.error_type, a.target, a.details["kind"]) == (
        ErrorType.CONTAMINATION,
        "knob:floors",
        "foreign",
    )


def test_without_markers_the_memorys_own_state_names_the_stale_value(tmp_path):
    bare = Q["p-super"].model_copy(update={"meta": {}, "forbidden": []})
    _, a = run(tmp_path, "p-super", "21001", question=bare, floors="off", gate="floors_only")
    assert (a.error_type, a.target, a.details["kind"]) == (
        ErrorType.CONTAMINATION,
        "knob:floors",
        "superseded",
    )


def test_rag_without_a_gate_blames_its_retrieval_knob(tmp_path):
    graph, a = run(tmp_path, "p-dead", "db-beta-44", cls=EmbeddingRagSystem, top_k=10)

    assert a.error_type is ErrorType.CONTAMINATION
    assert a.target == "knob:top_k"  # the evidence ranked above the dead value
    assert op_of(graph, a).name == "retrieve" and a.details["contaminant"] == "f5"
    assert admission(graph, "p-dead") == (None, {})


def test_rag_whose_ranking_put_the_stale_value_first_blames_its_search_knob(tmp_path):
    graph, a = run(tmp_path, "p-super", "21001", cls=BM25RagSystem, top_k=5)

    assert a.error_type is ErrorType.CONTAMINATION
    assert (
        a.target == "knob:top_k"
    )  # the system's search knob: no ranking put the evidence above the value
    assert "Tune the search (top_k)" in a.explanation


def test_a_floor_that_kept_the_evidence_out_is_a_retrieval_error_on_the_floors_knob(tmp_path):
    graph, a = run(tmp_path, "p-failed", "I don't know", gate_script=gate_all("admit"))

    assert (a.error_type, a.target) == (ErrorType.RETRIEVAL, "knob:floors")
    assert op_of(graph, a).name == "admit" and "negative evidence" in a.explanation
    positive, negative = answer_context(graph, "p-failed")
    assert positive == [] and [it["id"] for it in negative] == ["f6"]
    assert not evidence_reaches_answer(graph, Q["p-failed"], default_judges(BowEmbedder()))


def test_a_gate_llm_that_rejected_the_evidence_is_blamed(tmp_path):
    graph, a = run(tmp_path, "p-dead", "I don't know", gate_script=gate_all("reject", "off topic"))

    assert (a.error_type, a.target) == (ErrorType.RETRIEVAL, GATED_ADMIT)
    assert a.details["memory"] == "f2" and "off topic" in a.explanation


def test_a_wrong_answer_with_clean_context_is_still_a_response_error(tmp_path):
    graph, a = run(tmp_path, "p-dead", "db-zeta-00", gate_script=gate_all("admit"))

    assert (a.error_type, a.target) == (ErrorType.RESPONSE, ANSWER)
    assert evidence_reaches_answer(graph, Q["p-dead"], default_judges(BowEmbedder()))


def test_a_dead_value_shown_only_as_negative_evidence_is_not_contamination(tmp_path):
    _, a = run(
        tmp_path, "p-dead", "db-beta-44", gate_script=gate_all("admit")
    )  # strict: f5 is negative evidence
    assert a.error_type is ErrorType.RESPONSE


# --- planted faults ------------------------------------------------------------------------------


@pytest.fixture
def gated_faults():
    return {f.name: f for f in faults_for("gated")}


def test_gated_has_planted_faults_with_known_truth(gated_faults):
    assert {n for n in gated_faults if n.startswith("gated-")} == {
        "gated-gate-admits-all",
        "gated-floors-off",
        "gated-top-k-1",
    }
    assert (
        gated_faults["gated-gate-admits-all"].target,
        gated_faults["gated-gate-admits-all"].error_type,
    ) == (GATED_ADMIT, ErrorType.CONTAMINATION)
    assert (
        gated_faults["gated-floors-off"].target,
        gated_faults["gated-floors-off"].error_type,
    ) == ("knob:floors", ErrorType.CONTAMINATION)


def test_the_admit_all_fault_flips_llm_verdicts_but_not_the_workspace_floor(
    tmp_path, gated_faults
):
    system = GatedSystem(
        ScriptedLM({GATED_ADMIT: gate_all("reject")}),
        tmp_path / "g",
        embedder=BowEmbedder(),
        knobs={"scope": "all"},
    )
    gated_faults["gated-gate-admits-all"].apply(system)
    system.ingest(EPISODE.sessions)
    question = Q["p-super"].question
    decisions = {
        d.memory_id: (d.verdict, d.by)
        for d in system.admit(question, system.retrieve(question, k=8)).decisions
    }

    assert system.knobs()["floors"] == "lenient"
    assert decisions["f1"] == ("admit", "llm") and decisions["f3"] == ("reject", "floor")


@pytest.mark.parametrize(
    "name, question_id, stale",
    [
        ("gated-gate-admits-all", "p-dead", "db-beta-44"),
        ("gated-floors-off", "p-super", "21001"),
    ],
)
def test_each_contamination_fault_is_attributed_to_its_planted_target(
    tmp_path, gated_faults, name, question_id, stale
):
    fault = gated_faults[name]
    _, a = run(tmp_path, question_id, stale, gate_script=gate_all("reject"), fault=fault)
    assert (a.target, a.error_type) == (fault.target, fault.error_type)
