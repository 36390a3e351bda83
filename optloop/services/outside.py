"""Faults from outside optloop met in the middle of a run, turned into one line and an exit code.

:func:`classify` reads an exception (and the exceptions it was raised from) and names the
fault, or returns ``None`` for anything else (a bug, which keeps its traceback):

=========================================== ================================ =========
what the chain holds                        fault                            exit code
=========================================== ================================ =========
``OSError`` ENOSPC, EDQUOT, EFBIG;          a full disk (or a file size      74
SQLite "database or disk is full"           limit)
``OSError`` EROFS, EACCES, EPERM;           an unwritable store              74
SQLite "readonly database", "unable to
open database file"
``OSError`` EIO; SQLite "disk I/O error"    a write the device (or a file    74
                                            size limit) failed
an HTTP connection error, a timeout, or     the tracking server went away    75
a 5xx from the tracking server after
MLflow's (bounded) retries
=========================================== ================================ =========

Every checkpoint is written atomically (:func:`optloop.paths.write_atomic`), so such a fault leaves
the last complete checkpoint on disk: the same command resumes from it once space is freed, the
permission fixed or the server back (a trial under way when it struck is redone).
``optloop.cli.command.run_cli`` applies this to every command (:func:`error_for`); ``optloop.run``
first says which run it works on (:func:`describe_run`), so the line ends with what is saved and
the command that resumes it.
"""

from __future__ import annotations

import errno
import logging
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from optloop.errors import OptloopError, ServiceUnavailableError, StoreWriteError
from optloop.lm import redact_url
from optloop.services.preflight import TRACKING_FLAG, is_server, sqlite_path

FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
DENIED_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}
# Found in the text of an exception that wraps an OSError or SQLite error unchained (MLflow does).
FULL_CUES = ("database or disk is full", "[errno 28]", "[errno 27]", "[errno 122]")
DENIED_CUES = (
    "readonly database",
    "unable to open database file",
    "[errno 30]",
    "[errno 13]",
    "[errno 1]",
)
IO_CUES = ("disk i/o error", "[errno 5]")  # SQLite's word for EFBIG (a file size limit) and EIO


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or while handling (each once)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__, getattr(current, "orig", None)]


def _text(exc: BaseException) -> str:
    return " ".join(str(exc).split()).lower()


def disk_fault(exc: BaseException) -> tuple[str, str, str | None] | None:
    """``("full" | "denied" | "io", the reason, the file named)`` when ``exc`` comes from a full
    disk, a store that cannot be written, or a write the device failed; ``None`` otherwise."""
    for item in chain(exc):
        if isinstance(item, OSError) and item.errno is not None:
            kind = (
                "full"
                if item.errno in FULL_ERRNOS
                else "denied"
                if item.errno in DENIED_ERRNOS
                else "io"
                if item.errno == errno.EIO
                else None
            )
            if kind is not None:
                filename = item.filename if isinstance(item.filename, str) else None
                return kind, item.strerror or str(item), filename
    for item in chain(exc):
        text = _text(item)
        sqlite_like = (
            isinstance(item, sqlite3.Error)
            or "errno" in text
            or "sqlite" in text
            or "database" in text
        )
        for kind, cues in (("full", FULL_CUES), ("denied", DENIED_CUES), ("io", IO_CUES)):
            cue = next((c for c in cues if c in text), None)
            if cue is not None and (kind == "full" or sqlite_like):
                return kind, cue.strip("[]"), None
    return None


def tracking_lost(exc: BaseException, tracking_uri: str) -> str | None:
    """Why the tracking server at ``tracking_uri`` stopped answering, when ``exc`` says so (after
    MLflow's retries); ``None`` for any other error or a tracking store that is no server."""
    if not is_server(tracking_uri):
        return None
    import requests

    for item in chain(exc):
        if isinstance(item, requests.exceptions.Timeout):
            return "it did not answer in time"
        if isinstance(item, (requests.exceptions.ConnectionError, requests.exceptions.RetryError)):
            return (
                "connection refused or dropped"
                if "refused" in _text(item)
                else "it stopped answering"
            )
    for item in chain(exc):
        text = _text(item)
        if text.startswith("api request to") and (
            "failed with exception" in text
            or "failed with error code 5" in text
            or "failed with timeout" in text
        ):
            return "it stopped answering"
    return None


