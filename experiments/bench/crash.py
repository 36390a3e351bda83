"""Crash consistency of ``python -m optloop.run``, measured: SIGKILL at each checkpoint boundary in
turn, resume with the same command, compare with an uninterrupted run.

    python -m experiments.bench.crash                 # the matrix (md_flat on builtin:tiny, edit,
                                                      # budget 3)
    python -m experiments.bench.crash --shared        # also: two Optuna workers, one killed and
                                                      # restarted
    python -m experiments.bench.crash --json OUT.json

Every process is the real CLI against :class:`~optloop.testing.oracle.OracleEndpoint`, a loopback
OpenAI-compatible server that needs no model: md_flat's curate call keeps the session's user lines
as facts, the answer call gives the gold answer when the memories hold it, unless the answer
instruction carries the run's planted sentence (``--start answer=+...``), and everything else gets
a schema-valid stub. So the edit optimizer's deletion of the planted sentence is a real
improvement: the run registers a prompt and moves the ``champion`` alias, and every kill point
has something to lose.

A killed process is started by this module's ``kill`` command, which installs one hook and then
runs ``optloop.run`` exactly as the CLI does; the hook sends the process SIGKILL at its point (just
after the checkpoint write that ends the baseline, the trivial-instruction control's dev
evaluation, a trial, or the baseline's held-out test; inside a trial once its child run holds its
results; after the registry's new version and before its alias). The resuming process is the
plain ``python -m optloop.run`` with the same arguments (no ``--run-name``): it must find the
killed run by itself.

Compared with the uninterrupted run: the candidates tried and their dev accuracies, the held-out
accuracies, the registered prompt versions and the ``champion`` alias (in the MLflow registry),
no MLflow run left RUNNING (deleted ones included), no trial's child run or ``acc_dev`` point
twice, and the cost: the resumed run's model calls and tokens may exceed the uninterrupted run's
by at most the costliest step between two of its checkpoints (one trial, or one held-out
evaluation). Its LLM calls, cache hits included, and its seconds (every process's, startup
included) are reported, not bounded: a fresh process reads back from the LM cache what the killed
one computed (a half-done trial redone, its stores rebuilt, since stores do not survive a
process), which costs no model call but can pass a step of the uninterrupted run, whose trials
reuse the stores it built.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from optloop.cli.command import CommandParser, parse_command
from optloop.testing.oracle import DATASET, PLANTED, OracleEndpoint

REPO = Path(__file__).resolve().parents[2]

SYSTEM = "md_flat"
COSTS = ("llm_calls", "model_calls", "tokens")
BOUNDED = ("model_calls", "tokens")  # what the model computed (COSTS less the cache hits)


# --- the killed process: hooks, then optloop.run -------------------------------------------------


def _die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _evaluated(ckpt: Any) -> int:
    return sum(t.evaluation is not None for t in ckpt.trials)


def reached(point: str, ckpt: Any) -> bool:
    """Whether the checkpoint just written is the kill point ``point`` (a checkpoint boundary)."""
    if point == "baseline":
        return ckpt.baseline_dev is not None and not ckpt.trials
    if point == "control":
        return ckpt.control_dev is not None and not ckpt.trials
    if point.startswith("trial:"):
        k = int(point.split(":")[1])
        return len(ckpt.trials) == k and _evaluated(ckpt) == k and ckpt.test_before is None
    if point == "test":
        return ckpt.test_before is not None and ckpt.test_after is None
    return False


def _wait_for(after: Path | None, timeout: float = 120) -> None:
    """Hold this process until the file ``after`` exists (the bench says another worker is at
    work), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while after is not None and not after.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def install(point: str | None, record: Path | None, after: Path | None = None) -> None:
    """The hooks of a killed (or recorded) process: SIGKILL at ``point`` (at an ``in-`` trial
    point, once the file ``after`` exists); every checkpoint write's state and spending appended
    to ``record``."""
    import mlflow

    from optloop.loop import state
    from optloop.loop.tracking import sink as mlflow_sink

    save = state.Checkpoint.save

    def hooked_save(self: Any, path: Path) -> None:
        save(self, path)
        if record is not None:
            with record.open("a") as out:
                out.write(
                    json.dumps(
                        {
                            "evaluated": _evaluated(self),
                            "trials": len(self.trials),
                            "test_before": self.test_before is not None,
                            "test_after": self.test_after is not None,
                            "spending": self.spending,
                        }
                    )
                    + "\n"
                )
        if point is not None and reached(point, self):
            _die()

    state.Checkpoint.save = hooked_save  # type: ignore[method-assign]
    if point is not None and (point.startswith("in-trial:") or point == "in-first-trial"):
        log_trial = mlflow_sink.MlflowSink.log_trial

        def hooked_log_trial(self: Any, trial: int, *args: Any, **kwargs: Any) -> None:
            log_trial(self, trial, *args, **kwargs)
            if point == "in-first-trial" or trial == int(point.split(":")[1]):
                _wait_for(after)  # the trial stays open while it waits
                _die()  # the child run holds the trial's results; the checkpoint does not

        mlflow_sink.MlflowSink.log_trial = hooked_log_trial  # type: ignore[method-assign]
    if point == "register":
        register = mlflow.genai.register_prompt

        def hooked_register(*args: Any, **kwargs: Any) -> Any:
            register(*args, **kwargs)
            _die()  # a new version registered; its alias not moved, the checkpoint not told

        mlflow.genai.register_prompt = hooked_register


