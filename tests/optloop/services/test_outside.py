"""Faults from outside optloop turned into one line and an exit code: a full disk or an unwritable
store (74), a tracking server gone (75); anything else keeps its traceback."""

from __future__ import annotations

import errno
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optloop.errors import ServiceUnavailableError, StoreWriteError
from optloop.services.outside import classify, disk_fault, tracking_lost
from optloop.testing.loopback import closed_port_url

SQLITE = "sqlite:////tmp/nowhere/mlflow.db"


def raised(make):
    """The exception ``make()`` raises (so __context__ is set as in real code)."""
    try:
        make()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


def test_a_full_disk_is_exit_74_naming_the_file_and_its_free_space(tmp_path):
    full = OSError(
        errno.ENOSPC,
        "No space left on device",
        str(tmp_path / "runs" / "r" / "checkpoint.json.tmp"),
    )
    error = classify(full, tracking_uri=SQLITE, state=tmp_path, saved="run r is saved")
    assert isinstance(error, StoreWriteError) and error.exit_code == 74
    text = str(error)
    assert text.startswith(f"no space left writing {tmp_path}/runs/r/checkpoint.json.tmp (")
    assert (
        "KB free" in text and "No space left on device" in text and text.endswith("run r is saved")
    )


def test_sqlite_full_or_read_only_inside_mlflow_is_exit_74_naming_the_store(tmp_path):
    import sqlalchemy
    from mlflow.exceptions import MlflowException

    db = tmp_path / "mlruns" / "mlflow.db"

    def wrapped(message: str):
        def make():
            try:
                raise sqlalchemy.exc.OperationalError(
                    "INSERT ...", {}, sqlite3.OperationalError(message)
                )
            except sqlalchemy.exc.OperationalError as exc:
                raise MlflowException(f"(sqlite3.OperationalError) {message}") from exc

        return raised(make)

    full = classify(
        wrapped("database or disk is full"),
        tracking_uri=f"sqlite:///{db}",
        state=tmp_path,
        saved="s",
    )
    assert isinstance(full, StoreWriteError) and str(full).startswith("no space left writing ")
    assert str(db) in str(full) and str(tmp_path) in str(full)
    denied = classify(
        wrapped("attempt to write a readonly database"),
        tracking_uri=f"sqlite:///{db}",
        state=tmp_path,
        saved="s",
    )
    assert isinstance(denied, StoreWriteError) and str(denied).startswith("cannot write ")
    assert "make it writable" in str(denied)


def test_a_permission_error_is_exit_74_and_other_errors_are_not_faults(tmp_path):
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / ".mlflow.db.lock"))
    assert disk_fault(denied) is not None
    error = classify(denied, tracking_uri=SQLITE, state=tmp_path, saved="s")
    assert isinstance(error, StoreWriteError) and ".mlflow.db.lock" in str(error)
    for other in (ValueError("bad"), KeyError("x"), FileNotFoundError(errno.ENOENT, "gone", "x")):
        assert classify(other, tracking_uri=SQLITE, state=tmp_path, saved="s") is None


def test_a_lost_tracking_server_is_exit_75_only_for_a_server_uri(tmp_path):
    import requests
    from mlflow.exceptions import MlflowException

    def make():
        try:
            raise requests.exceptions.ConnectionError(
                "Max retries exceeded ... Connection refused"
            )
        except requests.exceptions.ConnectionError as e:  # how mlflow.utils.rest_utils wraps it
            raise MlflowException(  # noqa: B904
                f"API request to http://h/api failed with exception {e}"
            )

    exc = raised(make)
    assert tracking_lost(exc, SQLITE) is None
    error = classify(
        exc, tracking_uri="http://user:pw@127.0.0.1:5000", state=tmp_path, saved="run r is saved"
    )
    assert isinstance(error, ServiceUnavailableError) and error.exit_code == 75
    assert str(error).startswith(
        "lost the MLflow tracking server at http://user:***@127.0.0.1:5000 "
    )
    assert "--tracking-uri" in str(error) and "pw" not in str(error)


def test_mlflow_against_a_dead_server_fails_within_seconds_and_is_classified(
    tmp_path, monkeypatch
):
    """The real MLflow client, its retries bounded by optloop (7 retries over about 4 minutes
    unbounded)."""
    from mlflow.tracking import MlflowClient

    from optloop.services.preflight import MLFLOW_HTTP_BOUNDS, bound_mlflow_http

    for name in MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    bound_mlflow_http()
    uri = closed_port_url().removesuffix("/v1")
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        MlflowClient(uri).get_experiment_by_name("x")
    assert time.monotonic() - started < 30
    error = classify(info.value, tracking_uri=uri, state=tmp_path, saved="s")
    assert isinstance(error, ServiceUnavailableError), repr(info.value)


def test_run_cli_prints_one_line_and_the_exit_code_of_an_outside_fault(tmp_path):
    script = (
        "import errno, sys\n"
        "from optloop.cli.command import run_cli\n"
        "def main(argv):\n"
        f"    raise OSError(errno.ENOSPC, 'No space left on device', {str(tmp_path / 'f')!r})\n"
        "sys.exit(run_cli(main, []))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert done.returncode == 74, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"optloop: error: no space left writing {tmp_path / 'f'}"
    )


def test_the_line_ends_with_where_the_run_stands_and_the_command_that_goes_on(tmp_path):
    from optloop.cli.run_resume import saved_line
    from optloop.loop.state import Checkpoint

    path = tmp_path / "checkpoint.json"
    assert saved_line(path, "r", 3, "CMD") == (
        "run r had saved nothing yet; once that is fixed, rerun the same command: CMD"
    )
    Checkpoint(config_digest="d").save(path)
    assert saved_line(path, "r", 3, "CMD") == (
        "run r is saved (the baseline not yet evaluated); once that is fixed, rerun the same "
        "command to resume it: CMD"
    )
    Checkpoint(config_digest="d", parent_run_id="p1", finished=True).save(path)
    assert (
        saved_line(path, "r", 3, "CMD") == "run r had finished (MLflow parent run p1) before that"
    )
