"""The gated system: SQLite state, scoped retrieval, the admission gate and its floors, the graph
it leaves.

Unit tests never load a model: the LM is scripted per prompt site (``_gated_fakes.ScriptedLM``) and
the embedder is a hashed bag of words. The integration test at the end runs the embedded
SmolLM2-135M.
"""

from __future__ import annotations

import json
import sqlite3

import dspy
import pytest

from optloop.datasets import Session, Turn
from optloop.datasets.agentic import AgenticEpisode, AgenticProbe, to_episode
from optloop.errors import ConfigError
from optloop.lm import LMSettings, OptloopLM
from optloop.product.export import Bundle, prompt_pack, render
from optloop.sites import ANSWER, GATED_ADMIT
from optloop.tracing.recorder import record_episode
from signatures.gated import AdmitMemories
from systems import get_system
from systems.gated import DB_FILE, KNOB_VALUES, NEGATIVE_PREFIX, AdmissionGate, GatedSystem
from tests.systems._gated_fakes import (
    BowEmbedder,
    ScriptedLM,
    answer_with,
    candidate_ids,
    fact,
    gate_all,
    small_episode,
)

EPISODE = small_episode()
Q = {q.id: q for q in EPISODE.questions}


@pytest.fixture
def embedder() -> BowEmbedder:
    return BowEmbedder()


def make(tmp_path, lm=None, embedder=None, **knobs) -> GatedSystem:
    system = GatedSystem(
        lm or ScriptedLM(), tmp_path / "gated", embedder=embedder or BowEmbedder(), knobs=knobs
    )
    return system


def ingested(tmp_path, lm=None, **knobs) -> GatedSystem:
    system = make(tmp_path, lm, **knobs)
    system.ingest(EPISODE.sessions)
    return system


def by_id(system: GatedSystem) -> dict[str, dict]:
    return {m.id: m.metadata for m in system.all_memories()}


# ---------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------


def test_ingest_stores_each_fact_with_workspace_path_status_and_branch_in_sqlite(tmp_path):
    system = ingested(tmp_path)
    meta = by_id(system)

    assert sorted(meta) == [
        f"f{i}" for i in range(1, 9)
    ]  # start and end turns are run state, not memories
    assert (meta["f2"]["workspace"], meta["f2"]["path"], meta["f2"]["branch_status"]) == (
        "billing",
        "services/api",
        "completed",
    )
    assert meta["f3"]["workspace"] == "search"
    assert meta["f5"]["branch_status"] == "failed" and meta["f5"]["status"] == "active"
    assert meta["f8"]["branch_status"] == "rolled_back"
    assert (meta["f6"]["path"], meta["f6"]["key"], meta["f6"]["value"]) == (
        "infra",
        "logs.bucket",
        "logs-gamma-606",
    )
    texts = {m.id: m.text for m in system.all_memories()}
    assert (
        texts["f1"] == "The API server listens on port 21001."
    )  # the tag line is not part of the memory
    with sqlite3.connect(tmp_path / "gated" / DB_FILE) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns = {r[1] for r in db.execute("PRAGMA table_info(memories)")}
        runs = db.execute(
            "SELECT run, workspace, path, branch_status FROM runs ORDER BY seq"
        ).fetchall()
    assert tables == {"runs", "memories"}
    assert {
        "workspace",
        "path",
        "status",
        "branch_status",
        "superseded_by",
        "embedding",
    } <= columns
    assert runs[3] == ("r4", "billing", "services/api", "failed") and len(runs) == 7


def test_a_later_completed_value_supersedes_and_a_failed_or_rolled_back_one_does_not(tmp_path):
    meta = by_id(ingested(tmp_path))

    assert meta["f1"]["status"] == "superseded" and meta["f1"]["superseded_by"] == "f4"
    assert meta["f1"]["invalid_at"]  # what the recorder reads as an invalidated unit
    assert meta["f4"]["status"] == "active"
    assert meta["f3"]["status"] == "active"  # same key, another workspace: untouched
    assert meta["f2"]["status"] == "active"  # f5 came from a failed run
    assert meta["f7"]["status"] == "active"  # f8 was rolled back