def kill_main(argv: Sequence[str]) -> int:
    """``python -m experiments.bench.crash kill [--at POINT] [--record FILE] [--after FILE] --
    <optloop.run arguments>``"""
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.crash kill")
    parser.add_argument("--at")
    parser.add_argument("--record", type=Path)
    parser.add_argument("--after", type=Path, help="at an in- trial point, die once FILE exists")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    install(ns.at, ns.record, ns.after)
    from optloop.cli.command import run_cli
    from optloop.cli.run import main

    return run_cli(main, [a for a in ns.args if a != "--"])


# --- one scenario --------------------------------------------------------------------------------


def run_args(
    work: Path, budget: int, base_url: str, *, optimizer: str = "edit", extra: Sequence[str] = ()
) -> list[str]:
    return [
        "--system",
        SYSTEM,
        "--dataset",
        DATASET,
        "--allow-small-splits",
        "--budget",
        str(budget),
        "--optimizer",
        optimizer,
        "--start",
        f"answer=+{PLANTED}",
        "--promote-if",
        "delta",
        "--lm",
        "openai:oracle",
        "--lm-base-url",
        base_url,
        "--lm-retries",
        "1",
        "--lm-timeout",
        "30",
        "--tracking-uri",
        f"sqlite:///{work / 'mlruns' / 'mlflow.db'}",
        *extra,
    ]


def env_for(work: Path, base_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "OPTLOOP_HOME": str(work / "state"),
        "OPTLOOP_MLRUNS": str(work / "mlruns"),
        "OPTLOOP_EMBED": "openai:oracle",
        "OPENAI_BASE_URL": base_url,
        "PYTHONPATH": str(REPO),
    }


