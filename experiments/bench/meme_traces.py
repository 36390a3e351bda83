"""Benchmark attribution on MEME's published traces: optloop's stage against the authors' labels.

    python -m experiments.bench.meme_traces --path <checkout of meme-eval> [--json out.json]

The MEME authors publish one episode with the traces of seven systems and, for each
failed probe, a hand-judged ``failure_stage`` (encoding, maintenance, retrieval,
answering). This imports the traces (``optloop.tracing.meme_traces``), attributes
every failed probe offline (``optloop.attribution.traces``: no system run, no LLM;
optloop's deterministic judges, lexical then the bundled embedding model, loaded before
the clock starts; ``--lexical-only`` drops the embedding judge) and compares optloop's decisive
stage with the label: ExtractionError <-> encoding, UpdateError/DeletionError <-> maintenance,
RetrievalError <-> retrieval, ResponseError <-> answering (``docs/meme-traces.md``).

Prints the agreement, the confusion matrix, the agreement per system and every
disagreement (probe, system, label, optloop's verdict and explanation) for a person
to mark: optloop wrong, label arguable, or the mapping loses information. Targets:
agreement >= 0.80, under 50 ms per failure, 0 LLM calls. ``--json`` writes ``n``,
``agreement``, ``confusion``, ``per_system``, ``ms_per_failure``, ``llm_calls``,
``disagreements`` (and a few more keys).

Get the data (it is not copied into this repository)::

    git clone --depth 1 https://github.com/SeokwonJung-Jay/meme-eval
    python -m experiments.bench.meme_traces --path meme-eval
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from optloop.attribution.traces import TracedFailure, attribute_traces, llm_calls, warm_embedder
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.datasets.meme_published import STAGES
from optloop.paths import write_atomic
from optloop.tracing.meme_traces import import_traces

NONE = "none"  # optloop's verdict had no stage (Unattributed)
TARGET_AGREEMENT = 0.80
TARGET_MS = 50.0
EXPLANATION_CHARS = 220


def _probe_name(failure: TracedFailure) -> str:
    return f"{failure.probe.phase}/{failure.probe.task_type}"


def confusion(labelled: Sequence[TracedFailure]) -> dict[str, dict[str, int]]:
    """label stage -> optloop stage -> count (every stage present, zeros included)."""
    counts = Counter((f.probe.failure_stage, f.stage or NONE) for f in labelled)
    return {
        label: {verdict: counts[(label, verdict)] for verdict in (*STAGES, NONE)}
        for label in STAGES
    }


def per_system(labelled: Sequence[TracedFailure]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in labelled:
        row = out.setdefault(f.system, {"n": 0, "agree": 0})
        row["n"] += 1
        row["agree"] += f.stage == f.probe.failure_stage
    for row in out.values():
        row["agreement"] = row["agree"] / row["n"]
    return out


def disagreement(f: TracedFailure) -> dict[str, Any]:
    a = f.attribution
    return {
        "probe": _probe_name(f),
        "question_id": f.question.id,
        "system": f.system,
        "label": f.probe.failure_stage,
        "label_note": f.probe.analysis.get("note"),
        "verdict": a.error_type.value,
        "stage": f.stage,
        "op_id": a.op_id,
        "part": a.details.get("part"),
        "ambiguous": a.ambiguous,
        "answer": f.probe.answer[:200],
        "explanation": a.explanation,
    }


def evaluate(failures: Sequence[TracedFailure], source: str = "") -> dict[str, Any]:
    """The benchmark's figures over the failures that carry a label."""
    labelled = [f for f in failures if f.probe.failure_stage]
    agree = sum(f.stage == f.probe.failure_stage for f in labelled)
    ms = sorted(f.seconds * 1000 for f in failures)
    return {
        "source": source,
        "n": len(labelled),
        "agreement": agree / len(labelled) if labelled else None,
        "confusion": confusion(labelled),
        "per_system": per_system(labelled),
        "ms_per_failure": sum(ms) / len(ms) if ms else None,
        "ms_p95": ms[min(len(ms) - 1, int(0.95 * len(ms)))] if ms else None,
        "llm_calls": llm_calls(failures),
        "disagreements": [disagreement(f) for f in labelled if f.stage != f.probe.failure_stage],
        "failures": len(failures),
        "unlabelled_failures": len(failures) - len(labelled),
        "targets": {"agreement": TARGET_AGREEMENT, "ms_per_failure": TARGET_MS, "llm_calls": 0},
    }


