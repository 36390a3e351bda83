"""The backend contract: one attempt at a model. The engine caches, retries and accounts.

The implementations are ``local``, llama.cpp in-process (:mod:`optloop.lm.llama`), and ``openai``,
any OpenAI-compatible chat-completions endpoint (:mod:`optloop.lm.endpoint`);
:func:`optloop.lm.factory.make_backend` picks one. This module imports neither.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from optloop.errors import LMError
from optloop.lm.requests import MalformedResponse, Request


class Backend(ABC):
    """One way to reach a model. Backends make one attempt; the LM layer retries."""

    @property
    @abstractmethod
    def identity(self) -> str:
        """Stable name of the model for cache keys and records."""

    @abstractmethod
    def complete(self, request: Request) -> dict[str, Any]:
        """Return an OpenAI chat-completion dict, or raise."""

    def decoding(self, request: Request) -> str | None:
        """This backend's own settings that shape the answer to ``request`` (None: none do).

        They join the cache key, so an answer decoded under one setting is never served
        under another (e.g. a JSON answer bounded to 16 x 400 chars, asked for under 3 x 80).
        """
        return None

    def queued_s(self) -> float:
        """Seconds this thread's last :meth:`complete` waited for a machine-wide slot (local
        models)."""
        return 0.0

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, MalformedResponse)

    def is_timeout(self, exc: BaseException) -> bool:
        """Whether this failed attempt waited out the timeout (two in one call end it)."""
        return False

    def fault_label(self, exc: BaseException) -> str:
        """A short name for one failed attempt, as the graph and the records show it."""
        if isinstance(exc, MalformedResponse):
            return exc.label
        return type(exc).__name__

    def describe_failure(self, exc: BaseException) -> LMError:
        return LMError(f"LM call to {self.identity} failed: {type(exc).__name__}: {exc}")

    def is_rate_limited(self, exc: BaseException) -> bool:
        """Whether the endpoint refused this attempt for load (HTTP 429): retried apart from
        ``max_retries``."""
        return False

    def retry_after(self, exc: BaseException) -> float | None:
        """Seconds the endpoint asked us to wait before the next attempt (``Retry-After``), if it
        said."""
        return None

    def is_server_error(self, exc: BaseException) -> bool:
        """Whether the endpoint answered this attempt with a server error (HTTP 5xx)."""
        return False

    def request_error(self, exc: BaseException) -> str | None:
        """When this attempt failed on the request itself (a field the server refuses, a prompt
        longer than its context), what to change, in one line; such a call is never retried."""
        return None

    def where(self) -> str:
        """The endpoint as error messages name it (credentials masked)."""
        return self.identity
