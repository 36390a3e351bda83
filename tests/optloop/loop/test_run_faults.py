"""`python -m optloop.run` against faults from outside optloop, injected for real
(docs/reliability.md): a dead or lost tracking server, a full disk, a half-made store, a corrupt
checkpoint, a lost parent run, an unwritable store, and refusals that must write nothing.

Every case is :mod:`experiments.bench.outside` (which also prints the reliability guide's table) on
the real CLI against the loopback :class:`~optloop.testing.oracle.OracleEndpoint` (no model). A
fault this machine cannot inject (a tmpfs mount, an immutable file) skips its test. The cases of
several runs each (a real ``mlflow server`` killed and restarted, a SIGKILL then a resume) are
``slow``; the fast suite covers the same faults through the units they meet
(``tests/optloop/services/test_outside.py``, ``test_preflight.py``, ``test_tracking_store.py``,
``tests/optloop/loop/runs/test_checkpoint_guard.py``).
"""

from __future__ import annotations

import pytest

from experiments.bench import outside
from experiments.bench.outside import Row, Unsupported


def case(name: str, tmp_path) -> list[Row]:
    try:
        return outside.CASES[name](tmp_path)
    except Unsupported as exc:
        pytest.skip(str(exc))


def one_line(row: Row, start: str) -> None:
    """The command's last line is the error, and nothing but the run's own lines came before it."""
    assert row.tracebacks == 0 and row.other == [], row
    assert row.line.startswith(f"optloop: error: {start}"), row.line


def test_a_dead_tracking_server_is_exit_75_at_once_and_nothing_is_written(tmp_path):
    [dead] = outside.case_dead_tracking_server(tmp_path, then_lost=False)
    assert dead.exit_code == 75 and dead.seconds < 60 and dead.left == "nothing", dead
    one_line(dead, "cannot reach the MLflow tracking server at http://127.0.0.1:")


@pytest.mark.slow
def test_a_tracking_server_lost_mid_run_stops_it_saved_and_the_same_command_resumes(tmp_path):
    dead, lost = case("dead-tracking-server", tmp_path)
    assert dead.exit_code == 75 and dead.recovered_exit == 0, dead
    assert lost.exit_code == 75, lost
    one_line(lost, "lost the MLflow tracking server at http://127.0.0.1:")
    assert "is saved (" in lost.line and "rerun the same command to resume it" in lost.line
    assert lost.left.startswith("checkpoint ") and "stray" not in lost.left, lost.left
    assert (
        lost.recovered_exit == 0
        and "resumed" in lost.recovery
        and "0 run(s) left RUNNING" in lost.recovery
    )


@pytest.mark.parametrize(
    "name", ["full-disk-at-creation", pytest.param("full-disk", marks=pytest.mark.slow)]
)
def test_a_full_disk_is_exit_74_in_one_line_and_the_same_command_recovers_once_space_is_freed(
    name, tmp_path
):
    [row] = case(name, tmp_path)
    assert row.exit_code == 74, row
    one_line(row, "no space left writing ")
    assert "stray" not in row.left and "unreadable" not in row.left, row.left
    assert row.recovered_exit == 0 and "0 run(s) left RUNNING" in row.recovery, row.recovery


@pytest.mark.slow
def test_a_store_a_full_disk_left_half_made_is_mended_by_the_next_run(tmp_path):
    [row] = case("half-made-store", tmp_path)
    assert row.exit_code == 0 and "was left half-made" in row.line and "made again" in row.line, (
        row
    )


@pytest.mark.slow
def test_a_corrupt_checkpoint_is_refused_in_one_line_and_new_ends_the_killed_run(tmp_path):
    [row] = case("corrupt-checkpoint", tmp_path)
    assert row.exit_code == 2, row
    one_line(row, "run md_flat-edit-")
    assert "is unreadable (" in row.line and "rerun with --new to start afresh" in row.line
    assert (
        row.recovered_exit == 0
        and "the killed run's parent run KILLED, the new one FINISHED" in row.recovery
    )


@pytest.mark.slow
def test_a_checkpoint_whose_parent_run_is_gone_resumes_into_a_new_parent_run(tmp_path):
    other_store, deleted = case("parent-run-gone", tmp_path)
    for row in (other_store, deleted):
        assert row.exit_code == 0, row
        assert (
            "is not in the tracking store" in row.line
            and "resuming into a new parent run" in row.line
        ), row
        assert row.recovery.endswith(": trial-1 FINISHED, trial-2 FINISHED"), row.recovery


def test_an_unwritable_store_is_exit_74_in_one_line_and_nothing_is_written(tmp_path):
    folder, db = case("unwritable-store", tmp_path)
    one_line(folder, "cannot write the MLflow store's folder at ")
    one_line(db, "cannot write the MLflow store at ")
    for row in (folder, db):
        assert row.exit_code == 74 and row.recovered_exit == 0, row
    assert folder.left == "nothing", folder.left


def test_refusals_write_nothing_and_an_unreachable_storage_is_exit_75(tmp_path):
    start, storage = case("refusals", tmp_path)
    assert start.exit_code == 2 and start.left == "nothing", start
    one_line(start, "--start nosuch: no such site on mem0")
    assert storage.exit_code == 75 and storage.left == "nothing", storage
    one_line(storage, "cannot reach the database at postgresql://optloop:***@127.0.0.1:")


def test_the_runs_own_progress_and_projection_are_not_other_lines():
    printed = "\n".join(
        [
            "optloop.run md_flat-edit-1: md_flat on builtin:tiny, edit, budget 2 (a new run)",
            "[2 s] evaluating baseline on train (4 questions)",
            "  estimate for md_flat-edit-1: md_flat on builtin:tiny, edit,   ",
            "│ total                     │           6 │    96 │   1159 │ no price │  1 s │",
            "projected: 96 calls, 1159 tokens; ETA 0 s for the rest of the run",
            "[1.5 h] edit round 1: screening 1-8 of 11 programs on a train mini-batch",
            "WARNING  a library's line",
            "optloop: error: lost the MLflow tracking server",
        ]
    )
    assert outside.other_lines(printed) == ["WARNING  a library's line"]
