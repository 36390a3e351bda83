"""One Optuna study shared by several ``optloop.run`` workers (``docs/architecture.md``, "Several
workers").

Workers started with the same command (same ``--run-name`` and ``--storage``) coordinate through
the study's RDB storage alone (PostgreSQL across machines, SQLite on one); a single worker is the
one-worker case of the same protocol. The one primitive is :meth:`SharedStudy.claim`: a
first-writer-wins record in optloop's own table ``optloop_study_records`` beside Optuna's, atomic
by its primary key (study, key), whose loser reads the winner's value. Everything else (the
settings digest, join order, heartbeats, the parent run, the baseline and control hand-over,
proposals, budget slots, the finisher and the result) is a record claimed once; the record keys
and how a run settles are in ``docs/architecture.md``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from optloop.errors import ConfigError
from optloop.lm import redact_url
from optloop.services.preflight import storage_url

logger = logging.getLogger(__name__)

PREFIX = "optloop:"
OPEN_RETRIES = 6


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # several local workers wait for SQLite's write lock
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True}


def _optuna_storage(url: str) -> Any:
    import optuna

    url = storage_url(url)
    return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))


def _records_table() -> Any:
    """optloop's table of first-writer-wins records (see the module docstring), in the study's
    database."""
    global _RECORDS
    if _RECORDS is None:
        from sqlalchemy import Column, Integer, MetaData, PrimaryKeyConstraint, String, Table, Text

        _RECORDS = Table(
            RECORDS_TABLE,
            MetaData(),
            Column("study_id", Integer, nullable=False),
            Column("key", String(512), nullable=False),
            Column("value_json", Text, nullable=False),
            PrimaryKeyConstraint("study_id", "key", name=f"{RECORDS_TABLE}_pk"),
        )
    return _RECORDS


RECORDS_TABLE = "optloop_study_records"
_RECORDS: Any = None


def _records_engine(url: str) -> Any:
    """An engine on the study's database with optloop's records table in it (created by the first
    worker)."""
    from sqlalchemy import create_engine

    url = storage_url(url)
    engine = create_engine(url, **_engine_kwargs(url))
    _records_table().metadata.create_all(engine, checkfirst=True)
    return engine


def _retrying(what: str, fn: Callable[[], Any], tries: int = OPEN_RETRIES) -> Any:
    """``fn()``, retried a few times: workers starting together race to create tables and the
    study."""
    for attempt in range(tries):
        try:
            return fn()
        except ImportError as exc:
            raise ConfigError(
                f"{what}: the storage driver is missing ({exc}); for postgresql:// install "
                "psycopg2-binary"
            ) from None
        except Exception as exc:  # noqa: BLE001 - the last attempt re-raises as a one-line error
            if attempt == tries - 1:
                raise ConfigError(
                    f"{what} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                ) from None
            logger.debug("%s: %s; retrying", what, exc)
            time.sleep(0.2 + random.random() * (attempt + 1))
    raise AssertionError("unreachable")


class SharedStudy:
    """The study and the workers' shared records in it; see the module docstring.

    ``worker`` is this worker's stable id (kept in its checkpoint, so a
    restarted worker takes its own slots and roles back).
    """

    def __init__(
        self,
        storage: str,
        study_name: str,
        *,
        worker: str,
        budget: int,
        seed: int = 0,
        stale_after: float = 180.0,
        beat_every: float = 15.0,
        poll: float = 2.0,
    ):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.url = storage
        self.study_name = study_name
        self.worker = worker
        self.budget = budget
        self.seed = seed
        self.stale_after = stale_after
        self.beat_every = beat_every
        self.poll = poll
        where = f"opening Optuna storage {redact_url(storage)}"
        self.storage = _retrying(where, lambda: _optuna_storage(storage))
        self.study = _retrying(
            f"{where}, study {study_name!r}",
            lambda: optuna.create_study(
                study_name=study_name,
                storage=self.storage,
                direction="maximize",
                sampler=optuna.samplers.TPESampler(seed=seed),
                load_if_exists=True,
            ),
        )
        self.study_id = self.storage.get_study_id_from_name(study_name)
        self.engine = _retrying(
            f"{where}, table {RECORDS_TABLE}", lambda: _records_engine(storage)
        )
        self._adopt_user_attrs()
        self.rank = -1
        self._beats = 0
        self._seen_beats: dict[str, tuple[Any, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._taken: set[int] = set()

    # --- the primitive ----------------------------------------------------------------------

    @property
    def _table(self) -> Any:
        return _records_table()

    @contextmanager
    def _conn(self, write: bool = False) -> Iterator[Any]:
        with self.engine.begin() if write else self.engine.connect() as conn:
            yield conn

    def _adopt_user_attrs(self) -> None:
        """Copy the records an older optloop kept in the study's user attributes (read with
        Optuna's public API) into the records table, once: when the table holds none for this
        study."""
        from sqlalchemy import func, select

        t = self._table

        def count() -> int:
            with self._conn() as conn:
                return conn.execute(
                    select(func.count()).select_from(t).where(t.c.study_id == self.study_id)
                ).scalar()

        if self._with_retry(count):
            return
        for key, value in self.study.user_attrs.items():
            if key.startswith(PREFIX) or key.startswith("instructions:"):
                self.claim(key, value)

    def _with_retry(self, fn: Callable[[], Any]) -> Any:
        from sqlalchemy.exc import OperationalError

        for attempt in range(5):
            try:
                return fn()
            except OperationalError:  # a locked SQLite file, a dropped connection: try again
                if attempt == 4:
                    raise
                time.sleep(0.1 + random.random() * (attempt + 1))
        raise AssertionError("unreachable")

    def claim(self, key: str, value: Any) -> Any:
        """Store ``value`` under ``key`` unless some worker did first; the value that won."""
        from sqlalchemy.exc import IntegrityError

        row = {"study_id": self.study_id, "key": key, "value_json": json.dumps(value)}

        def insert() -> None:
            try:
                with self._conn(write=True) as conn:
                    conn.execute(self._table.insert().values(**row))
            except IntegrityError:
                pass  # someone was first

        self._with_retry(insert)
        return self.get(key)

    def put(self, key: str, value: Any) -> None:
        """Overwrite ``key`` (only for keys this worker alone writes: its heartbeat, cost,
        flags)."""
        from sqlalchemy import and_

        t = self._table
        where = and_(t.c.study_id == self.study_id, t.c.key == key)

        def upsert() -> None:
            with self._conn(write=True) as conn:
                if (
                    conn.execute(
                        t.update().where(where).values(value_json=json.dumps(value))
                    ).rowcount
                    == 0
                ):
                    conn.execute(
                        t.insert().values(
                            study_id=self.study_id, key=key, value_json=json.dumps(value)
                        )
                    )

        self._with_retry(upsert)

    def get(self, key: str) -> Any:
        from sqlalchemy import and_, select

        t = self._table
        query = select(t.c.value_json).where(and_(t.c.study_id == self.study_id, t.c.key == key))

        def read() -> Any:
            with self._conn() as conn:
                return conn.execute(query).scalar()

        raw = self._with_retry(read)
        return None if raw is None else json.loads(raw)

    def scan(self, prefix: str) -> dict[str, Any]:
        """Every record whose key starts with ``prefix``, keyed by the rest of the key."""
        from sqlalchemy import and_, select

        t = self._table
        query = select(t.c.key, t.c.value_json).where(
            and_(t.c.study_id == self.study_id, t.c.key.startswith(prefix, autoescape=True))
        )

        def read() -> list[Any]:
            with self._conn() as conn:
                return list(conn.execute(query))

        return {k[len(prefix) :]: json.loads(v) for k, v in self._with_retry(read)}

    # --- workers ----------------------------------------------------------------------------

    def join(self, config_digest: str) -> int:
        """Check the settings, take a rank (0 = leader), start the heartbeat; this worker's
        rank."""
        import optuna

        theirs = self.claim(f"{PREFIX}config", config_digest)
        if theirs != config_digest:
            raise ConfigError(
                f"study {self.study_name!r} in {redact_url(self.url)} belongs to a run with other "
                "settings; start every worker with the same command, or pick another --run-name"
            )
        ranks = {w: int(r) for r, w in self.scan(f"{PREFIX}worker:").items()}
        rank = ranks.get(self.worker)
        k = len(ranks)
        while rank is None:
            if self.claim(f"{PREFIX}worker:{k}", self.worker) == self.worker:
                rank = k
            k += 1
        self.rank = rank
        # another seed per worker, else every worker's TPE starts with the same random points
        if rank:
            self.study.sampler = optuna.samplers.TPESampler(seed=self.seed + 7919 * rank)
        self.put(f"{PREFIX}out:{self.worker}", False)
        self.beat()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat_loop, name="optloop-heartbeat", daemon=True
        )
        self._thread.start()
        return rank

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def leader_id(self) -> str | None:
        return self.get(f"{PREFIX}worker:0")

    def beat(self) -> None:
        self._beats += 1
        self.put(
            f"{PREFIX}beat:{self.worker}",
            {
                "n": self._beats,
                "t": time.time(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "rank": self.rank,
            },
        )

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.beat_every):
            try:
                self.beat()
            # a missed beat is retried; others only wait longer
            except Exception as exc:  # noqa: BLE001
                logger.debug("heartbeat failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def describe(self, worker: str) -> str:
        beat = self.get(f"{PREFIX}beat:{worker}") or {}
        return (
            f"worker {beat.get('rank', '?')} (host {beat.get('host', '?')}, pid "
            f"{beat.get('pid', '?')})"
        )

    def alive(self, worker: str) -> bool:
        """Whether ``worker``'s heartbeat moved within ``stale_after`` seconds of this worker's own
        clock."""
        if worker == self.worker:
            return True
        beat = self.get(f"{PREFIX}beat:{worker}")
        now = time.monotonic()
        value = (beat or {}).get("n")
        seen = self._seen_beats.get(worker)
        if seen is None or seen[0] != value:
            self._seen_beats[worker] = (value, now)
            return True
        return now - seen[1] < self.stale_after

    def wait_for(
        self, key: str, *, holder: str, what: str, progress: Callable[[str], None] | None = None
    ) -> Any:
        """The value of ``key`` once ``holder`` stored it; ``None`` if ``holder`` died first."""
        while True:
            value = self.get(key)
            if value is not None:
                return value
            if not self.alive(holder):
                return None
            if progress:
                progress(f"waiting for {self.describe(holder)}: {what}")
            time.sleep(self.poll)

    # --- candidates and budget slots --------------------------------------------------------

    def claim_candidate(self, digest: str, study_trial: int) -> dict[str, Any]:
        """Who evaluates the candidate ``digest``: this worker, or the one that claimed it
        first."""
        return self.claim(
            f"{PREFIX}candidate:{digest}", {"worker": self.worker, "study_trial": study_trial}
        )

    def slots(self) -> dict[int, dict[str, Any]]:
        return {int(k): v for k, v in self.scan(f"{PREFIX}slot:").items()}

    def done(self) -> dict[int, dict[str, Any]]:
        return {int(k): v for k, v in self.scan(f"{PREFIX}done:").items()}

    def my_open_slots(self) -> list[int]:
        """Slots this worker claimed and never finished (left by an interrupted run of it)."""
        done = self.done()
        return sorted(
            k
            for k, v in self.slots().items()
            if v["worker"] == self.worker and k not in done and k not in self._taken
        )

    def can_take(self) -> bool:
        return len(self.slots()) < self.budget or bool(self.my_open_slots())

    def take_slot(self, digest: str, study_trial: int | None) -> int | None:
        """The budget slot this worker evaluates ``digest`` in (its own unfinished one first);
        ``None`` when every slot of the budget is taken."""
        mine = self.my_open_slots()
        if mine:
            self._taken.add(mine[0])
            return mine[0]
        k = len(self.slots())
        value = {"worker": self.worker, "digest": digest, "study_trial": study_trial}
        while k < self.budget:
            if self.claim(f"{PREFIX}slot:{k}", value) == value:
                self._taken.add(k)
                return k
            k += 1
        return None

    def publish_done(self, slot: int, record: dict[str, Any]) -> None:
        self.claim(f"{PREFIX}done:{slot}", {"worker": self.worker, **record})
        self._taken.discard(slot)

    def results(self) -> dict[int, dict[str, Any]]:
        """The done slots that hold an evaluation (not the void ones)."""
        return {k: v for k, v in self.done().items() if not v.get("void")}

    def void_my_open_slots(self) -> list[int]:
        """Close the slots this worker claimed but will not fill (its optimizer ran out of
        candidates after a restart): they count as spent budget without an evaluation, so the run
        can settle."""
        slots = self.my_open_slots()
        for k in slots:
            self.publish_done(k, {"trial": k + 1, "void": True})
        return slots

    def best_accuracy(self, baseline: float) -> float:
        return max(
            [
                baseline,
                *(d["accuracy"] for d in self.results().values() if not d.get("stopped")),
            ]
        )

    def put_cost(self, cost: dict[str, float]) -> None:
        self.put(f"{PREFIX}cost:{self.worker}", cost)

    def others_cost(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for worker, cost in self.scan(f"{PREFIX}cost:").items():
            if worker != self.worker:
                for k, v in cost.items():
                    total[k] = total.get(k, 0) + v
        return total

    def leave(self) -> None:
        """This worker left its trial loop (it takes no slot any more)."""
        self.put(f"{PREFIX}out:{self.worker}", True)

    def settled(self) -> tuple[bool, list[str]]:
        """(whether every evaluation of the run is done, the workers it still waits for).

        Settled: every claimed slot is done and every worker has left its loop (or stopped
        beating, so it claims nothing more). A worker still in its loop when the whole budget is
        claimed leaves it at its next look, with its cost written (:meth:`put_cost`), so the
        result counts every process that worked on the run.
        """
        slots, done = self.slots(), self.done()
        holding = sorted({v["worker"] for k, v in slots.items() if k not in done})
        if holding:
            return False, holding
        out = self.scan(f"{PREFIX}out:")
        working = sorted(w for w, left in out.items() if not left and self.alive(w))
        return not working, working
