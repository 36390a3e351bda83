"""One machine, two runs: how much slower is each of two concurrent embedded-LM runs than one alone?

    python -m experiments.bench.two_runs [--system md_flat] [--budget 2] [--dataset builtin:tiny]
                                         [--stagger 2] [--slots 1] [--separate-locks] [--json OUT]
                                         [-- EXTRA optloop.run ARGS]

Runs ``python -m optloop.run --system md_flat --budget 2`` once alone, then twice at
the same time (the second ``--stagger`` seconds after the first), each run in a fresh
``OPTLOOP_HOME`` and MLflow store (so no run reuses another's LM cache or stores), and
reports each concurrent run's wall time over the lone run's. Target: at most 2.3x
(issue 23; before the machine-wide llama.cpp slots it was about 11x on 2 cores).

The runs share the machine's llama.cpp slots (``optloop/lm/machine.py``):
``--slots N`` sets ``OPTLOOP_LLAMA_SLOTS`` for them (1: model calls take turns, each
with every core; 2: two at a time, half the cores each). ``--separate-locks`` gives
each run its own lock directory, i.e. no coordination: the behaviour before the slots,
for a before/after figure. Run it on a quiet machine: anything else on the CPU (another
benchmark, a test suite) is in the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from optloop.cli import run_cli, setup_logging

TARGET = 2.3


def start_run(name: str, root: Path, args: argparse.Namespace, lock_dir: Path | None) -> tuple[subprocess.Popen, dict]:
    """Start one ``optloop.run`` in its own home under ``root``; returns the process and its bookkeeping."""
    home = root / name
    home.mkdir(parents=True)
    env = {**os.environ, "OPTLOOP_HOME": str(home / "state"), "OPTLOOP_MLRUNS": str(home / "mlruns"),
           "OPTLOOP_LLAMA_SLOTS": str(args.slots)}
    if lock_dir is not None:
        env["OPTLOOP_LOCK_DIR"] = str(lock_dir)
    out = home / "result.json"
    command = [sys.executable, "-m", "optloop.run", "--system", args.system, "--budget", str(args.budget),
               "--dataset", args.dataset, "--allow-small-splits", "--lm", args.lm, "--run-name", name,
               "--tracking-uri", f"sqlite:///{home / 'mlruns' / 'mlflow.db'}", "--json", str(out), *args.extra]
    log = (home / "run.log").open("w")
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=Path.cwd())
    return proc, {"name": name, "command": command, "out": out, "log": home / "run.log", "started": time.perf_counter()}


def finish(proc: subprocess.Popen, run: dict, timeout: float) -> dict[str, Any]:
    """Wait for a run; its wall time, exit code and the LM figures from its ``--json`` output."""
    code = proc.wait(timeout)
    wall = time.perf_counter() - run["started"]
    result: dict[str, Any] = {"name": run["name"], "wall_s": round(wall, 1), "exit": code}
    if run["out"].exists():
        lm = json.loads(run["out"].read_text()).get("lm", {})
        result.update({k: lm.get(k) for k in ("calls", "model_calls", "seconds", "queued_s", "tokens")})
    if code != 0:
        result["log_tail"] = run["log"].read_text()[-2000:]
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.two_runs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", default="md_flat")
    parser.add_argument("--budget", type=int, default=2)
    parser.add_argument("--dataset", default="builtin:tiny")
    parser.add_argument("--lm", default="local", help="LM spec of the runs (default: the embedded model)")
    parser.add_argument("--stagger", type=float, default=2.0, help="seconds between the two concurrent starts")
    parser.add_argument("--slots", type=int, default=1, help="OPTLOOP_LLAMA_SLOTS for the runs (default 1)")
    parser.add_argument("--separate-locks", action="store_true",
                        help="one lock directory per run: no machine-wide coordination (the 'before' figure)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("extra", nargs="*", help="more optloop.run arguments (after --)")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    console = Console()

    with tempfile.TemporaryDirectory(prefix="optloop-two-runs-") as tmp:
        root = Path(tmp)
        shared_locks = None if not args.separate_locks else root / "locks-alone"
        console.print(f"alone: {args.system}, budget {args.budget}, {args.dataset} ...")
        alone = finish(*start_run("alone", root, args, shared_locks), args.timeout)
        console.print(f"alone: {alone['wall_s']}s; now two at once, {args.stagger}s apart ...")
        first = start_run("first", root, args, root / "locks-first" if args.separate_locks else None)
        time.sleep(args.stagger)
        second = start_run("second", root, args, root / "locks-second" if args.separate_locks else None)
        together = [finish(*first, args.timeout), finish(*second, args.timeout)]

    runs = [alone, *together]
    worst = max(r["wall_s"] for r in together) / alone["wall_s"]
    figures = {"system": args.system, "budget": args.budget, "dataset": args.dataset, "lm": args.lm,
               "slots": args.slots, "coordinated": not args.separate_locks, "cpus": os.cpu_count(),
               "stagger_s": args.stagger, "runs": runs, "ratio_worst": round(worst, 2),
               "ratio_mean": round(sum(r["wall_s"] for r in together) / 2 / alone["wall_s"], 2),
               "target": TARGET, "met": worst <= TARGET}
    table = Table(title=f"two concurrent runs vs one alone ({os.cpu_count()} cpus, slots {args.slots}, "
                        f"{'machine-wide slots' if not args.separate_locks else 'no coordination'})")
    for col in ("run", "wall s", "x alone", "LM calls", "model calls", "LM s", "queued s", "exit"):
        table.add_column(col)
    for r in runs:
        table.add_row(r["name"], f"{r['wall_s']:.1f}", f"{r['wall_s'] / alone['wall_s']:.2f}", str(r.get("calls")),
                      str(r.get("model_calls")), f"{r.get('seconds') or 0:.1f}", f"{r.get('queued_s') or 0:.1f}",
                      str(r["exit"]))
    console.print(table)
    console.print(f"worst concurrent run: [bold]{worst:.2f}x[/bold] the lone run (target <= {TARGET}x: "
                  f"{'met' if figures['met'] else 'missed'})")
    for r in runs:
        if r["exit"] != 0:
            console.print(f"[red]{r['name']} failed (exit {r['exit']}):[/red]\n{r['log_tail']}", markup=False)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
