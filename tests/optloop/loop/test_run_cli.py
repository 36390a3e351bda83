"""`python -m optloop.run`: bad input (one line naming what to fix, exit 2, nothing written), the
other exit codes (75: endpoint unavailable, 130: interrupted, 0: done; README "Exit codes"), and
how the same command finds the run it resumes."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from optloop.cli.run import main
from optloop.cli.run_args import build_parser, default_optimizer, run_config
from optloop.cli.run_resume import choose_run, resume_command
from optloop.errors import ConfigError
from optloop.interrupt import interruptible
from optloop.lm.settings import LMSettings
from optloop.loop.state import Checkpoint, LoopConfig, _digest
from optloop.testing.loopback import closed_port_url
from tests._cli import run_cli

REPO = Path(__file__).resolve().parents[3]
# rag_bm25 on the model ``test`` of an endpoint whose URL comes next
RAG_ON_TEST_ENDPOINT = ["--system", "rag_bm25", "--lm", "openai:test", "--lm-base-url"]


def nothing_written(tmp_path: Path) -> bool:
    return not (tmp_path / "ml").exists() and not (tmp_path / "state" / "runs").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--system", "nosuch"], "invalid choice: 'nosuch'"),
        (["--budget", "0"], "0 is out of range"),
        (["--budget", "many"], "not a whole number"),
        (["--split", "0.5,0.3,0.3"], "must sum to 1"),
        (["--max-failed-share", "2"], "give a share from 0 to 1"),
        (["--max-failed-share", "some"], "is not a share"),
    ],
)
def test_bad_arguments_exit_with_one_line(args, message, tmp_path):
    result = run_cli(args, tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert nothing_written(tmp_path)


def test_malformed_dataset_fails_before_any_state(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "e1", "sessions": []}\nnot json\n')
    result = run_cli(["--system", "rag_bm25", "--dataset", f"jsonl:{bad}"], tmp_path)
    assert (
        result.returncode == 2
        and "optloop: error:" in result.stderr
        and "bad.jsonl" in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1 and nothing_written(tmp_path)


def test_too_few_episodes_is_a_dataset_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTLOOP_HOME", str(tmp_path / "state"))
    from optloop.errors import DatasetError

    with pytest.raises(DatasetError, match="at least 3 episodes"):
        main(
            [
                "--system",
                "rag_bm25",
                "--dataset",
                "builtin:tiny?limit=2",
                "--allow-small-splits",
                "--tracking-uri",
                f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}",
            ]
        )


def test_help_teaches_what_an_evaluation_is():
    text = build_parser().format_help()
    assert (
        "One evaluation (what --budget counts)" in text
        and "--proposer-lm" in text
        and "--untargeted" in text
    )


def test_split_and_promote_if_reach_the_config():
    args = build_parser().parse_args(["--split", "0.4, 0.3,0.3", "--promote-if", "delta"])
    assert args.split == (0.4, 0.3, 0.3) and args.promote_if == "delta"
    args = build_parser().parse_args([])
    assert args.split == (0.5, 0.25, 0.25) and args.promote_if == "ci"


@pytest.mark.parametrize(
    "value, message",
    [
        ("0.5,0.5", "give three fractions TRAIN,DEV,TEST"),
        ("0.5,0.25,a", "give three numbers TRAIN,DEV,TEST"),
        ("0.6,0.3,0.3", "they must sum to 1"),
        ("1,0,0", "every fraction must be above 0"),
        ("0.5,-0.25,0.75", "every fraction must be above 0"),
    ],
)
def test_bad_split_is_one_line_exit_2(value, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--split", value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "--split" in err
    assert len(err.strip().splitlines()) == 1


def test_bad_promote_if_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--promote-if", "always"])
    assert exit_info.value.code == 2 and "invalid choice: 'always'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "start, message",
    [
        ("answer", "write SITE=TEXT"),
        ("nosuch=Be brief.", "--start nosuch: no such site on md_flat"),
    ],
)
def test_bad_start_instruction_exits_with_one_line_before_any_state(start, message, tmp_path):
    result = run_cli(["--system", "md_flat", "--start", start], tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert nothing_written(tmp_path)


def test_query_rewrite_on_a_system_that_never_searches_is_one_line_before_any_state(tmp_path):
    result = run_cli(["--system", "long_context", "--query-rewrite"], tmp_path)
    assert result.returncode == 2 and "long_context puts every turn in context" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and nothing_written(tmp_path)


def test_query_rewrite_reaches_the_config_and_leaves_older_runs_resumable():
    """A run started before --query-rewrite existed has the same digests as one without the flag
    now."""
    from optloop.cli.command import lm_settings_from_args

    settings = lm_settings_from_args(build_parser().parse_args(["--system", "rag_bm25"]))
    plain = run_config(build_parser().parse_args(["--system", "rag_bm25"]), settings)
    rewrite = run_config(
        build_parser().parse_args(["--system", "rag_bm25", "--query-rewrite"]), settings
    )
    assert not plain.query_rewrite and rewrite.query_rewrite
    older = {
        k: v
        for k, v in plain.model_dump().items()
        if k not in ("query_rewrite", "batch", "control", "race", "min_gain", "stall")
    }  # all six came later
    assert plain.resume_key() == _digest(
        {k: v for k, v in older.items() if k not in ("tracking_uri", "run_name")}
    )
    assert rewrite.resume_key() != plain.resume_key() and rewrite.digest() != plain.digest()


# --- exit codes (README: "Exit codes") -----------------------------------------------------------


def snapshot(root: Path) -> dict[str, int]:
    return (
        {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}
        if root.exists()
        else {}
    )


def test_exit_75_when_the_endpoint_is_unreachable_at_startup_and_nothing_is_written(tmp_path):
    before = snapshot(tmp_path)
    result = run_cli(
        [
            *RAG_ON_TEST_ENDPOINT,
            closed_port_url(),
            "--lm-retries",
            "0",
        ],
        tmp_path,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 75, result.stderr
    assert len(lines) == 1 and lines[0].startswith("optloop: error: cannot reach LM endpoint"), (
        result.stderr
    )
    assert "nothing was written" in lines[0]
    assert (
        snapshot(tmp_path) == before
    )  # no state directory, no empty lm_cache.sqlite, no MLflow store


def test_exit_75_when_the_endpoint_answers_only_server_errors_at_startup(tmp_path):
    from optloop.testing.scripted import ScriptedOpenAIServer

    with ScriptedOpenAIServer([("status", 503)]) as server:
        result = run_cli(
            [
                *RAG_ON_TEST_ENDPOINT,
                server.base_url,
                "--lm-retries",
                "0",
            ],
            tmp_path,
        )
    assert result.returncode == 75 and "HTTP 503" in result.stderr, result.stderr
    assert snapshot(tmp_path) == {}


def test_exit_2_when_the_endpoint_refuses_the_model_at_startup(tmp_path):
    from optloop.testing.scripted import ScriptedOpenAIServer

    with ScriptedOpenAIServer(
        [("status", 404)]
    ) as server:  # the input (the model name) is wrong, not the server
        result = run_cli(
            [
                "--system",
                "rag_bm25",
                "--lm",
                "openai:nosuch",
                "--lm-base-url",
                server.base_url,
                "--lm-retries",
                "0",
            ],
            tmp_path,
        )
    assert result.returncode == 2 and "does not serve model 'nosuch'" in result.stderr, (
        result.stderr
    )
    assert snapshot(tmp_path) == {}


def finished_checkpoint(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "state" / "runs" / name / "checkpoint.json"
    Checkpoint(config_digest="whatever", parent_run_id="p1", finished=True).save(path)
    return path


def test_a_finished_run_name_is_refused_before_anything_is_printed_or_written(tmp_path):
    finished_checkpoint(tmp_path, "done")
    before = snapshot(tmp_path)
    result = run_cli(["--system", "md_flat", "--run-name", "done"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "optloop: error: run 'done' already finished (MLflow run p1); pick another "
        "--run-name to run again"
    )  # the one line: no "optloop.run ..." banner before
    assert snapshot(tmp_path) == before


def test_new_and_run_name_together_are_refused(tmp_path):
    result = run_cli(["--system", "md_flat", "--new", "--run-name", "x"], tmp_path)
    assert result.returncode == 2 and "--new and --run-name exclude each other" in result.stderr


# --- choosing the run: the same command resumes --------------------------------------------------


def args_of(*argv: str):
    return build_parser().parse_args(["--system", "md_flat", *argv])


def config_of(args) -> LoopConfig:
    return LoopConfig(
        system=args.system,
        dataset=args.dataset or "builtin:tiny",
        budget=args.budget,
        optimizer=args.optimizer or default_optimizer(LMSettings.from_spec("local")),
        seed=args.seed,
        run_name=args.run_name or "-",
    )


def unfinished(
    runs: Path,
    name: str,
    config: LoopConfig,
    *,
    auto_named: bool = True,
    finished: bool = False,
    age: float = 0.0,
    trials: int = 0,
) -> Path:
    path = runs / name / "checkpoint.json"
    ckpt = Checkpoint(
        config_digest=config.model_copy(update={"run_name": name}).digest(),
        resume_key=config.resume_key(),
        auto_named=auto_named,
        finished=finished,
        processes=1,
    )
    ckpt.save(path)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_the_same_command_resumes_the_latest_unfinished_run_of_its_settings(tmp_path):
    runs = tmp_path / "runs"
    args = args_of("--budget", "3")
    config = config_of(args)
    unfinished(runs, "older", config, age=100)
    unfinished(runs, "latest", config, age=10)
    unfinished(runs, "finished", config, finished=True, age=1)
    unfinished(
        runs, "named", config, auto_named=False, age=1
    )  # started with --run-name: that command resumes it
    unfinished(runs, "other-seed", config.model_copy(update={"seed": 1}), age=1)
    unfinished(runs, "other-budget", config.model_copy(update={"budget": 4}), age=1)
    (runs / "broken").mkdir()
    (runs / "broken" / "checkpoint.json").write_text("{")  # another run's broken state is skipped
    before = snapshot(tmp_path)
    choice = choose_run(args, config, runs)
    assert choice.name == "latest" and choice.checkpoint is not None
    assert choice.line.startswith(
        "[bold]optloop.run[/] resuming latest, the latest unfinished run of these settings"
    )
    assert "--new starts afresh" in choice.line and "1 process(es) so far" in choice.line
    assert "\n" not in choice.line
    fresh = choose_run(args_of("--budget", "3", "--new"), config, runs)
    assert (
        fresh.checkpoint is None
        and fresh.name.startswith("md_flat-edit-")
        and "a new run" in fresh.line
    )
    assert snapshot(tmp_path) == before  # choosing reads only


def test_other_settings_or_nothing_unfinished_start_a_new_run(tmp_path):
    runs = tmp_path / "runs"
    args = args_of()
    config = config_of(args)
    assert choose_run(args, config, runs).checkpoint is None  # no runs directory at all
    unfinished(runs, "other", config.model_copy(update={"untargeted": True}))
    unfinished(runs, "other-lm", config.model_copy(update={"lm_settings": {"n_ctx": 4096}}))
    choice = choose_run(args, config, runs)
    assert choice.checkpoint is None and choice.name not in ("other", "other-lm")


def test_a_run_in_use_is_left_to_its_process_unless_workers_share_it(tmp_path):
    from optloop.loop.runs.runner import _lock_dir

    runs = tmp_path / "runs"
    args = args_of()
    config = config_of(args)
    unfinished(runs, "busy", config)
    lock = _lock_dir(runs / "busy")  # another process runs it
    try:
        choice = choose_run(args, config, runs)
        assert choice.checkpoint is None and choice.name != "busy"
        assert "busy with these settings is in use" in choice.line
        shared_args = args_of("--optimizer", "optuna")
        shared_config = config_of(shared_args)
        unfinished(runs, "study", shared_config)
        lock2 = _lock_dir(runs / "study")
        try:
            joined = choose_run(
                shared_args, shared_config, runs
            )  # another worker joins the run, as documented
            assert joined.name == "study" and joined.line.startswith(
                "[bold]optloop.run[/] joining study"
            )
        finally:
            lock2.close()
    finally:
        lock.close()
    assert (
        choose_run(args, config, runs).name == "busy"
    )  # its process ended: the same command resumes it


def test_a_named_run_is_resumed_by_name_and_refused_with_other_settings(tmp_path):
    runs = tmp_path / "runs"
    args = args_of("--run-name", "mine")
    config = config_of(args)
    unfinished(runs, "mine", config, auto_named=False)
    choice = choose_run(args, config, runs)
    assert (
        choice.name == "mine" and choice.checkpoint is not None and "resuming mine" in choice.line
    )
    with pytest.raises(ConfigError, match="exists with other settings"):
        choose_run(args, config.model_copy(update={"seed": 5}), runs)


def test_the_resume_command_is_the_same_command_without_new():
    assert (
        resume_command(["--system", "md_flat", "--new", "--start", "answer=Be brief."])
        == "python -m optloop.run --system md_flat --start 'answer=Be brief.'"
    )


def test_sigterm_becomes_one_interrupt_and_the_handlers_come_back():
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with interruptible() as got:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here, at once
    assert got == ["SIGTERM"]
    with interruptible() as got:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            os.kill(
                os.getpid(), signal.SIGINT
            )  # a second signal while the run saves itself: ignored
            time.sleep(0.1)
    assert got == ["SIGTERM", "SIGINT"]
    assert signal.getsignal(signal.SIGTERM) is previous


def checkpoint_trials(runs: Path) -> list[Any] | None:
    """The trials of the first run's checkpoint under ``runs`` (``None``: no checkpoint yet, or
    one being written)."""
    for path in runs.glob("*/checkpoint.json"):
        try:
            return Checkpoint.model_validate_json(path.read_text()).trials
        except Exception:  # noqa: BLE001 - being written
            return None
    return None


def terminated_when_held(
    args: list[str], env: dict[str, str], endpoint: Any, never: str
) -> tuple[int, str]:
    """``optloop.run args`` sent SIGTERM once ``endpoint`` holds a request (``never``: the failure
    when it does not), then the endpoint let go: the exit code and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "optloop.run", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert endpoint.holding.wait(180), never
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    endpoint.release()
    return proc.returncode, err


