"""Attribute every wrong answer of a memory system to the operation that caused it.

    python -m optloop.attribute --system mem0 --dataset builtin:tiny
    python -m optloop.attribute --system rag_bm25 --dataset synthetic:suite --faults planted \\
        --json report.json

Runs the system over the dataset with the tracer on (one execution graph per
episode), attributes each failed question to its decisive operation, error
type and prompt site (or knob), and prints a table of error type by site.
Writes a JSON and a markdown report, the graphs, and (unless --no-traces) an
MLflow trace per failed question, whose spans are the operations.

While it runs it says where it is: on a terminal a status line, elsewhere (a
file, a pipe, a CI log) one plain line per episode with the time so far,
``[41 s] episode 3/40 recall-2: 4/6 correct so far, 2 failures attributed, ETA
2 min``. Those lines and the tables it prints are also appended, with the time,
to ``run.log`` beside the reports. Without a terminal tables are plain text
$COLUMNS wide (else 120), each title a line of its own. Third-party progress
bars (tqdm) are hidden unless --verbose.

With ``--from-traces meme:<dir>`` it runs nothing: it imports the traces MEME's
authors published (a checkout of ``SeokwonJung-Jay/meme-eval``, see
``docs/meme-traces.md``) as one graph per system and episode and attributes every
probe their judge failed, offline (no LM, no embedding model).

With ``--faults planted`` it instead runs the planted-fault harness: the
system clean and with each fault of the catalogue (``--list-faults``), and
reports how often attribution names the planted site and type: over the
induced failures (``site_accuracy``, ``type_accuracy``, ``n`` in the JSON, as
before) and over every failure a fault caused (``all_failures``), with the
failures the induced filter sets aside and why (``set_aside``,
``set_aside_cases``), the denominators (``denominators``: clean passes per
system and dataset; ``by_fault``: failures caused per fault) and a 95%
interval on every rate.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults, quiet_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported
if __name__ == "__main__":  # run as a command (not imported): tqdm's bars off unless --verbose
    os.environ.update(quiet_defaults())

import argparse
import inspect
import json
import logging
import shutil
import sys
import tempfile
import time
import types
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Group

from optloop import failures
from optloop.attribution import blame, default_judges
from optloop.attribution.planted import (
    EVIDENCE_REACHED,
    SET_ASIDE_REASONS,
    UNSOUND_CLEAN,
    run_planted,
)
from optloop.attribution.planted_report import format_rate, summarize
from optloop.cli import CommandParser, dataset_help, lm_from_args, parse_command, run_cli
from optloop.datasets import load_dataset
from optloop.errors import ConfigError
from optloop.faults.catalogue import CATALOGUE
from optloop.faults.model import PREREGISTERED
from optloop.output import Table, make_console
from optloop.paths import state_dir, write_atomic
from optloop.pipeline import Attributor, FreshStores, run_episodes
from optloop.progress import LOG_NAME, RunProgress, episode_line
from systems import SYSTEMS, get_system

logger = logging.getLogger(__name__)
# The command's own (main, main_traces); the functions it calls report through a callback.
console = make_console()

# What the command and attribute() attribute when not told: written here once, read by both.
DEFAULT_SYSTEM = "rag_bm25"
DEFAULT_DATASET = "builtin:tiny"


class EpisodeDone(BaseModel):
    """One episode run, traced and attributed, as :func:`attribute_dataset` reports it to its
    ``progress`` callback: this episode, and the counts of every episode done so far."""

    episode: str = Field(description="the episode's id")
    done: int = Field(description="episodes done, this one included")
    total: int = Field(description="episodes in the dataset")
    questions: int = Field(description="questions asked so far")
    correct: int = Field(description="questions answered right so far")
    failures: int = Field(description="wrong answers attributed so far")
    seconds: float = Field(description="wall time since the first episode started")

    @property
    def eta_s(self) -> float | None:
        """Seconds the episodes left should take at the pace so far (``None`` once done)."""
        left = self.total - self.done
        return self.seconds / self.done * left if left and self.done else None

    def text(self) -> str:
        """``episode 3/40 recall-2: 4/6 correct so far, 2 failures attributed, ETA 2 min``"""
        return episode_line(
            self.done,
            self.total,
            self.episode,
            self.questions,
            self.correct,
            self.failures,
            self.eta_s,
        )


def attribute_dataset(
    system_name: str,
    dataset_uri: str,
    lm: Any,
    work: Path,
    *,
    embedder: Any = None,
    traces: bool = False,
    llm_judge: bool = False,
    agent: bool = False,
    progress: Callable[[EpisodeDone], None] | None = None,
) -> dict[str, Any]:
    """Run, trace and attribute every episode through the one pipeline
    (:func:`optloop.pipeline.run_episodes`:
    ``--concurrency`` at a time, reported in episode order); returns the report (graphs saved under
    ``work/graphs``).

    With ``agent`` the LLM agent (:mod:`optloop.attribution.agent`) re-examines the cases the
    deterministic walk marks ambiguous. ``progress`` is called once per episode, in episode order,
    as soon as it is attributed (:class:`EpisodeDone`); nothing is printed here.
    """
    from optloop.attribution.agent import AttributionAgent
    from optloop.embed import get_embedder

    dataset = load_dataset(dataset_uri)
    cls = get_system(system_name)
    embedder = embedder or get_embedder()
    judges = default_judges(embedder, lm if llm_judge else None)
    explorer = AttributionAgent(lm) if agent else None
    attributor = Attributor(judges, embedder, agent=explorer)
    stores = FreshStores(
        lambda episode: cls(lm, work / "runs" / episode.id, embedder=embedder),
        lm,
        dataset_uri=dataset.uri,
    )
    attributions, questions, correct, timings = [], 0, 0, []
    mark = lm.accounting.mark()
    started = time.perf_counter()
    for done, result in enumerate(
        run_episodes(
            dataset.episodes,
            stores,
            lm=lm,
            attributor=attributor,
            keep="all",
            save_graph=lambda graph, episode: _save(graph, work, episode.id),
        ),
        start=1,
    ):
        questions += len(result.outcomes)
        correct += sum(o.passed for o in result.outcomes)
        timings += [
            result.attribution_s[o.question_id]
            for o in result.outcomes
            if o.attribution is not None
        ]
        failed = result.attributions()
        attributions += failed
        if traces and failed:
            from optloop import tracking
            from optloop.tracing.mlflow_traces import log_graph_traces

            tracking.configure()
            tracking.experiment(f"optloop-attribution-{system_name}")

            assert result.graph is not None
            log_graph_traces(
                result.graph,
                [a.question_id for a in failed],
                {a.question_id: a.to_annotation() for a in failed},
            )
        if progress is not None:
            progress(
                EpisodeDone(
                    episode=result.episode.id,
                    done=done,
                    total=len(dataset.episodes),
                    questions=questions,
                    correct=correct,
                    failures=len(attributions),
                    seconds=time.perf_counter() - started,
                )
            )
    usage = lm.accounting.totals(since=mark)
    failures.check(
        usage.errors,
        usage.calls,
        what=f"optloop.attribute of {system_name} on {dataset.uri}",
        first=failures.first_error(lm.accounting.since(mark)),
    )
    entries = blame(attributions, passed=correct)
    return {
        "system": system_name,
        "dataset": dataset.uri,
        "questions": questions,
        "correct": correct,
        "accuracy": correct / questions if questions else None,
        "failures": len(attributions),
        "blame": [e.model_dump() for e in entries],
        "by_type_and_site": [
            {"type": t, "target": s, "n": n}
            for (t, s), n in Counter(
                (a.error_type.value, a.target or "-") for a in attributions
            ).most_common()
        ],
        "attributions": [a.model_dump(mode="json") for a in attributions],
        "median_attribution_ms": sorted(timings)[len(timings) // 2] * 1000 if timings else None,
        "judge_calls": dict(judges.calls),
        "ambiguous": sum(a.ambiguous for a in attributions),
        "agent_calls": explorer.calls if explorer else 0,
        "cost": {
            "llm_calls": usage.calls,
            "tokens": usage.tokens,
            "seconds": round(time.perf_counter() - started, 1),
        },
        "failed_calls": usage.errors,
    }


def _save(graph: Any, work: Path, episode_id: str) -> str:
    path = work / "graphs" / f"{episode_id}.json"
    graph.save(path)
    return str(path)


def traces_report(uri: str, out: Path, lexical_only: bool = False) -> dict[str, Any]:
    """Import published traces (``meme:<dir>``), attribute every failed probe offline, save the
    graphs."""
    from optloop.attribution.traces import attribute_traces, llm_calls, warm_embedder
    from optloop.tracing.meme_traces import import_traces

    scheme, _, rest = uri.partition(":")
    if scheme != "meme" or not rest:
        raise ConfigError(
            f"--from-traces {uri!r}: expected meme:<dir> (a checkout of meme-eval, or its "
            "src/data/<name>.json)"
        )
    started = time.perf_counter()
    runs = import_traces(rest)
    import_s = time.perf_counter() - started
    embedder, load_s = (None, 0.0) if lexical_only else warm_embedder()
    failures = attribute_traces(runs, embedder)
    for run in runs:
        run.graph.save(out / "graphs" / run.system / f"{run.episode.id}.json")
    attributions = [f.attribution for f in failures]
    ms = sorted(f.seconds * 1000 for f in failures)
    return {
        "source": uri,
        "systems": list(dict.fromkeys(r.system for r in runs)),
        "probes": sum(len(r.probes) for r in runs),
        "failures": len(failures),
        "blame": [e.model_dump() for e in blame(attributions)],
        "by_type_and_site": [
            {"type": t, "target": s, "n": n}
            for (t, s), n in Counter(
                (a.error_type.value, a.target or "-") for a in attributions
            ).most_common()
        ],
        "by_system_and_type": [
            {"system": sy, "type": t, "n": n}
            for (sy, t), n in Counter(
                (f.system, f.attribution.error_type.value) for f in failures
            ).items()
        ],
        "attributions": [f.to_json() for f in failures],
        "ms_per_failure": sum(ms) / len(ms) if ms else None,
        "median_attribution_ms": ms[len(ms) // 2] if ms else None,
        "ambiguous": sum(a.ambiguous for a in attributions),
        "llm_calls": llm_calls(failures),
        "judges": "lexical" if embedder is None else f"lexical+embedding ({embedder.name})",
        "cost": {
            "llm_calls": llm_calls(failures),
            "tokens": 0,
            "seconds": round(time.perf_counter() - started, 3),
            "import_seconds": round(import_s, 3),
            "embedder_load_seconds": round(load_s, 3),
        },
    }


def render_traces(report: dict[str, Any]) -> Table:
    types = sorted({row["type"] for row in report["by_system_and_type"]})
    counts = {(r["system"], r["type"]): r["n"] for r in report["by_system_and_type"]}
    ms = report["ms_per_failure"]
    table = Table(
        title=f"{report['source']}: {report['failures']} failed probes of {report['probes']}, "
        f"attributed offline ({report['llm_calls']} LLM calls, {ms or 0:.1f} ms per failure)"
    )
    table.add_column("system")
    for t in types:
        table.add_column(t, justify="right")
    for system in report["systems"]:
        table.add_row(system, *(str(counts.get((system, t), "")) for t in types))
    return table


def render_traces_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Attribution of published traces: {report['source']}",
        "",
        f"{report['failures']} failed probes of {report['probes']}; {report['llm_calls']} LLM "
        f"calls; {report['ms_per_failure'] or 0:.1f} ms per failure.",
        "",
    ]
    for f in report["attributions"]:
        a = f["attribution"]
        lines += [
            f"### {f['system']} / {f['question_id']}: {a['question']}",
            "",
            f"- gold: `{a['gold'][:200]}`; answer: `{a['prediction'][:200]}`",
            f"- **{a['error_type']}** at `{a['op_id']}` (stage {f['stage']}; published "
            f"label {f['label']})" + (" (ambiguous)" if a["ambiguous"] else ""),
            "",
            a["explanation"],
            "",
        ]
    return "\n".join(lines)


def render_table(report: dict[str, Any]) -> Table:
    types = sorted({row["type"] for row in report["by_type_and_site"]})
    targets = sorted({row["target"] for row in report["by_type_and_site"]})
    title = failures.mark(
        f"{report['system']} on {report['dataset']}: {report['failures']} failures of "
        f"{report['questions']} questions",
        report.get("failed_calls", 0),
    )
    table = Table(title=f"{title}, attributed (error type by site)")
    table.add_column("site / knob")
    for t in types:
        table.add_column(t, justify="right")
    counts = {(r["type"], r["target"]): r["n"] for r in report["by_type_and_site"]}
    for target in targets:
        table.add_row(target, *(str(counts.get((t, target), "")) for t in types))
    return table


def _rate(entry: dict[str, Any]) -> str:
    """A blame entry's failure rate given a correct input, ``"12/20 (60%)"`` (``"-"`` when not
    computed)."""
    if entry.get("rate") is None:
        return "-"
    return f"{entry['failures']}/{entry['reached']} ({entry['rate']:.0%})"


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Attribution: {report['system']} on {report['dataset']}",
        "",
        failures.mark(
            f"Accuracy {report['correct']}/{report['questions']}", report.get("failed_calls", 0)
        )
        + f"; {report['failures']} failures attributed; "
        f"{report['cost']['llm_calls']} LLM calls, {report['cost']['seconds']} s.",
        "",
        "## Blame",
        "",
        "ranked by failure rate given a correct input (failures / questions that reached "
        "the target's stage intact)",
        "",
        "| site / knob | failures | share | failure rate | types |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {b['target']} | {b['failures']} | {b['share']:.0%} | {_rate(b)} | "
        f"{', '.join(f'{k} {v}' for k, v in b['types'].items())} |"
        for b in report["blame"]
    ]
    lines += ["", "## Failures", ""]
    for a in report["attributions"]:
        lines += [
            f"### {a['question_id']}: {a['question']}",
            "",
            f"- gold: `{a['gold']}`; prediction: `{a['prediction']}`",
            f"- **{a['error_type']}** at `{a['op_id']}`, fix `{a['target']}`"
            + (" (ambiguous)" if a["ambiguous"] else ""),
            "",
            a["explanation"],
            "",
        ]
    return "\n".join(lines)


def planted_report(
    systems: list[str],
    dataset_uri: str,
    lm: Any,
    work: Path,
    fault_names: list[str] | None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The planted-fault harness (:func:`~optloop.attribution.planted.run_planted`) over
    ``systems`` and its report; ``progress(message)`` hears each step of the harness."""
    dataset = load_dataset(dataset_uri)
    mark = lm.accounting.mark()
    started = time.perf_counter()
    planted = run_planted(
        systems,
        dataset,
        lm,
        work,
        fault_names=fault_names,
        progress=(lambda msg: progress(f"planted faults: {msg}")) if progress else None,
    )
    usage = lm.accounting.totals(since=mark)
    return {
        **summarize(planted),
        "systems": systems,
        "dataset": dataset.uri,
        "cases": [c.to_json() for c in planted.induced],
        "set_aside_cases": [c.to_json() for c in planted.set_aside],
        "cost": {
            "llm_calls": usage.calls,
            "tokens": usage.tokens,
            "seconds": round(time.perf_counter() - started, 1),
        },
    }