def _free(path: Path) -> str:
    """``"12 KB free"`` on the filesystem of ``path`` (its nearest existing folder)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free // 1024} KB free"
    except OSError:
        return "free space unknown"


def classify(
    exc: BaseException, *, tracking_uri: str, state: Path, saved: str
) -> OptloopError | None:
    """The one-line error for ``exc`` when it is an outside fault (module docstring), else
    ``None``. ``saved`` says where the run stands and how to resume it (appended to the line)."""
    if isinstance(exc, OptloopError) and exc.exit_code != 2:
        return None  # it says what it is already
    if (
        not isinstance(exc, OptloopError)
        and (reason := tracking_lost(exc, tracking_uri)) is not None
    ):
        return ServiceUnavailableError(
            "lost the MLflow tracking server at "
            f"{redact_url(tracking_uri)} ({reason}; "
            f"{TRACKING_FLAG}); {saved}"
        )
    found = disk_fault(exc)
    if found is None or (isinstance(exc, OptloopError) and found[0] == "denied"):
        return None  # bad input that met a permission (an unreadable checkpoint) stays bad input
    kind, reason, filename = found
    store = sqlite_path(tracking_uri)
    places = [Path(filename)] if filename else [p for p in (state, store) if p is not None]
    where = " or ".join(f"{p} ({_free(p)})" for p in places)
    if kind == "full":
        return StoreWriteError(
            f"no space left writing {where}: {reason}; free space there "
            "(OPTLOOP_HOME, "
            f"OPTLOOP_MLRUNS or {TRACKING_FLAG} set where it goes); {saved}"
        )
    if kind == "io":
        return StoreWriteError(
            f"a write failed in {where}: {reason} (a full disk, a file size "
            "limit or a failing "
            f"device); free space or check the device; {saved}"
        )
    return StoreWriteError(
        f"cannot write {where}: {reason}; make it writable, or set "
        "OPTLOOP_HOME / "
        f"{TRACKING_FLAG} to a writable place; {saved}"
    )


@contextmanager
def muted(*names: str) -> Iterator[None]:
    """The loggers ``names`` say nothing in the block (MLflow logs a traceback at ERROR for each
    write a full store refuses, then raises it: the raised error is reported once, by
    :func:`classify`)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@dataclass(frozen=True)
class RunPlace:
    """What a command tells :func:`error_for` about where it writes: the tracking URI (read when a
    fault strikes), the state directory, and ``saved()``: what of its work is saved and how to go
    on."""

    tracking_uri: Callable[[], str]
    state: Path
    saved: Callable[[], str]


_place: RunPlace | None = None


def describe_run(place: RunPlace | None) -> None:
    """Where this process's command writes (for :func:`error_for`); set once the command's input
    is valid, cleared (``None``) when the command ends."""
    global _place
    _place = place


def error_for(exc: BaseException) -> OptloopError | None:
    """:func:`classify` of ``exc`` with what the running command said of itself
    (:func:`describe_run`), or, when it said nothing, the default tracking store and state
    directory. ``optloop.cli.command.run_cli`` calls it for every exception a command raises."""
    from optloop.paths import state_dir
    from optloop.services import tracking

    place = _place or RunPlace(
        lambda: tracking.resolve_uri(create=False),
        state_dir(create=False),
        lambda: "rerun the same command once that is fixed",
    )
    try:
        uri, saved = place.tracking_uri(), place.saved()
    except Exception:
        uri, saved = (
            tracking.resolve_uri(create=False),
            "rerun the same command once that is fixed",
        )
    return classify(exc, tracking_uri=uri, state=place.state, saved=saved)


__all__ = [
    "RunPlace",
    "chain",
    "classify",
    "describe_run",
    "disk_fault",
    "error_for",
    "muted",
    "tracking_lost",
]