def test_sigterm_exits_130_marks_the_runs_killed_and_the_same_command_resumes_and_exits_0(
    tmp_path,
):
    """Exit 130 and exit 0, on the real CLI against a scripted endpoint (no model): SIGTERM while
    trial 1 is evaluated; then the same command (no --run-name) finds the run, ends the half-done
    trial's child run KILLED and deletes it, redoes it, and finishes with the costs of both
    processes."""
    from experiments.bench.crash import env_for, read_store, run_args
    from optloop.testing.oracle import OracleEndpoint

    runs = tmp_path / "state" / "runs"

    def trial_1_under_way() -> bool:
        trials = checkpoint_trials(runs)
        return trials is not None and len(trials) == 1 and trials[0].evaluation is None

    with OracleEndpoint() as endpoint:
        endpoint.hold_when = trial_1_under_way
        args = run_args(
            tmp_path, 1, endpoint.base_url, extra=["--json", str(tmp_path / "result.json")]
        )
        env = env_for(tmp_path, endpoint.base_url)
        code, err = terminated_when_held(args, env, endpoint, "trial 1 never started")
        [name] = [p.name for p in runs.iterdir()]
        last = err.strip().splitlines()[-1]
        assert code == 130, err[-3000:]
        assert last == (
            f"optloop: interrupted (SIGTERM): run {name} is saved (0 of 1 trials done), its "
            "MLflow runs marked KILLED; resume it with the same command: python -m optloop.run "
            f"{shlex.join(args)}"
        )
        store = read_store(tmp_path)
        assert (
            store.parents == ["KILLED"] and store.statuses == {"KILLED": 2} and not store.running
        )  # parent, trial 1
        saved = Checkpoint.load(runs / name / "checkpoint.json")
        assert (
            saved.processes == 1 and saved.spending["llm_calls"] > 0 and not saved.finished
        )  # what it spent

        again = subprocess.run(
            [sys.executable, "-m", "optloop.run", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.splitlines()[0].startswith(
        f"optloop.run resuming {name}, the latest unfinished run of these settings (0 of 1 "
        "trials done, 1 process(es) "
        "so far); --new starts afresh"
    ), again.stderr[:500]
    store = read_store(tmp_path)
    assert store.parents == ["FINISHED"] and not store.running and store.trials == [1]
    assert store.discarded == [
        "trial-1 KILLED"
    ]  # the half-done trial: ended KILLED, then deleted, then redone
    assert store.dev_steps == [0, 1]
    result = json.loads((tmp_path / "result.json").read_text())
    assert (
        result["cost"]["processes"] == 2
        and result["cost"]["llm_calls"] > saved.spending["llm_calls"]
    )
    assert Checkpoint.load(runs / name / "checkpoint.json").finished


def test_sigterm_mid_batch_resumes_the_batch_and_ends_as_the_uninterrupted_batched_run(tmp_path):
    """--batch 2 on the real CLI against the scripted endpoint: SIGTERM while the batch's two
    trials are evaluated (both in the checkpoint, neither evaluated, no child run open yet); the
    same command redoes them as a batch and the run ends with the candidates, accuracies and
    held-out figures of an uninterrupted --batch 2 run."""
    from experiments.bench.crash import OracleEndpoint, env_for, read_store, run_args

    def outcome(path: Path) -> tuple:
        result = json.loads(path.read_text())
        return (
            result["baseline_dev"],
            [(t["trial"], t["origin"], t["dev"]) for t in result["tried"]],
            result["test_before"],
            result["test_after"],
            result["changed_sites"],
        )

    clean_dir, killed_dir = tmp_path / "clean", tmp_path / "killed"
    runs = killed_dir / "state" / "runs"

    def batch_under_way() -> bool:
        trials = checkpoint_trials(runs)
        return (
            trials is not None and len(trials) == 2 and all(t.evaluation is None for t in trials)
        )

    with OracleEndpoint() as endpoint:
        clean_args = run_args(
            clean_dir,
            2,
            endpoint.base_url,
            extra=["--batch", "2", "--json", str(clean_dir / "result.json")],
        )
        clean = cli(clean_args, env_for(clean_dir, endpoint.base_url))
        assert clean.returncode == 0, clean.stderr[-3000:]
        endpoint.hold_when = batch_under_way
        args = run_args(
            killed_dir,
            2,
            endpoint.base_url,
            extra=["--batch", "2", "--json", str(killed_dir / "result.json")],
        )
        env = env_for(killed_dir, endpoint.base_url)
        code, err = terminated_when_held(args, env, endpoint, "the batch never started")
        assert code == 130, err[-3000:]
        assert "(0 of 2 trials done)" in err.strip().splitlines()[-1]
        again = cli(args, env)
    assert again.returncode == 0, again.stderr[-3000:]
    store = read_store(killed_dir)
    assert store.parents == ["FINISHED"] and not store.running and store.trials == [1, 2]
    assert store.dev_steps == [0, 1, 2]
    assert outcome(killed_dir / "result.json") == outcome(clean_dir / "result.json")
    assert json.loads((killed_dir / "result.json").read_text())["cost"]["processes"] == 2


def test_the_summary_says_what_every_process_spent_and_how_many_there_were():
    from optloop.cli.run_tables import cost_line

    assert (
        cost_line(
            {
                "llm_calls": 112,
                "model_calls": 31,
                "tokens": 21481,
                "seconds": 55.04,
                "processes": 2,
            }
        )
        == "112 LLM calls (31 computed), 21481 tokens, 55.0 s; the run took 2 processes"
    )
    assert cost_line(
        {
            "llm_calls": 3,
            "model_calls": 3,
            "tokens": 30,
            "seconds": 1,
            "cost_usd": 0.01234,
            "processes": 1,
        }
    ).endswith("1.0 s, $0.0123; the run took 1 process")
    assert cost_line(
        {
            "llm_calls": 3,
            "model_calls": 3,
            "tokens": 30,
            "seconds": 1,
            "cost_usd": 0.000002,
            "proposer_cost_usd": 0.0000005,
            "processes": 1,
        }
    ).endswith("1.0 s, $2.5e-06; the run took 1 process")


# --- spending limits and --estimate (exit code 3) ------------------------------------------------


def parent_run(tmp_path: Path):
    """The run's MLflow parent run, read back from the store (status, tags, metrics)."""
    from mlflow.tracking import MlflowClient

    from experiments.bench.crash import SYSTEM

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"optloop-{SYSTEM}")
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    return parent, children


def the_checkpoint(tmp_path: Path) -> Checkpoint:
    [path] = (tmp_path / "state" / "runs").glob("*/checkpoint.json")
    return Checkpoint.load(path)


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "optloop.run", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def with_flag(args: list[str], flag: str, value: str) -> list[str]:
    return [*args, flag, value]


def test_estimate_then_max_calls_stops_with_exit_3_and_a_higher_limit_resumes_the_baseline(
    tmp_path,
):
    """--estimate evaluates the baseline only (exit 0, "no price" for an unpriced model);
    --max-calls stops the same run after its first trial (exit 3, one line naming the limit and the
    command); a higher --max-calls resumes it (the limit is not a setting of the run) and finishes
    it on the baseline the estimate left.

    The estimate counts the optimizer's own calls: on this run (the edit optimizer, md_flat on
    builtin:tiny, budget 2) each of its two rounds (the second after trial 1 beats the baseline)
    screens the best and 10 edits (5 of answer, 5 of md_flat.curate, both blamed) on the 4 train
    questions, about 64 requests, over three times what the trials and the held-out test make;
    without them the estimate said 31 calls for a run of about 100. With them it must come within
    25% of the run's requests: the loopback endpoint answers deterministically and the edits are
    seeded, so what is left between them is the stores each resumed process rebuilds (its cache
    hits are requests) and the paraphrase the model expects. An --estimate after the first trial
    measures the optimizer's calls on it instead, within the same bound."""
    from experiments.bench.crash import env_for, run_args
    from optloop.testing.oracle import OracleEndpoint

    with OracleEndpoint() as endpoint:
        args, env = run_args(tmp_path, 2, endpoint.base_url), env_for(tmp_path, endpoint.base_url)
        estimated = cli([*args, "--estimate", "--json", str(tmp_path / "estimate.json")], env)
        assert estimated.returncode == 0, estimated.stderr[-3000:]
        assert (
            "held-out test" in estimated.stderr
            and "2 trials" in estimated.stderr
            and "no price" in estimated.stderr
        )
        assert "nothing else ran: the baseline is saved" in estimated.stderr
        assert "hours: requests x mean latency / concurrency" in estimated.stderr
        assert (
            "optimizer (edit, modeled)" in estimated.stderr and "optimizer: " in estimated.stderr
        )
        assert (
            "calls a trial" in estimated.stderr
            and "the edit model (optloop/loop/optimizers/edit.py)" in estimated.stderr
        )
        figures = json.loads((tmp_path / "estimate.json").read_text())
        assert (figures["dataset"], figures["n_dev_questions"], figures["n_test_questions"]) == (
            "builtin:tiny",
            3,
            2,
        )
        assert figures["hours"] == figures["total"]["hours"] > 0
        [trials] = [
            p for p in figures["parts"] if p["part"] == "2 trials"
        ]  # floored by dev's longest chain
        assert trials["floor"]["split"] == "dev" and trials["floor"]["requests"] > 0
        ckpt = the_checkpoint(tmp_path)
        baseline = ckpt.baseline_dev
        assert baseline is not None and ckpt.trials == [] and not ckpt.finished
        assert (
            baseline.lm_seconds is not None
            and baseline.cost_usd is None
            and "answer" in baseline.sites
        )
        parent, _ = parent_run(tmp_path)
        assert (
            parent.info.status == "KILLED" and parent.data.tags["optloop.stopped_by"] == "estimate"
        )

        # the control on dev comes before the first trial: its part of the estimate, the
        # baseline's dev requests (the same split, every one computed: its new prompts)
        [control] = [p for p in figures["parts"] if p["part"] == "control on dev"]
        assert control["evaluations"] == 1 and control["calls"] == baseline.llm_calls
        limit = (
            baseline.model_calls + ckpt.baseline_train.model_calls + control["calls"] + 1
        )  # reached by the first trial
        stopped = cli(with_flag(args, "--max-calls", str(limit)), env)
        assert stopped.returncode == 3, stopped.stderr[-3000:]
        assert stopped.stderr.splitlines()[0].startswith("optloop.run resuming ")
        last = stopped.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"optloop: stopped: --max-calls {limit} reached: the run has made "
        ), last
        assert "(1 of 2 trials done)" in last and "optloop.stopped_by=max-calls" in last
        assert last.endswith(
            f"re-run the same command with a higher --max-calls to go on: python -m optloop.run "
            f"{shlex.join(with_flag(args, '--max-calls', str(limit)))}"
        )
        ckpt = the_checkpoint(tmp_path)
        assert [t.evaluation is not None for t in ckpt.trials] == [
            True
        ] and ckpt.baseline_dev == baseline
        parent, children = parent_run(tmp_path)
        assert (
            parent.info.status == "KILLED"
            and parent.data.tags["optloop.stopped_by"] == "max-calls"
        )
        assert {name: r.info.status for name, r in children.items()} == {"trial-1": "FINISHED"}

        again = cli(
            [*args, "--estimate", "--json", str(tmp_path / "measured.json")], env
        )  # trial 1 is finished
        assert again.returncode == 0 and "optimizer (edit, measured)" in again.stderr, (
            again.stderr[-3000:]
        )
        assert "from the 1 finished trial(s): " in again.stderr
        measured = json.loads((tmp_path / "measured.json").read_text())

        done = cli(
            [*with_flag(args, "--max-calls", "100000"), "--json", str(tmp_path / "result.json")],
            env,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    # before the trials left, the projection of the rest and its ETA; then a line for the trial,
    # with its ETA
    assert (
        "projected: " in done.stderr
        and "ETA " in done.stderr.split("projected: ")[1].splitlines()[0]
    )
    assert re.search(
        r"^(\[[^\]]+\] )?trial 2/2 dev \d\.\d{3} \(best \d\.\d{3}\) \d+ s, ETA ",
        done.stderr,
        re.MULTILINE,
    ), done.stderr
    ckpt = the_checkpoint(tmp_path)
    assert (
        ckpt.finished and ckpt.baseline_dev == baseline and len(ckpt.trials) == 2
    )  # the same baseline, reused
    parent, children = parent_run(tmp_path)
    assert parent.info.status == "FINISHED" and "optloop.stopped_by" not in parent.data.tags
    assert sorted(children) == ["trial-1", "trial-2"]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["evaluations"] == 2 and result["cost"]["processes"] == 4
    made = result["cost"][
        "llm_calls"
    ]  # every request of the four processes (one LM: the proposer's are in it)
    [optimizer] = [p for p in figures["parts"] if p["part"].startswith("optimizer")]
    # one round, and one more after trial 1 beats the baseline (the oracle's edits do)
    assert figures["optimizer"]["rounds"] == 2 and figures["optimizer"]["trials_per_round"] == 16
    assert abs(figures["total"]["calls"] - made) <= 0.25 * made, (figures["total"], made)
    assert (
        figures["total"]["calls"] - optimizer["calls"] < 0.5 * made
    )  # what the estimate said without it
    # measured on trial 1's round, which holds the store rebuilds of the processes that resumed
    # (redone steps count as the optimizer's), and scaled by the model's two rounds: within 35%
    # (a round with written edits screens 16 programs, so its redone share weighs more than at 10)
    assert (
        measured["optimizer"]["measured"] and abs(measured["total"]["calls"] - made) <= 0.35 * made
    )


def test_max_cost_on_a_priced_model_stops_with_exit_3_and_logs_dollars_per_trial_and_site(
    tmp_path,
):
    """gpt-4o-mini's price (litellm's table) on the scripted endpoint's usage (7 + 3 tokens a
    call): --max-cost stops the run after its first trial; a higher one resumes and finishes it;
    dollars, calls and tokens are logged per trial and per site on the trial's child run, and the
    run's totals on the parent."""
    from experiments.bench.crash import env_for, run_args
    from optloop.lm import model_price
    from optloop.testing.oracle import OracleEndpoint

    price = model_price("gpt-4o-mini")
    assert price is not None
    per_call = 7 * price.input + 3 * price.output
    with OracleEndpoint() as endpoint:
        args = run_args(tmp_path, 2, endpoint.base_url)
        args[args.index("openai:oracle")] = "openai:gpt-4o-mini"
        env = env_for(tmp_path, endpoint.base_url)
        stopped = cli(
            with_flag(args, "--max-cost", "0.00001"), env
        )  # about 3.5 calls' worth: the baseline's train
        assert stopped.returncode == 3, stopped.stderr[-3000:]
        last = stopped.stderr.strip().splitlines()[-1]
        assert last.startswith(
            "optloop: stopped: --max-cost 1e-05 reached: the run has spent $"
        ), last
        assert "re-run the same command with a higher --max-cost to go on" in last
        ckpt = the_checkpoint(tmp_path)
        assert (
            ckpt.baseline_train is not None and ckpt.baseline_dev is None
        )  # stopped before the baseline's dev
        assert ckpt.baseline_train.cost_usd == pytest.approx(
            ckpt.baseline_train.model_calls * per_call
        )
        parent, _ = parent_run(tmp_path)
        assert (
            parent.info.status == "KILLED" and parent.data.tags["optloop.stopped_by"] == "max-cost"
        )

        done = cli(
            [*with_flag(args, "--max-cost", "1"), "--json", str(tmp_path / "result.json")], env
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.splitlines()[0].startswith("optloop.run resuming ")
    result = json.loads((tmp_path / "result.json").read_text())
    cost = result["cost"]
    assert (
        cost["cost_usd"] == pytest.approx(cost["model_calls"] * per_call)
        and cost["processes"] == 2
    )
    parent, children = parent_run(tmp_path)
    assert parent.info.status == "FINISHED" and "optloop.stopped_by" not in parent.data.tags
    metrics = parent.data.metrics
    assert metrics["cost_usd"] == pytest.approx(cost["cost_usd"])
    sites = {key.split("/", 1)[1] for key in metrics if key.startswith("cost_usd/")}
    assert {"answer", "md_flat.curate"} <= sites
    assert sum(metrics[f"cost_usd/{s}"] for s in sites) == pytest.approx(metrics["cost_usd"])
    assert sum(metrics[f"llm_calls/{s}"] for s in sites) == metrics["llm_calls"]
    trial = children["trial-1"].data.metrics
    assert (
        trial["cost_usd"] == pytest.approx(trial["model_calls"] * per_call)
        and trial["cost_usd"] > 0
    )
    assert trial["llm_calls/answer"] > 0 and trial["tokens/answer"] == pytest.approx(
        trial["cost_usd/answer"] / per_call * 10
    )


@pytest.mark.parametrize(
    "lm, named",
    [("openai:my-vllm-model", "openai:my-vllm-model"), ("local", "the embedded model")],
)
def test_max_cost_on_a_model_without_a_price_is_one_line_exit_2_before_anything_is_written(
    tmp_path, lm, named
):
    result = run_cli(
        ["--system", "md_flat", "--lm", lm, "--lm-base-url", closed_port_url(), "--max-cost", "5"],
        tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"optloop: error: --max-cost: {named} has no price in litellm's model cost map, "
        "so its dollars are unknown; limit the run with --max-calls N instead"
    )
    assert nothing_written(tmp_path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-cost", "0"], "give a limit above 0 dollars"),
        (["--max-cost", "lots"], "is not a number of dollars"),
        (["--max-calls", "0"], "give at least 1 model call"),
    ],
)
def test_bad_limits_are_one_line_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_limits_are_not_settings_of_the_run():
    """The same command with another limit (or --estimate) resumes the run: none of them reaches
    the config."""
    from optloop.cli.command import lm_settings_from_args
    from optloop.cli.run_args import run_config

    plain = build_parser().parse_args(["--system", "md_flat"])
    limited = build_parser().parse_args(
        ["--system", "md_flat", "--max-cost", "3", "--max-calls", "9", "--estimate"]
    )
    settings = lm_settings_from_args(plain)
    assert run_config(limited, settings).resume_key() == run_config(plain, settings).resume_key()
    assert run_config(limited, settings).digest() == run_config(plain, settings).digest()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sites", "nosuch"], "--sites nosuch: no such site on rag_bm25; its sites are answer"),
        (["--knob", "nosuch=3"], "rag_bm25 has no knob(s) ['nosuch']; its knobs are ['top_k']"),
        (
            ["--knob", "top_k=many"],
            "--knob top_k='many': rag_bm25's top_k takes a whole number, e.g. --knob top_k=5",
        ),
    ],
)
def test_bad_sites_and_knobs_are_one_line_exit_2_before_any_state(args, message, tmp_path):
    """Checked with the input: not after the baseline (--sites), nor as the system is built."""
    from optloop.testing.scripted import ScriptedOpenAIServer

    with ScriptedOpenAIServer([("ok", "{}")]) as server:
        result = run_cli(
            [
                *RAG_ON_TEST_ENDPOINT,
                server.base_url,
                *args,
            ],
            tmp_path,
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"optloop: error: {message}"
    assert nothing_written(tmp_path)


# --- defaults that make the command mean something -----------------------------------------------


def test_a_split_under_20_dev_or_test_questions_is_refused_in_one_line_and_nothing_is_written(
    tmp_path,
):
    result = run_cli(["--system", "md_flat", "--dataset", "builtin:tiny"], tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        "optloop: error: builtin:tiny splits into 3 dev and 2 test questions, fewer than 20"
    )
    assert "--dataset" in line and "--split" in line and "--allow-small-splits" in line
    assert nothing_written(tmp_path)


def test_without_a_dataset_each_system_runs_on_a_generated_one_with_20_dev_and_20_test_questions():
    from optloop.cli.command import lm_settings_from_args
    from optloop.datasets import load_dataset
    from optloop.datasets.defaults import default_dataset
    from optloop.loop.policy import questions, split_dataset
    from systems import SYSTEMS

    text = " ".join(build_parser().format_help().split())
    for system in SYSTEMS:
        uri = default_dataset(system)
        assert uri.startswith("synthetic:") and uri in text and system in text
        config = run_config(args_of("--system", system), lm_settings_from_args(args_of()))
        assert config.dataset == uri
        _, dev, test = split_dataset(load_dataset(uri), config)
        assert questions(dev) >= 20 and questions(test) >= 20


def test_batch_reaches_the_config_and_only_a_batch_above_1_changes_the_run_key():
    from optloop.cli.command import lm_settings_from_args

    settings = lm_settings_from_args(args_of())
    one, four = run_config(args_of(), settings), run_config(args_of("--batch", "4"), settings)
    assert one.batch == 1 and four.batch == 4
    assert (
        one.resume_key() == one.model_copy(update={"batch": 1}).resume_key() != four.resume_key()
    )
    assert "batch" not in one.model_dump(exclude=one._unset_later_fields())


def test_no_control_reaches_the_config_and_changes_the_run_key_and_the_default_does_not():
    from optloop.cli.command import lm_settings_from_args

    settings = lm_settings_from_args(args_of())
    on, off = run_config(args_of(), settings), run_config(args_of("--no-control"), settings)
    assert on.control and not off.control
    assert on.resume_key() != off.resume_key() and on.digest() != off.digest()
    # a run started before the control existed has the digests of one with it on
    assert "control" not in on.model_dump(exclude=on._unset_later_fields())
    assert on.resume_key() == on.model_copy(update={"control": True}).resume_key()


def test_exit_4_when_the_calls_of_an_evaluation_fail_and_no_accuracy_is_reported(tmp_path):
    from optloop.testing.scripted import ScriptedOpenAIServer

    too_long = (
        400,
        {},
        {
            "message": "This model's maximum context length is 2048 tokens. However, you "
            "requested 9658 tokens (9146 in the messages, 512 in the completion).",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        },
    )
    with ScriptedOpenAIServer([("ok", "pong"), ("status", too_long)]) as server:
        result = run_cli(
            [
                *RAG_ON_TEST_ENDPOINT,
                server.base_url,
                "--optimizer",
                "edit",
                "--budget",
                "1",
            ],
            tmp_path,
        )
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 4, result.stderr
    assert (
        "LM calls failed after their retries in the train evaluation of candidate baseline" in last
    )
    assert (
        "the server's context is 2048" in last
        and "--n_ctx" in last
        and "rerun the same command" in last
    )
    assert "accuracy" not in result.stdout + result.stderr
    assert len([r for r in server.requests if r["body"]["messages"][-1]["content"] != "ping"]) > 0


def test_the_default_optimizer_follows_who_writes_the_instructions():
    assert default_optimizer(LMSettings.from_spec("local")) == "edit"
    assert default_optimizer(LMSettings.from_spec("openai:gpt-4o-mini")) == "simba"
    assert config_of(args_of()).optimizer == "edit"  # the embedded model, no --optimizer
    assert config_of(args_of("--optimizer", "gepa")).optimizer == "gepa"


# --- the trivial-instruction control -------------------------------------------------------------


def test_the_summary_reports_the_trivial_instruction_control_and_no_control_skips_it(tmp_path):
    """The real CLI against the scripted endpoint: the summary shows the start prompt, the trivial
    instruction and the loop's best on dev and test, and the paired differences loop - start and
    loop - control; the result, MLflow's metrics, tag and summary.json carry the control. With
    --no-control none of it is evaluated and the summary says what the report cannot tell."""
    from mlflow.tracking import MlflowClient

    from experiments.bench.crash import env_for, run_args
    from optloop.artifacts import SUMMARY
    from optloop.loop.policy import NO_CONTROL
    from optloop.loop.tracking.names import BEATS_CONTROL
    from optloop.testing.oracle import OracleEndpoint

    done: dict[str, subprocess.CompletedProcess[str]] = {}
    with OracleEndpoint() as endpoint:
        for name, extra in (("control", []), ("none", ["--no-control"])):
            work = tmp_path / name
            args = run_args(
                work, 1, endpoint.base_url, extra=[*extra, "--json", str(work / "result.json")]
            )
            done[name] = cli(args, env_for(work, endpoint.base_url))
            assert done[name].returncode == 0, done[name].stderr[-3000:]

    text = done["control"].stderr
    result = json.loads((tmp_path / "control" / "result.json").read_text())
    sites = result["control_sites"]
    assert sites and set(sites) <= set(result["targets"])  # the blamed prompt sites
    assert (
        f"control (the trivial instruction at {', '.join(sites)}): dev " in text
    )  # before trials
    assert text.index("control (the trivial instruction at") < text.index("trial 1/1")
    for row in ("start prompt (--start)", "trivial instruction (control: ", "loop's best"):
        assert row in text, row
    assert "loop \u2212 start prompt" in text and "loop \u2212 control" in text
    assert "paired: " in text and "beats the control" in text
    assert result["test_control_ci"]["n"] == result["n_test"] and result["control_dev"] is not None
    assert result["delta_control_ci"] is not None and result["beats_control"] is not None
    ckpt = the_checkpoint(tmp_path / "control")
    assert ckpt.control_dev is not None and ckpt.control_test is not None
    parent, _ = parent_run(tmp_path / "control")
    assert {
        "acc_dev_control",
        "acc_test_control",
        "acc_test_control_ci_low",
        "delta_test_control",
        "delta_test_control_ci_low",
        "delta_test_control_ci_high",
    } <= set(parent.data.metrics)
    assert parent.data.metrics["acc_dev_control"] == pytest.approx(result["control_dev"])
    assert parent.data.tags[BEATS_CONTROL] == str(result["beats_control"])
    client = MlflowClient(f"sqlite:///{tmp_path / 'control' / 'mlruns' / 'mlflow.db'}")
    path = client.download_artifacts(parent.info.run_id, SUMMARY, str(tmp_path))
    summary = json.loads(Path(path).read_text())
    assert [r["program"] for r in summary["rows"]] == ["own", "control", "best"]
    assert [d["against"] for d in summary["differences"]] == ["own", "control"]
    assert summary["beats_control"] == result["beats_control"]
    assert set(summary["control_prompts"]) == set(sites) and all(
        prompt.startswith("Given the fields") for prompt in summary["control_prompts"].values()
    )

    none = done["none"].stderr
    result = json.loads((tmp_path / "none" / "result.json").read_text())
    assert result["control_note"] == NO_CONTROL and result["control_sites"] == []
    assert result["control_dev"] is None and result["beats_control"] is None
    assert "trivial instruction (control)" in none and "not evaluated" in none
    assert "loop \u2212 control" not in none and "control (the trivial instruction" not in none
    assert the_checkpoint(tmp_path / "none").control_dev is None
    parent, _ = parent_run(tmp_path / "none")
    assert "acc_dev_control" not in parent.data.metrics
    assert parent.data.tags[BEATS_CONTROL] == "no control"
    assert parent.data.params["control"] == "False"