def _planted_scope(report: dict[str, Any]) -> str:
    datasets = report.get("datasets") or [report.get("dataset") or ""]
    return ", ".join(d for d in datasets if d) or "(no dataset)"


def _planted_lines(report: dict[str, Any]) -> list[str]:
    """The headline figures as sentences: each accuracy induced-only and over every caused failure,
    what was set aside, the attribution's speed; an empty sample says so, a small one is
    flagged."""
    ind, every, aside = report["induced"], report["all_failures"], report["set_aside"]
    lines = []
    for label, key in (("site accuracy", "site"), ("type accuracy", "type")):
        lines.append(f"{label}, induced failures only: {format_rate(ind[key])}")
        lines.append(f"{label}, every failure a fault caused: {format_rate(every[key])}")
    if aside["n"]:
        why = "; ".join(
            f"{r['n']} because {r['description']}" for r in aside["by_reason"].values() if r["n"]
        )
        lines.append(
            f"set aside from the induced figure: {aside['n']} ({why}); each is attributed below"
        )
    else:
        lines.append("set aside from the induced figure: none")
    small = [d for d in report["denominators"] if d["small_sample"]]
    for d in small:
        lines.append(f"{d['system']} on {d['dataset']}: {d['note']}")
    if report["median_attribution_ms"] is None:
        lines.append("attribution: no failure attributed")
    else:
        lines.append(
            f"attribution: median {report['median_attribution_ms']:.2f} ms, p95 "
            f"{report['p95_attribution_ms']:.2f} ms per failure, "
            f"{report['attribution_llm_calls']} LLM calls"
        )
    lines.append(
        "k/n estimate [95% CI]: seeded bootstrap (optloop.stats.bootstrap_mean, seed "
        f"{report['seed']}); * marks n < {report['min_sample']}, too small to support a figure"
    )
    return lines


