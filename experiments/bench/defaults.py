"""Each system's default dataset, measured: the embedded model's baseline there and the projected
run.

    flock /tmp/optloop-lm.lock python -m experiments.bench.defaults [--systems rag_bm25,mem0,...]
        [--budget 50]
        [--home DIR] [--timeout 1500] [--json experiments/results/defaults.json]
        [--markdown experiments/results/defaults.md]

For every system,
``python -m optloop.run --system S --budget B --estimate --json <home>/S/estimate.json`` with
``OPTLOOP_HOME=<home>/S``: no ``--dataset``, so the system's default
(:mod:`optloop.datasets.defaults`); the run evaluates the baseline on train and dev, prints the
projection of the whole run and stops. A system whose directory already holds that baseline is not
run again. The table gives, per system, the dataset, the split's dev and test questions, the
baseline's dev accuracy with its 95% CI (bootstrap over the dev questions, seeded) and whether it
lies between 0.2 and 0.8 (headroom both ways), the baseline's wall time, and the projected hours of
``--budget B`` (``--estimate``'s model: LM time at the measured latency, the optimizer's own calls
included). A system that did not finish within ``--timeout`` is listed as not measured. A system
left out of ``--systems`` keeps its row from the earlier ``--json``.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from experiments.markdown import provenance_lines, table
from experiments.provenance import command_of, stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.loop.state import Checkpoint
from optloop.paths import write_atomic
from optloop.stats import bootstrap_mean

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
HEADROOM = (0.2, 0.8)


class Row(BaseModel):
    system: str
    dataset: str | None = None
    n_dev: int | None = None
    n_test: int | None = None
    dev: str | None = None  # accuracy [95% CI] n
    dev_accuracy: float | None = None
    train_accuracy: float | None = None
    headroom: bool | None = None
    baseline_seconds: float | None = None
    hours: float | None = None
    measured: str | None = None  # the UTC day the baseline's estimate was written
    note: str = ""


def _checkpoint(home: Path) -> Checkpoint | None:
    paths = sorted((home / "runs").glob("*/checkpoint.json")) if (home / "runs").is_dir() else []
    for path in paths:
        ckpt = Checkpoint.load(path)
        if ckpt.baseline_dev is not None:
            return ckpt
    return None


def measure(system: str, args: argparse.Namespace) -> Row:
    home = args.home / system
    estimate = home / "estimate.json"
    if (_checkpoint(home) is None or not estimate.exists()) and args.report_only:
        return Row(system=system, note="not measured")
    if _checkpoint(home) is None or not estimate.exists():
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OPTLOOP_HOME": str(home), "OPTLOOP_MLRUNS": str(home / "mlruns")}
        cmd = [
            sys.executable,
            "-m",
            "optloop.run",
            "--system",
            system,
            "--budget",
            str(args.budget),
            "--estimate",
            "--json",
            str(estimate),
        ]
        try:
            with (home / "estimate.log").open("w") as log:
                subprocess.run(
                    cmd,
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=args.timeout,
                    check=False,
                )
        except subprocess.TimeoutExpired:
            return Row(
                system=system, note=f"not measured: the baseline took over {args.timeout} s"
            )
    ckpt = _checkpoint(home)
    if ckpt is None or not estimate.exists():
        return Row(system=system, note=f"not measured: no baseline (see {home / 'estimate.log'})")
    figures: dict[str, Any] = json.loads(estimate.read_text())
    dev, train = ckpt.baseline_dev, ckpt.baseline_train
    assert dev is not None and train is not None
    ci = bootstrap_mean([float(o.passed) for o in dev.outcomes], seed=0)
    return Row(
        system=system,
        dataset=figures.get("dataset"),
        n_dev=figures.get("n_dev_questions"),
        n_test=figures.get("n_test_questions"),
        dev=f"{ci.estimate:.3f} [{ci.low:.3f}, {ci.high:.3f}] n={ci.n}",
        dev_accuracy=dev.accuracy,
        train_accuracy=train.accuracy,
        headroom=HEADROOM[0] <= dev.accuracy <= HEADROOM[1],
        baseline_seconds=round(train.seconds + dev.seconds, 1),
        hours=figures.get("hours"),
        measured=datetime.fromtimestamp(estimate.stat().st_mtime, tz=UTC).date().isoformat(),
    )


def _previous_rows(path: Path) -> list[Row]:
    """The rows of an earlier report at ``path`` (none when there is none)."""
    old = json.loads(path.read_text()) if path.exists() else {}
    return [Row.model_validate(r) for r in old.get("rows", [])]


def _merged(previous: Sequence[Row], measured: Sequence[Row]) -> list[Row]:
    """``previous`` with each system in ``measured`` replaced (new systems appended): a system left
    out of ``--systems`` keeps its row, so one system can be measured again on its own."""
    fresh = {r.system: r for r in measured}
    rows = [fresh.pop(r.system, r) for r in previous]
    return rows + [r for r in measured if r.system in fresh]


def to_markdown(rows: Sequence[Row], results: dict[str, Any]) -> str:
    head = (
        "# Default datasets on the embedded model\n\n"
        + provenance_lines(results["provenance"]).rstrip("\n")
        + f"\n- each system: `python -m optloop.run --system S --budget {results['budget']} "
        "--estimate --json OUT`, no --dataset\n"
        f"- headroom: baseline dev accuracy in [{HEADROOM[0]}, {HEADROOM[1]}]\n"
        "- measured: the day each system's baseline was run (a row is kept until its directory "
        "under --home is removed, or, for a system left out of --systems, from the earlier "
        "--json; the commit above is the report's). Rows measured before 2026-11-28 decoded "
        "JSON answers under llama-cpp-python's schema grammar, which allows no newline between "
        "JSON tokens (fixed in f7c97b4, `optloop/lm/grammar.py`)\n"
        "- the task model: the default `--lm` (SmolLM2-135M), the one with headroom here; the "
        "Qwen 2.5-Coder 0.5B answers 0.95-1.00 on this dataset for rag_bm25, long_context and "
        "rag_embedding, and mem0's documented pair is the 0.5B answering and the 1.5B writing "
        "(`headroom.md`; docs/models.md, 'Defaults, as measured')\n\n"
    )
    header = [
        "system",
        "dataset",
        "dev / test questions",
        "baseline dev [95% CI] n",
        "train",
        "headroom",
        "baseline s",
        f"projected hours, --budget {results['budget']}",
        "measured",
    ]
    cells = [
        [r.system, r.note, *[""] * 7]
        if r.dev is None
        else [
            r.system,
            f"`{r.dataset}`",
            f"{r.n_dev} / {r.n_test}",
            r.dev,
            f"{r.train_accuracy:.3f}",
            "yes" if r.headroom else "NO",
            f"{r.baseline_seconds:.0f}",
            "unknown" if r.hours is None else f"{r.hours:.1f}",
            r.measured or "",
        ]
        for r in rows
    ]
    return head + table(header, cells) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.defaults", __doc__)
    parser.add_argument(
        "--systems", default="rag_bm25,mem0,md_flat,long_context,rag_embedding,tiered,gated"
    )
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--home", type=Path, default=Path("/tmp/optloop-defaults"))
    parser.add_argument(
        "--timeout", type=float, default=1500.0, help="seconds a system's baseline may take"
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "defaults.json")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "defaults.md")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: report the systems whose baseline is already in --home",
    )
    args = parse_command(parser, argv)
    from optloop.testing.replay import bundled_identity

    measured = [measure(s, args) for s in args.systems.split(",") if s]
    rows = _merged(_previous_rows(args.json), measured)
    results = stamped(
        {"budget": args.budget, "rows": [r.model_dump() for r in rows]},
        bundled_identity(),
        command_of("experiments.bench.defaults", argv),
    )
    write_atomic(args.json, json.dumps(results, indent=1))
    write_atomic(args.markdown, to_markdown(rows, results))
    print(to_markdown(rows, results))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
