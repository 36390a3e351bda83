"""Baseline table: accuracy of each memory system per task type, in the spirit of MEME's Table 2.

    python -m experiments.bench.baselines [--systems a,b] [--datasets URI,URI] [--episodes N]
                                          [--config FILE] [--json OUT] [--markdown OUT]
                                          [--probes OUT]

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

The "all questions" row carries a seeded 95% bootstrap interval (``optloop.stats``). Per probe
(``--probes OUT``, markdown; the JSON always has them): the question, expected, got, pass, what
retrieval put in context, and what each episode's store held once its questions were answered,
by tier (``metadata["tier"]``: tiered's ``ltm``, ``mtm``, ``stm``; ``memory`` for the others).
For a system with an extraction log (``tiered``), the share of sessions whose extraction stored at
least one fact, with its interval. Results files start with their provenance (command, date,
commit, model, machine).
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from experiments.bench._common import EpisodeRun, bench_lm, parse_systems, run_episode
from experiments.markdown import provenance_lines
from experiments.provenance import command_of, provenance
from optloop.analysis.experiment_files import load_config, with_limit
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.datasets import LOADERS, Dataset, Episode, Question, load_dataset, parse_uri
from optloop.datasets.memfail import default_path
from optloop.embed import get_embedder
from optloop.errors import ConfigError, DatasetError
from optloop.sites import QUERY_REWRITE
from optloop.stats import Interval, bootstrap_mean
from systems import SYSTEMS, get_system
from systems.base import MemorySystem

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
    """``<family>/<task type>``; a dataset task that refines the type (conditional_easy) replaces
    it."""
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
    systems = parse_systems(
        args.systems
        if args.systems is not None
        else config.systems
        if config
        else list(DEFAULT_SYSTEMS)
    )
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
            "episodes": self.episodes,
            "questions": self.questions,
            "accuracy": self.correct / self.questions if self.questions else None,
            "seconds_per_episode": self.seconds / self.episodes if self.episodes else None,
            "calls_per_episode": self.calls / self.episodes if self.episodes else None,
        }


def memory_report(episode: Episode) -> Callable[[MemorySystem], dict[str, Any]]:
    """What a system held once ``episode``'s questions were answered: its units by tier, what
    retrieval puts in context for each question (asked again: without a query-rewrite site,
    retrieval calls no LM), and, for a system with an extraction log, per session the facts
    written, stored and refused."""
    from systems.tiered import TieredSystem

    def inspect(system: MemorySystem) -> dict[str, Any]:
        tiers: dict[str, list[str]] = defaultdict(list)
        for item in system.all_memories():
            tiers[str(item.metadata.get("tier", "memory"))].append(item.text)
        report: dict[str, Any] = {"tiers": dict(tiers)}
        if QUERY_REWRITE not in system.prompt_sites():
            report["context"] = {
                q.id: [m.text for m in system.retrieve(q.question)] for q in episode.questions
            }
        if isinstance(system, TieredSystem):
            log = system.store.extractions()
            report["extraction"] = {}
            for s in episode.sessions:
                rows = [r for r in log if r["session_id"] == s.id]
                report["extraction"][s.id] = {
                    "messages": len(rows),
                    "written": sum(len(r["written"]) for r in rows),
                    "stored": sum(f["action"] != "unchanged" for r in rows for f in r["stored"]),
                    "refused": sum(len(r["refused"]) for r in rows),
                }
        return report

    return inspect


@dataclass
class Results:
    systems: list[str]
    labels: list[str] = field(default_factory=list)  # rows, in first-seen order
    cells: dict[str, dict[str, list[int]]] = field(
        default_factory=lambda: defaultdict(dict)
    )  # label -> system -> [correct, n]
    totals: dict[str, SystemTotals] = field(default_factory=dict)
    # system -> 1.0 / 0.0 per question, in order
    passes: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    probes: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    episodes: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, system: str, uri: str, run: EpisodeRun) -> None:
        self.totals.setdefault(system, SystemTotals()).add(run)
        inspected = run.inspected or {}
        self.episodes[system].append({"dataset": uri, "episode": run.episode_id, **inspected})
        for result in run.results:
            q = result.question
            self.passes[system].append(float(result.passed))
            self.probes[system].append(
                {
                    "dataset": uri,
                    "episode": run.episode_id,
                    "question_id": q.id,
                    "task": task_label(uri, q),
                    "question": q.question,
                    "expected": q.gold,
                    "got": result.prediction,
                    "pass": result.passed,
                    "context": (inspected.get("context") or {}).get(q.id),
                }
            )
            label = task_label(uri, result.question)
            if label not in self.labels:
                self.labels.append(label)
            cell = self.cells[label].setdefault(system, [0, 0])
            cell[0] += result.passed
            cell[1] += 1

    def accuracy(self, system: str) -> Interval | None:
        """Accuracy over every question, with its seeded 95% bootstrap interval."""
        values = self.passes.get(system)
        return bootstrap_mean(values, seed=0) if values else None

    def extraction(self, system: str) -> dict[str, Any] | None:
        """Sessions whose extraction stored at least one fact (a system with an extraction log)."""
        sessions = [
            counts
            for ep in self.episodes.get(system, [])
            for counts in (ep.get("extraction") or {}).values()
        ]
        if not sessions:
            return None
        stored = [float(c["stored"] > 0) for c in sessions]
        totals = {
            name: sum(c[name] for c in sessions) for name in ("written", "stored", "refused")
        }
        return {
            "sessions": len(sessions),
            "with_facts": int(sum(stored)),
            "share": bootstrap_mean(stored, seed=0),
            **totals,
        }

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
                run = run_episode(
                    system_cls,
                    episode,
                    lm,
                    work / name / f"d{index}" / episode.id,
                    embedder,
                    inspect=memory_report(episode),
                )
                results.add(name, dataset.uri, run)
                progress.advance(task)
        progress.update(task, description=name)
    return results


def _fmt_cell(found: tuple[int, int] | None) -> str:
    return f"{found[0] / found[1]:.2f} ({found[1]})" if found else "-"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(value: Interval | None) -> dict[str, Any] | None:
    if value is None:
        return None
    return {
        "estimate": round(value.estimate, 4),
        "low": round(value.low, 4),
        "high": round(value.high, 4),
        "n": value.n,
    }


def to_json(
    plan: Plan, results: Results, lm_identity: str, origin: dict[str, str] | None = None
) -> dict[str, Any]:
    accuracy = {
        label: {
            s: {"correct": c[0], "n": c[1], "accuracy": c[0] / c[1]}
            for s in plan.systems
            if (c := results.cell(label, s))
        }
        for label in results.rows()
    }
    extraction = {
        s: {**found, "share": _interval(found["share"])}
        for s in plan.systems
        if (found := results.extraction(s))
    }
    return {
        "provenance": origin or {},
        "lm": lm_identity,
        "datasets": [
            {
                "uri": d.uri,
                "name": d.name,
                "episodes": len(d.episodes),
                "questions": sum(len(e.questions) for e in d.episodes),
            }
            for d in plan.datasets
        ],
        "skipped": plan.skipped,
        "systems": plan.systems,
        "accuracy": accuracy,
        "cost": {s: results.totals.get(s, SystemTotals()).as_dict() for s in plan.systems},
        "accuracy_ci": {s: _interval(results.accuracy(s)) for s in plan.systems},
        "extraction": extraction,
        "probes": dict(results.probes),
        "episodes": dict(results.episodes),
    }


def to_markdown(
    plan: Plan, results: Results, lm_identity: str, origin: dict[str, str] | None = None
) -> str:
    lines = [
        f"Accuracy per task type ({lm_identity}); cells: accuracy (questions).",
        "",
        "| task | " + " | ".join(plan.systems) + " |",
        "|---" * (len(plan.systems) + 1) + "|",
    ]
    for label in results.rows():
        cells = [_fmt_cell(results.cell(label, s)) for s in plan.systems]
        lines.append(
            f"| {label if label != ALL_ROW else '**' + ALL_ROW + '**'} | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", "| system | episodes | s/episode | LLM calls/episode |", "|---|---|---|---|"]
    for s in plan.systems:
        t = results.totals.get(s, SystemTotals()).as_dict()
        lines.append(
            f"| {s} | {t['episodes']} | {_fmt(t['seconds_per_episode'])} | "
            f"{_fmt(t['calls_per_episode'])} |"
        )
    lines += ["", "Accuracy over every question, seeded 95% bootstrap interval:", ""]
    lines += [
        f"- {s}: {found.format(signed=False)}"
        for s in plan.systems
        if (found := results.accuracy(s))
    ]
    for s in plan.systems:
        if found := results.extraction(s):
            lines.append(
                f"- {s}: sessions whose extraction stored at least one fact: "
                f"{found['with_facts']}/{found['sessions']} = "
                f"{found['share'].format(signed=False)}; facts written "
                f"{found['written']}, stored {found['stored']}, "
                f"refused {found['refused']}"
            )
    lines += ["", "Datasets: " + ", ".join(f"`{d.uri}`" for d in plan.datasets) + "."]
    lines += [f"{note}." for note in plan.skipped]
    return (provenance_lines(origin) if origin else "") + "\n".join(lines) + "\n"


def _cell_text(text: Any, limit: int = 160) -> str:
    flat = " ".join(str(text).split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


def _tier_lines(units: Sequence[str]) -> str:
    return "; ".join(_cell_text(u, 120) for u in units) if units else "(empty)"


def probes_markdown(
    plan: Plan, results: Results, lm_identity: str, origin: dict[str, str] | None = None
) -> str:
    """Per system and episode: what each tier held, then each probe (expected, got, pass,
    context)."""
    lines = [f"# Per probe ({lm_identity})", ""]
    for s in plan.systems:
        lines += [f"## {s}", ""]
        if found := results.accuracy(s):
            lines += [f"Accuracy {found.format(signed=False)}.", ""]
        for ep in results.episodes.get(s, []):
            lines += [f"### {ep['episode']} (`{ep['dataset']}`)", ""]
            for tier, units in sorted((ep.get("tiers") or {}).items()):
                lines.append(f"- {tier.upper()} ({len(units)}): {_tier_lines(units)}")
            for sid, counts in (ep.get("extraction") or {}).items():
                lines.append(
                    f"- extraction {sid}: {counts['messages']} message(s), "
                    f"{counts['written']} object(s) written, {counts['stored']} fact(s) "
                    f"stored, {counts['refused']} refused"
                )
            lines += [
                "",
                "| probe | task | expected | got | pass | in context |",
                "|---|---|---|---|---|---|",
            ]
            for row in results.probes.get(s, []):
                if row["episode"] != ep["episode"] or row["dataset"] != ep["dataset"]:
                    continue
                context = _tier_lines(row["context"]) if row["context"] is not None else "-"
                cells = [
                    _cell_text(row["question"]),
                    row["task"],
                    _cell_text(row["expected"]),
                    _cell_text(row["got"]),
                    "yes" if row["pass"] else "no",
                    _cell_text(context, 400),
                ]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    return (provenance_lines(origin) if origin else "") + "\n".join(lines)


def print_tables(plan: Plan, results: Results, lm_identity: str, console: Console) -> None:
    table = Table(title=f"accuracy per task type ({lm_identity}); cells: accuracy (questions)")
    table.add_column("task")
    for s in plan.systems:
        table.add_column(s, justify="right")
    for label in results.rows():
        table.add_row(
            label,
            *[_fmt_cell(results.cell(label, s)) for s in plan.systems],
            end_section=label == results.labels[-1] if results.labels else False,
        )
    console.print(table)
    cost = Table(title="cost per episode")
    for col in ("system", "episodes", "s/episode", "LLM calls/episode"):
        cost.add_column(col, justify="left" if col == "system" else "right")
    for s in plan.systems:
        t = results.totals.get(s, SystemTotals()).as_dict()
        cost.add_row(
            s, str(t["episodes"]), _fmt(t["seconds_per_episode"]), _fmt(t["calls_per_episode"])
        )
    console.print(cost)
    for note in plan.skipped:
        console.print(f"[dim]{note}[/dim]")


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.baselines", __doc__, lm=True)
    parser.add_argument(
        "--systems", help=f"comma-separated (default: {','.join(DEFAULT_SYSTEMS)})"
    )
    parser.add_argument(
        "--datasets", help="comma-separated dataset URIs (default: MemFail tasks + synthetic:meme)"
    )
    parser.add_argument(
        "--episodes",
        type=int,
        metavar="N",
        help=f"at most N episodes per dataset whose URI has no limit= (default {DEFAULT_EPISODES} "
        "for the default datasets)",
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="experiment file (experiments/configs/*.toml)"
    )
    parser.add_argument(
        "--json", type=Path, metavar="OUT", help="also write the figures to this JSON file"
    )
    parser.add_argument(
        "--markdown", type=Path, metavar="OUT", help="also write the tables to this Markdown file"
    )
    parser.add_argument(
        "--probes",
        type=Path,
        metavar="OUT",
        help="also write the per-probe tables (expected, got, pass, context, each "
        "tier) as Markdown",
    )
    parser.add_argument(
        "--lm-cache",
        type=Path,
        metavar="FILE",
        help="reuse this LM cache (an earlier run's answers; new ones are added) "
        "instead of a fresh one",
    )
    args = parse_command(parser, argv)
    if args.episodes is not None and args.episodes < 1:
        parser.error("--episodes must be at least 1")
    # unknown systems, bad URIs and bad config files fail here, before the LM
    plan = make_plan(args)

    with tempfile.TemporaryDirectory() as tmp:
        lm = bench_lm(args, Path(tmp), args.lm_cache, systems=plan.systems)
        with Progress() as progress:
            results = run_bench(plan, lm, Path(tmp), progress)
    identity = lm.backend.identity
    origin = provenance(identity, command_of("experiments.bench.baselines", argv))

    print_tables(plan, results, identity, Console())
    if args.json:
        args.json.write_text(json.dumps(to_json(plan, results, identity, origin), indent=2))
    if args.markdown:
        args.markdown.write_text(to_markdown(plan, results, identity, origin))
    if args.probes:
        args.probes.write_text(probes_markdown(plan, results, identity, origin))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
