"""Faults from outside optloop, measured: each case of ``docs/reliability.md`` on the real CLI.

    python -m experiments.bench.outside                    # every case; the table as markdown
    python -m experiments.bench.outside --case full-disk   # one case (repeatable)
    python -m experiments.bench.outside --json OUT.json

Each case runs ``python -m optloop.run`` (md_flat on builtin:tiny, the edit optimizer, budget 2)
against :class:`~optloop.testing.oracle.OracleEndpoint`, a loopback endpoint that needs no
model, in a fresh work folder; injects one fault from outside optloop; records the exit code,
the last line printed, what was left on disk (the run's checkpoint, stray temporary files, the
MLflow runs left RUNNING); then removes the fault and runs the same command again to see whether
it recovers. The faults:

- a dead tracking server (``--tracking-uri`` on a loopback port with nothing listening), and one
  that goes away mid-run (a real ``mlflow server``, killed while trial 1 is evaluated, restarted);
- a full disk: the state and the MLflow store on a small tmpfs (1400 KB: full mid-run; 300 KB:
  full while MLflow creates its tables), then grown;
- an MLflow store left half-made by such a full disk in an older optloop (plain MLflow's table
  creation cut off);
- a checkpoint cut to half its bytes after a SIGKILL, and one whose MLflow parent run is gone
  (another ``--tracking-uri``, or ``mlruns/`` deleted);
- an unwritable store: the empty ``mlruns`` folder, or an existing ``mlflow.db``, made immutable
  (``chattr +i`` as root, where ``chmod`` does not stop writes; ``chmod a-w`` otherwise);
- smaller ones: a refused ``--start`` on mem0 (nothing may be written), an unreachable
  PostgreSQL ``--storage``.

(An export of a prompt reference ending in a newline, exported files' modes and an empty gold
answer need no run: ``tests/optloop/cli/test_export.py``,
``tests/optloop/datasets/test_jsonl.py``.)

A case that needs what this machine cannot do (mount a tmpfs, make a file immutable) raises
:class:`Unsupported`; the tests skip it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.bench.crash import env_for, optloop_run, run_args  # noqa: E402
from optloop.testing.oracle import OracleEndpoint  # noqa: E402

BUDGET = 2


class Unsupported(Exception):
    """This machine cannot inject the fault (no tmpfs mount, no immutable files)."""


class Row(BaseModel):
    """One case of the table."""

    case: str
    fault: str
    exit_code: int
    line: str = Field(description="the last line the command printed")
    lines: int = Field(description="lines on stderr")
    tracebacks: int = Field(0, description="tracebacks on stderr")
    other: list[str] = Field(
        default_factory=list,
        description="lines printed besides the run's "
        "own banner "
        "(optloop.run ...) and the last "
        "line",
    )
    left: str = Field(description="what was on disk after the failing command")
    recovery: str = Field(description="what the same command did once the fault was removed")
    recovered_exit: int | None = None
    seconds: float = Field(description="wall time of the failing command")


# --- injecting faults ----------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size_kb: int) -> Iterator[Path]:
    """A tmpfs of ``size_kb`` mounted at ``path`` (root only); unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise Unsupported(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def grow(path: Path, size_kb: int) -> None:
    """Give the tmpfs at ``path`` ``size_kb`` (space restored)."""
    subprocess.run(
        ["mount", "-o", f"remount,size={size_kb}k", str(path)], check=True, capture_output=True
    )


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[Path]:
    """``path`` (a file, or a folder: no new entries) refuses writes, even to root: ``chattr +i``
    as root, ``chmod a-w`` for anyone else; restored after (also by :func:`restore`)."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise Unsupported(f"cannot make {path} immutable: {done.stderr.strip()}")
    else:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        yield path
    finally:
        restore(path)


def restore(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    else:
        path.chmod(path.stat().st_mode | 0o200)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TrackingServer:
    """A real ``mlflow server`` on a loopback port, its store and artifacts under ``work``."""

    def __init__(self, work: Path, port: int):
        self.work, self.port = work, port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                f"sqlite:///{self.work / 'server.db'}",
                "--artifacts-destination",
                str(self.work / "artifacts"),
                "--workers",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.work / "server.log", "ab"),
            cwd=self.work,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"mlflow server did not start in {timeout} s; see {self.work / 'server.log'}"
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None


# --- reading what was left -----------------------------------------------------------------------


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# The lines every run prints before it starts: which run, its dataset, what its splits can show,
# what the endpoint check chose.
_OWN_LINES = ("optloop.run ", "dataset ", "power: ", "LM endpoint ", "LM proposer endpoint ")


# A run's progress: a stage or trial line (``[41 s] trial 1/2 ...``, optloop.progress without a
# terminal), and the projection it prints after the baseline, from its title to its last line.
_PROGRESS = re.compile(r"^\[\d+(\.\d)? (s|min|h)\] ")
_ESTIMATE_FIRST, _ESTIMATE_LAST = "estimate for ", "projected: "


def other_lines(text: str) -> list[str]:
    """What was printed besides the run's own lines (which run, its dataset, the endpoint check's
    choices, its progress and projection) and the last line."""
    lines = [line for line in text.splitlines() if line.strip()]
    out, projection = [], False
    for line in lines[:-1]:
        projection = projection or _ESTIMATE_FIRST in line
        if not (projection or line.startswith(_OWN_LINES) or _PROGRESS.match(line)):
            out.append(line)
        projection = projection and not line.startswith(_ESTIMATE_LAST)
    return out


def described(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The printed part of a :class:`Row` for ``done``."""
    return {
        "exit_code": done.returncode,
        "line": last_line(done.stderr),
        "lines": len([x for x in done.stderr.splitlines() if x.strip()]),
        "tracebacks": done.stderr.count("Traceback (most recent call last)"),
        "other": other_lines(done.stderr),
    }


