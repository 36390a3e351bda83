"""A failed LM call is never a measured answer: when figures stop, and how the rest carry their
failures.

An LM call that fails after its retries (a request the server refuses, a prompt longer than its
context, a server that keeps failing) leaves its question without a real answer: scored, it would
count as a wrong one, and an accuracy made of such questions measures the endpoint, not the memory.
Memory libraries also swallow some of their own LLM failures (a failed extraction stores nothing),
so the count that matters is the failed *calls*, not the questions that raised.

Threshold: a figure (an evaluation of ``optloop.run``, the report of ``optloop.attribute``, a
benchmark's evaluation) whose failed calls are more than :data:`ALLOWED_SHARE` (5 %) of its LM
calls is not reported: :func:`check` raises :class:`~optloop.errors.CallsFailedError` (exit code 4)
with the first failure's message, which says what to change. At or under it the figure is reported
with the count beside it (:func:`mark`), in the table and in MLflow (``lm_failed_calls``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from optloop.errors import CallsFailedError

ALLOWED_SHARE = 0.05
"""The share of an evaluation's LM calls that may fail (after retries) before its figures are
withheld."""


def too_many(failed: int, calls: int, allowed: float = ALLOWED_SHARE) -> bool:
    """Whether ``failed`` of ``calls`` LM calls is past the ``allowed`` share."""
    return failed > allowed * max(calls, failed, 1)


def first_error(records: Iterable[Any]) -> str | None:
    """The message of the first failed call among ``records`` (:class:`~optloop.lm.CallRecord`)."""
    return next((r.error for r in records if getattr(r, "error", None)), None)


def check(
    failed: int, calls: int, *, what: str, first: str | None, allowed: float = ALLOWED_SHARE
) -> None:
    """Raise :class:`CallsFailedError` when ``failed`` of ``calls`` is past the ``allowed`` share;
    ``what`` names the figure (``the dev evaluation of candidate baseline``), ``first`` is the
    first failure's message."""
    if not too_many(failed, calls, allowed):
        return
    cause = f"; the first: {first}" if first else ""
    raise CallsFailedError(
        f"{failed} of {calls} LM calls failed after their retries in {what}, more than "
        f"{allowed:.0%}: its figures would score failed calls as wrong answers, so none is "
        f"reported{cause}"
    )


def mark(text: str, failed: int) -> str:
    """``text`` with the count of failed calls beside it when there were any:
    ``0.650 [...] n=20 (1 failed call)``."""
    if not failed:
        return text
    return f"{text} ({failed} failed call{'s' if failed != 1 else ''})"
