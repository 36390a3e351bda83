"""Reliability bench: the real loop against an LM endpoint that misbehaves on a schedule.

    python -m experiments.bench.chaos                        # md_flat on builtin:tiny, budget 1
    python -m experiments.bench.chaos --budget 2 --json faults.json

A loopback OpenAI-compatible server (:class:`optloop.testing.chaos.FaultyEndpoint`)
stands in front of the embedded LM. Request number ``n`` (1-based, counted by the
server) gets the fault the :class:`~optloop.testing.chaos.FaultSchedule` names for it,
or a real answer:

``http500`` / ``http503``  an HTTP error status
``truncated``              HTTP 200 and a JSON body cut off mid-way
``nonjson``                HTTP 200 and an HTML error page
``hang``                   no answer until past ``--lm-timeout``

The default schedule (a cycle of 20 requests) puts isolated faults of every kind,
which one retry cures, and one burst of two faults in a row, which outlasts
``--lm-retries 1`` and fails a call (the question it belonged to fails, the run
goes on: the bench passes ``--max-failed-share 1``).
``python -m optloop.run --system md_flat --lm openai:smollm2 --lm-base-url <server>
--lm-retries 1 --lm-timeout T`` runs against it in a subprocess, with its own state dir and
MLflow store under ``--work``.

Figures (printed, and written with ``--json``):

* **injected**: requests the server answered with a fault (server side);
* **cured**: failed attempts whose call a retry then completed (client side: the LM
  layer's call records, ``optloop.run --json``'s ``lm`` section);
* **surfaced**: failed attempts of calls that failed after their retries, the calls
  themselves, and the questions those failures lost (the run's checkpoint);
* **marked**: operations of the saved fault graphs carrying ``lm_faults`` / ``lm_error``.

Consistency: injected == cured + surfaced attempts (every fault the server injected
was seen by a retry or surfaced, and nothing else failed); the faults marked on the
graphs' operations == the faulted attempts the evaluations counted; every surfaced
call used all its attempts.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from optloop.artifacts import CHECKPOINT
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.testing.chaos import FaultSchedule, FaultyEndpoint
from optloop.tracing.graph import ExecutionGraph

REPO = Path(__file__).resolve().parents[2]

# --- reading a finished run --------------------------------------------------------------------


def evaluations(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """Every distinct evaluation a checkpoint holds (test_after is test_before when the baseline
    stayed best)."""
    found = [checkpoint.get("baseline_train"), checkpoint.get("baseline_dev")]
    found += [t.get("evaluation") for t in checkpoint.get("trials", [])]
    found += [checkpoint.get("test_before")]
    after = checkpoint.get("test_after")
    if after and after != checkpoint.get("test_before"):
        found.append(after)
    return [ev for ev in found if ev]


def graph_figures(evals: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Faults marked on the operations of the evaluations' fault graphs."""
    marked_ops, marked_faults, surfaced_ops, kinds = 0, 0, 0, Counter()
    examples: list[dict[str, Any]] = []
    for ev in evals:
        for path in ev.get("fault_graphs", []):
            graph = ExecutionGraph.load(Path(path))
            first = (graph.meta.get("evaluation") or {}).get("first_op", 0)
            for op in graph.faulted_ops():
                if (
                    op.seq < first
                ):  # copied from a store this evaluation reused: counted where it was built
                    continue
                marked_ops += 1
                marked_faults += len(op.lm_faults)
                surfaced_ops += op.lm_error is not None
                kinds.update(op.lm_faults)
                if len(examples) < 3:
                    examples.append(
                        {
                            "graph": Path(path).name,
                            "op": op.id,
                            "site": op.site,
                            "lm_attempts": op.lm_attempts,
                            "lm_faults": op.lm_faults,
                            "lm_error": op.lm_error,
                        }
                    )
    return {
        "ops_marked": marked_ops,
        "faults_marked": marked_faults,
        "ops_surfaced": surfaced_ops,
        "fault_kinds_marked": dict(kinds),
        "examples": examples,
    }


class Figures(BaseModel):
    command: str
    requests: int
    injected: int
    slow_answers: int  # real answers later than --lm-timeout: client-side faults nobody injected
    slowest_answer_s: float
    injected_by_kind: dict[str, int]
    faulted_attempts: int  # client side: every failed attempt the LM layer saw
    cured: int
    surfaced_attempts: int
    surfaced_calls: int
    surfaced_calls_in_evaluations: (
        int  # the rest hit the optimizer (SIMBA's runs, the proposer): a candidate fewer
    )
    questions_lost: int
    evaluation_faults: (
        int  # faulted attempts during the loop's evaluations (the rest: SIMBA, proposer, ping)
    )
    graphs: dict[str, Any]
    run_rc: int
    evaluations: int
    budget: int
    seconds: float
    checks: dict[str, bool]

    @property
    def consistent(self) -> bool:
        return all(self.checks.values())