def stray_files(root: Path) -> list[str]:
    """Temporary files a write left behind (``*.tmp``, ``.mlflow.db.creating-*``)."""
    if not root.exists():
        return []
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.name.endswith(".tmp") or ".creating-" in p.name
    )


def checkpoints(state: Path) -> list[str]:
    """Each run's checkpoint: ``<run>: <progress>`` or ``<run>: unreadable``."""
    from optloop.loop.state import Checkpoint

    out = []
    for path in (
        sorted((state / "runs").glob("*/checkpoint.json")) if (state / "runs").is_dir() else []
    ):
        try:
            ckpt = Checkpoint.model_validate_json(path.read_text())
            out.append(
                "checkpoint finished" if ckpt.finished else f"checkpoint {ckpt.progress(BUDGET)}"
            )
        except Exception:
            out.append("checkpoint unreadable")
    return out


def running_runs(db: Path) -> int | None:
    """MLflow runs left RUNNING in the SQLite store ``db`` (``None``: no readable store)."""
    import sqlite3

    if not db.is_file():
        return None
    try:
        with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as conn:
            return int(
                conn.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0]
            )
    except sqlite3.Error:
        return None


def left_on_disk(work: Path, db: Path | None = None) -> str:
    """What a failing command left: nothing, or its checkpoints, stray temporary files, RUNNING
    runs."""
    state, db = work / "state", db or work / "mlruns" / "mlflow.db"
    parts = checkpoints(state)
    if strays := stray_files(work):
        parts.append(f"stray {', '.join(strays)}")
    if (running := running_runs(db)) is not None:
        parts.append(f"mlflow.db ({running} run(s) RUNNING)")
    elif db.exists():
        parts.append("mlflow.db unreadable")
    if not parts:
        files = [
            p
            for p in work.rglob("*")
            if p.is_file() and p.parts[len(work.parts)] in ("state", "mlruns")
        ]
        return (
            "nothing"
            if not files
            else f"{len(files)} file(s): " + ", ".join(str(p.relative_to(work)) for p in files[:4])
        )
    return "; ".join(parts)


# --- the cases -----------------------------------------------------------------------------------


def _run(
    work: Path,
    endpoint: OracleEndpoint,
    *,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    kill_at: str | None = None,
    tracking: str | None = None,
) -> tuple[subprocess.CompletedProcess[str], float]:
    args = run_args(work, BUDGET, endpoint.base_url, extra=extra)
    if tracking is not None:
        args[args.index("--tracking-uri") + 1] = tracking
    started = time.perf_counter()
    done = optloop_run(args, env or env_for(work, endpoint.base_url), kill_at=kill_at, timeout=600)
    return done, round(time.perf_counter() - started, 1)