def test_an_explicit_superseded_tag_is_kept_and_plain_conversations_are_current_workspace_notes(
    tmp_path,
):
    record = AgenticEpisode(
        id="e",
        facts=[
            fact(
                "a1",
                "r1",
                "api.port",
                "20001",
                "The API listens on port 20001.",
                status="superseded",
            ),
            fact("a2", "r2", "db.host", "db-one-10", "The API connects to db-one-10."),
        ],
        probes=[
            AgenticProbe(
                id="q",
                question="Which host?",
                gold="db-one-10",
                workspace="billing",
                category="clean_recall",
                recall=["db-one-10"],
            )
        ],
    )
    chat = Session(
        id="chat",
        turns=[Turn(id="chat:t1", role="user", content="Remember that lunch is at noon.")],
    )
    system = make(tmp_path)
    system.ingest([*to_episode(record).sessions, chat])

    meta = by_id(system)
    assert meta["a1"]["status"] == "superseded" and meta["a1"]["superseded_by"] is None
    assert meta["a2"]["status"] == "active"
    assert meta["chat:t1"]["workspace"] == "billing" and meta["chat:t1"]["kind"] == "note"
    assert [m.text for m in system.all_memories() if m.id == "chat:t1"] == [
        "user: Remember that lunch is at noon."
    ]


def test_state_survives_a_new_instance_and_a_session_is_not_ingested_twice(tmp_path):
    system = ingested(tmp_path)
    again = make(tmp_path)
    again.ingest(EPISODE.sessions[:2])

    assert [m.model_dump() for m in again.all_memories()] == [
        m.model_dump() for m in system.all_memories()
    ]
    assert (
        again.retrieve(Q["p-dead"].question)[0].id == system.retrieve(Q["p-dead"].question)[0].id
    )


def test_another_embedder_re_embeds_the_stored_rows(tmp_path):
    ingested(tmp_path)

    class Other(BowEmbedder):
        @property
        def name(self) -> str:  # type: ignore[override]
            return "test:other"

    system = make(tmp_path, embedder=Other())
    with sqlite3.connect(tmp_path / "gated" / DB_FILE) as db:
        assert {r[0] for r in db.execute("SELECT embedder FROM memories")} == {"test:other"}
    assert system.retrieve(Q["p-dead"].question)


def test_reset_delete_and_update(tmp_path):
    system = ingested(tmp_path)
    system.delete_memory("f7")
    system.update_memory("f2", "The API connects to the database host db-omega-99.")

    assert "f7" not in by_id(system)
    texts = [m.text for m in system.all_memories() if m.id == "f2"]
    assert texts == ["The API connects to the database host db-omega-99."]
    system.reset()
    assert system.all_memories() == [] and system.retrieve(Q["p-dead"].question) == []
    with sqlite3.connect(tmp_path / "gated" / DB_FILE) as db:
        assert db.execute("SELECT COUNT(*) FROM memories").fetchone() == (0,)


# ---------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------


def test_retrieval_keeps_the_questions_workspace_and_path(tmp_path):
    system = ingested(tmp_path)

    hits = system.retrieve(Q["p-super"].question)
    assert hits and {h.metadata["workspace"] for h in hits} == {"billing"}
    assert all(h.metadata["path"] == "services/api" for h in hits)
    assert {"f1", "f4"} <= {
        h.id for h in hits
    }  # the superseded row is a candidate: the gate decides
    infra = system.retrieve(Q["p-failed"].question)
    assert [h.id for h in infra] == ["f6"]


def test_the_scope_knob_widens_retrieval(tmp_path):
    system = ingested(tmp_path)
    question = Q["p-failed"].question

    system.set_knob("scope", "workspace")
    assert {h.metadata["workspace"] for h in system.retrieve(question, k=20)} == {"billing"}
    assert len(system.retrieve(question, k=20)) == 7
    system.set_knob("scope", "all")
    assert "f3" in {h.id for h in system.retrieve(question, k=20)}


def test_a_question_without_a_header_is_asked_in_the_latest_runs_workspace(tmp_path):
    system = ingested(tmp_path)
    assert system.scope_of("Which port?") == ("billing", "", "Which port?")
    assert {
        h.metadata["workspace"]
        for h in system.retrieve("Which port does the API server listen on?")
    } == {"billing"}


# ---------------------------------------------------------------------------
# The gate
# ---------------------------------------------------------------------------


def decisions_of(admission) -> dict[str, tuple[str, str]]:
    return {d.memory_id: (d.verdict, d.by) for d in admission.decisions}