def optloop_run(
    args: Sequence[str],
    env: dict[str, str],
    *,
    kill_at: str | None = None,
    record: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """The same command: ``python -m optloop.run ARGS``, or under the ``kill`` launcher."""
    if kill_at is None and record is None:
        cmd = [sys.executable, "-m", "optloop.run", *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "experiments.bench.crash",
            "kill",
            *(["--at", kill_at] if kill_at else []),
            *(["--record", str(record)] if record else []),
            "--",
            *args,
        ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


class Store(BaseModel):
    """What one scenario left in MLflow."""

    statuses: dict[str, int] = Field(description="status -> runs, deleted ones included")
    running: list[str] = Field(description="runs left RUNNING (deleted ones included)")
    trials: list[int] = Field(description="the trial numbers of the active child runs")
    discarded: list[str] = Field(description="deleted child runs: 'trial-<k> <status>'")
    dev_steps: list[int] = Field(description="acc_dev steps of the parent run")
    parents: list[str] = Field(description="the parent runs' statuses")
    registry: dict[str, dict[str, Any]] = Field(
        description="prompt -> versions and the champion's version"
    )


def read_store(work: Path) -> Store:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"optloop-{SYSTEM}")
    runs = (
        client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)
        if experiment
        else []
    )
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    statuses: dict[str, int] = {}
    for r in runs:
        statuses[r.info.status] = statuses.get(r.info.status, 0) + 1
    dev_steps = sorted(
        m.step for p in parents for m in client.get_metric_history(p.info.run_id, "acc_dev")
    )
    registry: dict[str, dict[str, Any]] = {}
    for prompt in client.search_prompts():
        versions = sorted(int(v.version) for v in client.search_prompt_versions(prompt.name))
        try:
            champion = int(client.get_prompt_version_by_alias(prompt.name, "champion").version)
        except Exception:  # noqa: BLE001 - no champion alias
            champion = None
        registry[prompt.name] = {"versions": versions, "champion": champion}
    running = [r.info.run_name or r.info.run_id for r in runs if r.info.status == "RUNNING"]
    return Store(
        statuses=statuses,
        running=running,
        trials=sorted(
            int(r.data.params["trial"])
            for r in children
            if r.info.lifecycle_stage == "active" and "trial" in r.data.params
        ),
        discarded=sorted(
            f"{r.info.run_name} {r.info.status}"
            for r in children
            if r.info.lifecycle_stage == "deleted"
        ),
        dev_steps=dev_steps,
        parents=[p.info.status for p in parents],
        registry=registry,
    )


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """What must be identical between a resumed run and an uninterrupted one."""
    keys = (
        "targets",
        "tunable_sites",
        "tunable_knobs",
        "baseline_dev",
        "best_dev",
        "best_trial",
        "test_before",
        "test_after",
        "evaluations",
        "changed_sites",
        "changed_knobs",
        "promoted",
        "promotion_reason",
        "registered",
        "n_dev",
        "n_test",
        "test_before_ci",
        "test_after_ci",
        "delta_test_ci",
        "tried",
        "prompt_diff",
        "control_sites",
        "control_dev",
        "test_control_ci",
        "delta_control_ci",
        "beats_control",
    )
    return {k: result[k] for k in keys}


def step_costs(record: Path, budget: int) -> dict[str, dict[str, float]]:
    """The uninterrupted run's cost of each step between two of its checkpoints: each trial, the
    held-out test (both evaluations), from its recorded checkpoint writes."""
    snaps = [json.loads(line) for line in record.read_text().splitlines()]

    def at(pred: Callable[[dict[str, Any]], bool], last: bool) -> dict[str, float]:
        found = [s["spending"] for s in snaps if pred(s)]
        return found[-1 if last else 0]

    def diff(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: b.get(k, 0) - a.get(k, 0) for k in (*COSTS, "seconds")}

    steps = {
        f"trial {k}": diff(
            at(lambda s, k=k: s["evaluated"] == k - 1, True),
            at(lambda s, k=k: s["evaluated"] == k and s["trials"] == k, False),
        )
        for k in range(1, budget + 1)
    }
    steps["held-out test"] = diff(
        at(lambda s: s["evaluated"] == budget and not s["test_before"], True),
        at(lambda s: s["test_after"], False),
    )
    return steps


class Row(BaseModel):
    kill_point: str
    killed: bool = Field(description="the first process died by SIGKILL at its point")
    resumed: bool = Field(
        description="the same command found the run, said so, and finished it (exit 0)"
    )
    identical: bool = Field(
        description="candidates, accuracies, registry versions and alias as uninterrupted"
    )
    no_running: bool
    no_duplicate: bool
    extra: dict[str, float] = Field(description="resumed minus uninterrupted cost")
    within_one_step: bool = Field(
        description="extra model calls and tokens within the costliest step (LLM calls, cache "
        "hits included, are reported in ``extra``)"
    )
    processes: int
    discarded: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


KILL_POINTS = {
    "after the baseline": "baseline",
    "after the control on dev": "control",
    "during trial 1": "in-trial:1",
    "after trial 1": "trial:1",
    "during trial 2": "in-trial:2",
    "after trial 2": "trial:2",
    "during trial 3": "in-trial:3",
    "after trial 3": "trial:3",
    "during the held-out test": "test",
    "during registry promotion": "register",
}