def _row(
    case: str,
    fault: str,
    done: subprocess.CompletedProcess[str],
    seconds: float,
    left: str,
    again: subprocess.CompletedProcess[str] | None,
    recovery: str,
) -> Row:
    return Row(
        case=case,
        fault=fault,
        **described(done),
        left=left,
        recovery=recovery,
        recovered_exit=None if again is None else again.returncode,
        seconds=seconds,
    )


def _recovery(again: subprocess.CompletedProcess[str], work: Path, db: Path | None = None) -> str:
    first = next((x for x in again.stderr.splitlines() if x.startswith("optloop.run ")), "")
    said = (
        "resumed" if " resuming " in first else "started afresh" if "a new run" in first else "ran"
    )
    running = running_runs(db or work / "mlruns" / "mlflow.db")
    left = "?" if running is None else running
    return f"exit {again.returncode}: {said}, {left} run(s) left RUNNING"


def case_dead_tracking_server(work: Path, *, then_lost: bool = True) -> list[Row]:
    """A tracking URI with nothing listening; then (``then_lost``) a real server there, the same
    command again, and a run whose server is killed mid-run and restarted."""
    server = TrackingServer(work / "server", closed_port())
    down, lost = work / "down", work / "lost"
    with OracleEndpoint() as endpoint:
        done, seconds = _run(down, endpoint, tracking=server.uri)
        left = left_on_disk(down)
        if not then_lost:
            return [
                _row(
                    "dead-tracking-server",
                    "tracking server down at start",
                    done,
                    seconds,
                    left,
                    None,
                    "(not run)",
                )
            ]
        server.start()
        try:
            again, _ = _run(down, endpoint, tracking=server.uri)
            first = _row(
                "dead-tracking-server",
                "tracking server down at start (`--tracking-uri http://127.0.0.1:<closed port>`)",
                done,
                seconds,
                left,
                again,
                f"once a server listens there: exit {again.returncode}",
            )
            endpoint.hold_when = lambda: _trial_open(lost)
            args = run_args(lost, BUDGET, endpoint.base_url)
            args[args.index("--tracking-uri") + 1] = server.uri
            env = env_for(lost, endpoint.base_url)
            proc = subprocess.Popen(
                [sys.executable, "-m", "optloop.run", *args],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            started = time.perf_counter()
            try:
                if not endpoint.holding.wait(300):
                    raise RuntimeError("trial 1 never started")
                server.stop()  # while trial 1 is evaluated
                endpoint.release()
                out, err = proc.communicate(timeout=300)
            finally:
                if proc.poll() is None:
                    proc.kill()
            stopped = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            seconds = round(time.perf_counter() - started, 1)
            left = left_on_disk(lost)
            server.start()
            again = optloop_run(args, env, timeout=600)
            second = _row(
                "tracking-server-lost",
                "tracking server killed while trial 1 is evaluated, then restarted",
                stopped,
                seconds,
                left,
                again,
                _recovery(again, lost, work / "server" / "server.db"),
            )
        finally:
            server.stop()
    return [first, second]


def _trial_open(work: Path) -> bool:
    from optloop.loop.state import Checkpoint

    for path in (work / "state" / "runs").glob("*/checkpoint.json"):
        try:
            trials = Checkpoint.model_validate_json(path.read_text()).trials
        except Exception:
            return False
        return len(trials) == 1 and trials[0].evaluation is None
    return False


def case_full_disk(work: Path, size_kb: int = 1400) -> list[Row]:
    """OPTLOOP_HOME and the MLflow store on a tmpfs that fills mid-run; then grown."""
    with tmpfs(work / "disk", size_kb) as disk, OracleEndpoint() as endpoint:
        env = {**env_for(disk, endpoint.base_url)}
        done, seconds = _run(disk, endpoint, env=env)
        left = left_on_disk(disk)
        grow(disk, 256 * 1024)
        again, _ = _run(disk, endpoint, env=env)
        return [
            _row(
                f"full-disk-{size_kb}k",
                f"state and store on a {size_kb} KB tmpfs (full "
                f"{'while MLflow creates its tables' if size_kb < 1000 else 'mid-run'}), "
                "then grown",
                done,
                seconds,
                left,
                again,
                _recovery(again, disk),
            )
        ]


def case_half_made_store(work: Path) -> list[Row]:
    """A store whose table creation a full disk cut off (plain MLflow, as an older optloop left
    it)."""
    db = work / "mlruns" / "mlflow.db"
    with tmpfs(work / "mlruns", 300):
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import mlflow, sys; mlflow.MlflowClient(sys.argv[1]).search_experiments()",
                f"sqlite:///{db}",
            ],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0:
            raise RuntimeError("MLflow created its store in 300 KB: no half-made store to test")
        kept = work / "half-made.db"
        shutil.copy(db, kept)
    shutil.copy(kept, db)
    from optloop.services.tracking_store import schema_state

    state = schema_state(db)
    with OracleEndpoint() as endpoint:
        done, seconds = _run(work, endpoint)
    mended = next((x for x in done.stderr.splitlines() if "half-made" in x), "")
    return [
        Row(
            case="half-made-store",
            fault="mlflow.db left at schema revision "
            f"{state.revision} of "
            f"{state.head} by a full disk during plain MLflow's table creation",
            **{**described(done), "line": " ".join(mended.split()) or last_line(done.stderr)},
            left=left_on_disk(work),
            recovery="(the first run mends it)",
            seconds=seconds,
        )
    ]