def figures(
    endpoint: FaultyEndpoint,
    result: dict[str, Any],
    checkpoint: dict[str, Any],
    *,
    command: str,
    run_rc: int,
    budget: int,
    retries: int,
    seconds: float,
) -> Figures:
    lm = result.get("lm", {})
    evals = evaluations(checkpoint)
    graphs = graph_figures(evals)
    injected = sum(endpoint.injected().values())
    faulted, cured, calls = (
        int(lm.get("faults", 0)),
        int(lm.get("cured", 0)),
        int(lm.get("errors", 0)),
    )
    surfaced = faulted - cured
    evaluation_faults = sum(int(ev.get("lm_attempt_faults", 0)) for ev in evals)
    checks = {
        "run completed": run_rc == 0 and result.get("evaluations") == budget,
        "injected (+ slow answers) == cured + surfaced attempts": injected + endpoint.slow
        == cured + surfaced
        == faulted,
        "each surfaced call used all its attempts": surfaced == calls * (retries + 1),
        "graph faults == evaluation faults": graphs["faults_marked"] == evaluation_faults,
        "graph surfaced ops == evaluation failed calls": graphs["ops_surfaced"]
        == sum(int(ev.get("lm_failed_calls", 0)) for ev in evals),
    }
    return Figures(
        command=command,
        requests=len(endpoint.log),
        injected=injected,
        slow_answers=endpoint.slow,
        slowest_answer_s=round(max(endpoint.answer_seconds, default=0.0), 1),
        injected_by_kind=dict(endpoint.injected()),
        faulted_attempts=faulted,
        cured=cured,
        surfaced_attempts=surfaced,
        surfaced_calls=calls,
        surfaced_calls_in_evaluations=sum(int(ev.get("lm_failed_calls", 0)) for ev in evals),
        questions_lost=sum(bool(o.get("error")) for ev in evals for o in ev["outcomes"]),
        evaluation_faults=evaluation_faults,
        graphs=graphs,
        run_rc=run_rc,
        evaluations=int(result.get("evaluations", 0)),
        budget=budget,
        seconds=round(seconds, 1),
        checks=checks,
    )


# --- running ------------------------------------------------------------------------------------


def run_loop(
    base_url: str,
    work: Path,
    *,
    system: str,
    dataset: str,
    budget: int,
    timeout: float,
    retries: int,
    run_name: str = "faults",
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 1800,
    concurrency: int = 1,
) -> subprocess.CompletedProcess[str]:
    """``python -m optloop.run`` against ``base_url``, its state and MLflow store under ``work``.

    ``concurrency`` 1 by default (an endpoint's default is 8): the schedule counts requests in the
    order they arrive, and its burst of two faults in a row fails a call only when the call's retry
    is the very next request, which requests of other calls in flight would take instead."""
    cmd = [
        sys.executable,
        "-m",
        "optloop.run",
        "--system",
        system,
        "--dataset",
        dataset,
        "--allow-small-splits",
        "--budget",
        str(budget),
        "--lm",
        "openai:smollm2",
        "--lm-base-url",
        base_url,
        "--lm-timeout",
        str(timeout),
        "--lm-retries",
        str(retries),
        "--concurrency",
        str(concurrency),
        "--run-name",
        run_name,
        "--tracking-uri",
        f"sqlite:///{work / 'mlruns' / 'mlflow.db'}",
        "--json",
        str(work / f"{run_name}.json"),
        "--max-failed-share",
        "1",  # the bench counts the calls that fail after their retries: none stops the run
        *extra,
    ]
    run_env = {
        **os.environ,
        "OPTLOOP_HOME": str(work / "state"),
        "OPTLOOP_MLRUNS": str(work / "mlruns"),
        **(env or {}),
    }
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=REPO, env=run_env, timeout=timeout_s
    )


def upstream_lm(work: Path) -> Any:
    """The embedded SmolLM2 that answers behind the faulty endpoint (its own cache).

    Its decoding bounds are tighter than optloop's local defaults (JSON strings of 120
    characters, arrays of 4 items): a shorter answer is the server's business, and on a
    busy 2-core machine it keeps real answers well inside the client's timeout.
    """
    from optloop.lm import LMSettings, OptloopLM

    return OptloopLM(
        LMSettings.from_spec(
            "local",
            cache_path=work / "upstream_lm_cache.sqlite",
            max_string_chars=120,
            max_array_items=4,
        )
    )


