"""Benchmark attribution on planted faults: accuracy, speed, and LLM calls of the deterministic
pass.

    python -m experiments.bench.attribution [--systems rag_bm25,...]
                                            [--datasets "builtin:tiny;synthetic:suite"]
                                            [--faults preregistered|NAME,...]
                                            [--json out.json] [--markdown out.md]

Runs the planted-fault harness (``optloop.faults.planted``) for each system
over each dataset with the embedded LM: every system clean and under each of
its faults. Each question that passes clean and fails under a fault is a
failure the fault caused, with a known site and type; the deterministic
attribution pass (lexical then embedding judges, no LLM judge) is scored
against it. Reports, overall, per fault and per error type, site and type
accuracy over the induced failures (a sound clean pass, and the fault kept the
evidence from the answer) next to the same over every failure the faults
caused, each with its 95% bootstrap interval and n; the failures set aside
from the induced figure, each with its reason and its attribution; the
denominators (clean passes per system and dataset, failures caused per fault),
flagging samples under 10 as too small to support a figure; the original
faults' figures apart from those of the preregistered ones; the median and
p95 milliseconds per attributed failure; and the LLM calls the attribution
made (0 by design). ``--json`` and ``--markdown`` save the same report, with its provenance
(command, date, commit, model, machine).
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
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory

from rich.console import Console

from experiments.markdown import provenance_lines
from experiments.provenance import command_of, model_of, stamped
from optloop.cli.attribute import render_planted, render_planted_markdown
from optloop.cli.command import CommandParser, lm_from_args, parse_command, run_cli
from optloop.datasets import load_dataset
from optloop.errors import ConfigError
from optloop.faults.catalogue import CATALOGUE
from optloop.faults.planted import PlantedRun, run_planted
from optloop.faults.planted_report import summarize
from systems import get_system

DEFAULT_SYSTEMS = "rag_bm25,rag_embedding,long_context,md_flat,mem0,graphiti"
DEFAULT_DATASETS = ";".join(["builtin:tiny"] + [f"synthetic:suite?seed={i}" for i in range(5)])
LIBRARY_SYSTEMS = {
    "mem0",
    "graphiti",
}  # ~50 s per ingested session on 2 cores with the embedded LM


def select_faults(spec: str | None) -> list[str] | None:
    """``--faults``: ``None`` (every fault), the names given, or every fault a catalogue batch
    added (``preregistered``); an unknown name fails before any work."""
    if not spec:
        return None
    batches = {f.added for f in CATALOGUE}
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        names += [f.name for f in CATALOGUE if f.added == item] if item in batches else [item]
    unknown = sorted(set(names) - {f.name for f in CATALOGUE})
    if unknown:
        raise ConfigError(
            f"unknown fault(s) {unknown}; see python -m optloop attribute --list-faults"
        )
    return list(dict.fromkeys(names))


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.attribution", __doc__, lm=True)
    parser.add_argument(
        "--systems", default=DEFAULT_SYSTEMS, help=f"comma-separated (default {DEFAULT_SYSTEMS})"
    )
    parser.add_argument(
        "--datasets",
        default=DEFAULT_DATASETS,
        help=f"semicolon-separated dataset URIs (default {DEFAULT_DATASETS!r})",
    )
    parser.add_argument(
        "--library-datasets",
        default="builtin:tiny",
        help="semicolon-separated datasets for mem0 and graphiti, which ingest ~50 s a session "
        "here (default builtin:tiny)",
    )
    parser.add_argument(
        "--faults",
        metavar="NAMES",
        help="comma-separated fault names, or 'preregistered' for the faults written down before "
        "any run evaluated them (default: the whole catalogue; see python -m optloop attribute "
        "--list-faults)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures (and every case) here")
    parser.add_argument("--markdown", type=Path, help="also write the report as markdown here")
    args = parse_command(parser, argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for name in systems:
        get_system(name)
    fault_names = select_faults(args.faults)
    datasets = [load_dataset(uri.strip()) for uri in args.datasets.split(";") if uri.strip()]
    library_uris = {
        load_dataset(uri.strip()).uri for uri in args.library_datasets.split(";") if uri.strip()
    }
    lm = lm_from_args(args)
    console = Console()
    planted = PlantedRun([])
    started = time.perf_counter()
    with (
        TemporaryDirectory(prefix="optloop-bench-attr-") as tmp,
        console.status("planted faults") as status,
    ):
        for dataset in datasets:
            for system in systems:  # one system at a time, so a slow one shows its progress
                if system in LIBRARY_SYSTEMS and dataset.uri not in library_uris:
                    continue
                planted += run_planted(
                    [system],
                    dataset,
                    lm,
                    Path(tmp) / dataset.name,
                    embedder=None,
                    fault_names=fault_names,
                    progress=lambda msg: status.update(f"{dataset.name}: {msg}"),
                )
    summary = summarize(planted)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["datasets"] = [d.uri for d in datasets]
    summary["lm"] = lm.backend.identity
    summary["cases"] = [c.to_json() for c in planted.induced]
    summary["set_aside_cases"] = [c.to_json() for c in planted.set_aside]
    console.print(
        f"planted faults, deterministic attribution ({lm.backend.identity}); "
        f"{summary['seconds']} s in all"
    )
    console.print(render_planted(summary))
    summary = stamped(summary, model_of(args), command_of("experiments.bench.attribution", argv))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    if args.markdown:
        args.markdown.write_text(
            provenance_lines(summary["provenance"]) + render_planted_markdown(summary)
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
