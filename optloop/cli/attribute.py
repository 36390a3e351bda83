"""Attribute every wrong answer of a memory system to the operation that caused it.

    python -m optloop attribute --system mem0 --dataset builtin:tiny
    python -m optloop attribute --system rag_bm25 --dataset synthetic:suite --faults planted \\
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

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

import argparse
import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Group

from optloop import failures
from optloop.analysis import (
    DEFAULT_DATASET,
    DEFAULT_SYSTEM,
    attribute_dataset,
    planted_report,
    traces_report,
)
from optloop.cli.command import CommandParser, dataset_help, lm_from_args, parse_command
from optloop.cli.status import RunProgress
from optloop.datasets import load_dataset
from optloop.errors import ConfigError
from optloop.faults.catalogue import CATALOGUE
from optloop.faults.model import PREREGISTERED
from optloop.faults.planted import EVIDENCE_REACHED, SET_ASIDE_REASONS, UNSOUND_CLEAN
from optloop.faults.planted_report import format_rate
from optloop.output import Table, make_console
from optloop.paths import state_dir, write_atomic
from optloop.progress import LOG_NAME
from systems import SYSTEMS, get_system

logger = logging.getLogger(__name__)
# The command's own (main, main_traces); the functions it calls report through a callback.
console = make_console()


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
    parser = CommandParser("optloop attribute", __doc__, lm=True)
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
