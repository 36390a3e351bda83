"""The graphiti system: real graphiti-core on Kuzu, its LLM calls on optloop prompt sites.

Fidelity is checked at the HTTP boundary: vanilla ``Graphiti`` with
``OpenAIGenericClient`` and our ``GraphitiSystem`` each talk to a loopback
OpenAI-compatible server that answers every graphiti prompt with fixed valid
JSON, and the messages both send are compared byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy
import pytest
from graphiti_core import Graphiti
from graphiti_core.driver.kuzu_driver import KuzuDriver
from graphiti_core.llm_client.config import LLMConfig
from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient
from graphiti_core.nodes import EpisodeType
from graphiti_core.prompts.models import Message

from optloop.datasets import Session, Turn
from optloop.embed import get_embedder
from optloop.errors import ConfigError
from optloop.lm import LMSettings, OptloopLM
from optloop.testing.loopback import closed_port_url
from optloop.testing.scripted import ScriptedOpenAIServer
from signatures._layout import render_system
from signatures.graphiti import PROMPT_NAMES, SIGNATURES, library_system_prompt
from systems import get_system
from systems.graphiti_system import (
    GraphitiSystem,
    LocalCrossEncoderClient,
    LocalEmbedderClient,
    SiteLLMClient,
    UnknownPromptError,
    episode_body,
    graph_backend,
    parse_session_time,
)

SESSIONS = [
    Session(
        id="s1",
        timestamp="2024-01-01T10:00:00+00:00",
        turns=[
            Turn(id="s1:t1", role="user", content="I am Alice and I live in Paris."),
            Turn(id="s1:t2", role="assistant", content="Nice to meet you, Alice!"),
        ],
    ),
    Session(
        id="s2",
        timestamp="2024-02-01T10:00:00+00:00",
        turns=[
            Turn(id="s2:t1", role="user", content="Alice Smith moved to Berlin with Bob."),
            Turn(id="s2:t2", role="assistant", content="Exciting news!"),
        ],
    ),
]

# Which graphiti prompt a request is, told by its response schema's top-level fields
# (independent of the instructions, so a changed site is still recognised).
PROMPT_BY_FIELDS = {
    frozenset({"extracted_entities"}): "extract_nodes.extract_message",
    frozenset({"entity_resolutions"}): "dedupe_nodes.nodes",
    frozenset({"edges"}): "extract_edges.edge",
    frozenset({"valid_at", "invalid_at"}): "extract_edges.extract_timestamps",
    frozenset({"duplicate_facts", "contradicted_facts"}): "dedupe_edges.resolve_edge",
    frozenset({"summaries"}): "extract_nodes.extract_summaries_batch",
}


def canned_answer(prompt: str, user: str) -> dict[str, Any]:
    """A valid answer of graphiti's response model; the second session is recognised by
    'Berlin'."""
    second = "Berlin" in user
    if prompt == "extract_nodes.extract_message":
        names = ["Alice Smith", "Berlin", "Bob"] if second else ["Alice", "Paris"]
        return {"extracted_entities": [{"name": n, "entity_type_id": 0} for n in names]}
    if prompt == "extract_edges.edge":
        edge = (
            ("Alice Smith", "Berlin", "Alice Smith lives in the city of Berlin now")
            if second
            else ("Alice", "Paris", "Alice lives in Paris")
        )
        return {
            "edges": [
                {
                    "source_entity_name": edge[0],
                    "target_entity_name": edge[1],
                    "relation_type": "LIVES_IN",
                    "fact": edge[2],
                }
            ]
        }
    return {
        "dedupe_nodes.nodes": {"entity_resolutions": []},
        "extract_edges.extract_timestamps": {"valid_at": None, "invalid_at": None},
        "dedupe_edges.resolve_edge": {"duplicate_facts": [], "contradicted_facts": []},
        "extract_nodes.extract_summaries_batch": {"summaries": []},
    }[prompt]


class GraphitiStubServer(ScriptedOpenAIServer):
    """A loopback OpenAI-compatible server that answers each graphiti prompt with valid JSON.

    Records ``(prompt, messages)`` for every chat completion, in arrival order.
    """

    def __init__(self) -> None:
        super().__init__([("respond", self._respond)])
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []

    def _respond(self, body: dict[str, Any]) -> tuple[str, Any]:
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("schema", {})
        prompt = PROMPT_BY_FIELDS.get(frozenset(schema.get("properties", {})), "unknown")
        self.calls.append((prompt, body["messages"]))
        if prompt == "unknown":
            return "status", 400
        return "ok", json.dumps(canned_answer(prompt, body["messages"][-1]["content"]))

    def by_prompt(self) -> dict[str, list[list[dict[str, Any]]]]:
        out: dict[str, list[list[dict[str, Any]]]] = {}
        for prompt, messages in self.calls:
            out.setdefault(prompt, []).append(messages)
        return out


def stub_lm(server: GraphitiStubServer) -> OptloopLM:
    return OptloopLM(LMSettings.from_spec("openai:test", base_url=server.base_url, cache=False))


async def _ingest_vanilla(base_url: str, db_path: Path, sessions: Sequence[Session]) -> None:
    """What a graphiti user writes: Kuzu, OpenAIGenericClient, the same embedder and reranker."""
    driver = KuzuDriver(db=str(db_path))
    await driver.graph_ops.build_indices_and_constraints(driver)
    driver._database = "default"
    embedder = get_embedder()
    graphiti = Graphiti(
        graph_driver=driver,
        llm_client=OpenAIGenericClient(LLMConfig(api_key="test", base_url=base_url, model="test")),
        embedder=LocalEmbedderClient(embedder),
        cross_encoder=LocalCrossEncoderClient(embedder),
    )
    for session in sessions:
        await graphiti.add_episode(
            name=session.id,
            episode_body=episode_body(session),
            source_description=f"{session.kind} session {session.id}",
            reference_time=parse_session_time(session.timestamp),
            source=EpisodeType.message,
            group_id="optloop",
        )


@pytest.fixture(scope="module")
def vanilla_calls(tmp_path_factory) -> dict[str, list[list[dict[str, Any]]]]:
    """The messages vanilla graphiti sends while ingesting SESSIONS, by prompt."""
    with GraphitiStubServer() as server:
        asyncio.run(
            _ingest_vanilla(
                server.base_url, tmp_path_factory.mktemp("vanilla") / "g.kuzu", SESSIONS
            )
        )
    return server.by_prompt()


def ingest_ours(
    tmp_path: Path,
    sessions: Sequence[Session],
    *,
    instructions: dict[str, str] | None = None,
) -> tuple[dict[str, list[list[dict[str, Any]]]], GraphitiSystem]:
    with GraphitiStubServer() as server:
        system = GraphitiSystem(stub_lm(server), tmp_path / "ours")
        for site, text in (instructions or {}).items():
            system.prompt_sites()[site].set_instructions(text)
        system.ingest(sessions)
    return server.by_prompt(), system


# --- signatures ---------------------------------------------------------------------------


def test_signatures_are_seeded_from_the_installed_graphiti_prompts():
    from graphiti_core.prompts.lib import BUILTIN_PROMPT_SPECS

    assert set(SIGNATURES) == {f"graphiti.{name}" for name in PROMPT_NAMES}
    for name in PROMPT_NAMES:
        signature = SIGNATURES[f"graphiti.{name}"]
        assert signature.instructions == library_system_prompt(name)
        assert list(signature.input_fields) == ["user_content"]
        assert list(signature.output_fields) == list(
            BUILTIN_PROMPT_SPECS[name].response_model.model_fields
        )


def test_system_is_registered_and_exposes_one_ingest_site_per_graphiti_prompt(tmp_path):
    assert get_system("graphiti") is GraphitiSystem
    system = GraphitiSystem(
        OptloopLM(LMSettings.from_spec("openai:test", base_url=closed_port_url())), tmp_path
    )
    sites = system.prompt_sites()
    assert {n for n, s in sites.items() if s.stage == "ingest"} == {
        f"graphiti.{n}" for n in PROMPT_NAMES
    }
    assert sites["graphiti.extract_edges.edge"].seed_instruction.startswith(
        "You are an expert fact extractor"
    )
    assert "answer" in sites
    system.close()


# --- fidelity -----------------------------------------------------------------------------


def test_add_episode_calls_exactly_the_six_seeded_prompts(vanilla_calls):
    assert set(vanilla_calls) == set(PROMPT_NAMES)


def test_seeded_sites_send_byte_identical_messages_to_vanilla_graphiti(vanilla_calls, tmp_path):
    ours, system = ingest_ours(tmp_path, SESSIONS)
    assert set(ours) == set(PROMPT_NAMES)
    for prompt in PROMPT_NAMES:
        assert ours[prompt] == vanilla_calls[prompt], prompt
    # The framing graphiti appends (unicode note, language note) reached the wire.
    system_message = ours["extract_edges.edge"][0][0]["content"]
    assert "Do not escape unicode characters." in system_message
    assert "returned in the same language" in system_message
    system.close()


def test_changed_instructions_change_only_that_sites_system_message(vanilla_calls, tmp_path):
    site = "graphiti.extract_edges.edge"
    seed = SIGNATURES[site].instructions
    new = "Extract every fact triple from the CURRENT MESSAGE, one edge per stated relationship."
    ours, system = ingest_ours(tmp_path, SESSIONS, instructions={site: new})
    assert set(ours) == set(PROMPT_NAMES)
    for prompt in PROMPT_NAMES:
        if prompt != "extract_edges.edge":
            assert ours[prompt] == vanilla_calls[prompt], prompt
            continue
        assert len(ours[prompt]) == len(vanilla_calls[prompt])
        for sent, vanilla in zip(ours[prompt], vanilla_calls[prompt], strict=True):
            assert sent[1] == vanilla[1]  # the user message is untouched
            framing = vanilla[0]["content"].removeprefix(seed)
            assert sent[0]["content"] == new + framing != vanilla[0]["content"]
    system.close()


def test_demos_render_between_the_instructions_and_graphitis_framing(vanilla_calls, tmp_path):
    site = "graphiti.extract_edges.edge"
    demo = dspy.Example(
        user_content="Bob: I work at Acme.",
        edges=[
            {
                "source_entity_name": "Bob",
                "target_entity_name": "Acme",
                "relation_type": "WORKS_AT",
                "fact": "Bob works at Acme",
            }
        ],
    )
    with GraphitiStubServer() as server:
        system = GraphitiSystem(stub_lm(server), tmp_path)
        system.prompt_sites()[site].module.demos = [demo]
        system.ingest(SESSIONS[:1])
    sent = server.by_prompt()["extract_edges.edge"][0]
    vanilla = vanilla_calls["extract_edges.edge"][0]
    framing = vanilla[0]["content"].removeprefix(SIGNATURES[site].instructions)
    # What an exported (instructions + demos) string makes vanilla graphiti send.
    assert sent[0]["content"] == render_system(SIGNATURES[site], [demo]) + framing
    assert "Bob works at Acme" in sent[0]["content"] and sent[1] == vanilla[1]
    system.close()


def test_unknown_prompt_name_is_a_clear_error(tmp_path):
    system = GraphitiSystem(
        OptloopLM(LMSettings.from_spec("openai:test", base_url=closed_port_url())), tmp_path
    )
    client = SiteLLMClient(system.lm, system.prompt_sites)
    messages = [Message(role="system", content="sys"), Message(role="user", content="user")]
    with pytest.raises(UnknownPromptError, match=r"eval\.qa_prompt.*no optloop prompt site"):
        asyncio.run(client.generate_response(messages, prompt_name="eval.qa_prompt"))
    system.close()


def test_a_dspy_trace_around_ingest_records_each_site_call(tmp_path):
    with GraphitiStubServer() as server:
        system = GraphitiSystem(stub_lm(server), tmp_path)
        with dspy.context(trace=[]):
            system.ingest(SESSIONS[:1])
            trace = list(dspy.settings.trace)
    sites = system.prompt_sites()
    assert [prompt for prompt, _ in server.calls] == [
        "extract_nodes.extract_message",
        "extract_edges.edge",
        "extract_edges.extract_timestamps",
    ]
    # Each LLM call graphiti made is one traced call of its site's module, on the user message
    # sent.
    assert [(id(module), inputs["user_content"]) for module, inputs, _ in trace] == [
        (id(sites[f"graphiti.{prompt}"].module), messages[1]["content"])
        for prompt, messages in server.calls
    ]
    system.close()


# --- knobs --------------------------------------------------------------------------------


def test_knobs_accept_num_results_alias_and_reject_unknown_recipes(tmp_path):
    lm = OptloopLM(LMSettings.from_spec("openai:test", base_url=closed_port_url()))
    system = GraphitiSystem(
        lm, tmp_path / "a", knobs={"num_results": 3, "search_recipe": "NODE_HYBRID_SEARCH_RRF"}
    )
    assert system.knobs() == {"top_k": 3, "search_recipe": "NODE_HYBRID_SEARCH_RRF"}
    system.set_knob("num_results", 7)
    assert system.knobs()["top_k"] == 7
    with pytest.raises(ConfigError, match="EDGE_HYBRID_SEARCH_RRF"):
        system.set_knob("search_recipe", "NO_SUCH_RECIPE")
    with pytest.raises(ConfigError, match="unknown graphiti search_recipe"):
        GraphitiSystem(
            lm, tmp_path / "b", knobs={"search_recipe": "EDGE_HYBRID_SEARCH_NODE_DISTANCE"}
        )
    system.close()


def test_graph_uri_picks_the_database_and_rejects_unknown_schemes(tmp_path):
    assert [
        graph_backend(u)
        for u in (None, "bolt://localhost:7687", "neo4j+s://db.example", "falkor://h:6379")
    ] == ["kuzu", "neo4j", "neo4j", "falkordb"]
    with pytest.raises(ConfigError, match="unsupported graph URI 'mysql://x'"):
        GraphitiSystem(
            OptloopLM(LMSettings.from_spec("openai:test", base_url=closed_port_url())),
            tmp_path,
            graph_uri="mysql://x",
        )


def test_session_times_parse_iso_and_locomo_style():
    assert (
        parse_session_time("2024-01-01T10:00:00+00:00").isoformat() == "2024-01-01T10:00:00+00:00"
    )
    assert parse_session_time("1:56 pm on 8 May, 2023").isoformat() == "2023-05-08T13:56:00+00:00"
    assert parse_session_time("not a date at all") is None
    assert parse_session_time(None) is None


# --- state --------------------------------------------------------------------------------


def test_separate_run_dirs_do_not_share_state_and_reset_empties(tmp_path):
    with GraphitiStubServer() as server:
        first = GraphitiSystem(stub_lm(server), tmp_path / "first")
        second = GraphitiSystem(stub_lm(server), tmp_path / "second")
        first.ingest(SESSIONS[:1])

        stored = first.all_memories()
        facts = [m for m in stored if m.metadata["kind"] == "edge"]
        assert [m.text for m in facts] == ["Alice lives in Paris"]
        assert facts[0].metadata["session_ids"] == ["s1"]
        assert {m.metadata["name"] for m in stored if m.metadata["kind"] == "node"} == {
            "Alice",
            "Paris",
        }
        # The session itself is stored too: graphiti's episode, which the default recipe searches.
        episodes = [m for m in stored if m.metadata["kind"] == "episode"]
        assert [m.metadata["session_ids"] for m in episodes] == [["s1"]]
        assert "Alice" in episodes[0].text
        retrieved = first.retrieve("Where does Alice live?", k=3)
        assert retrieved[0].id == facts[0].id  # facts first, then entities and episodes
        assert {m.metadata["kind"] for m in retrieved[1:]} <= {"node", "episode"}
        assert retrieved[0].metadata["timestamp"].startswith("2024-01-01")
        edges_only = GraphitiSystem(
            stub_lm(server), tmp_path / "edges", knobs={"search_recipe": "EDGE_HYBRID_SEARCH_RRF"}
        )
        assert edges_only.retrievable_kinds() == {"edge"}
        edges_only.close()

        assert second.all_memories() == []
        assert second.retrieve("Where does Alice live?") == []

        first.reset()
        assert first.all_memories() == []
        assert first.retrieve("Where does Alice live?") == []
        first.ingest(SESSIONS[:1])  # the store is usable again after reset
        assert [m.text for m in first.all_memories() if m.metadata["kind"] == "edge"] == [
            "Alice lives in Paris"
        ]
        assert second.all_memories() == []
        first.close()
        second.close()


def test_a_store_opened_again_keeps_its_memories_and_search(tmp_path):
    # What a resumed run does: the same directory opened by a new system object, whose full-text
    # indexes already exist (creating them again made Kuzu refuse, and the run stop).
    with GraphitiStubServer() as server:
        first = GraphitiSystem(stub_lm(server), tmp_path / "store")
        first.ingest(SESSIONS[:1])
        stored = sorted(m.text for m in first.all_memories())
        first.close()
        again = GraphitiSystem(stub_lm(server), tmp_path / "store")
        assert sorted(m.text for m in again.all_memories()) == stored
        assert "Alice lives in Paris" in [m.text for m in again.retrieve("Where does Alice live?")]
        again.close()


# --- the real embedded LM -------------------------------------------------------------------


def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]{3,}", text)}


@pytest.mark.integration
@pytest.mark.slow
def test_ingest_retrieve_answer_on_the_embedded_lm(tmp_path):
    # SmolLM2-135M under schema-constrained decoding, kept short: one llama.cpp thread (the
    # 2-core machine is shared; oversubscribed llama.cpp threads slow down many-fold),
    # at most 3 items per list and 80 characters per string, no retries (temperature 0
    # would repeat the same answer). About 8 LM calls, 3-4 minutes here.
    lm = OptloopLM(
        LMSettings.from_spec(
            "local",
            n_threads=1,
            max_array_items=3,
            max_string_chars=80,
            max_tokens=1024,
            max_retries=0,
        )
    )
    system = GraphitiSystem(lm, tmp_path)
    sessions = [
        Session(
            id="s1",
            timestamp="2024-03-01T09:00:00+00:00",
            turns=[
                Turn(
                    id="s1:t1",
                    role="user",
                    content="My name is Alice. I work at Google in Zurich.",
                ),
            ],
        ),
        Session(
            id="s2",
            timestamp="2024-03-08T09:00:00+00:00",
            turns=[
                Turn(id="s2:t1", role="user", content="Alice adopted a cat named Tom."),
            ],
        ),
    ]
    mark = lm.accounting.mark()
    system.ingest(sessions)
    by_site = lm.accounting.by_site(since=mark)
    assert (
        by_site["graphiti.extract_nodes.extract_message"].calls == 2
    )  # one add_episode per session
    assert by_site["graphiti.extract_edges.edge"].calls == 2
    assert set(by_site) <= set(SIGNATURES)
    assert all(
        usage.errors == 0 and usage.model_calls == usage.calls for usage in by_site.values()
    )

    stored = system.all_memories()
    assert [m for m in stored if m.metadata["kind"] == "node"], "graphiti stored no entity"
    for edge in (m for m in stored if m.metadata["kind"] == "edge"):
        assert edge.metadata["session_ids"] and set(edge.metadata["session_ids"]) <= {"s1", "s2"}
    # The 135M model copies names from graphiti's own examples too; some stored text must
    # still come from the sessions.
    session_words = set().union(*(_words(t.content) for s in sessions for t in s.turns))
    shared = sorted(set().union(*(_words(m.text) for m in stored)) & session_words)
    assert shared, [m.text for m in stored]

    # Retrieval through graphiti's own search finds a stored memory by a word it holds.
    system.set_knob("search_recipe", "COMBINED_HYBRID_SEARCH_RRF")
    retrieved = system.retrieve(shared[0], k=5)
    assert retrieved and {m.id for m in retrieved} & {m.id for m in stored}
    answer = system.answer("Where does Alice work?", retrieved)
    assert isinstance(answer, str) and answer.strip()
    system.close()


def test_closing_the_loop_cancels_an_interrupted_ingest_instead_of_leaving_it_pending():
    from systems.graphiti_system import _LoopThread

    loop_thread = _LoopThread(name="graphiti-test")
    started, cancelled = asyncio.Event(), []

    async def slow_ingest() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    future = asyncio.run_coroutine_threadsafe(slow_ingest(), loop_thread.loop)
    asyncio.run_coroutine_threadsafe(started.wait(), loop_thread.loop).result(timeout=10)
    loop_thread.close()

    assert cancelled == [True]
    assert future.cancelled()
    assert loop_thread.loop.is_closed()


def test_an_interrupt_while_run_waits_cancels_the_coroutine():
    from systems.graphiti_system import _LoopThread

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    loop_thread = _LoopThread(name="graphiti-test")
    cancelled = threading.Event()

    async def slow_ingest() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupted):
            loop_thread.run(slow_ingest())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert cancelled.wait(10)
    loop_thread.close()
