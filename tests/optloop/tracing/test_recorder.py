"""The recorder on MD-flat with a scripted LM: what the graph holds after a run."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils import DummyLM

from optloop.datasets import Episode, Question, Session, Turn
from optloop.lm import Accounting
from optloop.tracing.graph import ExecutionGraph
from optloop.tracing.recorder import record_episode
from systems.baselines import MarkdownFlatSystem

EPISODE = Episode(
    id="ep",
    sessions=[
        Session(
            id="s1",
            timestamp="2024-03-01",
            turns=[
                Turn(id="s1:t1", role="user", content="My dog is Biscuit."),
                Turn(id="s1:t2", role="user", content="I live in Denver."),
            ],
        ),
        Session(
            id="s2",
            timestamp="2024-04-01",
            turns=[Turn(id="s2:t1", role="user", content="I moved to Austin.")],
        ),
    ],
    questions=[
        Question(
            id="q1",
            question="What is my dog's name?",
            gold="Biscuit",
            evidence_ids=["s1:t1"],
            task_type="exact_recall",
            scorer="contains",
        ),
        Question(
            id="q2",
            question="Which city do I live in now?",
            gold="Austin",
            evidence_ids=["s2:t1"],
            task_type="update",
            scorer="contains",
        ),
    ],
)


def scripted_lm(*answers: dict) -> DummyLM:
    lm = DummyLM(list(answers), adapter=dspy.JSONAdapter())
    lm.accounting = Accounting()  # what the recorder reads LLM-call counts from
    return lm


@pytest.fixture
def run(tmp_path, local_embedder):
    def _run(*answers: dict) -> tuple[ExecutionGraph, dict[str, str]]:
        system = MarkdownFlatSystem(
            scripted_lm(*answers), tmp_path / "md", embedder=local_embedder
        )
        return record_episode(system, EPISODE, dataset="test")

    return _run


@pytest.fixture(scope="module")
def local_embedder():
    from optloop.embed import get_embedder

    return get_embedder("local")


def test_graph_records_site_calls_store_diff_retrieval_and_answers(run):
    graph, predictions = run(
        {"facts": ["User's dog is named Biscuit.", "User lives in Denver."]},
        {"facts": ["User's dog is named Biscuit.", "User lives in Austin."]},
        {"answer": "Biscuit"},
        {"answer": "Denver"},
    )

    assert predictions == {"q1": "Biscuit", "q2": "Denver"}
    names = [(op.name, op.site, op.session_id or op.question_id) for op in graph.operations]
    assert names == [
        ("extract", "md_flat.curate", "s1"),
        ("store", None, "s1"),
        ("extract", "md_flat.curate", "s2"),
        ("update", None, "s2"),
        ("retrieve", None, "q1"),
        ("answer", "answer", "q1"),
        ("retrieve", None, "q2"),
        ("answer", "answer", "q2"),
    ]
    curate = graph.operations[0]
    assert "message:s1:t1@0" in curate.inputs and any(
        i.startswith("prompt:md_flat.curate@") for i in curate.inputs
    )
    assert [graph.variables[o].text for o in curate.outputs] == [
        "User's dog is named Biscuit.",
        "User lives in Denver.",
    ]
    # Denver -> Austin is one update: the old unit in, the rewritten one out.
    update = graph.operations[3]
    old = [graph.variables[i] for i in update.inputs if i.startswith("memory:")]
    assert [v.text for v in old] == ["User lives in Denver."]
    assert graph.variables[update.outputs[0]].text == "User lives in Austin."
    assert graph.latest("memory", old[0].name).status == "deleted"
    retrieve = graph.operations[4]
    assert retrieve.knobs == {"top_k": 0}
    items = graph.variables[retrieve.outputs[0]].data["items"]
    assert [it["text"] for it in items] == [
        "User's dog is named Biscuit.",
        "User lives in Austin.",
    ]
    assert graph.variables[graph.operations[5].outputs[0]].text == "Biscuit"
    assert graph.meta["sites"]["md_flat.curate"]["op_kinds"] == [
        "extract",
        "update",
        "delete",
        "store",
    ]


def test_graph_json_round_trip_is_equal(run, tmp_path):
    graph, _ = run(
        {"facts": ["User's dog is named Biscuit."]},
        {"facts": ["User's dog is named Biscuit."]},
        {"answer": "Biscuit"},
        {"answer": "Denver"},
    )
    path = graph.save(tmp_path / "g.json")
    assert ExecutionGraph.load(path) == graph
    assert ExecutionGraph.from_json(graph.to_json()) == graph


def test_descendants_and_ancestors_follow_data_flow(run):
    graph, _ = run(
        {"facts": ["User's dog is named Biscuit."]},
        {"facts": ["User's dog is named Biscuit."]},
        {"answer": "Biscuit"},
        {"answer": "Denver"},
    )
    down = graph.descendants("message:s1:t1@0")
    assert any(v.startswith("memory:") for v in down) and "answer:q1.answer@0" in down
    assert "message:s1:t1@0" in graph.ancestors("answer:q1.answer@0")


def test_the_graph_names_the_systems_knobs_and_search_knob(run):
    graph, _ = run(
        {"facts": ["User's dog is named Biscuit."]},
        {"facts": []},
        {"answer": "Biscuit"},
        {"answer": "Denver"},
    )
    assert graph.meta["knobs"] == {"top_k": 0} and graph.meta["search_knob"] == "top_k"


def _episode(tag: str) -> Episode:
    """EPISODE with every id and text prefixed by ``tag``, so two recordings cannot be mistaken."""
    sessions = [
        Session(
            id=f"{tag}-{s.id}",
            timestamp=s.timestamp,
            turns=[
                Turn(id=f"{tag}-{t.id}", role=t.role, content=f"{tag}: {t.content}")
                for t in s.turns
            ],
        )
        for s in EPISODE.sessions
    ]
    return Episode(
        id=tag,
        sessions=sessions,
        questions=[
            q.model_copy(update={"id": f"{tag}-{q.id}", "evidence_ids": []})
            for q in EPISODE.questions
        ],
    )


class CountingLM(DummyLM):
    """A scripted LM that logs each call in ``accounting`` (shared, as one OptloopLM's is) and
    takes a while."""

    def __init__(self, answers: list[dict], accounting: Accounting):
        super().__init__(answers, adapter=dspy.JSONAdapter())
        self.accounting = accounting

    def forward(self, *args, **kwargs):
        import time

        from optloop.lm import CallRecord, current_site

        self.accounting.add(
            CallRecord(
                site=current_site(),
                model="dummy",
                prompt_tokens=1,
                completion_tokens=1,
                seconds=0.0,
                cached=False,
            )
        )
        time.sleep(0.05)  # the other thread's call lands meanwhile
        return super().forward(*args, **kwargs)


def test_two_threads_record_into_their_own_recorders_at_once(tmp_path, local_embedder):
    """The active recorder is per context: two threads, both recording at the same moment, each see
    only their own system's calls (a process-wide recorder would refuse the second, or mix the two
    graphs), and each operation counts only its own LM call, though both threads' calls go to one
    accounting."""
    import threading

    from optloop.tracing.recorder import Recorder, active_recorder

    accounting = Accounting()

    both_active = threading.Barrier(2, timeout=30)
    graphs: dict[str, ExecutionGraph] = {}
    errors: list[BaseException] = []

    def record(tag: str) -> None:
        try:
            episode = _episode(tag)
            lm = CountingLM(
                [
                    *({"facts": [f"{tag} fact {i}"]} for i in range(2)),
                    {"answer": tag},
                    {"answer": tag},
                ],
                accounting,
            )
            system = MarkdownFlatSystem(lm, tmp_path / tag, embedder=local_embedder)
            with Recorder(system, episode) as recorder:
                both_active.wait()  # each thread's recorder is active while the other's is
                assert active_recorder() is recorder
                for session in episode.sessions:
                    recorder.ingest_session(session)
                    both_active.wait()  # interleave the two recordings session by session
                for question in episode.questions:
                    assert recorder.ask(question) == tag
            assert active_recorder() is None
            graphs[tag] = recorder.graph
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            both_active.abort()

    threads = [threading.Thread(target=record, args=(tag,)) for tag in ("red", "blue")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for tag, other in (("red", "blue"), ("blue", "red")):
        graph = graphs[tag]
        calls = [op for op in graph.operations if op.site]
        assert [op.site for op in calls] == [
            "md_flat.curate",
            "md_flat.curate",
            "answer",
            "answer",
        ]
        texts = [graph.variables[v].text for op in calls for v in op.outputs]
        assert texts and all(tag in t and other not in t for t in texts), texts
        assert {op.session_id for op in calls if op.session_id} == {f"{tag}-s1", f"{tag}-s2"}
        assert [op.llm_calls for op in calls] == [1, 1, 1, 1]
    assert len(accounting.records) == 8


def test_a_second_recorder_in_the_same_context_is_refused(tmp_path, local_embedder):
    from optloop.tracing.recorder import Recorder, active_recorder

    first = Recorder(
        MarkdownFlatSystem(scripted_lm(), tmp_path / "a", embedder=local_embedder), EPISODE
    )
    second = Recorder(
        MarkdownFlatSystem(scripted_lm(), tmp_path / "b", embedder=local_embedder), EPISODE
    )
    with first:
        with (
            first
        ):  # re-entering the active recorder is fine (a private store records its questions so)
            assert active_recorder() is first
        assert active_recorder() is first
        with pytest.raises(RuntimeError, match="another Recorder"):
            second.__enter__()
    assert active_recorder() is None


def test_a_rewritten_query_is_recorded_beside_the_search_for_the_question_as_asked(
    tmp_path, local_embedder
):
    """With a ``retrieve.query`` site, the retrieval records what the same search returns for
    the question as asked (``asked``), so attribution can tell a rewrite that lost the evidence
    from a search that never had it; and it attributes the miss to the rewrite."""
    from optloop.attribution import attribute, default_judges
    from systems.baselines import BM25RagSystem

    lm = scripted_lm(
        {"query": "name pet"}, {"answer": "unknown"}, {"query": "Which city"}, {"answer": "Austin"}
    )
    system = BM25RagSystem(lm, tmp_path / "rag", embedder=local_embedder, query_site=True)
    graph, predictions = record_episode(system, EPISODE, dataset="test")
    retrieved = {v.question_id: v.data for v in graph.variables.values() if v.cls == "retrieved"}
    assert retrieved["q1"]["query"] == "name pet"
    assert any("s1:t1" in m for m in retrieved["q1"]["asked"])  # the question as asked finds it
    assert not any("s1:t1" in i["id"] for i in retrieved["q1"]["items"])  # "name pet" did not
    a = attribute(graph, EPISODE.questions[0], predictions["q1"], default_judges(local_embedder))
    assert a.target == "retrieve.query" and "question as asked ranks it" in a.explanation
