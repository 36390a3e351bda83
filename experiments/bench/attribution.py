"""Benchmark attribution on planted faults: accuracy, speed, and LLM calls of the deterministic pass.

    python -m experiments.bench.attribution [--systems rag_bm25,...] [--datasets builtin:tiny,synthetic:suite]
                                            [--json out.json]

Runs the planted-fault harness (``optloop.attribution.faults``) for each system
over each dataset with the embedded LM: every system clean and under each of
its faults. Each question that passes clean and fails under a fault is an
induced failure with a known site and type; the deterministic attribution pass
(lexical then embedding judges, no LLM judge) is scored against it. Reports
site accuracy, type accuracy and n overall, per fault and per error type; the
median and p95 milliseconds per attributed failure; and the LLM calls the
attribution made (0 by design).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory

from rich.console import Console
from rich.table import Table

from optloop.attribution.faults import PlantedRun, run_planted, summarize
from optloop.cli import add_lm_arguments, lm_from_args, run_cli, setup_logging
from optloop.datasets import load_dataset
from systems import get_system

DEFAULT_SYSTEMS = "rag_bm25,rag_embedding,long_context,md_flat,mem0,graphiti"
DEFAULT_DATASETS = ";".join(["builtin:tiny"] + [f"synthetic:suite?seed={i}" for i in range(5)])
LIBRARY_SYSTEMS = {"mem0", "graphiti"}  # ~50 s per ingested session on 2 cores with the embedded LM


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.attribution", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"comma-separated (default {DEFAULT_SYSTEMS})")
    parser.add_argument("--datasets", default=DEFAULT_DATASETS,
                        help=f"semicolon-separated dataset URIs (default {DEFAULT_DATASETS!r})")
    parser.add_argument("--library-datasets", default="builtin:tiny",
                        help="semicolon-separated datasets for mem0 and graphiti, which ingest ~50 s a session "
                             "here (default builtin:tiny)")
    parser.add_argument("--json", type=Path, help="also write the figures (and every case) here")
    parser.add_argument("--verbose", action="store_true")
    add_lm_arguments(parser)
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for name in systems:
        get_system(name)
    datasets = [load_dataset(uri.strip()) for uri in args.datasets.split(";") if uri.strip()]
    library_uris = {load_dataset(uri.strip()).uri for uri in args.library_datasets.split(";") if uri.strip()}
    lm = lm_from_args(args)
    console = Console()
    planted = PlantedRun([])
    started = time.perf_counter()
    with TemporaryDirectory(prefix="optloop-bench-attr-") as tmp, console.status("planted faults") as status:
        for dataset in datasets:
            for system in systems:  # one system at a time, so a slow one shows its progress
                if system in LIBRARY_SYSTEMS and dataset.uri not in library_uris:
                    continue
                planted += run_planted([system], dataset, lm, Path(tmp) / dataset.name, embedder=None,
                                     progress=lambda msg: status.update(f"{dataset.name}: {msg}"))
    summary = summarize(planted)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["datasets"] = [d.uri for d in datasets]

    table = Table(title=f"planted faults, deterministic attribution ({lm.backend.identity})")
    for col in ("system/fault", "induced failures", "site acc.", "type acc."):
        table.add_column(col)
    for name, row in summary["by_fault"].items():
        table.add_row(name, str(row["n"]), f"{row['site_accuracy']:.2f}", f"{row['type_accuracy']:.2f}")
    for name, row in summary["by_type"].items():
        table.add_row(f"[b]type {name}", str(row["n"]), f"{row['site_accuracy']:.2f}", f"{row['type_accuracy']:.2f}")
    table.add_row("[b]all", str(summary["n"]), f"{summary['site_accuracy'] or 0:.3f}",
                  f"{summary['type_accuracy'] or 0:.3f}")
    console.print(table)
    console.print(f"attribution: median {summary['median_attribution_ms'] or 0:.2f} ms, p95 "
                  f"{summary['p95_attribution_ms'] or 0:.2f} ms per failure, "
                  f"{summary['attribution_llm_calls']} LLM calls; {summary['collateral']} collateral failures "
                  "(the fault did not keep the evidence from the answer) left out; systems covered: "
                  f"{', '.join(summary['systems_covered'])}; {summary['seconds']} s in all")
    if args.json:
        detail = [{"system": c.system, "fault": c.fault, "episode": c.episode, "true_target": c.true_target,
                   "true_type": c.true_type.value, "site_ok": c.site_ok, "type_ok": c.type_ok,
                   "attribution": c.attribution.model_dump(mode="json")} for c in planted.cases]
        args.json.write_text(json.dumps({**summary, "cases": detail}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
