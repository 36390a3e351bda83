"""Before a run writes anything: the outside services it needs answer, its stores are writable.

``optloop.run`` calls :func:`check_run` once its input is valid and the LM endpoint answered
(``probe_lm``), and before the first file of the run is written:

- the MLflow tracking URI: a server (``http(s)://``) is asked for ``/health`` once, with a
  bounded timeout; a database URI (``postgresql://`` ...) is connected to once; the embedded
  SQLite store's directory and file must be writable;
- the Optuna storage (``--storage``): a database URL is connected to once;
- optloop's state directory (``OPTLOOP_HOME``) must be writable.

An unreachable service is a :class:`~optloop.errors.ServiceUnavailableError` (exit 75), a store
that cannot be written a :class:`~optloop.errors.StoreWriteError` (exit 74): one line naming the
URL or path and the flag that sets it, and nothing written.

:func:`bound_mlflow_http` caps MLflow's own HTTP retries (by default 7 retries with a backoff
that makes about 4 minutes a call), so a tracking server lost mid-run stops the run within
seconds (see :mod:`optloop.services.outside`). Each value is a default: a variable the user set
wins.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

from optloop.errors import ConfigError, ServiceUnavailableError, StoreWriteError
from optloop.lm import redact_url

PROBE_TIMEOUT_S = 5.0

# MLflow's HTTP client settings (mlflow.environment_variables): 3 retries 1, 2 and 4 s apart, 10 s
# a try.
MLFLOW_HTTP_BOUNDS: dict[str, str] = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}

TRACKING_FLAG = "--tracking-uri (MLFLOW_TRACKING_URI)"


def bound_mlflow_http() -> dict[str, str]:
    """Set each of :data:`MLFLOW_HTTP_BOUNDS` the user did not set; return what was set."""
    applied = {}
    for name, value in MLFLOW_HTTP_BOUNDS.items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    return applied


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URI (``None`` for any other URI or an in-memory
    database)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///")
    return Path(path) if path and path != ":memory:" else None


def is_server(uri: str) -> bool:
    """Whether ``uri`` names a tracking server spoken to over HTTP."""
    return uri.split("://", 1)[0] in ("http", "https")


# --- services -------------------------------------------------------------------------------


def probe_tracking_server(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """One ``GET /health`` to the tracking server at ``uri``; :class:`ServiceUnavailableError` when
    it does not answer within ``timeout`` seconds or answers with a server error."""
    import requests

    where = redact_url(uri)
    try:
        response = requests.get(f"{uri.rstrip('/')}/health", timeout=timeout)
    except requests.exceptions.RequestException as exc:
        raise ServiceUnavailableError(
            f"cannot reach the MLflow tracking server at {where} ({_reason(exc)}); start it, or "
            "point "
            f"{TRACKING_FLAG} at one that is up; nothing was written"
        ) from None
    if response.status_code >= 500:
        raise ServiceUnavailableError(
            f"the MLflow tracking server at {where} answers HTTP {response.status_code}; rerun "
            "once it is up, or "
            f"point {TRACKING_FLAG} elsewhere; nothing was written"
        )


def storage_url(url: str) -> str:
    """``url`` naming a PostgreSQL driver that is installed.

    To SQLAlchemy 2.1 a bare ``postgresql://`` means psycopg 3; with only psycopg2-binary
    installed the URL is pointed at it (``postgres://`` is accepted too). Other URLs pass as they
    are.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        return url
    for module in ("psycopg", "psycopg2"):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{module}://{rest}"
    raise ConfigError(
        f"--storage {redact_url(url)}: no PostgreSQL driver is installed; pip install "
        "psycopg2-binary"
    )


def probe_database(url: str, flag: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """One connection to the database at ``url`` (``flag``: the option that set it). Unreachable:
    :class:`ServiceUnavailableError`; refused credentials or a missing database:
    :class:`ConfigError`."""
    import sqlalchemy

    where = redact_url(url)
    try:
        engine = sqlalchemy.create_engine(
            storage_url(url), connect_args={"connect_timeout": int(timeout)}
        )
    except ImportError as exc:
        raise ConfigError(
            f"{flag} {where}: its driver is missing ({exc}); for postgresql:// "
            "install "
            "psycopg2-binary"
        ) from None
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as exc:
        reason = _reason(exc)
        if any(
            cue in reason
            for cue in ("authentication failed", "does not exist", "no password supplied")
        ):
            raise ConfigError(
                f"{flag} {where}: {reason}; fix the URL's user, password or database"
            ) from None
        raise ServiceUnavailableError(
            f"cannot reach the database at {where} ({reason}); start "
            f"it, or fix {flag}; "
            "nothing was written"
        ) from None
    finally:
        engine.dispose()


def _reason(exc: BaseException) -> str:
    """The useful part of a connection error, on one short line."""
    inner = getattr(exc, "orig", None) or exc
    text = " ".join(str(inner).split())
    for cue in (
        "Connection refused",
        "timed out",
        "Name or service not known",
        "No route to host",
        "Connection reset",
    ):
        if cue.lower() in text.lower():
            return cue.lower() if cue != "Connection refused" else "connection refused"
    return text[:160] or type(inner).__name__


# --- stores ---------------------------------------------------------------------------------


def write_fault(path: Path) -> OSError | None:
    """The ``OSError`` a write at ``path`` (a file or directory, existing or to be created) meets
    now, found without changing anything: an existing file is opened for writing, a directory (the
    nearest existing one) gets an unnamed temporary file."""
    try:
        if path.is_file():
            os.close(os.open(path, os.O_RDWR))
            path = path.parent
        while not path.exists():
            path = path.parent
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return exc
    return None


def check_writable(path: Path, what: str, fix: str) -> None:
    """:class:`StoreWriteError` (exit 74) naming ``path`` when it cannot be written."""
    fault = write_fault(path)
    if fault is not None:
        raise StoreWriteError(
            f"cannot write {what} at {path} ({fault.strerror or fault}): {fix}; "
            "nothing was "
            "written"
        )


def check_tracking(uri: str) -> None:
    """The tracking URI answers (a server, a database) or can be written (the SQLite store)."""
    if is_server(uri):
        probe_tracking_server(uri)
        return
    db = sqlite_path(uri)
    if db is not None:
        fix = (
            f"make it writable, or point {TRACKING_FLAG} (or OPTLOOP_MLRUNS) at a writable folder"
        )
        check_writable(db.parent, "the MLflow store's folder", fix)
        if db.exists():
            check_writable(db, "the MLflow store", fix)
        return
    if uri.split("://", 1)[0].split("+", 1)[0] in ("postgresql", "postgres", "mysql", "mssql"):
        probe_database(uri, TRACKING_FLAG)


def check_run(tracking_uri: str, storage: str | None, state: Path, run_dir: Path) -> None:
    """Everything :mod:`this module <optloop.services.preflight>`'s docstring lists, for one run;
    reads
    only."""
    bound_mlflow_http()
    check_writable(
        state,
        "optloop's state directory (OPTLOOP_HOME)",
        "make it writable, or set OPTLOOP_HOME to a writable folder",
    )
    checkpoint = run_dir / "checkpoint.json"
    if checkpoint.exists():
        check_writable(checkpoint, f"run {run_dir.name}'s checkpoint", "make it writable")
    check_tracking(tracking_uri)
    if storage and sqlite_path(storage) is None and not storage.startswith("sqlite"):
        probe_database(storage, "--storage")


__all__ = [
    "MLFLOW_HTTP_BOUNDS",
    "PROBE_TIMEOUT_S",
    "bound_mlflow_http",
    "check_run",
    "check_tracking",
    "check_writable",
    "is_server",
    "probe_database",
    "probe_tracking_server",
    "sqlite_path",
    "write_fault",
]