def case_corrupt_checkpoint(work: Path) -> list[Row]:
    """SIGKILL after trial 1, the checkpoint cut to half, the same command; then with --new."""
    with OracleEndpoint() as endpoint:
        killed, _ = _run(work, endpoint, kill_at="trial:1")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        [path] = (work / "state" / "runs").glob("*/checkpoint.json")
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
        done, seconds = _run(work, endpoint)
        left = left_on_disk(work)
        again, _ = _run(work, endpoint, extra=["--new"])
    statuses = _parent_statuses(work / "mlruns" / "mlflow.db")
    return [
        _row(
            "corrupt-checkpoint",
            "checkpoint.json cut to half its bytes after a SIGKILL after trial 1",
            done,
            seconds,
            left,
            again,
            f"with --new: exit {again.returncode}, the killed "
            "run's parent "
            f"run {statuses[0] if statuses else '?'}, the new one "
            f"{statuses[-1] if statuses else '?'}; "
            f"{_recovery(again, work).split(': ', 1)[1]}",
        )
    ]


def _parent_statuses(db: Path) -> list[str]:
    """The parent runs' statuses, oldest first."""
    import sqlite3

    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "select status from runs where run_uuid not in (select run_uuid from "
            "tags where key = "
            "'mlflow.parentRunId') order by start_time"
        ).fetchall()
    return [r[0] for r in rows]


def case_parent_run_gone(work: Path) -> list[Row]:
    """SIGKILL after trial 1; the same command on another store, then after ``mlruns/`` is
    deleted."""
    rows = []
    with OracleEndpoint() as endpoint:
        killed, _ = _run(work, endpoint, kill_at="trial:1")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        other = work / "other" / "mlflow.db"
        done, seconds = _run(work, endpoint, tracking=f"sqlite:///{other}")
        said = next(
            (x for x in done.stderr.splitlines() if "is not in the tracking store" in x), ""
        )
        rows.append(
            Row(
                case="parent-run-gone",
                fault="the same settings with another "
                "`--tracking-uri` after a "
                "SIGKILL after trial 1",
                **{**described(done), "line": " ".join(said.split())},
                left=left_on_disk(work, other),
                recovery=f"(resumed at once) trials in the new store: {_trial_names(other)}",
                seconds=seconds,
            )
        )
    shutil.rmtree(work)
    work.mkdir()
    with OracleEndpoint() as endpoint:
        killed, _ = _run(work, endpoint, kill_at="trial:1")
        shutil.rmtree(work / "mlruns")
        done, seconds = _run(work, endpoint)
        said = next(
            (x for x in done.stderr.splitlines() if "is not in the tracking store" in x), ""
        )
        db = work / "mlruns" / "mlflow.db"
        rows.append(
            Row(
                case="mlruns-deleted",
                fault="`mlruns/` deleted after a SIGKILL after trial 1",
                **{**described(done), "line": " ".join(said.split())},
                left=left_on_disk(work),
                recovery=f"(resumed at once) trials: {_trial_names(db)}",
                seconds=seconds,
            )
        )
    return rows


