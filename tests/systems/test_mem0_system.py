"""Mem0System: real mem0ai behind prompt sites.

Fast tests speak to loopback OpenAI-compatible servers (``optloop/testing/scripted.py``)
and compare, at the HTTP boundary, what our sites send with what vanilla mem0
sends. The integration test runs the real embedded LM.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from optloop.datasets import Session, Turn
from optloop.embed import get_embedder
from optloop.errors import LMError, OptloopError
from optloop.lm import LMSettings, OptloopLM
from optloop.testing.scripted import ScriptedOpenAIServer
from signatures.mem0 import ADDITIVE_EXTRACTION_PROMPT, RERANK_SYSTEM_PROMPT, Mem0Extract
from systems import get_system
from systems.base import MemoryItem
from systems.mem0_system import (
    USER_ID,
    Mem0System,
    OptloopEmbedding,
    SiteDispatchLLM,
    UnknownPromptError,
    UnwiredEmbedding,
    UnwiredLLM,
    session_messages,
)

SESSIONS = [
    Session(
        id="s1",
        timestamp="2023-05-08 13:56",
        turns=[
            Turn(
                id="s1:t1", role="user", content="I adopted a beagle puppy named Max last weekend."
            ),
            Turn(id="s1:t2", role="assistant", content="Congratulations! How is Max settling in?"),
            Turn(id="s1:t3", role="user", content="He loves the dog park near my flat in Denver."),
        ],
    ),
    Session(
        id="s2",
        timestamp="2023-05-20 09:12",
        turns=[
            Turn(
                id="s2:t1", role="user", content="I started pottery classes on Tuesday evenings."
            ),
            Turn(
                id="s2:t2", role="assistant", content="That sounds relaxing. What are you making?"
            ),
            Turn(id="s2:t3", role="user", content="A blue mug for my sister Ana."),
        ],
    ),
]


def extraction(*texts: str) -> str:
    """A valid mem0 extraction answer storing ``texts``."""
    return json.dumps(
        {
            "memory": [
                {"id": str(i), "text": t, "attributed_to": "user"} for i, t in enumerate(texts)
            ]
        }
    )


S1_MEMORY = "User adopted a beagle puppy named Max who loves the dog park in Denver"
S2_MEMORY = (
    "User takes pottery classes on Tuesday evenings and is making a blue mug for sister Ana"
)
SCRIPT = [("ok", extraction(S1_MEMORY)), ("ok", extraction(S2_MEMORY))]


@pytest.fixture(scope="module")
def embedder():
    return get_embedder()


@pytest.fixture(autouse=True)
def _no_openrouter(monkeypatch):
    # mem0's OpenAI client switches to OpenRouter when this is set.
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)


def scripted_lm(server: ScriptedOpenAIServer) -> OptloopLM:
    """Our LM on a loopback server, uncached so every call reaches the server."""
    return OptloopLM(
        LMSettings.from_spec("openai:test", base_url=server.base_url, cache=False, max_retries=0)
    )


def vanilla_mem0(root: Path, base_url: str, embedder):
    """Unmodified ``mem0.Memory`` with its OpenAI LLM (and LLM reranker) on ``base_url``.

    Only the embedder is ours, so both sides see the same vectors and therefore
    the same "Existing Memories" in their prompts.
    """
    from mem0 import Memory
    from mem0.configs.base import MemoryConfig

    llm = {
        "provider": "openai",
        "config": {"model": "gpt-test", "api_key": "test-key", "openai_base_url": base_url},
    }
    memory = Memory(
        MemoryConfig(
            vector_store={
                "provider": "qdrant",
                "config": {
                    "collection_name": "mem0",
                    "embedding_model_dims": embedder.dim,
                    "path": str(root / "qdrant"),
                    "on_disk": True,
                },
            },
            llm=llm,
            embedder={
                "provider": "openai",
                "config": {
                    "api_key": "unused",
                    "openai_base_url": "http://optloop.invalid/v1",
                    "embedding_dims": embedder.dim,
                },
            },
            history_db_path=str(root / "history.db"),
            reranker={"provider": "llm_reranker", "config": {"llm": llm}},
        )
    )
    memory.embedding_model = OptloopEmbedding(embedder)
    return memory


def vanilla_add(memory, session: Session) -> None:
    memory.add(
        session_messages(session),
        user_id=USER_ID,
        metadata={
            "session_id": session.id,
            "turn_ids": [t.id for t in session.turns],
            "timestamp": session.timestamp,
        },
    )


def sent_messages(server: ScriptedOpenAIServer) -> list[list[dict]]:
    return [
        r["body"]["messages"] for r in server.requests if r["path"].endswith("/chat/completions")
    ]


# --- sites -------------------------------------------------------------------------------


def test_registry_resolves_mem0_to_this_class():
    assert get_system("mem0") is Mem0System


def test_extract_site_seeds_from_installed_mem0_prompt_verbatim(tmp_path, embedder):
    from mem0.configs import prompts

    with ScriptedOpenAIServer(SCRIPT) as server:
        system = Mem0System(scripted_lm(server), tmp_path / "run", embedder=embedder)
    site = system.prompt_sites()["mem0.extract"]
    assert (site.stage, site.op_kinds) == ("ingest", ("extract", "store"))
    # DSPy's own Signature.instructions would strip the blank lines mem0's prompt starts with.
    assert site.instructions == site.seed_instruction == prompts.ADDITIVE_EXTRACTION_PROMPT
    assert site.instructions.startswith("\n\n# ROLE")
    assert not site.changed
    site.set_instructions("\n  Extract facts.\n")
    assert site.instructions == "\n  Extract facts.\n" and site.changed
    state = site.module.dump_state()
    site.set_instructions(prompts.ADDITIVE_EXTRACTION_PROMPT)
    assert not site.changed
    site.module.load_state(state)
    assert site.instructions == "\n  Extract facts.\n"
    assert (
        Mem0Extract.instructions == prompts.ADDITIVE_EXTRACTION_PROMPT
    )  # rewrites never touch the seed class
    assert "mem0.rerank" not in system.prompt_sites()
    system.set_knob("rerank", True)
    assert system.prompt_sites()["mem0.rerank"].instructions == RERANK_SYSTEM_PROMPT


# --- fidelity at the HTTP boundary -------------------------------------------------------


def test_seed_extraction_messages_are_byte_identical_to_vanilla_mem0(tmp_path, embedder):
    from mem0.configs.llms.base import BaseLlmConfig

    with (
        ScriptedOpenAIServer(SCRIPT) as vanilla_server,
        ScriptedOpenAIServer(SCRIPT) as our_server,
    ):
        vanilla = vanilla_mem0(tmp_path / "vanilla", vanilla_server.base_url, embedder)
        for session in SESSIONS:
            vanilla_add(vanilla, session)
        lm = scripted_lm(our_server)
        ours = Mem0System(lm, tmp_path / "ours", embedder=embedder)
        ours.ingest(SESSIONS)

    theirs, mine = sent_messages(vanilla_server), sent_messages(our_server)
    assert len(theirs) == len(mine) == 2  # one extraction call per session
    assert mine == theirs  # every byte of every message, both calls
    assert [m["role"] for m in mine[0]] == ["system", "user"]
    assert mine[0][0]["content"] == ADDITIVE_EXTRACTION_PROMPT
    # The second call carries state built by the first: the stored memory and the last messages.
    assert (
        S1_MEMORY in mine[1][1]["content"]
        and "user: He loves the dog park" in mine[1][1]["content"]
    )
    assert vanilla_server.requests[0]["body"]["response_format"] == {"type": "json_object"}
    assert our_server.requests[0]["body"]["response_format"]["type"] == "json_schema"
    # and the answer may be as long as mem0's own call allows (its LLM config's max_tokens)
    assert our_server.requests[0]["body"]["max_tokens"] == BaseLlmConfig().max_tokens
    assert vanilla_server.requests[0]["body"]["max_tokens"] == BaseLlmConfig().max_tokens
    # Both stores end up holding the same memories.
    vanilla_texts = sorted(
        r["memory"] for r in vanilla.get_all(filters={"user_id": USER_ID})["results"]
    )
    assert [m.text for m in ours.all_memories()] == vanilla_texts == [S1_MEMORY, S2_MEMORY]
    assert lm.accounting.totals("mem0.extract").calls == 2


def test_changed_instructions_change_only_the_system_message(tmp_path, embedder):
    new_instructions = "Extract the user's facts as JSON."
    with ScriptedOpenAIServer(SCRIPT) as seed_server, ScriptedOpenAIServer(SCRIPT) as tuned_server:
        Mem0System(scripted_lm(seed_server), tmp_path / "seed", embedder=embedder).ingest(
            SESSIONS[:1]
        )
        tuned = Mem0System(scripted_lm(tuned_server), tmp_path / "tuned", embedder=embedder)
        tuned.prompt_sites()["mem0.extract"].set_instructions(new_instructions)
        tuned.ingest(SESSIONS[:1])

    (seed,), (changed,) = sent_messages(seed_server), sent_messages(tuned_server)
    assert seed[0]["content"] == ADDITIVE_EXTRACTION_PROMPT
    assert changed[0] == {"role": "system", "content": new_instructions}
    assert changed[1] == seed[1]  # the user message is mem0's, untouched
    assert len(changed) == len(seed) == 2


def test_rerank_site_sends_the_llm_rerankers_messages(tmp_path, embedder):
    query = "What is my dog called?"
    with (
        ScriptedOpenAIServer([SCRIPT[0], ("ok", "0.85")]) as vanilla_server,
        ScriptedOpenAIServer([SCRIPT[0], ("ok", json.dumps({"score": 0.85}))]) as our_server,
    ):
        vanilla = vanilla_mem0(tmp_path / "vanilla", vanilla_server.base_url, embedder)
        vanilla_add(vanilla, SESSIONS[0])
        theirs = vanilla.search(
            query, top_k=5, filters={"user_id": USER_ID}, threshold=0.1, rerank=True
        )["results"]
        ours = Mem0System(
            scripted_lm(our_server), tmp_path / "ours", embedder=embedder, knobs={"rerank": True}
        )
        ours.ingest(SESSIONS[:1])
        retrieved = ours.retrieve(query)

    their_rerank, our_rerank = sent_messages(vanilla_server)[1:], sent_messages(our_server)[1:]
    assert len(our_rerank) == len(their_rerank) == 1  # one scoring call per retrieved memory
    assert our_rerank == their_rerank
    assert our_rerank[0] == [
        {"role": "system", "content": RERANK_SYSTEM_PROMPT},
        {"role": "user", "content": f"Query: {query}\n\nDocument: {S1_MEMORY}"},
    ]
    assert theirs[0]["rerank_score"] == retrieved[0].metadata["rerank_score"] == 0.85
    assert ours.lm.accounting.totals("mem0.rerank").calls == 1


def test_unrecognized_prompt_raises_naming_it(tmp_path, embedder):
    with ScriptedOpenAIServer(SCRIPT) as server:
        system = Mem0System(scripted_lm(server), tmp_path / "run", embedder=embedder)
        with pytest.raises(UnknownPromptError, match="You are a smart memory manager") as err:
            system.memory.llm.generate_response(
                [
                    {"role": "system", "content": "You are a smart memory manager."},
                    {"role": "user", "content": "x"},
                ]
            )
        assert isinstance(err.value, OptloopError)
        with pytest.raises(UnknownPromptError, match=r"roles \['user'\]"):
            system.memory.llm.generate_response([{"role": "user", "content": "x"}])
        assert server.requests == []  # nothing unrecognized reaches the LM


def test_lm_failures_surface_as_optloop_errors_not_mem0s_wrapper(tmp_path, embedder):
    with ScriptedOpenAIServer([("status", 400)]) as server:
        system = Mem0System(scripted_lm(server), tmp_path / "run", embedder=embedder)
        with pytest.raises(LMError, match="HTTP 400"):
            system.ingest(SESSIONS[:1])
    assert system.all_memories() == []


# --- store behaviour ---------------------------------------------------------------------


def test_memories_keep_session_provenance(tmp_path, embedder):
    with ScriptedOpenAIServer(SCRIPT) as server:
        system = Mem0System(scripted_lm(server), tmp_path / "run", embedder=embedder)
        system.ingest(SESSIONS)
        (hit, *_) = system.retrieve("Where does Max like to go?", k=1)
    assert isinstance(hit, MemoryItem) and hit.text == S1_MEMORY
    assert 0 < hit.score <= 1
    assert hit.metadata["session_id"] == "s1"
    assert hit.metadata["turn_ids"] == ["s1:t1", "s1:t2", "s1:t3"]
    assert hit.metadata["timestamp"] == "2023-05-08 13:56"
    assert hit.metadata["attributed_to"] == "user"
    assert [m.metadata["session_id"] for m in system.all_memories()] == ["s1", "s2"]


def test_named_speakers_prefix_their_turns():
    session = Session(
        id="d1",
        turns=[
            Turn(id="d1:1", role="user", content="Hi!", speaker="Caroline"),
            Turn(id="d1:2", role="assistant", content="Hello."),
        ],
    )
    assert session_messages(session) == [
        {"role": "user", "content": "Caroline: Hi!"},
        {"role": "assistant", "content": "Hello."},
    ]


def test_instances_share_nothing_and_reset_empties(tmp_path, embedder):
    with (
        ScriptedOpenAIServer([SCRIPT[0]]) as server_a,
        ScriptedOpenAIServer([SCRIPT[1]]) as server_b,
    ):
        a = Mem0System(scripted_lm(server_a), tmp_path / "a", embedder=embedder)
        b = Mem0System(scripted_lm(server_b), tmp_path / "b", embedder=embedder)
        a.ingest(SESSIONS[:1])
        b.ingest(SESSIONS[1:])
        assert [m.text for m in a.all_memories()] == [S1_MEMORY]
        assert [m.text for m in b.all_memories()] == [S2_MEMORY]
        assert {m.text for m in a.retrieve("pottery mug for Ana", k=5)} <= {S1_MEMORY}
        # b's prompt saw none of a's state.
        assert "Max" not in sent_messages(server_b)[0][1]["content"]

        a.reset()
        assert list((tmp_path / "a").iterdir()) == []
        assert a.all_memories() == [] and a.retrieve("Max the beagle") == []
        assert [m.text for m in b.all_memories()] == [S2_MEMORY]  # b untouched

        a.ingest(SESSIONS[:1])  # the store reopens after a reset
        assert [m.text for m in a.all_memories()] == [S1_MEMORY]
        # Nothing of the forgotten store leaks into the new extraction prompt.
        assert "## Existing Memories\n[]" in sent_messages(server_a)[1][1]["content"]
        a.close()
        b.close()


def test_a_store_builds_no_openai_client_and_wires_every_client(tmp_path, embedder, monkeypatch):
    """mem0 builds its LLM, embedder and reranker LLM from the config; optloop replaces all three,
    so building them as OpenAI clients (an SSL context each, most of a store's CPU) would be
    waste."""
    import openai

    built: list[object] = []
    real_init = openai.OpenAI.__init__
    with ScriptedOpenAIServer([SCRIPT[0]]) as server:
        system = Mem0System(scripted_lm(server), tmp_path / "m", embedder=embedder)
        with monkeypatch.context() as patched:
            patched.setattr(
                openai.OpenAI,
                "__init__",
                lambda self, *a, **k: (built.append(self), real_init(self, *a, **k))[1],
            )
            memory = system.memory
        assert built == []
        assert isinstance(memory.llm, SiteDispatchLLM) and isinstance(
            memory.reranker.llm, SiteDispatchLLM
        )
        assert isinstance(memory.embedding_model, OptloopEmbedding)
        system.ingest(SESSIONS[:1])
        assert [m.text for m in system.all_memories()] == [S1_MEMORY]
        system.close()


def test_placeholder_clients_fail_loudly_if_left_unwired():
    from mem0.configs.embeddings.base import BaseEmbedderConfig
    from mem0.configs.llms.base import BaseLlmConfig

    with pytest.raises(OptloopError, match="did not wire"):
        UnwiredLLM(BaseLlmConfig()).generate_response([{"role": "user", "content": "hi"}])
    with pytest.raises(OptloopError, match="did not wire"):
        UnwiredEmbedding(BaseEmbedderConfig()).embed("hi")


# --- the real embedded LM ----------------------------------------------------------------

STOPWORDS = {
    "user",
    "users",
    "that",
    "this",
    "with",
    "from",
    "have",
    "their",
    "about",
    "into",
    "they",
    "were",
}


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4 and w not in STOPWORDS}


def check_pipeline(system: Mem0System, lm: OptloopLM) -> None:
    """Ingest both sessions, retrieve, answer; assert what a 135M model can honestly be held to."""
    system.ingest(SESSIONS)
    stored = system.all_memories()
    assert stored, "the embedded LM extracted no memory from two sessions"
    session_words = content_words(" ".join(t.content for s in SESSIONS for t in s.turns))
    for memory in stored:
        assert content_words(memory.text) & session_words, (
            f"memory unrelated to the sessions: {memory.text!r}"
        )
        assert memory.metadata["session_id"] in {"s1", "s2"}
    assert lm.accounting.totals("mem0.extract").calls == 2

    question = "What is the name of my dog?"
    retrieved = system.retrieve(question)
    assert retrieved and {m.id for m in retrieved} <= {m.id for m in stored}
    answer = system.answer(question, retrieved)
    assert isinstance(answer, str)
    assert lm.accounting.totals("answer").calls == 1


@pytest.mark.integration
def test_pipeline_on_the_embedded_lm_with_short_instructions(tmp_path, embedder):
    # What an optimized prompt looks like to the system: a rewritten site, mem0's own user
    # message and schema, decoded by the real model (seconds, unlike the full seed prompt).
    # Tight bounds keep the tiny model's rambling short (11 s on an idle machine, but decoding
    # slowed to 3 s a token under load); max_tokens fits two bounded items, so no retry grows it.
    lm = OptloopLM(
        LMSettings.from_spec("local", max_array_items=2, max_string_chars=64, max_tokens=320)
    )
    system = Mem0System(lm, tmp_path / "run", embedder=embedder)
    system.prompt_sites()["mem0.extract"].set_instructions(
        "Extract every fact about the user from the New Messages: one memory per fact, each "
        "a short sentence."
    )
    check_pipeline(system, lm)


@pytest.mark.integration
@pytest.mark.slow
def test_seed_prompt_pipeline_on_the_embedded_lm(tmp_path, embedder):
    # mem0's extraction prompt alone is ~8.5k SmolLM2 tokens (mem0's n_ctx, 12288, holds it;
    # SmolLM2's trained 8192 does not). The first call evaluates it (minutes on two shared cores);
    # the second reuses llama.cpp's cached prefix. Bounded lists and strings keep each answer
    # inside max_tokens.
    lm = OptloopLM(
        LMSettings.from_spec(
            "local",
            max_array_items=2,
            max_string_chars=64,
            max_tokens=320,
            n_ctx=Mem0System.local_decoding["n_ctx"],
        )
    )
    check_pipeline(Mem0System(lm, tmp_path / "run", embedder=embedder), lm)
