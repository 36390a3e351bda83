"""The embedded SQLite tracking store: made whole or not at all, and a half-made one mended.

MLflow creates its tables (and runs some forty migrations) the first time a store is
opened. A full disk or a kill in the middle leaves a file with some of the tables and
an old schema revision; every later open then fails (``table spans already exists``)
until the file is deleted by hand. So:

- a missing store is created in a temporary file beside it and renamed into place once
  its schema is complete (:func:`ensure_sqlite_store`): the store's path holds a whole
  store or nothing;
- a store whose schema stops short of MLflow's head revision (:func:`schema_state`) is
  made again when it holds no run, experiment or registered prompt (nothing is lost);
  one that holds data is refused with a :class:`~optloop.errors.StoreWriteError` that
  says how to mend it (``mlflow db upgrade`` on a backup).

Callers hold the store's creation lock (``optloop.loop.tracking.run.experiment``).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from optloop.errors import StoreWriteError
from optloop.services.outside import muted

# Tables whose rows are the user's records; a half-made store with none of them has nothing to
# lose.
_RECORD_TABLES = ("runs", "registered_models", "trace_info")


@dataclass(frozen=True)
class SchemaState:
    """What a SQLite store file holds: its schema revision (``None``: none recorded), whether that
    is MLflow's head, and whether any record (a run, a registered prompt, a trace) is in it."""

    revision: str | None
    head: str
    has_records: bool

    @property
    def complete(self) -> bool:
        return self.revision == self.head


def head_revision() -> str:
    """The schema revision this MLflow creates stores at."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    return str(_get_latest_schema_revision())


def schema_state(db: Path) -> SchemaState:
    """:class:`SchemaState` of store file ``db``, read without writing to it."""
    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as conn:
        tables = {
            row[0] for row in conn.execute("select name from sqlite_master where type = 'table'")
        }
        revision = None
        if "alembic_version" in tables:
            row = conn.execute("select version_num from alembic_version").fetchone()
            revision = row[0] if row else None
        has_records = any(
            conn.execute(f"select 1 from {t} limit 1").fetchone() is not None
            for t in _RECORD_TABLES
            if t in tables
        )
        experiments = 0
        # the store's own "Default" experiment is no record of the user's
        if "experiments" in tables:
            experiments = conn.execute(
                "select count(*) from experiments where name != 'Default'"
            ).fetchone()[0]
    return SchemaState(
        revision=revision, head=head_revision(), has_records=has_records or experiments > 0
    )


def ensure_sqlite_store(db: Path) -> str | None:
    """A complete MLflow store at ``db``: created whole when missing, made again when a cut-off
    creation left it half-made and empty (the line to tell the user so is returned); a
    :class:`StoreWriteError` (exit 74) when a half-made store holds records. An ``OSError`` or
    ``sqlite3.Error`` of a full or read-only disk propagates (the caller names it)."""
    said = None
    if db.exists():
        state = schema_state(db)
        if state.complete:
            return None
        if state.has_records:
            raise StoreWriteError(
                f"the MLflow store {db} stops at schema revision {state.revision or 'none'}, not "
                f"{state.head} (its "
                "creation or an upgrade was cut off) and holds runs: back it up, then run "
                "`mlflow db upgrade "
                f"sqlite:///{db}`, or point --tracking-uri at another store"
            )
        said = (
            f"optloop.run: the MLflow store {db} was left half-made (schema revision "
            f"{state.revision or 'none'} "
            f"of {state.head}: its creation was cut off, by a full disk perhaps) and held no "
            "runs: made again"
        )
        _remove(db)
    _create(db)
    return said


def _create(db: Path) -> None:
    """The store's tables in a temporary file beside ``db``, renamed to ``db`` once complete."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    db.parent.mkdir(parents=True, exist_ok=True)
    tmp = db.with_name(f".{db.name}.creating-{os.getpid()}")
    _remove(tmp)
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
    try:
        # its INFO lines, and a traceback at ERROR before it raises
        with muted("mlflow.store.db.utils"):
            _initialize_tables(engine)
        engine.dispose()
        # the whole schema on disk before it takes the store's name
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, db)
    finally:
        engine.dispose()
        _remove(tmp)


def _remove(db: Path) -> None:
    """``db`` and SQLite's side files, if present."""
    for path in (
        db,
        db.with_name(db.name + "-journal"),
        db.with_name(db.name + "-wal"),
        db.with_name(db.name + "-shm"),
    ):
        path.unlink(missing_ok=True)


__all__ = ["SchemaState", "ensure_sqlite_store", "head_revision", "schema_state"]