def bench(
    work: Path,
    *,
    system: str = "md_flat",
    dataset: str = "builtin:tiny",
    budget: int = 1,
    timeout: float = 60.0,
    retries: int = 1,
    schedule: FaultSchedule | None = None,
    lm: Any = None,
    optimizer: str | None = None,
    stub: bool = False,
) -> tuple[Figures, subprocess.CompletedProcess[str]]:
    """The loop against a :class:`FaultyEndpoint` in front of ``lm``, and its figures.

    ``lm`` None: the embedded model (:func:`upstream_lm`); ``stub`` answers with
    :func:`optloop.testing.chaos.stub_answer` instead of any model (the faults are the
    endpoint's either way). ``optimizer`` None runs the loop's default (SIMBA); ``edit`` makes
    trial 1 a deletion the failures point at, which needs no text from the model, so the budget
    is spent whatever the model writes.
    """
    schedule = schedule or FaultSchedule()
    extra = ("--optimizer", optimizer) if optimizer else ()
    lm = None if stub else (lm or upstream_lm(work))
    started = time.perf_counter()
    with FaultyEndpoint(lm, schedule, hang_s=timeout + 2, client_timeout=timeout) as endpoint:
        proc = run_loop(
            endpoint.base_url,
            work,
            system=system,
            dataset=dataset,
            budget=budget,
            timeout=timeout,
            retries=retries,
            extra=extra,
        )
    seconds = time.perf_counter() - started
    result_path = work / "faults.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    ckpt_path = work / "state" / "runs" / "faults" / CHECKPOINT
    checkpoint = json.loads(ckpt_path.read_text()) if ckpt_path.exists() else {}
    command = (
        f"python -m optloop.run --system {system} --dataset {dataset} --budget {budget} --lm "
        f"openai:smollm2 --lm-base-url <faulty endpoint> --lm-timeout {timeout} --lm-retries "
        f"{retries}" + "".join(f" {arg}" for arg in extra)
    )
    return figures(
        endpoint,
        result,
        checkpoint,
        command=command,
        run_rc=proc.returncode,
        budget=budget,
        retries=retries,
        seconds=seconds,
    ), proc


def table(fig: Figures) -> Table:
    out = Table(title="LM faults injected into a real optloop.run")
    out.add_column("figure")
    out.add_column("value", justify="right")
    out.add_row("requests to the endpoint", str(fig.requests))
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(fig.injected_by_kind.items()))
    out.add_row("faults injected", f"{fig.injected} ({kinds})")
    if fig.slow_answers:
        out.add_row("real answers slower than --lm-timeout", str(fig.slow_answers))
    out.add_row("retried and cured", str(fig.cured))
    out.add_row("surfaced (attempts / calls)", f"{fig.surfaced_attempts} / {fig.surfaced_calls}")
    out.add_row(
        "surfaced calls in evaluations (the rest: optimizer)",
        str(fig.surfaced_calls_in_evaluations),
    )
    out.add_row("questions lost to surfaced faults", str(fig.questions_lost))
    out.add_row(
        "graph ops marked (faults on them)",
        f"{fig.graphs['ops_marked']} ({fig.graphs['faults_marked']})",
    )
    out.add_row("evaluations / budget", f"{fig.evaluations} / {fig.budget}")
    out.add_row("slowest real answer (s)", f"{fig.slowest_answer_s}")
    out.add_row("wall seconds", f"{fig.seconds}")
    out.add_section()
    for name, ok in fig.checks.items():
        out.add_row(name, "ok" if ok else "FAILED")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.chaos", __doc__)
    parser.add_argument("--system", default="md_flat")
    parser.add_argument("--dataset", default="builtin:tiny")
    parser.add_argument("--budget", type=int, default=1)
    parser.add_argument(
        "--lm-timeout",
        type=float,
        default=60.0,
        help="the run's --lm-timeout (default 60: above the slowest real answer on a busy 2-core "
        "machine; a hang lasts 2 s more)",
    )
    parser.add_argument("--lm-retries", type=int, default=1)
    parser.add_argument(
        "--schedule",
        help="PERIOD:POS=FAULT,... (default 20:3=http500,6=truncated,9=http503,"
        "12=nonjson,15=hang,18=http503,19=http500)",
    )
    parser.add_argument(
        "--work", help="keep the run's state and MLflow store here (default: a temp dir)"
    )
    parser.add_argument("--json", metavar="OUT", help="write the figures here")
    args = parse_command(parser, argv)
    schedule = FaultSchedule.parse(args.schedule) if args.schedule else FaultSchedule()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="optloop-faults-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        fig, proc = bench(
            work,
            system=args.system,
            dataset=args.dataset,
            budget=args.budget,
            timeout=args.lm_timeout,
            retries=args.lm_retries,
            schedule=schedule,
        )
    console.print(table(fig))
    console.print(f"command: {fig.command}")
    if proc.returncode != 0:
        console.print(
            f"the run failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
        )
    if args.json:
        Path(args.json).write_text(fig.model_dump_json(indent=1))
    return 0 if fig.consistent else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