def _fault_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """system/fault, clean passes, caused, induced, set aside (unsound / evidence reached), four
    rate cells."""
    rows: list[tuple[str, ...]] = []
    groups = [
        (f"{name}" + (" (new)" if row.get("added") == PREREGISTERED else ""), row)
        for name, row in report["by_fault"].items()
    ]
    groups += [(f"type {name}", row) for name, row in report["by_type"].items()]
    groups += [(f"faults added: {name}", row) for name, row in report.get("by_added", {}).items()]
    groups += [
        (
            "all",
            {
                "caused": report["all_failures"]["n"],
                "induced": report["induced"],
                "all": report["all_failures"],
                "passed_clean": sum(d["passed_clean"] for d in report["denominators"]),
            },
        )
    ]
    for name, row in groups:
        aside = row.get("set_aside")
        rows.append(
            (
                name,
                str(row.get("passed_clean", "")),
                str(row["caused"]),
                str(row["induced"]["n"]),
                f"{aside[UNSOUND_CLEAN]} / {aside[EVIDENCE_REACHED]}" if aside else "",
                format_rate(row["induced"]["site"], compact=True),
                format_rate(row["all"]["site"], compact=True),
                format_rate(row["induced"]["type"], compact=True),
                format_rate(row["all"]["type"], compact=True),
            )
        )
    return rows


