"""optloop.product.apply: registry prompts (real MLflow store) into a live vanilla mem0 Memory or
Graphiti.

What is checked is what the library then sends, at a loopback OpenAI-compatible server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from optloop.errors import ConfigError
from optloop.product import apply, registry_uri, response_format, site_of
from optloop.testing.scripted import ScriptedOpenAIServer
from signatures.graphiti import library_system_prompt
from signatures.mem0 import (
    ADDITIVE_EXTRACTION_PROMPT,  # first: points MEM0_DIR into optloop's state
)
from tests.optloop._export_store import EDGE_SITE, store, template  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def _no_openrouter(monkeypatch):
    monkeypatch.delenv(
        "OPENROUTER_API_KEY", raising=False
    )  # mem0's OpenAI client would switch to it


def test_registry_references_in_every_accepted_spelling():
    assert registry_uri("optloop.mem0.extract@champion") == (
        "prompts:/optloop.mem0.extract@champion",
        "champion",
    )
    assert (
        registry_uri("prompts:/optloop.mem0.extract@champion")[0]
        == "prompts:/optloop.mem0.extract@champion"
    )
    assert registry_uri("optloop.mem0.extract/3") == ("prompts:/optloop.mem0.extract/3", None)
    assert (
        registry_uri(" prompts:/optloop.mem0.extract/3 ")[0] == "prompts:/optloop.mem0.extract/3"
    )
    for bad in ("optloop.mem0.extract", "a@b@c", "x/y", "prompts:/", "a b@c"):
        with pytest.raises(ConfigError, match="NAME@ALIAS or NAME/VERSION"):
            registry_uri(bad)


def test_site_comes_from_tags_else_from_the_name():
    assert site_of("whatever", {"site": "mem0.extract", "system": "mem0"}) == (
        "mem0",
        "mem0.extract",
    )
    assert site_of("optloop.mem0.extract", {}) == ("mem0", "mem0.extract")
    assert site_of("optloop.mem0.answer", {}) == ("mem0", "answer")
    assert site_of("optloop.graphiti.extract_edges.edge", {}) == ("graphiti", EDGE_SITE)
    assert site_of("optloop.md_flat.retrieve.query", {}) == ("md_flat", "retrieve.query")


class _HashEmbedding:
    """A deterministic 8-dim embedder for mem0 (the product's own choice of embedder)."""

    def __new__(cls):
        from mem0.configs.embeddings.base import BaseEmbedderConfig
        from mem0.embeddings.base import EmbeddingBase

        class HashEmbedding(EmbeddingBase):
            def __init__(self):
                super().__init__(BaseEmbedderConfig(embedding_dims=8))

            def embed(self, text, memory_action=None):
                return [b / 255 for b in hashlib.sha256(text.encode()).digest()[:8]]

            def embed_batch(self, texts, memory_action="add"):
                return [self.embed(t) for t in texts]

        return HashEmbedding()


def vanilla_memory(root, base_url):
    from mem0 import Memory
    from mem0.configs.base import MemoryConfig

    llm = {
        "provider": "openai",
        "config": {"model": "gpt-test", "api_key": "k", "openai_base_url": base_url},
    }
    memory = Memory(
        MemoryConfig(
            vector_store={
                "provider": "qdrant",
                "config": {
                    "collection_name": "m",
                    "embedding_model_dims": 8,
                    "path": str(root / "qdrant"),
                    "on_disk": True,
                },
            },
            llm=llm,
            embedder={
                "provider": "openai",
                "config": {"api_key": "k", "openai_base_url": base_url, "embedding_dims": 8},
            },
            history_db_path=str(root / "history.db"),
            reranker={"provider": "llm_reranker", "config": {"llm": llm}},
        )
    )
    memory.embedding_model = _HashEmbedding()
    return memory


EXTRACTION = json.dumps(
    {"memory": [{"id": "0", "text": "User adopted a beagle named Max", "attributed_to": "user"}]}
)


def chats(server):
    return [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]


def test_registry_prompt_applied_to_a_live_mem0_memory(store, tmp_path):
    with ScriptedOpenAIServer([("ok", EXTRACTION)]) as server:
        memory = vanilla_memory(tmp_path, server.base_url)
        assert apply(memory, "prompts:/optloop.mem0.extract@champion") == ["mem0.extract"]
        memory.add([{"role": "user", "content": "I adopted a beagle named Max."}], user_id="u")
        stored = memory.get_all(filters={"user_id": "u"})["results"]
        memory.close()
    [sent] = chats(server)
    assert sent["messages"][0] == {
        "role": "system",
        "content": store.texts["mem0"]["mem0.extract"],
    }
    assert sent["messages"][0]["content"] != ADDITIVE_EXTRACTION_PROMPT
    assert sent["response_format"] == response_format("mem0.extract")
    assert [m["memory"] for m in stored] == ["User adopted a beagle named Max"]


def test_sources_combine_and_later_ones_win(store, tmp_path):
    exported = tmp_path / "prompts.json"
    exported.write_text(json.dumps({"mem0.extract": "From the JSON export.", "answer": "Answer."}))
    with ScriptedOpenAIServer([("ok", EXTRACTION)]) as server:
        memory = vanilla_memory(tmp_path, server.base_url)
        applied = apply(
            memory,
            ["optloop.mem0.extract/1", "optloop.mem0.answer@champion"],
            {"mem0.rerank": "Score it."},
            str(exported),
        )
        memory.add([{"role": "user", "content": "Hello."}], user_id="u")
        memory.close()
    assert applied == ["mem0.extract", "mem0.rerank"]  # answer is optloop's own step: skipped
    assert chats(server)[0]["messages"][0]["content"] == "From the JSON export."
    assert (
        memory.reranker.llm._exported_prompt_routes[memory.reranker._SYSTEM_PROMPT][0]
        == "Score it."
    )


def test_registry_prompt_applied_to_a_live_graphiti_reaches_its_llm_calls(store, tmp_path):
    from graphiti_core import Graphiti
    from graphiti_core.driver.kuzu_driver import KuzuDriver
    from graphiti_core.llm_client import client as graphiti_llm_client
    from graphiti_core.llm_client.config import LLMConfig
    from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient
    from graphiti_core.prompts.prompt_helpers import DO_NOT_ESCAPE_UNICODE

    from optloop.embed import get_embedder
    from systems.graphiti_system import LocalCrossEncoderClient, LocalEmbedderClient

    class Probe(dict):  # every key the builder reads exists
        def __missing__(self, key):
            return []

    with ScriptedOpenAIServer([("ok", json.dumps({"edges": []}))]) as server:
        driver = KuzuDriver(db=str(tmp_path / "g.kuzu"))
        embedder = get_embedder()
        graphiti = Graphiti(
            graph_driver=driver,
            embedder=LocalEmbedderClient(embedder),
            cross_encoder=LocalCrossEncoderClient(embedder),
            llm_client=OpenAIGenericClient(
                LLMConfig(api_key="k", base_url=server.base_url, model="m")
            ),
        )
        assert apply(graphiti, "optloop.graphiti.extract_edges.edge@champion") == [EDGE_SITE]
        asyncio.run(graphiti.clients.complete_prompt("extract_edges.edge", Probe(), group_id="g"))
        driver.client.close()
        driver.db.close()
    [sent] = chats(server)
    framing = DO_NOT_ESCAPE_UNICODE + graphiti_llm_client.get_extraction_language_instruction("g")
    assert sent["messages"][0]["content"] == store.texts["graphiti"][EDGE_SITE] + framing
    assert not sent["messages"][0]["content"].startswith(
        library_system_prompt("extract_edges.edge") + framing
    )
    assert graphiti.prompt_library is graphiti.clients.prompt_library


def test_apply_refuses_what_does_not_fit(store, tmp_path):
    memory = vanilla_memory(tmp_path, "http://127.0.0.1:9/v1")
    cases = [
        ((memory, "optloop.graphiti.extract_edges.edge@champion"), "are not mem0 prompts"),
        (
            (memory, "optloop.mem0.answer@champion"),
            "none of the prompts (answer) is a mem0 prompt",
        ),
        ((memory, {"mem0.update": "x"}), "mem0 has no such prompt"),
        ((memory, "optloop.mem0.extract@nope"), "alias nope not found"),
        ((memory, str(tmp_path / "missing.json")), "no such file"),
        ((memory,), "needs a prompt source"),
        ((object(), {"mem0.extract": "x"}), "takes a live mem0.Memory or graphiti_core.Graphiti"),
    ]
    for args, message in cases:
        with pytest.raises(ConfigError) as raised:
            apply(*args)
        assert message in str(raised.value), (args, str(raised.value))
    memory.close()
    assert not hasattr(memory.llm, "_exported_prompt_routes")  # nothing was applied