def run(path: Path, lexical_only: bool = False) -> dict[str, Any]:
    started = time.perf_counter()
    runs = import_traces(path)
    import_s = time.perf_counter() - started
    embedder, load_s = (None, 0.0) if lexical_only else warm_embedder()
    report = evaluate(attribute_traces(runs, embedder), str(path))
    report["probes"] = sum(len(r.probes) for r in runs)
    report["judges"] = "lexical" if lexical_only else f"lexical+embedding ({embedder.name})"
    report["import_seconds"] = round(import_s, 3)
    report["embedder_load_seconds"] = round(load_s, 3)
    return report


# --- rendering ----------------------------------------------------------------------------


def render_confusion(report: dict[str, Any]) -> Table:
    table = Table(title="label (rows) x optloop's stage (columns)")
    table.add_column("label")
    for verdict in (*STAGES, NONE):
        table.add_column(verdict, justify="right")
    for label, row in report["confusion"].items():
        table.add_row(label, *(str(n) if n else "." for n in row.values()))
    return table


def render_systems(report: dict[str, Any]) -> Table:
    table = Table(title="agreement per system")
    for col in ("system", "labelled failures", "agree", "agreement"):
        table.add_column(col, justify="left" if col == "system" else "right")
    for system, row in report["per_system"].items():
        table.add_row(system, str(row["n"]), str(row["agree"]), f"{row['agreement']:.2f}")
    return table


def render_disagreements(report: dict[str, Any]) -> Table:
    n = len(report["disagreements"])
    table = Table(
        title=f"{n} disagreement{'' if n == 1 else 's'} (mark each: optloop wrong / label "
        "arguable / mapping loses information)",
        show_lines=True,
    )
    for col in ("#", "probe", "system", "label", "optloop", "explanation"):
        table.add_column(col, overflow="fold")
    for i, d in enumerate(report["disagreements"], 1):
        text = d["explanation"]
        text = text if len(text) <= EXPLANATION_CHARS else text[: EXPLANATION_CHARS - 1] + "…"
        table.add_row(
            str(i),
            escape(d["probe"]),
            d["system"],
            d["label"],
            f"{d['verdict']} ({d['stage'] or NONE})",
            escape(text),
        )
    return table


def summary_line(report: dict[str, Any]) -> str:
    agreement, ms = report["agreement"] or 0.0, report["ms_per_failure"] or 0.0

    def met(ok: bool) -> str:
        return "met" if ok else "missed"

    marks = [
        f"agreement {agreement:.3f} (target >= {TARGET_AGREEMENT}: "
        f"{met(agreement >= TARGET_AGREEMENT)})",
        f"{ms:.2f} ms per failure (target < {TARGET_MS:.0f}: {met(ms < TARGET_MS)})",
        f"{report['llm_calls']} LLM calls",
    ]
    return (
        f"n={report['n']} labelled failures of {report.get('probes', '?')} probes, judges "
        f"{report.get('judges', '?')}: " + "; ".join(marks)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.meme_traces", __doc__)
    parser.add_argument(
        "--path",
        type=Path,
        required=True,
        help="a checkout of SeokwonJung-Jay/meme-eval (src/data and public/<name>), or one "
        "src/data/<name>.json",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")
    parser.add_argument(
        "--lexical-only",
        action="store_true",
        help="judge with the lexical judge alone (no embedding model; undecided counts as absent)",
    )
    args = parse_command(parser, argv)
    report = run(args.path, lexical_only=args.lexical_only)
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(summary_line(report))
    console.print(render_confusion(report))
    console.print(render_systems(report))
    if report["disagreements"]:
        console.print(render_disagreements(report))
    if args.json:
        write_atomic(args.json, json.dumps(report, indent=1, ensure_ascii=False))
        console.print(f"figures in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