def test_strict_floors_reject_superseded_and_other_workspaces_and_demote_dead_branches(tmp_path):
    lm = ScriptedLM({GATED_ADMIT: gate_all("admit")})
    system = ingested(tmp_path, lm, scope="all")
    question = Q["p-super"].question

    admission = system.admit(question, system.retrieve(question, k=8))
    decisions = decisions_of(admission)
    assert decisions["f1"] == ("reject", "floor")  # superseded
    assert decisions["f3"] == ("reject", "floor")  # workspace search
    assert decisions["f5"] == ("negative", "floor")  # failed run
    assert decisions["f8"] == ("negative", "floor")  # rolled back
    assert decisions["f4"] == ("admit", "llm")
    reasons = {d.memory_id: d.reason for d in admission.decisions}
    assert "superseded by f4" in reasons["f1"] and "workspace search" in reasons["f3"]
    # the LLM saw only what the floors left open
    shown = candidate_ids(lm.calls[-1][1])
    assert {d.memory_id for d in admission.decisions if d.by == "llm"} == {
        d.memory_id for d in admission.decisions if str(d.rank) in shown
    }
    assert "f1" not in {d.memory_id for d in admission.decisions if str(d.rank) in shown}


def test_negative_evidence_off_rejects_dead_branches_outright(tmp_path):
    system = ingested(
        tmp_path, ScriptedLM({GATED_ADMIT: gate_all("admit")}), negative_evidence=False
    )
    question = Q["p-dead"].question
    assert decisions_of(system.admit(question, system.retrieve(question)))["f5"] == (
        "reject",
        "floor",
    )


def test_lenient_floors_leave_status_and_branch_to_the_llm(tmp_path):
    lm = ScriptedLM({GATED_ADMIT: gate_all("admit")})
    system = ingested(tmp_path, lm, floors="lenient", scope="all")
    question = Q["p-super"].question

    decisions = decisions_of(system.admit(question, system.retrieve(question, k=8)))
    assert decisions["f1"] == ("admit", "llm") and decisions["f5"] == ("admit", "llm")
    assert decisions["f3"] == ("reject", "floor")  # the workspace floor holds
    assert (
        "superseded" in lm.calls[-1][1]["candidates"]
        and "run failed" in lm.calls[-1][1]["candidates"]
    )
    system.set_knob("floors", "off")
    assert decisions_of(system.admit(question, system.retrieve(question, k=8)))["f3"] == (
        "admit",
        "llm",
    )


def test_llm_verdicts_missing_verdicts_and_negative_verdicts(tmp_path):
    def script(fields):
        ids = candidate_ids(fields)
        return {
            "decisions": [{"id": ids[0], "verdict": "reject", "reason": "not about ports"}]
            + (
                [{"id": ids[1], "verdict": "negative", "reason": "a failed idea"}]
                if len(ids) > 1
                else []
            )
        }

    system = ingested(tmp_path, ScriptedLM({GATED_ADMIT: script}), floors="off")
    question = Q["p-super"].question
    admission = system.admit(question, system.retrieve(question))

    by_rank = sorted(admission.decisions, key=lambda d: d.rank)
    assert (by_rank[0].verdict, by_rank[0].by, by_rank[0].reason) == (
        "reject",
        "llm",
        "not about ports",
    )
    assert (by_rank[1].verdict, by_rank[1].by) == ("negative", "llm")
    assert all((d.verdict, d.by) == ("admit", "default") for d in by_rank[2:])
    assert [m.id for m in admission.negative] == [by_rank[1].memory_id]
    system.set_knob("negative_evidence", False)
    assert (
        sorted(system.admit(question, system.retrieve(question)).decisions, key=lambda d: d.rank)[
            1
        ].verdict
        == "reject"
    )


def test_floors_hold_whatever_the_module_returns(tmp_path, caplog):
    system = ingested(tmp_path, ScriptedLM({GATED_ADMIT: gate_all("admit")}))
    module = system.prompt_sites()[GATED_ADMIT].module
    original = module.forward

    def tampered(**kwargs):
        prediction = original(**kwargs)
        prediction["decisions"] = [
            d.model_copy(update={"verdict": "admit"}) for d in prediction.decisions
        ]
        return prediction

    module.forward = tampered
    question = Q["p-super"].question
    admission = system.admit(question, system.retrieve(question))
    assert decisions_of(admission)["f1"] == ("reject", "floor")
    assert "f1" not in [m.id for m in admission.positive]
    assert "its floor says reject" in caplog.text


