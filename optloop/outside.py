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

Every checkpoint is written atomically (:func:`optloop.paths.write_atomic`), so such a fault
leaves the last complete checkpoint on disk: the same command resumes from it once space is
freed, the permission fixed or the server back (a trial under way when it struck is redone).
``optloop.cli.run_cli`` applies this to every command (:func:`error_for`); ``optloop.run`` first says
which run it works on (:func:`describe_run`), so the line ends with what is saved and the command
that resumes it.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from optloop.errors import OptloopError, ServiceUnavailableError, StoreWriteError
from optloop.lm import redact_url
from optloop.preflight import TRACKING_FLAG, is_server, sqlite_path

FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
DENIED_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}
# In the text of an exception that wraps the OSError or SQLite error without chaining it (MLflow does).
FULL_CUES = ("database or disk is full", "[errno 28]", "[errno 27]", "[errno 122]")
DENIED_CUES = ("readonly database", "unable to open database file", "[errno 30]", "[errno 13]", "[errno 1]")
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


def disk_fault(exc: BaseException) -> tuple[str, OSError | BaseException] | None:
    """``("full" | "denied" | "io", the exception that says so)`` when ``exc`` comes from a full disk, a
    store that cannot be written, or a write the device failed; ``None`` otherwise."""
    for item in chain(exc):
        if isinstance(item, OSError) and item.errno in FULL_ERRNOS:
            return "full", item
        if isinstance(item, OSError) and item.errno in DENIED_ERRNOS:
            return "denied", item
        if isinstance(item, OSError) and item.errno == errno.EIO:
            return "io", item
    for item in chain(exc):
        text = _text(item)
        if any(cue in text for cue in FULL_CUES):
            return "full", item
        if any(cue in text for cue in DENIED_CUES) and (isinstance(item, sqlite3.Error) or "errno" in text
                                                        or "sqlite" in text or "database" in text):
            return "denied", item
        if any(cue in text for cue in IO_CUES):
            return "io", item
    return None


def tracking_lost(exc: BaseException, tracking_uri: str) -> str | None:
    """Why the tracking server at ``tracking_uri`` stopped answering, when ``exc`` says so (after MLflow's
    retries); ``None`` for any other error or a tracking store that is no server."""
    if not is_server(tracking_uri):
        return None
    import requests

    for item in chain(exc):
        if isinstance(item, requests.exceptions.Timeout):
            return "it did not answer in time"
        if isinstance(item, (requests.exceptions.ConnectionError, requests.exceptions.RetryError)):
            return "connection refused or dropped" if "refused" in _text(item) else "it stopped answering"
    for item in chain(exc):
        text = _text(item)
        if text.startswith("api request to") and ("failed with exception" in text or "failed with error code 5"
                                                  in text or "failed with timeout" in text):
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


def classify(exc: BaseException, *, tracking_uri: str, state: Path, saved: str) -> OptloopError | None:
    """The one-line error for ``exc`` when it is an outside fault (module docstring), else ``None``.
    ``saved`` says where the run stands and how to resume it (appended to the line)."""
    if isinstance(exc, OptloopError):
        return None
    if (reason := tracking_lost(exc, tracking_uri)) is not None:
        return ServiceUnavailableError(f"lost the MLflow tracking server at {redact_url(tracking_uri)} ({reason}; "
                                       f"{TRACKING_FLAG}); {saved}")
    found = disk_fault(exc)
    if found is None:
        return None
    kind, cause = found
    filename = getattr(cause, "filename", None)
    store = sqlite_path(tracking_uri)
    places = [Path(filename)] if filename else [p for p in (state, store) if p is not None]
    where = " or ".join(f"{p} ({_free(p)})" for p in places)
    reason = getattr(cause, "strerror", None) or " ".join(str(cause).split())[:120]
    if kind == "full":
        return StoreWriteError(f"no space left writing {where}: {reason}; free space there (OPTLOOP_HOME, "
                               f"OPTLOOP_MLRUNS or {TRACKING_FLAG} set where it goes); {saved}")
    if kind == "io":
        return StoreWriteError(f"a write failed in {where}: {reason} (a full disk, a file size limit or a failing "
                               f"device); free space or check the device; {saved}")
    return StoreWriteError(f"cannot write {where}: {reason}; make it writable, or set OPTLOOP_HOME / "
                           f"{TRACKING_FLAG} to a writable place; {saved}")


@dataclass(frozen=True)
class RunPlace:
    """What a command tells :func:`error_for` about where it writes: the tracking URI (read when a fault
    strikes), the state directory, and ``saved()``: what of its work is saved and how to go on."""

    tracking_uri: Callable[[], str]
    state: Path
    saved: Callable[[], str]


_place: RunPlace | None = None


def describe_run(place: RunPlace) -> None:
    """Where this process's command writes (for :func:`error_for`); set once the command's input is valid."""
    global _place
    _place = place


def error_for(exc: BaseException) -> OptloopError | None:
    """:func:`classify` of ``exc`` with what the running command said of itself (:func:`describe_run`), or,
    when it said nothing, the default tracking store and state directory. ``optloop.cli.run_cli`` calls it
    for every exception a command raises."""
    from optloop import tracking
    from optloop.paths import state_dir

    place = _place or RunPlace(lambda: tracking.resolve_uri(create=False), state_dir(create=False),
                               lambda: "rerun the same command once that is fixed")
    try:
        uri, saved = place.tracking_uri(), place.saved()
    except Exception:  # noqa: BLE001 - the fault itself may keep the run's state from being read
        uri, saved = tracking.resolve_uri(create=False), "rerun the same command once that is fixed"
    return classify(exc, tracking_uri=uri, state=place.state, saved=saved)


def saved_line(checkpoint: Path, run_name: str, budget: int, again: str) -> str:
    """Where a run a fault stopped stands (from its checkpoint on disk) and the command that goes on."""
    from optloop.loop.state import Checkpoint

    if not checkpoint.exists():
        return f"run {run_name} had saved nothing yet; once that is fixed, rerun the same command: {again}"
    progress = Checkpoint.load(checkpoint).progress(budget)
    return f"run {run_name} is saved ({progress}); once that is fixed, rerun the same command to resume it: {again}"


__all__ = ["RunPlace", "chain", "classify", "describe_run", "disk_fault", "error_for", "saved_line",
           "tracking_lost"]
