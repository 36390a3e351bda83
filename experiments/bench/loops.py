"""The loop on one system, once per optimizer: what each run blamed, changed and gained on test.

    flock /tmp/optloop-lm.lock python -m experiments.bench.loops --system gated \\
        --dataset "agentic:generate?records=80&seed=0" --optimizers edit --budget 3 \\
        --json experiments/results/gated_loop.json --markdown experiments/results/gated_loop.md
    python -m experiments.bench.loops --report-only \\
        --json experiments/results/tiered_loop.json --markdown experiments/results/tiered_loop.md

For each optimizer in turn, ``python -m optloop.run --system S --dataset D --optimizer O
--budget B --seed K --new --json <work>/O.json`` (``--split F`` when given), all with
``OPTLOOP_HOME=<work>``: the runs share one LM cache (a later run replays the baseline calls
an earlier one computed) and one MLflow store, ``<work>/mlruns``. A run that exits non-zero
stops the bench: the runs that finished before it are reported, and the bench exits with its
code. The table gives per optimizer the dev baseline and best, the held-out test before
and after with their 95% CIs and the paired delta's (``optloop.run``'s own figures), the
targets the baseline's blame picked, what the best candidate changed, whether it was promoted
(``--promote-if ci``: only when the delta's CI lies above 0), and the run's LLM calls and
seconds; below it each best candidate's prompt diff. ``--report-only`` writes the markdown
again from ``--json``, keeping the provenance of the command that ran.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(offline_defaults())  # first: litellm and Hugging Face read them when imported

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.markdown import provenance_lines, table
from experiments.provenance import command_of, stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.paths import write_atomic

REPO = Path(__file__).resolve().parents[2]


def _interval(ci: Mapping[str, Any], signed: bool = False) -> str:
    f = "+.3f" if signed else ".3f"
    return f"{ci['estimate']:{f}} [{ci['low']:{f}}, {ci['high']:{f}}] n={ci['n']}"


def row(optimizer: str, run: Mapping[str, Any]) -> list[str]:
    """One run's line of the table, from ``optloop.run --json``."""
    cost = run["cost"]
    changed = [*run["changed_sites"], *(f"knob:{k}" for k in run["changed_knobs"])]
    return [
        optimizer,
        f"{run['baseline_dev']:.3f} -> {run['best_dev']:.3f}",
        _interval(run["test_before_ci"]),
        _interval(run["test_after_ci"]),
        _interval(run["delta_test_ci"], signed=True),
        ", ".join(run["targets"]) or "-",
        ", ".join(changed) or "-",
        "yes" if run["promoted"] else "no",
        f"{cost['llm_calls']} ({cost['model_calls']} computed)",
        f"{cost['seconds']:.0f}",
    ]


HEADER = [
    "optimizer",
    "dev baseline -> best",
    "test before",
    "test after",
    "held-out delta [95% CI]",
    "blamed and optimized",
    "changed (best)",
    "promoted",
    "LLM calls",
    "seconds",
]


def to_markdown(results: Mapping[str, Any]) -> str:
    runs: Mapping[str, Mapping[str, Any]] = results["runs"]
    systems = sorted({r["config"]["system"] for r in runs.values()})
    out = [
        f"# The loop on {', '.join(systems)} (the embedded model)\n",
        provenance_lines(results["provenance"]).rstrip("\n") + "\n",
        table(HEADER, [row(o, r) for o, r in runs.items()]) + "\n",
    ]
    for optimizer, run in runs.items():
        out += [
            f"## {optimizer}: the best candidate's prompt diff\n",
            f"```diff\n{run['prompt_diff'] or '(no change)'}\n```\n",
        ]
    return "\n".join(out)


def run_command(args: argparse.Namespace, optimizer: str, out: Path) -> list[str]:
    cmd = [
        "--system",
        args.system,
        "--dataset",
        args.dataset,
        "--optimizer",
        optimizer,
        "--budget",
        str(args.budget),
        "--seed",
        str(args.seed),
        "--new",
        "--json",
        str(out),
    ]
    return cmd + (["--split", args.split] if args.split else [])


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.loops", __doc__)
    parser.add_argument("--system", help="the system every run optimizes")
    parser.add_argument("--dataset", help="its dataset URI")
    parser.add_argument("--optimizers", default="edit", help="comma-separated, run in this order")
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", help="train,dev,test fractions (optloop.run's --split)")
    parser.add_argument(
        "--work", type=Path, default=Path("/tmp/optloop-loops"), help="OPTLOOP_HOME of the runs"
    )
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: the markdown again from --json"
    )
    args = parse_command(parser, argv)
    if args.report_only:
        if not args.json.exists():
            parser.error(f"--report-only: {args.json} does not exist; run the bench first")
        results = json.loads(args.json.read_text())
    else:
        if not (args.system and args.dataset):
            parser.error("--system and --dataset are needed unless --report-only")
        from optloop.testing.replay import bundled_identity

        args.work.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "OPTLOOP_HOME": str(args.work),
            "OPTLOOP_MLRUNS": str(args.work / "mlruns"),
        }
        runs: dict[str, Any] = {}
        commands = []
        failed = 0
        for optimizer in [o for o in args.optimizers.split(",") if o]:
            out = args.work / f"{args.system}-{optimizer}.json"
            cmd = run_command(args, optimizer, out)
            commands.append(shlex.join(["python", "-m", "optloop.run", *cmd]))
            print(f"loops: {commands[-1]}", flush=True)
            done = subprocess.run(
                [sys.executable, "-m", "optloop.run", *cmd], cwd=REPO, env=env, check=False
            )
            if done.returncode != 0:
                print(
                    f"loops: {optimizer} exited {done.returncode}; its output is above",
                    file=sys.stderr,
                )
                if not runs:
                    return done.returncode
                failed = done.returncode
                break
            runs[optimizer] = json.loads(out.read_text())
        results = stamped(
            {"runs": runs, "commands": commands},
            bundled_identity(),
            command_of("experiments.bench.loops", argv),
        )
        write_atomic(args.json, json.dumps(results, indent=1))
    text = to_markdown(results)
    write_atomic(args.markdown, text)
    print(text)
    return 0 if args.report_only else failed


if __name__ == "__main__":
    sys.exit(run_cli(main))