def test_floors_only_makes_no_llm_call(tmp_path):
    lm = ScriptedLM()
    system = ingested(tmp_path, lm, gate="floors_only")
    question = Q["p-dead"].question
    admission = system.admit(question, system.retrieve(question))

    assert lm.calls == []
    assert {d.by for d in admission.decisions} == {"floor"}
    assert decisions_of(admission)["f2"] == ("admit", "floor") and decisions_of(admission)[
        "f5"
    ] == ("negative", "floor")


def test_the_answer_sees_positive_memories_and_dead_branches_as_negative_evidence(tmp_path):
    lm = ScriptedLM({GATED_ADMIT: gate_all("admit"), ANSWER: answer_with(r"db-\w+-\d+")})
    system = ingested(tmp_path, lm)
    question = Q["p-dead"].question

    prediction = system.answer(question, system.retrieve(question))
    memories = lm.calls[-1][1]["memories"]
    assert prediction == "db-alpha-11"
    assert f"- {NEGATIVE_PREFIX}Pointed the API's database connection at db-beta-44." in memories
    assert memories.index("db-alpha-11") < memories.index(NEGATIVE_PREFIX)
    assert lm.sites() == [GATED_ADMIT, ANSWER]
    assert system.last_admission is not None and [
        m.id for m in system.last_admission.negative
    ] == ["f5", "f8"]


def test_no_candidates_means_no_gate_call(tmp_path):
    lm = ScriptedLM()
    system = make(tmp_path, lm)
    assert system.answer("[workspace nowhere] Which port?", []) == "I don't know"
    assert lm.sites() == [ANSWER] and lm.calls[0][1]["memories"] == "(no memories)"


# ---------------------------------------------------------------------------
# The execution graph
# ---------------------------------------------------------------------------


def test_the_graph_shows_the_schema_state_and_every_gate_decision(tmp_path):
    lm = ScriptedLM({GATED_ADMIT: gate_all("admit", "it answers the question")})
    system = make(tmp_path, lm)
    graph, predictions = record_episode(system, EPISODE, [Q["p-dead"]])

    memory = graph.latest("memory", "f5")
    assert (
        memory.data["metadata"]["branch_status"] == "failed"
        and memory.data["metadata"]["workspace"] == "billing"
    )
    assert (
        graph.latest("memory", "f1").status == "invalidated"
    )  # superseded in session r3, recorded as an update
    assert any(op.name == "update" and op.session_id == "r3" for op in graph.operations)
    ops = graph.question_ops("p-dead")
    assert [(op.name, op.category, op.site) for op in ops] == [
        ("retrieve", "retrieve", None),
        ("admit", "answer", GATED_ADMIT),
        ("answer", "answer", ANSWER),
    ]
    retrieve, gate, answer = ops
    assert retrieve.outputs[0] in gate.inputs
    decisions = graph.variables[gate.outputs[0]].data
    assert {d["memory_id"]: (d["verdict"], d["by"]) for d in decisions}["f5"] == (
        "negative",
        "floor",
    )
    assert {d["memory_id"]: d["reason"] for d in decisions}["f2"] == "it answers the question"
    assert len(decisions) == len(graph.variables[retrieve.outputs[0]].data["items"])
    assert gate.outputs[0] in answer.inputs
    assert graph.meta["sites"][GATED_ADMIT]["op_kinds"] == ["admit"]
    assert graph.meta["knobs"]["floors"] == "strict"


# ---------------------------------------------------------------------------
# Knobs, registry, modules, export
# ---------------------------------------------------------------------------


def test_knobs_have_value_spaces_and_bad_values_fail(tmp_path):
    system = make(tmp_path)
    assert system.knobs() == {
        "top_k": 5,
        "scope": "workspace_path",
        "floors": "strict",
        "gate": "llm",
        "negative_evidence": True,
    }
    assert GatedSystem.knob_values == KNOB_VALUES
    assert all(value in KNOB_VALUES[name] for name, value in system.knobs().items())
    with pytest.raises(ConfigError, match="floors must be one of"):
        system.set_knob("floors", "loose")
    with pytest.raises(ConfigError, match="top_k"):
        make(tmp_path, top_k=0)
    with pytest.raises(ConfigError, match="no knob"):
        make(tmp_path, threshold=0.3)


