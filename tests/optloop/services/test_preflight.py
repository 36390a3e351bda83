"""Before a run writes anything: outside services probed once with a bounded timeout (exit 75),
stores checked writable (exit 74); a checkpoint write that fails leaves the old checkpoint and no
temporary file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from optloop.errors import ConfigError, ServiceUnavailableError, StoreWriteError
from optloop.services.preflight import (
    MLFLOW_HTTP_BOUNDS,
    bound_mlflow_http,
    check_tracking,
    check_writable,
    probe_database,
    probe_tracking_server,
    write_fault,
)
from optloop.testing.loopback import closed_port_url

REPO = Path(__file__).resolve().parents[3]


def test_mlflow_http_retries_are_bounded_unless_the_user_set_them(monkeypatch):
    for name in MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")
    applied = bound_mlflow_http()
    from mlflow.environment_variables import (
        MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR,
        MLFLOW_HTTP_REQUEST_MAX_RETRIES,
        MLFLOW_HTTP_REQUEST_TIMEOUT,
    )

    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in applied and MLFLOW_HTTP_REQUEST_TIMEOUT.get() == 99
    assert (
        MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 3
        and MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.get() == 1
    )


def health_server(status: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(status if self.path == "/health" else 404)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_tracking_server_with_nothing_listening_is_exit_75_at_once():
    uri = closed_port_url().removesuffix("/v1")
    started = time.monotonic()
    with pytest.raises(ServiceUnavailableError) as info:
        check_tracking(uri)
    assert time.monotonic() - started < 5 and info.value.exit_code == 75
    assert str(info.value) == (
        f"cannot reach the MLflow tracking server at {uri} (connection "
        "refused); start it, or "
        "point --tracking-uri (MLFLOW_TRACKING_URI) at one that is up; "
        "nothing was written"
    )


def test_a_tracking_server_answering_5xx_is_unavailable_and_one_answering_health_is_up():
    for status, fails in ((503, True), (200, False)):
        server = health_server(status)
        try:
            uri = f"http://127.0.0.1:{server.server_address[1]}"
            if fails:
                with pytest.raises(ServiceUnavailableError, match="answers HTTP 503"):
                    probe_tracking_server(uri)
            else:
                probe_tracking_server(uri)
        finally:
            server.shutdown()


def test_a_hanging_tracking_server_is_given_up_within_the_timeout():
    import socket

    with socket.socket() as listener:  # accepts the connection, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        started = time.monotonic()
        with pytest.raises(ServiceUnavailableError, match="timed out|stopped"):
            probe_tracking_server(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=1)
        assert time.monotonic() - started < 5


def test_an_unreachable_postgresql_storage_is_exit_75_and_bad_credentials_exit_2(monkeypatch):
    port = closed_port_url().split(":")[2].split("/")[0]
    url = f"postgresql://optloop:secret@127.0.0.1:{port}/optloop"
    with pytest.raises(ServiceUnavailableError) as info:
        probe_database(url, "--storage")
    assert info.value.exit_code == 75 and "secret" not in str(info.value)
    assert str(info.value).startswith(
        "cannot reach the database at "
        f"postgresql://optloop:***@127.0.0.1:{port}/optloop "
        "(connection refused)"
    )
    import sqlalchemy

    class Refused:
        def connect(self):
            raise sqlalchemy.exc.OperationalError(
                "connect", {}, Exception("FATAL: password authentication failed")
            )

        def dispose(self):
            pass

    monkeypatch.setattr(sqlalchemy, "create_engine", lambda *a, **k: Refused())
    with pytest.raises(ConfigError, match="authentication failed"):
        probe_database(url, "--storage")


def test_write_fault_looks_at_the_nearest_existing_folder_and_changes_nothing(tmp_path):
    assert write_fault(tmp_path / "a" / "b" / "mlflow.db") is None
    assert not (tmp_path / "a").exists() and list(tmp_path.iterdir()) == []


def deny(path: Path):
    """``path`` refuses writes even to root (chattr +i); skipped where that cannot be done."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make {path} immutable here: {done.stderr.strip()}")
    else:
        path.chmod(0o555 if path.is_dir() else 0o444)


def allow(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    else:
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_an_unwritable_store_folder_or_file_is_exit_74_naming_it(tmp_path):
    mlruns = tmp_path / "mlruns"
    mlruns.mkdir()
    deny(mlruns)
    try:
        with pytest.raises(StoreWriteError) as info:
            check_tracking(f"sqlite:///{mlruns / 'mlflow.db'}")
    finally:
        allow(mlruns)
    assert info.value.exit_code == 74
    assert str(info.value).startswith(f"cannot write the MLflow store's folder at {mlruns} (")
    db = mlruns / "mlflow.db"
    db.write_bytes(b"")
    deny(db)
    try:
        with pytest.raises(StoreWriteError, match=f"cannot write the MLflow store at {db}"):
            check_tracking(f"sqlite:///{db}")
    finally:
        allow(db)
    check_writable(db, "x", "y")  # writable again


def test_a_checkpoint_write_that_fails_leaves_the_old_one_and_no_temporary_file(tmp_path):
    """A file size limit (RLIMIT_FSIZE) fails the write as a full disk would (EFBIG; ENOSPC on a
    tmpfs)."""
    path = tmp_path / "checkpoint.json"
    path.write_text('{"old": true}')
    code = (
        "import resource, sys; from pathlib import Path\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "from optloop.paths import write_atomic\n"
        "write_atomic(Path(sys.argv[1]), 'x' * 100000)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode != 0 and "File too large" in done.stderr, done.stderr[-1000:]
    assert path.read_text() == '{"old": true}' and sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.json"
    ]
