"""Baseline table: accuracy of each memory system per task type, in the spirit of MEME's Table 2.

    python -m experiments.bench.baselines [--systems a,b] [--datasets URI,URI] [--episodes N]
                                          [--config FILE] [--json OUT] [--markdown OUT]

For each system and each episode of each dataset: a fresh store under a temporary
directory, ingest all the episode's sessions, then retrieve and answer every question,
scored by the question's own scorer. Rows are task types prefixed with the dataset
family (``memfail/coexisting``, ``meme/cascade``; MemFail's conditional_easy and
conditional_hard stay apart although both ask task type ``conditional``), columns
systems, cells accuracy and question count. A second table gives seconds and LLM calls
per episode for each system. The LM cache is a fresh temporary file, so every figure
is a real model call.

Defaults: every system but mem0 and graphiti (minutes per episode on 2 cores; name
them with --systems); datasets: the MemFail tasks whose CSV is in the shared data folder
(long_hop is skipped when absent) and ``synthetic:meme`` (the six MEME tasks), each cut
to --episodes episodes (default 3). --config takes systems, datasets and episodes from
an experiment file (experiments/configs/); flags given on the command line win. Unknown
systems and malformed dataset URIs fail before the LM is loaded.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(offline_defaults())  # first: litellm, mem0 and Hugging Face read them when imported

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from experiments.bench._common import EpisodeRun, bench_lm, parse_systems, run_episode
from optloop.cli import CommandParser, parse_command, run_cli
from optloop.config import load_config, with_limit
from optloop.datasets import LOADERS, Dataset, Question, load_dataset, parse_uri
from optloop.datasets.memfail import default_path
from optloop.embed import get_embedder
from optloop.errors import ConfigError, DatasetError
from systems import SYSTEMS, get_system

SLOW_SYSTEMS = ("mem0", "graphiti")
DEFAULT_SYSTEMS = tuple(n for n in SYSTEMS if n not in SLOW_SYSTEMS)
MEMFAIL_TASKS = ("coexisting", "conditional_easy", "conditional_hard", "persona", "long_hop")
DEFAULT_EPISODES = 3
ALL_ROW = "all questions"


def default_datasets(episodes: int) -> tuple[list[str], list[str]]:
    """(URIs, notes on what was skipped): the MemFail tasks with data here, then synthetic MEME."""
    uris, skipped = [], []
    for task in MEMFAIL_TASKS:
        try:
            default_path(task)
        except DatasetError as exc:
            skipped.append(f"memfail:{task} skipped: {str(exc).removeprefix(f'memfail:{task}: ')}")
            continue
        uris.append(f"memfail:{task}?limit={episodes}")
    uris.append(f"synthetic:meme?seed=0&episodes={episodes}")
    return uris, skipped


def split_uris(text: str) -> list[str]:
    """Comma-separated URIs; a comma inside a query (``tasks=a,b``) stays in its URI."""
    uris: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if uris and piece.partition(":")[0].lower() not in LOADERS:
            uris[-1] += "," + piece
        else:
            uris.append(piece)
    return uris


def family(uri: str) -> str:
    """The row prefix of a dataset: its scheme, or for synthetic/builtin the generator's name."""
    scheme, rest, _ = parse_uri(uri)
    name = rest.partition(":")[0].strip().lower()
    return (name or "tiny") if scheme in ("synthetic", "builtin") else scheme


def task_label(uri: str, question: Question) -> str:
    """``<family>/<task type>``; a dataset task that refines the type (conditional_easy) replaces it."""
    scheme, rest, _ = parse_uri(uri)
    sub = rest.partition(":")[0].strip().lower().replace("-", "_")
    task = sub if sub.startswith(question.task_type + "_") else question.task_type
    return f"{family(uri)}/{task}"


@dataclass
class Plan:
    systems: list[str]
    datasets: list[Dataset]
    skipped: list[str] = field(default_factory=list)


