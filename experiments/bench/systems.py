"""Benchmark the memory systems: cost per ingested session and answer accuracy.

    python -m experiments.bench.systems [--systems mem0,graphiti,...] [--dataset builtin:tiny]
                                        [--json out.json]

For each system and each episode of the dataset: a fresh store, ingest the
episode's sessions, then retrieve and answer every question, scored by the
question's own scorer. Reports, per system, LLM calls and seconds per ingested
session (ingest stage only), seconds to ingest one episode (a LoCoMo conversation; the mean,
and each episode's in ``per_episode``), calls per question, accuracy and the mean score (token F1
under LoCoMo's scorers), and the LLM calls one evaluation of the dataset takes. The LM cache is a
fresh temporary file, so every figure is a real model call. ``--json`` and ``--markdown`` carry
the provenance header (command, date, commit, model, machine).
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
from experiments.markdown import provenance_lines, table
from experiments.provenance import model_of, stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.datasets import load_dataset
from optloop.lm import OptloopLM
from optloop.paths import write_atomic
from systems import SYSTEMS, get_system


def bench_system(
    name: str, dataset_uri: str, lm: OptloopLM, work: Path, progress: Progress
) -> dict[str, Any]:
    dataset = load_dataset(dataset_uri)
    system_cls = get_system(name)
    sessions = questions = correct = 0
    ingest_s = answer_s = score = 0.0
    ingest_calls = answer_calls = 0
    per_episode: list[dict[str, Any]] = []
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
        score += sum(r.score for r in run.results)
        per_episode.append(
            {
                "episode": episode.id,
                "sessions": run.sessions,
                "turns": sum(len(s.turns) for s in episode.sessions),
                "ingest_s": round(run.ingest_s, 1),
                "ingest_calls": run.ingest_calls,
            }
        )
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
        "mean_score": score / questions,
        "ingest_seconds_per_episode": ingest_s / len(dataset.episodes),
        "calls_per_evaluation": ingest_calls + answer_calls,
        "seconds_per_evaluation": ingest_s + answer_s,
        "per_episode": per_episode,
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
    parser.add_argument("--markdown", type=Path, help="and as a markdown table to this file")
    args = parse_command(parser, argv)
    names = parse_systems(args.systems)  # unknown names fail here, before any work

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lm = bench_lm(args, Path(tmp), systems=names)
        with Progress() as progress:
            for name in names:
                rows.append(bench_system(name, args.dataset, lm, Path(tmp), progress))

    shown = Table(title=f"memory systems on {args.dataset} ({lm.backend.identity})")
    for col in (
        "system",
        "sessions",
        "LLM calls/session",
        "s/session",
        "LLM calls/question",
        "s/question",
        "accuracy",
    ):
        shown.add_column(col)
    for r in rows:
        shown.add_row(
            r["system"],
            str(r["sessions"]),
            f"{r['calls_per_session']:.1f}",
            f"{r['seconds_per_session']:.1f}",
            f"{r['calls_per_question']:.1f}",
            f"{r['seconds_per_question']:.1f}",
            f"{r['accuracy']:.2f} ({r['questions']} q)",
        )
    Console().print(shown)
    data = stamped({"dataset": args.dataset, "systems": rows}, model_of(args))
    if args.json:
        write_atomic(args.json, json.dumps(data, indent=2) + "\n")
    if args.markdown:
        write_atomic(args.markdown, to_markdown(data))
    return 0


def to_markdown(data: dict[str, Any]) -> str:
    """The figures as a results page: provenance, then one row per system."""
    rows = [
        [
            r["system"],
            f"{r['episodes']} / {r['sessions']} / {r['questions']}",
            f"{r['ingest_seconds_per_episode']:.0f}",
            f"{r['seconds_per_session']:.1f}",
            f"{r['calls_per_session']:.1f}",
            f"{r['seconds_per_question']:.1f}",
            f"{r['calls_per_question']:.1f}",
            f"{r['calls_per_evaluation']}",
            f"{r['accuracy']:.2f} / {r['mean_score']:.2f}",
        ]
        for r in data["systems"]
    ]
    return "\n".join(
        [
            f"# Memory systems on `{data['dataset']}`: what one evaluation costs",
            "",
            provenance_lines(data["provenance"]).rstrip("\n"),
            "",
            table(
                [
                    "system",
                    "episodes / sessions / questions",
                    "s to ingest an episode",
                    "s / session",
                    "LLM calls / session",
                    "s / question",
                    "LLM calls / question",
                    "LLM calls, whole evaluation",
                    "accuracy / mean score",
                ],
                rows,
            ),
            "",
        ]
    )


if __name__ == "__main__":
    sys.exit(run_cli(main))
