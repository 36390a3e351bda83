"""Embeddings: the bundled MiniLM (real model, offline) and an OpenAI-compatible endpoint over
loopback."""

from __future__ import annotations

import numpy as np
import pytest

from optloop.embed import LocalEmbedder, OpenAIEmbedder, get_embedder
from optloop.errors import ConfigError, LMUnreachableError
from optloop.testing.loopback import closed_port_url
from optloop.testing.scripted import ScriptedOpenAIServer


def test_default_embedder_is_the_bundled_minilm():
    embedder = get_embedder()
    assert isinstance(embedder, LocalEmbedder) and embedder.dim == 384


def test_local_embeddings_are_normalized_and_meaningful():
    vectors = LocalEmbedder().embed(
        ["I live in Lisbon.", "My home is in Lisbon.", "Quarterly revenue grew."]
    )
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3


def test_batching_does_not_change_the_vectors():
    texts = [f"sentence number {i} about topic {i % 7}" for i in range(70)]
    whole = LocalEmbedder(batch_size=64).embed(texts)
    small = LocalEmbedder(batch_size=8).embed(texts)
    assert whole.shape == (70, 384) and np.allclose(whole, small, atol=1e-5)
    assert LocalEmbedder().embed([]).shape == (0, 384)


def test_remote_embeddings_are_batched_and_normalized():
    with ScriptedOpenAIServer([("embed", 4)]) as server:
        embedder = OpenAIEmbedder("emb-model", base_url=server.base_url, batch_size=2)
        vectors = embedder.embed(["a", "b", "c"])
    assert vectors.shape == (3, 4) and [len(r["body"]["input"]) for r in server.requests] == [2, 1]
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)


def test_unreachable_embedding_endpoint_names_the_url():
    url = closed_port_url()
    with pytest.raises(LMUnreachableError, match=url.replace(".", r"\.")):
        OpenAIEmbedder("m", base_url=url, max_retries=0).embed(["x"])


def test_unknown_embedder_spec():
    with pytest.raises(ConfigError, match="unknown embedder spec"):
        get_embedder("word2vec")


class _Counting(LocalEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.arange(len(texts) * 384, dtype=np.float32).reshape(len(texts), 384) + sum(
            map(len, texts)
        )


def test_query_cache_embeds_a_single_text_once_and_passes_batches_through():
    from concurrent.futures import ThreadPoolExecutor

    from optloop.embed import CachedEmbedder

    inner = _Counting()
    cache = CachedEmbedder(inner, max_texts=2, batches=False)
    assert (cache.name, cache.dim) == (inner.name, inner.dim) and CachedEmbedder.around(
        cache
    ) is cache
    first = cache.embed(["where does Clara live?"])
    first[0, 0] = 99.0  # the caller's own copy: the cache is not changed through it
    with ThreadPoolExecutor(4) as pool:
        again = list(pool.map(lambda _: cache.embed(["where does Clara live?"]), range(8)))
    assert inner.calls.count(["where does Clara live?"]) == 1  # computed once, eight times served
    expected = inner.embed(["where does Clara live?"])
    assert all(np.array_equal(a, expected) for a in again)
    assert cache.hits == 8
    batch = cache.embed(
        ["a", "where does Clara live?"]
    )  # several texts: exactly the inner embedder's call
    assert np.array_equal(batch, inner.embed(["a", "where does Clara live?"]))
    cache.embed(["b"]), cache.embed(["c"])  # max_texts 2: the question is forgotten
    calls = len(inner.calls)
    cache.embed(["where does Clara live?"])
    assert len(inner.calls) == calls + 1