def scenario(
    root: Path,
    label: str,
    point: str,
    budget: int,
    endpoint: OracleEndpoint,
    clean: dict[str, Any],
    clean_store: Store,
    bound: dict[str, float],
) -> Row:
    work = root / re.sub(r"\W+", "-", label).strip("-")
    args = run_args(work, budget, endpoint.base_url, extra=["--json", str(work / "result.json")])
    env = env_for(work, endpoint.base_url)
    first = optloop_run(args, env, kill_at=point)
    killed = first.returncode == -signal.SIGKILL
    problems = (
        []
        if killed
        else [f"not killed at {point}: exit {first.returncode}: {first.stderr[-500:]}"]
    )
    second = optloop_run(args, env)
    resumed = (
        second.returncode == 0 and "resuming" in second.stderr.splitlines()[0]
        if second.stderr
        else False
    )
    if not resumed:
        problems.append(f"resume: exit {second.returncode}: {second.stderr[-800:]}")
        return Row(
            kill_point=label,
            killed=killed,
            resumed=False,
            identical=False,
            no_running=False,
            no_duplicate=False,
            extra={},
            within_one_step=False,
            processes=0,
            problems=problems,
        )
    result = json.loads((work / "result.json").read_text())
    store = read_store(work)
    identical = comparable(result) == comparable(clean) and store.registry == clean_store.registry
    if not identical:
        problems.append(
            f"differs: {_differences(comparable(result), comparable(clean))}; registry "
            f"{store.registry} vs {clean_store.registry}"
        )
    no_running = not store.running and store.parents == ["FINISHED"]
    no_duplicate = store.trials == list(range(1, budget + 1)) and store.dev_steps == list(
        range(budget + 1)
    )
    if not (no_running and no_duplicate):
        problems.append(f"store: {store.model_dump()}")
    if point.startswith("in-trial:") and store.discarded != [
        f"trial-{point.split(':')[1]} KILLED"
    ]:
        problems.append(f"the half-done trial was not ended KILLED and deleted: {store.discarded}")
    extra = {
        k: round(result["cost"].get(k, 0) - clean["cost"].get(k, 0), 1)
        for k in (*COSTS, "seconds")
    }
    within = all(abs(extra[k]) <= bound[k] for k in BOUNDED)
    if not within:
        problems.append(f"extra cost {extra} beyond the costliest step {bound}")
    return Row(
        kill_point=label,
        killed=killed,
        resumed=resumed,
        identical=identical,
        no_running=no_running,
        no_duplicate=no_duplicate,
        extra=extra,
        within_one_step=within,
        processes=int(result["cost"].get("processes", 0)),
        discarded=store.discarded,
        problems=problems,
    )


