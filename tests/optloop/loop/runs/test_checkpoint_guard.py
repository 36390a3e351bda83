"""Checkpoints the world broke: an unreadable one of the run the same command would resume is
refused (exit 2, nothing written) and set aside with --new, its MLflow run ended KILLED; a lost
parent run is detected."""

from __future__ import annotations

import pytest

from optloop.cli.run import build_parser, choose_run
from optloop.errors import ConfigError
from optloop.loop.runs.checkpoint_guard import broken_runs, parent_run_missing, retire
from optloop.loop.state import Checkpoint
from tests.optloop.loop.test_run_cli import args_of, config_of, snapshot, unfinished


def cut(path, keep: float = 0.5) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])


def test_a_truncated_checkpoint_of_these_settings_is_found_with_its_parent_run(tmp_path):
    runs = tmp_path / "runs"
    config = config_of(args_of())
    path = unfinished(runs, "md_flat-simba-1", config)
    ckpt = Checkpoint.load(path)
    ckpt.parent_run_id = "abc123"
    ckpt.split = {
        "train": [f"episode-{i}" for i in range(200)]
    }  # the file's tail, where the cut falls
    ckpt.save(path)
    cut(path)
    other = unfinished(runs, "md_flat-simba-2", config.model_copy(update={"seed": 7}))
    cut(other)  # another settings' broken run: not this command's business
    unfinished(runs, "md_flat-simba-3", config)  # readable: resumed as usual
    [found] = broken_runs(runs, config)
    assert (found.name, found.parent_run_id) == ("md_flat-simba-1", "abc123")
    assert "not valid JSON" in found.reason and f"{path.stat().st_size} bytes" in found.reason


def test_a_checkpoint_cut_before_its_settings_counts_by_the_name_of_its_folder(
    tmp_path,
):
    runs = tmp_path / "runs"
    config = config_of(args_of())
    for name in ("md_flat-edit-20260101-000000", "graphiti-simba-20260101-000000"):
        (runs / name).mkdir(parents=True)
        (runs / name / "checkpoint.json").write_text('{"config_dig')
    assert [b.name for b in broken_runs(runs, config)] == ["md_flat-edit-20260101-000000"]


def test_the_same_command_refuses_a_broken_run_in_one_line_and_writes_nothing(tmp_path):
    runs = tmp_path / "runs"
    args = args_of()
    config = config_of(args)
    cut(unfinished(runs, "md_flat-simba-1", config))
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as info:
        choose_run(args, config, runs)
    text = str(info.value)
    assert info.value.exit_code == 2 and "\n" not in text
    assert text.startswith(
        "run md_flat-simba-1's checkpoint "
        f"{runs / 'md_flat-simba-1' / 'checkpoint.json'} is "
        "unreadable ("
    )
    assert (
        "rerun with --new to start afresh" in text
        and f"or delete {runs / 'md_flat-simba-1'}" in text
    )
    assert snapshot(tmp_path) == before
    fresh = choose_run(build_parser().parse_args(["--system", "md_flat", "--new"]), config, runs)
    assert fresh.checkpoint is None and fresh.name != "md_flat-simba-1"


def test_new_sets_the_broken_checkpoint_aside_and_ends_its_running_mlflow_run_killed(tmp_path):
    from mlflow.tracking import MlflowClient

    from optloop.services.tracking_store import ensure_sqlite_store

    db = tmp_path / "mlruns" / "mlflow.db"
    ensure_sqlite_store(db)
    uri = f"sqlite:///{db}"
    client = MlflowClient(uri)
    run = client.create_run(
        client.create_experiment("optloop-md_flat")
    )  # RUNNING, as a SIGKILL leaves it
    runs = tmp_path / "runs"
    config = config_of(args_of())
    path = unfinished(runs, "md_flat-simba-1", config)
    ckpt = Checkpoint.load(path)
    ckpt.parent_run_id = run.info.run_id
    ckpt.save(path)
    cut(path, 0.7)
    lines = retire(broken_runs(runs, config), uri)
    assert lines == [
        f"optloop.run: run md_flat-simba-1's unreadable checkpoint set aside as "
        f"checkpoint.json.unreadable; its MLflow run {run.info.run_id} ended KILLED"
    ]
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    assert not path.exists() and path.with_name("checkpoint.json.unreadable").exists()
    assert broken_runs(runs, config) == []


def test_a_parent_run_the_store_lacks_is_missing_and_one_it_holds_is_not(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from optloop.services.tracking_store import ensure_sqlite_store

    db = tmp_path / "mlflow.db"
    ensure_sqlite_store(db)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    try:
        client = MlflowClient()
        run = client.create_run(client.create_experiment("e"))
        assert not parent_run_missing(run.info.run_id)
        assert parent_run_missing("0123456789abcdef0123456789abcdef")
    finally:
        mlflow.set_tracking_uri(previous)
