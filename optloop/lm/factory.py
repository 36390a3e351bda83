"""Which backend a setting names: :func:`make_backend`.

Apart from :mod:`optloop.lm.backends` (the contract) so that the contract imports no implementation
and each implementation imports only the contract.
"""

from __future__ import annotations

from optloop.lm.backends import Backend
from optloop.lm.endpoint import OpenAICompatibleBackend
from optloop.lm.llama import LocalLlamaBackend
from optloop.lm.models import local_model_path
from optloop.lm.settings import LMSettings


def make_backend(settings: LMSettings) -> Backend:
    """The backend of ``settings``: llama.cpp in-process (``local``: the bundled model, a model of
    :data:`~optloop.lm.models.MODELS` by name, or a GGUF path) or an OpenAI-compatible endpoint."""
    if settings.backend == "local":
        return LocalLlamaBackend(
            local_model_path(settings.model),
            n_ctx=settings.n_ctx,
            n_threads=settings.n_threads,
            max_chars=settings.max_string_chars,
            max_items=settings.max_array_items,
        )
    return OpenAICompatibleBackend(settings)