def make_plan(args: argparse.Namespace) -> Plan:
    """Systems and loaded datasets from flags and --config; every failure here precedes LM work."""
    config = load_config(args.config) if args.config else None
    systems = parse_systems(args.systems if args.systems is not None
                            else config.systems if config else list(DEFAULT_SYSTEMS))
    if not systems:
        raise ConfigError("--systems names no system")
    episodes = args.episodes if args.episodes is not None else config.episodes if config else None
    skipped: list[str] = []
    if args.datasets is not None:
        uris = [with_limit(u, episodes) for u in split_uris(args.datasets)]
    elif config:
        uris = [with_limit(u, episodes) for u in config.datasets]
    else:  # already cut to size
        uris, skipped = default_datasets(episodes or DEFAULT_EPISODES)
    if not uris:
        raise ConfigError("--datasets names no dataset")
    datasets = [load_dataset(uri) for uri in uris]
    return Plan(systems, datasets, skipped)


@dataclass
class SystemTotals:
    episodes: int = 0
    questions: int = 0
    correct: int = 0
    seconds: float = 0.0
    calls: int = 0

    def add(self, run: EpisodeRun) -> None:
        self.episodes += 1
        self.questions += len(run.results)
        self.correct += run.correct
        self.seconds += run.seconds
        self.calls += run.calls

    def as_dict(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes, "questions": self.questions,
            "accuracy": self.correct / self.questions if self.questions else None,
            "seconds_per_episode": self.seconds / self.episodes if self.episodes else None,
            "calls_per_episode": self.calls / self.episodes if self.episodes else None,
        }


@dataclass
class Results:
    systems: list[str]
    labels: list[str] = field(default_factory=list)  # rows, in first-seen order
    cells: dict[str, dict[str, list[int]]] = field(default_factory=lambda: defaultdict(dict))  # label -> system -> [correct, n]
    totals: dict[str, SystemTotals] = field(default_factory=dict)

    def add(self, system: str, uri: str, run: EpisodeRun) -> None:
        self.totals.setdefault(system, SystemTotals()).add(run)
        for result in run.results:
            label = task_label(uri, result.question)
            if label not in self.labels:
                self.labels.append(label)
            cell = self.cells[label].setdefault(system, [0, 0])
            cell[0] += result.passed
            cell[1] += 1

    def cell(self, label: str, system: str) -> tuple[int, int] | None:
        if label == ALL_ROW:
            totals = self.totals.get(system)
            return (totals.correct, totals.questions) if totals and totals.questions else None
        found = self.cells.get(label, {}).get(system)
        return tuple(found) if found else None  # type: ignore[return-value]

    def rows(self) -> list[str]:
        return [*self.labels, ALL_ROW]


def run_bench(plan: Plan, lm: Any, work: Path, progress: Progress) -> Results:
    results = Results(plan.systems)
    embedder = get_embedder()  # one embedder for every store (the model loads once)
    total = sum(len(d.episodes) for d in plan.datasets)
    for name in plan.systems:
        system_cls = get_system(name)
        task = progress.add_task(name, total=total)
        for index, dataset in enumerate(plan.datasets):
            progress.update(task, description=f"{name} {dataset.name}")
            for episode in dataset.episodes:
                run = run_episode(system_cls, episode, lm, work / name / f"d{index}" / episode.id, embedder)
                results.add(name, dataset.uri, run)
                progress.advance(task)
        progress.update(task, description=name)
    return results


def _fmt_cell(found: tuple[int, int] | None) -> str:
    return f"{found[0] / found[1]:.2f} ({found[1]})" if found else "-"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def to_json(plan: Plan, results: Results, lm_identity: str) -> dict[str, Any]:
    accuracy = {
        label: {s: {"correct": c[0], "n": c[1], "accuracy": c[0] / c[1]}
                for s in plan.systems if (c := results.cell(label, s))}
        for label in results.rows()
    }
    return {
        "lm": lm_identity,
        "datasets": [{"uri": d.uri, "name": d.name, "episodes": len(d.episodes),
                      "questions": sum(len(e.questions) for e in d.episodes)} for d in plan.datasets],
        "skipped": plan.skipped,
        "systems": plan.systems,
        "accuracy": accuracy,
        "cost": {s: results.totals.get(s, SystemTotals()).as_dict() for s in plan.systems},
    }


