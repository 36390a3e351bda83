"""Benchmark the memory systems: cost per ingested session and answer accuracy.

    python -m experiments.bench.systems [--systems mem0,graphiti,...] [--dataset builtin:tiny]
                                        [--json out.json]

For each system and each episode of the dataset: a fresh store, ingest the
episode's sessions, then retrieve and answer every question, scored by the
question's own scorer. Reports, per system, LLM calls and seconds per ingested
session (ingest stage only), calls per question, and accuracy. The LM cache is
a fresh temporary file, so every figure is a real model call.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from experiments.bench._common import bench_lm, parse_systems, run_episode
from optloop.cli import CommandParser, parse_command, run_cli
from optloop.datasets import load_dataset
from optloop.lm import OptloopLM
from systems import SYSTEMS, get_system


def bench_system(
    name: str, dataset_uri: str, lm: OptloopLM, work: Path, progress: Progress
) -> dict[str, Any]:
    dataset = load_dataset(dataset_uri)
    system_cls = get_system(name)
    sessions = questions = correct = 0
    ingest_s = answer_s = 0.0
    ingest_calls = answer_calls = 0
    task = progress.add_task(f"{name}", total=len(dataset.episodes))
    for episode in dataset.episodes:
        run = run_episode(system_cls, episode, lm, work / name / episode.id)
        sessions += run.sessions
        questions += len(run.results)
        correct += run.correct
        ingest_s += run.ingest_s
        answer_s += run.answer_s
        ingest_calls += run.ingest_calls
        answer_calls += run.answer_calls
        progress.advance(task)
    return {
        "system": name,
        "episodes": len(dataset.episodes),
        "sessions": sessions,
        "questions": questions,
        "calls_per_session": ingest_calls / sessions,
        "seconds_per_session": ingest_s / sessions,
        "calls_per_question": answer_calls / questions,
        "seconds_per_question": answer_s / questions,
        "accuracy": correct / questions,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.systems", __doc__, lm=True)
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated (default: all {len(SYSTEMS)}: {', '.join(SYSTEMS)})",
    )
    parser.add_argument(
        "--dataset", default="builtin:tiny", help="dataset URI (default builtin:tiny)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parse_command(parser, argv)
    names = parse_systems(args.systems)  # unknown names fail here, before any work

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lm = bench_lm(args, Path(tmp), systems=names)
        with Progress() as progress:
            for name in names:
                rows.append(bench_system(name, args.dataset, lm, Path(tmp), progress))

    table = Table(title=f"memory systems on {args.dataset} ({lm.backend.identity})")
    for col in (
        "system",
        "sessions",
        "LLM calls/session",
        "s/session",
        "LLM calls/question",
        "s/question",
        "accuracy",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["system"],
            str(r["sessions"]),
            f"{r['calls_per_session']:.1f}",
            f"{r['seconds_per_session']:.1f}",
            f"{r['calls_per_question']:.1f}",
            f"{r['seconds_per_question']:.1f}",
            f"{r['accuracy']:.2f} ({r['questions']} q)",
        )
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
