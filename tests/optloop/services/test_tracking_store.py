"""The embedded MLflow store is made whole or not at all, and one a full disk left half-made is
mended.

A full disk is a file size limit here (RLIMIT_FSIZE in a child process: SQLite's writes then fail
with EFBIG, "disk I/O error", where a full tmpfs says "database or disk is full"), which needs no
privileges; the CLI cases on a real tmpfs are in ``tests/optloop/loop/test_run_faults.py``.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from optloop.errors import StoreWriteError
from optloop.services.tracking_store import ensure_sqlite_store, schema_state

REPO = Path(__file__).resolve().parents[3]
LIMIT = 300 * 1024  # bytes a file may grow to: MLflow's complete store is larger


def limited(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a child process whose files may not grow past :data:`LIMIT` bytes."""
    prelude = f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def cut_off(done: subprocess.CompletedProcess[str]) -> bool:
    """Whether ``done`` failed on the file size limit."""
    return done.returncode != 0 and (
        "disk I/O error" in done.stderr or "File too large" in done.stderr
    )


def half_made(db: Path) -> Path:
    """A store whose creation by plain MLflow a full disk cut off."""
    done = limited(
        "import mlflow, sys; mlflow.MlflowClient(sys.argv[1]).search_experiments()",
        f"sqlite:///{db}",
    )
    assert cut_off(done), done.stderr[-2000:]
    return db


def test_a_new_store_is_complete_and_opens_in_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlruns" / "mlflow.db"
    ensure_sqlite_store(db)
    assert schema_state(db).complete and not schema_state(db).has_records
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db"]
    assert MlflowClient(f"sqlite:///{db}").create_experiment(
        "e"
    )  # no "out-of-date schema", no migration
    ensure_sqlite_store(db)  # a complete store is left as it is
    assert schema_state(db).has_records


def open_in_mlflow(db: Path) -> subprocess.CompletedProcess[str]:
    """Plain MLflow opening store ``db`` in a fresh process (MLflow keeps a process's engines)."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import mlflow, sys; print([e.name for e in "
            "mlflow.MlflowClient(sys.argv[1]).search_experiments()])",
            f"sqlite:///{db}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def test_plain_mlflow_cut_off_by_a_full_disk_wedges_the_store_and_optloop_mends_it(tmp_path):
    db = half_made(tmp_path / "mlflow.db")
    state = schema_state(db)
    assert not state.complete and not state.has_records
    wedged = open_in_mlflow(db)  # every later open fails, space or not
    assert wedged.returncode != 0 and "already exists" in wedged.stderr, wedged.stderr[-2000:]
    ensure_sqlite_store(db)
    assert schema_state(db).complete
    mended = open_in_mlflow(db)
    assert mended.returncode == 0 and mended.stdout.strip() == "['Default']", mended.stderr[-2000:]


def test_a_half_made_store_that_holds_records_is_refused_with_how_to_mend_it(tmp_path):
    db = half_made(tmp_path / "mlflow.db")
    with sqlite3.connect(db) as conn:
        tables = {
            r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")
        }
        assert "experiments" in tables
        conn.execute("insert into experiments (name, lifecycle_stage) values ('mine', 'active')")
    before = db.read_bytes()
    with pytest.raises(StoreWriteError, match="mlflow db upgrade") as info:
        ensure_sqlite_store(db)
    assert info.value.exit_code == 74 and str(db) in str(info.value)
    assert db.read_bytes() == before


def test_creating_a_store_on_a_full_disk_leaves_no_store_and_no_temporary_file(tmp_path):
    db = tmp_path / "mlruns" / "mlflow.db"
    done = limited(
        "import sys; from pathlib import Path; from optloop.services.tracking_store import "
        "ensure_sqlite_store; "
        "ensure_sqlite_store(Path(sys.argv[1]))",
        str(db),
    )
    assert cut_off(done), done.stderr[-2000:]
    assert list(db.parent.iterdir()) == []  # the next run creates it whole, nothing to mend
    ensure_sqlite_store(db)
    assert schema_state(db).complete