def _trial_names(db: Path) -> str:
    import sqlite3

    with sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "select name, status from runs where name like 'trial-%' and "
            "lifecycle_stage = "
            "'active' order by name"
        ).fetchall()
    return ", ".join(f"{n} {s}" for n, s in rows) or "none"


def case_unwritable_store(work: Path) -> list[Row]:
    """The empty mlruns folder, then an existing mlflow.db, refusing writes."""
    from optloop.services.tracking_store import ensure_sqlite_store

    rows = []
    mlruns = work / "mlruns"
    mlruns.mkdir(parents=True)
    with OracleEndpoint() as endpoint:
        with unwritable(mlruns):
            done, seconds = _run(work, endpoint)
            left = left_on_disk(work)
        again, _ = _run(work, endpoint)
        rows.append(
            _row(
                "unwritable-mlruns",
                "empty `mlruns/` that refuses new files (chattr +i; chmod 555 for a user)",
                done,
                seconds,
                left,
                again,
                "made writable: " + _recovery(again, work),
            )
        )
    shutil.rmtree(work)
    db = work / "mlruns" / "mlflow.db"
    ensure_sqlite_store(db)
    with OracleEndpoint() as endpoint:
        with unwritable(db):
            done, seconds = _run(work, endpoint)
            left = left_on_disk(work)
        again, _ = _run(work, endpoint)
        rows.append(
            _row(
                "read-only-mlflow-db",
                "existing `mlflow.db` that refuses writes (chattr +i; chmod 444 for a user)",
                done,
                seconds,
                left,
                again,
                "made writable: " + _recovery(again, work),
            )
        )
    return rows


def case_refusals(work: Path) -> list[Row]:
    """Bad input writes nothing (mem0's --start), an unreachable PostgreSQL storage is exit 75."""
    rows = []
    with OracleEndpoint() as endpoint:
        env = {**env_for(work, endpoint.base_url), "HOME": str(work / "home")}
        args = [
            "--system",
            "mem0",
            "--budget",
            "1",
            "--start",
            "nosuch=x",
            "--lm",
            "openai:oracle",
            "--lm-base-url",
            endpoint.base_url,
            "--tracking-uri",
            f"sqlite:///{work / 'mlruns' / 'mlflow.db'}",
        ]
        started = time.perf_counter()
        done = optloop_run(args, env)
        seconds = round(time.perf_counter() - started, 1)
        written = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
        rows.append(
            _row(
                "refused-start",
                "`--system mem0 --start nosuch=x`",
                done,
                seconds,
                "nothing" if not written else ", ".join(written[:4]),
                None,
                "(bad input: fix it)",
            )
        )
        url = f"postgresql://optloop:secret@127.0.0.1:{closed_port()}/optloop"
        done, seconds = _run(work, endpoint, extra=["--optimizer", "optuna", "--storage", url])
        rows.append(
            _row(
                "storage-unreachable",
                "`--optimizer optuna --storage postgresql://...` with nothing listening",
                done,
                seconds,
                left_on_disk(work),
                None,
                "(rerun once it is up)",
            )
        )
    return rows