def to_markdown(plan: Plan, results: Results, lm_identity: str) -> str:
    lines = [f"Accuracy per task type ({lm_identity}); cells: accuracy (questions).", "",
             "| task | " + " | ".join(plan.systems) + " |", "|---" * (len(plan.systems) + 1) + "|"]
    for label in results.rows():
        cells = [_fmt_cell(results.cell(label, s)) for s in plan.systems]
        lines.append(f"| {label if label != ALL_ROW else '**' + ALL_ROW + '**'} | " + " | ".join(cells) + " |")
    lines += ["", "| system | episodes | s/episode | LLM calls/episode |", "|---|---|---|---|"]
    for s in plan.systems:
        t = results.totals.get(s, SystemTotals()).as_dict()
        lines.append(f"| {s} | {t['episodes']} | {_fmt(t['seconds_per_episode'])} | {_fmt(t['calls_per_episode'])} |")
    lines += ["", "Datasets: " + ", ".join(f"`{d.uri}`" for d in plan.datasets) + "."]
    lines += [f"{note}." for note in plan.skipped]
    return "\n".join(lines) + "\n"


def print_tables(plan: Plan, results: Results, lm_identity: str, console: Console) -> None:
    table = Table(title=f"accuracy per task type ({lm_identity}); cells: accuracy (questions)")
    table.add_column("task")
    for s in plan.systems:
        table.add_column(s, justify="right")
    for label in results.rows():
        table.add_row(label, *[_fmt_cell(results.cell(label, s)) for s in plan.systems],
                      end_section=label == results.labels[-1] if results.labels else False)
    console.print(table)
    cost = Table(title="cost per episode")
    for col in ("system", "episodes", "s/episode", "LLM calls/episode"):
        cost.add_column(col, justify="left" if col == "system" else "right")
    for s in plan.systems:
        t = results.totals.get(s, SystemTotals()).as_dict()
        cost.add_row(s, str(t["episodes"]), _fmt(t["seconds_per_episode"]), _fmt(t["calls_per_episode"]))
    console.print(cost)
    for note in plan.skipped:
        console.print(f"[dim]{note}[/dim]")


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.baselines", __doc__, lm=True)
    parser.add_argument("--systems", help=f"comma-separated (default: {','.join(DEFAULT_SYSTEMS)})")
    parser.add_argument("--datasets", help="comma-separated dataset URIs (default: MemFail tasks + synthetic:meme)")
    parser.add_argument("--episodes", type=int, metavar="N",
                        help=f"at most N episodes per dataset whose URI has no limit= (default {DEFAULT_EPISODES} "
                             "for the default datasets)")
    parser.add_argument("--config", type=Path, metavar="FILE", help="experiment file (experiments/configs/*.toml)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the figures to this JSON file")
    parser.add_argument("--markdown", type=Path, metavar="OUT", help="also write the tables to this Markdown file")
    args = parse_command(parser, argv)
    if args.episodes is not None and args.episodes < 1:
        parser.error("--episodes must be at least 1")
    plan = make_plan(args)  # unknown systems, bad URIs and bad config files fail here, before the LM

    with tempfile.TemporaryDirectory() as tmp:
        lm = bench_lm(args, Path(tmp))
        with Progress() as progress:
            results = run_bench(plan, lm, Path(tmp), progress)
    identity = lm.backend.identity

    print_tables(plan, results, identity, Console())
    if args.json:
        args.json.write_text(json.dumps(to_json(plan, results, identity), indent=2))
    if args.markdown:
        args.markdown.write_text(to_markdown(plan, results, identity))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