def _differences(a: dict[str, Any], b: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {a[k]!r} != {b[k]!r}" for k in a if a[k] != b[k])[:1500]


class Matrix(BaseModel):
    budget: int
    clean: dict[str, Any] = Field(description="the uninterrupted run's figures")
    bound: dict[str, float] = Field(
        description="the costliest step between two checkpoints of the uninterrupted run"
    )
    rows: list[Row]
    shared: dict[str, Any] | None = None
    seconds: float


def matrix(
    root: Path,
    budget: int = 3,
    points: dict[str, str] | None = None,
    *,
    progress: Callable[[str], None] = lambda msg: None,
) -> Matrix:
    started = time.perf_counter()
    with OracleEndpoint() as endpoint:
        work = root / "uninterrupted"
        record = work / "checkpoints.jsonl"
        work.mkdir(parents=True, exist_ok=True)
        args = run_args(
            work, budget, endpoint.base_url, extra=["--json", str(work / "result.json")]
        )
        progress("the uninterrupted run")
        proc = optloop_run(args, env_for(work, endpoint.base_url), record=record)
        if proc.returncode != 0:
            raise RuntimeError(
                f"the uninterrupted run failed ({proc.returncode}): {proc.stderr[-2000:]}"
            )
        clean = json.loads((work / "result.json").read_text())
        clean_store = read_store(work)
        steps = step_costs(record, budget)
        bound = {k: max(s[k] for s in steps.values()) for k in (*COSTS, "seconds")}
        rows = []
        for label, point in (points or KILL_POINTS).items():
            progress(f"killed {label}")
            rows.append(scenario(root, label, point, budget, endpoint, clean, clean_store, bound))
    summary = {
        "tried": [(t["trial"], t["dev"], t["changed"]) for t in clean["tried"]],
        "test": (clean["test_before"], clean["test_after"]),
        "promoted": clean["promoted"],
        "registry": clean_store.registry,
        "cost": clean["cost"],
        "steps": steps,
    }
    return Matrix(
        budget=budget,
        clean=summary,
        bound=bound,
        rows=rows,
        seconds=round(time.perf_counter() - started, 1),
    )


# --- the shared study: one of two workers killed -------------------------------------------------


def shared(
    root: Path, budget: int = 3, *, progress: Callable[[str], None] = lambda msg: None
) -> dict[str, Any]:
    """Two ``--optimizer optuna`` workers started with the same command on one study; the first
    (the leader) is SIGKILLed inside its first trial while the second works on, then restarted with
    the same command."""
    work = root / "shared"
    work.mkdir(parents=True, exist_ok=True)
    with OracleEndpoint(delay=0.15) as endpoint:
        env = env_for(work, endpoint.base_url)
        args = [
            *run_args(
                work, budget, endpoint.base_url, optimizer="optuna", extra=["--run-name", "shared"]
            ),
            "--sites",
            "answer",
        ]
        ckpt = work / "state" / "runs" / "shared" / "checkpoint.json"
        # written once worker 1 joined: worker 0 dies in its first trial only then, so that the
        # two work on the study at once (else worker 1, slower to start, finds worker 0 dead and
        # resumes its checkpoint, and the restarted worker 0 comes to a run already done)
        joined = work / "worker1-joined"
        progress("shared study: worker 0, to be killed in its first trial")
        launcher = [
            sys.executable,
            "-m",
            "experiments.bench.crash",
            "kill",
            "--at",
            "in-first-trial",
            "--after",
            str(joined),
            "--",
        ]
        leader = subprocess.Popen(
            [*launcher, *args, "--json", str(work / "w0.json")],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        out1 = open(work / "worker1.log", "w")  # noqa: SIM115 - closed below
        other: subprocess.Popen[str] | None = None
        try:
            deadline = time.monotonic() + 120
            while not ckpt.exists() and time.monotonic() < deadline and leader.poll() is None:
                time.sleep(0.2)  # the first worker leads: it made the run's checkpoint
            progress("shared study: worker 1")
            other = subprocess.Popen(
                [sys.executable, "-m", "optloop.run", *args, "--json", str(work / "w1.json")],
                cwd=REPO,
                env=env,
                stdout=out1,
                stderr=subprocess.STDOUT,
                text=True,
            )
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and other.poll() is None:
                if "joined run shared as worker" in (work / "worker1.log").read_text():
                    break
                time.sleep(0.2)
            joined.touch()
            _, leader_err = leader.communicate(timeout=600)
            progress("shared study: worker 0 again, the same command")
            again = optloop_run([*args, "--json", str(work / "w0.json")], env)
            other.wait(timeout=600)
        finally:
            for proc in (leader, other):
                if proc is not None and proc.poll() is None:
                    proc.kill()
            out1.close()
    results = [
        json.loads(p.read_text()) for p in (work / "w0.json", work / "w1.json") if p.exists()
    ]
    for r in results:
        r.pop("lm", None)
    store = read_store(work)
    checks = {
        "worker 0 (the leader) was killed in its first trial": leader.returncode
        == -signal.SIGKILL,
        "worker 0 resumed with the same command (exit 0)": again.returncode == 0
        and "resuming shared" in again.stderr,
        "worker 1 finished (exit 0)": other is not None and other.returncode == 0,
        "both print one result": len(results) == 2 and results[0] == results[1],
        "the budget is exact": bool(results) and results[0]["evaluations"] == budget,
        "no trial twice": store.trials == list(range(1, budget + 1)),
        "no run left RUNNING": not store.running and store.parents == ["FINISHED"],
        "the killed trial ended KILLED, then deleted": len(store.discarded) == 1
        and store.discarded[0].endswith("KILLED"),
        "three processes in the cost": bool(results) and results[0]["cost"].get("processes") == 3,
    }
    log = (work / "worker1.log").read_text()
    return {
        "checks": checks,
        "cost": results[0]["cost"] if results else {},
        "store": store.model_dump(),
        "logs": {
            "worker 0 killed": leader_err[-800:],
            "worker 0 again": again.stderr[-1500:],
            "worker 1": log[-1500:],
        },
    }


# --- the table -----------------------------------------------------------------------------------


def markdown(m: Matrix) -> str:
    lines = [
        "| kill point | resumed | identical | no RUNNING, no duplicate | extra cost (LLM calls "
        "/ model calls / tokens / s) | processes |",
        "|---|---|---|---|---|---|",
    ]
    for r in m.rows:
        e = r.extra
        cost = (
            f"{e.get('llm_calls', 0):+.0f} / {e.get('model_calls', 0):+.0f} / "
            f"{e.get('tokens', 0):+.0f} / "
            f"{e.get('seconds', 0):+.1f}"
            if e
            else "-"
        )
        lines.append(
            f"| {r.kill_point} | {_yes(r.resumed)} | {_yes(r.identical)} | "
            f"{_yes(r.no_running and r.no_duplicate)} | {cost} | {r.processes} |"
        )
    b = m.bound
    lines.append(
        "\nOne step (the costliest trial or held-out test of the uninterrupted run): "
        f"{b['llm_calls']:.0f} LLM calls, {b['model_calls']:.0f} model calls, {b['tokens']:.0f} "
        f"tokens, {b['seconds']:.1f} s. Uninterrupted: {m.clean['cost']}."
    )
    if m.shared is not None:
        lines.append(
            "\nShared Optuna study, one of two workers killed: "
            + "; ".join(f"{k}: {_yes(v)}" for k, v in m.shared["checks"].items())
        )
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def table(m: Matrix) -> Table:
    t = Table(
        title=f"crash matrix: optloop.run {SYSTEM} on {DATASET}, edit, budget {m.budget}, "
        "SIGKILL then the same command"
    )
    for col in (
        "kill point",
        "resumed",
        "identical",
        "no RUNNING / dup.",
        "extra calls",
        "extra model calls",
        "extra tokens",
        "extra s",
        "processes",
    ):
        t.add_column(col, justify="left" if col == "kill point" else "right")
    for r in m.rows:
        e = r.extra
        t.add_row(
            r.kill_point,
            _yes(r.resumed),
            _yes(r.identical),
            _yes(r.no_running and r.no_duplicate),
            f"{e.get('llm_calls', 0):+.0f}",
            f"{e.get('model_calls', 0):+.0f}",
            f"{e.get('tokens', 0):+.0f}",
            f"{e.get('seconds', 0):+.1f}",
            str(r.processes),
        )
    return t


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["kill"]:
        return kill_main(argv[1:])
    parser = CommandParser("python -m experiments.bench.crash", __doc__)
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument(
        "--shared", action="store_true", help="also kill one of two Optuna workers"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--keep", type=Path, help="keep every scenario's state and MLflow store here"
    )
    args = parse_command(parser, argv)
    console = Console(stderr=True)
    root = args.keep or Path(tempfile.mkdtemp(prefix="optloop-crash-"))
    try:
        with console.status("crash matrix") as status:
            result = matrix(root, args.budget, progress=status.update)
            if args.shared:
                result.shared = shared(root, args.budget, progress=status.update)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    Console().print(table(result))
    print(markdown(result))
    for r in result.rows:
        for problem in r.problems:
            console.print(f"{r.kill_point}: {problem}", markup=False)
    if args.json:
        args.json.write_text(result.model_dump_json(indent=1))
    ok = all(
        r.killed
        and r.resumed
        and r.identical
        and r.no_running
        and r.no_duplicate
        and r.within_one_step
        and not r.problems
        for r in result.rows
    )
    return 0 if ok and (result.shared is None or all(result.shared["checks"].values())) else 1


if __name__ == "__main__":
    sys.exit(main())