def case_export_and_gold(work: Path) -> list[Row]:
    """``optloop export --prompt`` of a reference ending in a newline (a mem0 module), its file
    mode under umask 022; a dataset question with an empty gold answer."""
    import stat

    from optloop.product.templates.mem0_prompts import library_prompts
    from optloop.services.tracking_store import ensure_sqlite_store

    db = work / "mlruns" / "mlflow.db"
    ensure_sqlite_store(db)
    code = (
        "import sys, mlflow; from optloop.loop.tracking.prompt_registry import register_prompts; "
        "mlflow.set_tracking_uri(sys.argv[1]); "
        "register_prompts('mem0', {'mem0.extract': sys.argv[2]}, run_id='', promote=True, "
        "message='m')"
    )
    text = library_prompts()["mem0.extract"] + "\nKeep dates."
    subprocess.run(
        [sys.executable, "-c", code, f"sqlite:///{db}", text],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    out = work / "out" / "mem0_prompts.py"
    out.parent.mkdir()
    started = time.perf_counter()
    done = subprocess.run(
        [
            "sh",
            "-c",
            'umask 022 && exec "$@"',
            "sh",
            sys.executable,
            "-m",
            "optloop",
            "export",
            "--prompt",
            "optloop.mem0.extract@champion\n",
            "--format",
            "mem0",
            "--out",
            str(out),
            "--tracking-uri",
            f"sqlite:///{db}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    seconds = round(time.perf_counter() - started, 1)
    mode = oct(stat.S_IMODE(out.stat().st_mode)) if out.exists() else "none"
    compiles = (
        out.exists()
        and subprocess.run(
            [sys.executable, "-m", "py_compile", str(out)], capture_output=True
        ).returncode
        == 0
    )
    rows = [
        _row(
            "export-newline-ref",
            "`optloop export --prompt 'optloop.mem0.extract@champion\\n' "
            "--format mem0` under umask 022",
            done,
            seconds,
            f"mem0_prompts.py, mode {mode}, {'compiles' if compiles else 'does not compile'}",
            None,
            "(done)",
        )
    ]
    from optloop.datasets import load_dataset

    episode = json.loads(load_dataset("builtin:tiny").episodes[0].model_dump_json())
    episode["questions"][0]["gold"] = ""
    data = work / "gold.jsonl"
    data.write_text("\n".join(json.dumps({**episode, "id": f"e{i}"}) for i in range(4)) + "\n")
    gold = work / "gold"
    with OracleEndpoint() as endpoint:
        done, seconds = _run(gold, endpoint, extra=["--dataset", f"jsonl:{data}"])
    rows.append(
        _row(
            "empty-gold",
            'a question with `gold: ""` in a `jsonl:` dataset',
            done,
            seconds,
            left_on_disk(gold),
            None,
            "(bad input: fix it)",
        )
    )
    return rows


CASES: dict[str, Callable[[Path], list[Row]]] = {
    "dead-tracking-server": case_dead_tracking_server,
    "full-disk": case_full_disk,
    "full-disk-at-creation": lambda work: case_full_disk(work, 300),
    "half-made-store": case_half_made_store,
    "corrupt-checkpoint": case_corrupt_checkpoint,
    "parent-run-gone": case_parent_run_gone,
    "unwritable-store": case_unwritable_store,
    "refusals": case_refusals,
    "export-and-gold": case_export_and_gold,
}


def compact(text: str) -> str:
    """``text`` for the table: the case's temporary folder as ``<work>``, the printed resume
    command's arguments (the case's own) as ``<the same arguments>``."""
    import re

    text = re.sub(r"/tmp/optloop-[^/ ]+", "<work>", text)
    text = re.sub(r"/tmp/tmp[^/ ]+", "<work>", text)
    return re.sub(r"(: python -m optloop\.run) .*$", r"\1 <the same arguments>", text)


def table(rows: Sequence[Row]) -> str:
    """The rows as the markdown table of ``docs/reliability.md``."""
    out = [
        "| fault | exit | the line printed (the last) | left on disk | the same command after "
        "| s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        line = compact(r.line).replace("|", "\\|")
        extra = f"; {r.tracebacks} traceback(s)" if r.tracebacks else ""
        extra += f"; {len(r.other)} other line(s)" if r.other and r.exit_code else ""
        out.append(
            f"| {r.fault} | {r.exit_code} | `{line}`{extra} | {compact(r.left)} | "
            f"{r.recovery} | {r.seconds} |"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench.outside",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--case", action="append", choices=list(CASES), help="run only this case (repeatable)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    failed: list[str] = []
    for name in args.case or list(CASES):
        with tempfile.TemporaryDirectory(prefix=f"optloop-{name}-") as tmp:
            try:
                rows += CASES[name](Path(tmp))
            except Unsupported as exc:
                print(f"{name}: skipped: {exc}", file=sys.stderr)
            # the other cases still run; the exit code says so
            except Exception as exc:  # noqa: BLE001
                print(f"{name}: failed: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
                failed.append(name)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.model_dump() for r in rows], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
