"""Which backend a setting names: :func:`make_backend`.

Apart from :mod:`optloop.lm.backends` (the contract) so that the contract imports no implementation
and each implementation imports only the contract.
"""

from __future__ import annotations

from pathlib import Path

from optloop.lm.backends import Backend
from optloop.lm.endpoint import OpenAICompatibleBackend
from optloop.lm.llama import LocalLlamaBackend
from optloop.lm.settings import LMSettings, bundled_model_path


def make_backend(settings: LMSettings) -> Backend:
    """The backend of ``settings``: llama.cpp in-process (``local``) or an OpenAI-compatible
    endpoint."""
    if settings.backend == "local":
        path = Path(settings.model).expanduser() if settings.model else bundled_model_path()
        return LocalLlamaBackend(
            path,
            n_ctx=settings.n_ctx,
            n_threads=settings.n_threads,
            max_chars=settings.max_string_chars,
            max_items=settings.max_array_items,
        )
    return OpenAICompatibleBackend(settings)