FAULT_COLUMNS = (
    "system/fault",
    "clean passes",
    "caused",
    "induced",
    "set aside (unsound / reached)",
    "site acc. induced",
    "site acc. all",
    "type acc. induced",
    "type acc. all",
)
DENOMINATOR_COLUMNS = (
    "system",
    "dataset",
    "episodes",
    "questions",
    "passed clean",
    "sound clean passes",
    "failures caused",
    "note",
)
ASIDE_COLUMNS = (
    "system/fault",
    "question",
    "why set aside",
    "planted",
    "attributed",
    "site",
    "type",
)


def _denominator_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            d["system"],
            d["dataset"],
            str(d["episodes"]),
            str(d["questions"]),
            str(d["passed_clean"]),
            str(d["sound_clean"]),
            str(d["failures_caused"]),
            d["note"],
        )
        for d in report["denominators"]
    ]


def _aside_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            f"{c['system']}/{c['fault']}",
            f"{c['episode']}/{c['question_id']}",
            c["set_aside"],
            f"{c['true_target']} {c['true_type']}",
            f"{c['attribution']['target'] or '-'} {c['attribution']['error_type']}",
            "ok" if c["site_ok"] else "wrong",
            "ok" if c["type_ok"] else "wrong",
        )
        for c in report.get("set_aside_cases", [])
    ]