def test_registered_with_its_sites(tmp_path):
    assert get_system("gated") is GatedSystem
    sites = make(tmp_path).prompt_sites()
    assert set(sites) == {GATED_ADMIT, ANSWER}
    assert (sites[GATED_ADMIT].stage, sites[GATED_ADMIT].op_kinds, sites[GATED_ADMIT].layout) == (
        "answer",
        ("admit",),
        "dspy",
    )
    assert sites[GATED_ADMIT].instructions == AdmitMemories.instructions


def test_a_candidates_plain_predict_becomes_the_gate_module(tmp_path):
    system = ingested(tmp_path, ScriptedLM({GATED_ADMIT: gate_all("reject")}))
    plain = dspy.Predict(AdmitMemories.with_instructions("Reject everything."))
    system.use_modules({GATED_ADMIT: plain})

    site = system.prompt_sites()[GATED_ADMIT]
    assert isinstance(site.module, AdmissionGate) and site.instructions == "Reject everything."
    question = Q["p-dead"].question
    assert decisions_of(system.admit(question, system.retrieve(question)))["f2"] == (
        "reject",
        "llm",
    )
    copy = site.module.deepcopy()
    assert isinstance(copy, AdmissionGate)


def test_the_prompt_pack_carries_the_gate_prompt_schema_knobs_and_applies_back(tmp_path):
    bundle = Bundle(
        system="gated",
        prompts={GATED_ADMIT: "Admit only current facts.", ANSWER: "Answer briefly."},
        knobs={"floors": "lenient", "top_k": 8},
        source={"run_id": "r1"},
        label="run r1",
    )
    pack = json.loads(render(bundle, "pack"))

    assert pack == prompt_pack(bundle) | {"knob_values": pack["knob_values"]}
    assert pack["format"] == "optloop.prompt-pack/1" and pack["system"] == "gated"
    assert pack["knob_values"]["floors"] == ["strict", "lenient", "off"]
    gate = pack["sites"][GATED_ADMIT]
    assert set(gate["inputs"]) == {"question", "scope", "candidates"}
    assert gate["outputs"]["decisions"]["schema"]["items"]["$ref"].endswith("GateVerdict")
    system = make(tmp_path)
    system.apply_pack(pack)
    assert system.prompt_sites()[GATED_ADMIT].instructions == "Admit only current facts."
    assert system.knobs()["floors"] == "lenient" and system.knobs()["top_k"] == 8
    with pytest.raises(ConfigError):
        system.apply_pack({**pack, "system": "mem0"})


# ---------------------------------------------------------------------------
# Integration: the embedded SmolLM2-135M (written, run with `-m integration`)
# ---------------------------------------------------------------------------


@pytest.mark.integration
def test_gated_on_the_embedded_model_gates_one_question_and_answers(tmp_path_factory):
    from optloop.embed import get_embedder

    lm = OptloopLM(
        LMSettings.from_spec(
            "local",
            cache_path=tmp_path_factory.mktemp("lm") / "cache.sqlite",
            **{k: v for k, v in GatedSystem.local_decoding.items()},
        )
    )
    system = GatedSystem(lm, tmp_path_factory.mktemp("gated"), embedder=get_embedder("local"))
    system.ingest(EPISODE.sessions)
    question = Q["p-dead"].question
    mark = lm.accounting.mark()

    memories = system.retrieve(question)
    prediction = system.answer(question, memories)

    calls = lm.accounting.by_site(since=mark)
    assert (
        calls[GATED_ADMIT].calls == 1
        and calls[GATED_ADMIT].errors == 0
        and calls[ANSWER].calls == 1
    )
    admission = system.last_admission
    assert admission is not None and {d.memory_id for d in admission.decisions} == {
        m.id for m in memories
    }
    floors = {d.memory_id: d.verdict for d in admission.decisions if d.by == "floor"}
    assert (
        floors.get("f5") == "negative"
    )  # the failed run's host: negative evidence, whatever the model says
    assert [d.by for d in admission.decisions if d.memory_id == "f2"] in (
        ["llm"],
        ["default"],
    )  # left to the LLM
    assert isinstance(prediction, str) and prediction.strip()