def render_planted(report: dict[str, Any]) -> Group:
    """The planted report for the terminal: the denominators, each fault's caused failures with the
    induced-only and all-failures accuracies side by side, the headline sentences, the set-aside
    failures."""
    scope = _planted_scope(report)
    parts: list[Any] = []
    for title, columns, rows in (
        (
            f"planted faults on {scope}: clean runs (the denominators)",
            DENOMINATOR_COLUMNS,
            _denominator_rows(report),
        ),
        (
            "failures each fault caused, attributed (k/n estimate [95% CI])",
            FAULT_COLUMNS,
            _fault_rows(report),
        ),
        (
            "failures set aside from the induced figure, attributed anyway",
            ASIDE_COLUMNS,
            _aside_rows(report),
        ),
    ):
        if not rows and columns is ASIDE_COLUMNS:
            continue
        table = Table(title=title)
        for col in columns:
            table.add_column(col)
        for row in rows:
            table.add_row(*row)
        parts.append(table)
    parts.insert(2, "\n".join(_planted_lines(report)))
    return Group(*parts)


def render_planted_markdown(report: dict[str, Any]) -> str:
    """The planted report as markdown: the same tables and sentences as :func:`render_planted`."""

    def table(columns: Sequence[str], rows: list[tuple[str, ...]]) -> list[str]:
        return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
            "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows
        ]

    lines = [
        f"# Planted faults on {_planted_scope(report)}",
        "",
        "## Clean runs (the denominators)",
        "",
        *table(DENOMINATOR_COLUMNS, _denominator_rows(report)),
        "",
        "## Failures each fault caused",
        "",
        *table(FAULT_COLUMNS, _fault_rows(report)),
        "",
        *(f"- {line}" for line in _planted_lines(report)),
        "",
    ]
    aside = _aside_rows(report)
    if aside:
        lines += [
            "## Failures set aside from the induced figure, attributed anyway",
            "",
            *table(ASIDE_COLUMNS, aside),
            "",
            *(f"- `{key}`: {text}" for key, text in SET_ASIDE_REASONS.items()),
            "",
        ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("python -m optloop.attribute", __doc__, lm=True)
    parser.add_argument(
        "--system",
        default=DEFAULT_SYSTEM,
        help=f"memory system, or a comma-separated list with --faults ({', '.join(SYSTEMS)})",
    )
    parser.add_argument("--dataset", default=DEFAULT_DATASET, help=dataset_help(DEFAULT_DATASET))
    parser.add_argument(
        "--faults", choices=["planted"], help="run the planted-fault harness instead"
    )
    parser.add_argument(
        "--from-traces",
        metavar="URI",
        help="attribute published traces offline instead of running "
        "a system: meme:<dir> (a checkout of meme-eval; see docs/meme-traces.md)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        dest="fault_names",
        metavar="NAME",
        help="only this planted fault (repeatable)",
    )
    parser.add_argument(
        "--list-faults", action="store_true", help="print the fault catalogue and exit"
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the JSON report here")
    parser.add_argument(
        "--markdown", type=Path, metavar="OUT", help="write the markdown report here"
    )
    parser.add_argument(
        "--out", type=Path, help="where graphs and reports go (default .optloop/attribution/...)"
    )
    parser.add_argument(
        "--no-traces", action="store_true", help="do not mirror failures to MLflow traces"
    )
    parser.add_argument(
        "--lexical-only",
        action="store_true",
        help="with --from-traces: the lexical judge alone "
        "(no embedding model; a text it cannot decide counts as not carrying the evidence)",
    )
    parser.add_argument(
        "--llm-judge",
        action="store_true",
        help="let an LLM judge settle cases the cheap judges cannot (costs LLM calls)",
    )
    parser.add_argument(
        "--agent",
        action="store_true",
        help="let an LLM agent explore the graph for the cases the "
        "deterministic pass marks ambiguous (costs LLM calls; at most 6 per case)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    if args.list_faults:
        table = Table(title="planted-fault catalogue")
        for col in ("fault", "systems", "true target", "true type", "added", "what it does"):
            table.add_column(col)
        for f in CATALOGUE:
            table.add_row(
                f.name, ", ".join(f.systems), f.target, f.error_type.value, f.added, f.description
            )
        console.print(table)
        return 0
    if args.from_traces:
        return main_traces(args)
    systems = [s.strip() for s in args.system.split(",") if s.strip()]
    for name in systems:
        get_system(name)  # unknown names fail before any work
    if len(systems) > 1 and not args.faults:
        raise ConfigError("several systems need --faults planted; attribute one system at a time")
    known = {f.name for f in CATALOGUE}
    unknown = sorted(set(args.fault_names or ()) - known)
    if unknown:
        raise ConfigError(f"unknown fault(s) {unknown}; see --list-faults")
    dataset = load_dataset(args.dataset)  # a malformed dataset fails here, before any LLM call
    lm = lm_from_args(args, get_system(systems[0]).local_decoding if len(systems) == 1 else None)
    endpoint = lm.check_endpoint()  # an endpoint that cannot serve fails now; its modes, and why
    slug = f"{'+'.join(systems)}-{args.dataset.replace(':', '_').replace('/', '_')}"
    out = args.out or state_dir() / "attribution" / slug
    # Where it is, as optloop run says it: a status line on a terminal, else a line per episode;
    # every line and table also in run.log beside the reports.
    progress = RunProgress(console, out / LOG_NAME)
    progress.show(
        f"optloop attribute: {'+'.join(systems)} on {dataset.uri}: {len(dataset.episodes)} "
        f"episodes, {sum(len(e.questions) for e in dataset.episodes)} questions"
        + (" (planted faults)" if args.faults else "")
    )
    for line in endpoint:
        progress.show(line)
    with tempfile.TemporaryDirectory(prefix="optloop-attr-") as tmp:
        work = Path(tmp)
        if args.faults:
            with progress.shown("planted faults") as say:
                report = planted_report(
                    systems, args.dataset, lm, work, args.fault_names, progress=say
                )
            progress.show(render_planted(report))
            markdown = render_planted_markdown(report)
        else:
            with progress.shown(f"{systems[0]} on {dataset.uri}") as say:
                report = attribute_dataset(
                    systems[0],
                    args.dataset,
                    lm,
                    work,
                    traces=not args.no_traces,
                    llm_judge=args.llm_judge,
                    agent=args.agent,
                    progress=lambda done: say(done.text()),
                )
            progress.show(render_table(report))
            for b in report["blame"]:
                progress.show(
                    f"  blame {b['target']}: {b['failures']} ({b['share']:.0%}), failure "
                    f"rate {_rate(b)}"
                )
            markdown = render_markdown(report)
            if (work / "graphs").exists():
                shutil.rmtree(out / "graphs", ignore_errors=True)
                shutil.copytree(work / "graphs", out / "graphs")
    text = json.dumps(report, indent=1, ensure_ascii=False)
    write_atomic(args.json or out / "report.json", text)
    if markdown is not None:
        write_atomic(args.markdown or out / "report.md", markdown)
    progress.show(
        f"reports in {args.json or out / 'report.json'}"
        + ("" if markdown is None else f" and {args.markdown or out / 'report.md'}")
        + f"; log: {out / LOG_NAME}"
    )
    return 0


def main_traces(args: argparse.Namespace) -> int:
    """``--from-traces``: import, attribute, write the reports; no LM is made."""
    clashing = [
        flag
        for flag, on in (
            ("--faults", args.faults),
            ("--agent", args.agent),
            ("--llm-judge", args.llm_judge),
        )
        if on
    ]
    if clashing:
        raise ConfigError(f"--from-traces attributes offline; drop {', '.join(clashing)}")
    slug = "traces-" + args.from_traces.replace(":", "_").replace("/", "_").strip("_")
    out = args.out or state_dir() / "attribution" / slug
    report = traces_report(args.from_traces, out, lexical_only=args.lexical_only)
    console.print(render_traces(report))
    for b in report["blame"]:
        console.print(f"  blame {b['target']}: {b['failures']} ({b['share']:.0%})")
    write_atomic(
        args.json or out / "report.json", json.dumps(report, indent=1, ensure_ascii=False)
    )
    write_atomic(args.markdown or out / "report.md", render_traces_markdown(report))
    console.print(
        f"reports in {args.json or out / 'report.json'} and {args.markdown or out / 'report.md'}; "
        f"graphs in {out / 'graphs'}"
    )
    return 0


class AttributionReport(BaseModel):
    """What :func:`attribute` found: the same report ``optloop attribute`` writes to
    ``report.json``."""

    model_config = ConfigDict(extra="allow")

    system: str
    dataset: str
    questions: int = Field(description="questions asked")
    correct: int = Field(description="questions answered right")
    accuracy: float | None = Field(description="correct / questions (None without questions)")
    failures: int = Field(description="wrong answers, each attributed")
    blame: list[dict[str, Any]] = Field(
        description="per target (prompt site or knob:<name>), ranked by failure "
        "rate: failures, share, rate with its 95% CI"
    )
    by_type_and_site: list[dict[str, Any]] = Field(
        description="failures per error type and target"
    )
    attributions: list[dict[str, Any]] = Field(
        description="one per wrong answer: decisive operation, error type, target, explanation"
    )
    graphs: Path | None = Field(
        None, description="the folder of execution graphs, one per episode"
    )


def attribute(
    system: str = DEFAULT_SYSTEM,
    dataset: str = DEFAULT_DATASET,
    lm: str | None = None,
    *,
    lm_base_url: str | None = None,
    concurrency: int | None = None,
    out: str | Path | None = None,
    traces: bool = False,
    llm_judge: bool = False,
    agent: bool = False,
    progress: Callable[[EpisodeDone], None] | None = None,
) -> AttributionReport:
    """Run a memory system over a dataset and attribute every wrong answer to its cause.

    The same attribution as ``optloop attribute``: the system runs with every memory operation
    recorded, and each failed question is traced to its decisive operation (the first one that lost
    the evidence), its error type, and the prompt site or knob to fix; blame is summed per target.

    Example:

        .. code-block:: python

            import optloop

            report = optloop.attribute(system="rag_bm25", dataset="builtin:tiny")
            for entry in report.blame:
                print(entry["target"], entry["failures"])

    Args:
        system:
            A memory system of ``systems.SYSTEMS``.
        dataset:
            A dataset URI (see ``docs/systems.md``).
        lm:
            The LM spec (``local``, ``local:<name>``, ``local:/path/model.gguf``,
            ``openai:<model>``); :obj:`None` reads ``OPTLOOP_LM``, else ``local``.
        lm_base_url:
            Base URL of an OpenAI-compatible endpoint (else ``OPENAI_BASE_URL``).
        concurrency:
            LM requests in flight at once.
        out:
            A folder to keep the execution graphs in (``<out>/graphs``); :obj:`None` keeps none.
        traces:
            Also log one MLflow trace per failed question.
        llm_judge:
            Let an LLM judge settle the cases the lexical and embedding judges cannot.
        agent:
            Let an LLM agent re-examine the cases the deterministic walk leaves ambiguous.
        progress:
            Called once per episode as soon as it is attributed, in episode order, with an
            :class:`EpisodeDone` (``print(done.text())`` prints the line ``optloop attribute``
            prints); :obj:`None` says nothing.

    Returns:
        The :class:`AttributionReport`: accuracy, blame per target, failures per error type and
        target, and every attribution.

    Raises:
        optloop.errors.OptloopError:
            An unknown system, a malformed dataset, or an LM that cannot be reached.
    """
    from optloop.datasets import load_dataset
    from optloop.lm import LMSettings, OptloopLM
    from systems import get_system

    cls = get_system(system)
    load_dataset(dataset)  # a malformed dataset fails here, before any LLM call
    settings = LMSettings.from_spec(
        lm, defaults=cls.local_decoding, base_url=lm_base_url, concurrency=concurrency
    )
    model = OptloopLM(settings)
    with tempfile.TemporaryDirectory(prefix="optloop-attr-") as tmp:
        report = attribute_dataset(
            system,
            dataset,
            model,
            Path(tmp),
            traces=traces,
            llm_judge=llm_judge,
            agent=agent,
            progress=progress,
        )
        graphs = None
        if out is not None and (Path(tmp) / "graphs").exists():
            graphs = Path(out) / "graphs"
            shutil.rmtree(graphs, ignore_errors=True)
            shutil.copytree(Path(tmp) / "graphs", graphs)
    return AttributionReport.model_validate({**report, "graphs": graphs})


class _CallableModule(types.ModuleType):
    """This module, callable: ``optloop.attribute(...)`` is :func:`attribute` (the module and the
    function share the name ``optloop.attribute``; calling the module runs the function)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return attribute(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(attribute)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    sys.exit(run_cli(main))
