"""The loop's two benchmarks: targeted vs untargeted at equal budget, and what ingestion reuse saves.

    python -m experiments.bench.loop targeted --systems mem0,rag_bm25 --dataset "memfail:coexisting?limit=8" --budget 3
    python -m experiments.bench.loop reuse --system md_flat --dataset "synthetic:meme?episodes=2&fillers=12&questions=1"

``targeted`` runs ``optloop.run``'s loop twice per system on the same split and
seed: once rewriting only the blamed sites, once every site (``--untargeted``),
each with the same budget, and reports held-out accuracy before and after and
the LLM calls each used (all of them: baseline, optimizer, candidates, test).

``reuse`` evaluates three candidates of one system over one dataset: the
baseline (builds every store), a candidate that changes only the answer
instruction (reuses every store), and one that changes an ingest instruction
(rebuilds every store: a full re-ingest). It reports the LLM calls of each and
the ratio answer-only / full re-ingest. The ratio is structural: answer-only
costs one call per question; a re-ingest also costs the ingest calls of every
session, so it depends on sessions per question (reported beside it).

Both use fresh LM caches under a temp dir (``targeted``: one per arm), so the
calls are real model calls and each arm's model calls, tokens and seconds are its
own. ``blamed`` is what the baseline's attribution blamed; ``optimized`` what the
optimizer was allowed to change.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from experiments.bench._common import bench_lm, parse_systems
from optloop.cli import add_lm_arguments, run_cli, setup_logging
from optloop.datasets import load_dataset
from optloop.loop.candidate import SiteState
from optloop.loop.evaluate import Evaluator
from optloop.loop.runner import Loop, LoopConfig
from optloop.sites import ANSWER
from optloop.paths import write_atomic

console = Console(width=None if sys.stdout.isatty() else 160)  # a log file gets the whole table


def targeted(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rows = []
    for system in parse_systems(args.systems):
        for untargeted in (False, True):
            name = f"bench-{system}-{'untargeted' if untargeted else 'targeted'}-s{args.seed}"
            lm = bench_lm(args, tmp / name, [system])  # each arm on its own fresh cache: its calls, tokens, seconds are its own
            config = LoopConfig(system=system, dataset=args.dataset, budget=args.budget, seed=args.seed,
                                untargeted=untargeted, run_name=name, tracking_uri=args.tracking_uri,
                                lm=args.lm or "local")
            with console.status(f"{name}") as status:
                result = Loop(config, lm, lm, work=tmp / "runs" / name,
                              progress=lambda msg, s=status, n=name: s.update(f"{n}: {msg}")).run()
            rows.append({"system": system, "mode": "untargeted" if untargeted else "targeted",
                         "blamed": result.targets, "optimized": result.tunable_sites,
                         "changed": result.changed_sites, "test_before": result.test_before,
                         "test_after": result.test_after, "delta_test": result.delta_test,
                         "delta_test_ci": [result.delta_test_ci.low, result.delta_test_ci.high],
                         "n_test": result.n_test, "n_dev": result.n_dev, "promoted": result.promoted,
                         "dev_before": result.baseline_dev, "dev_best": result.best_dev,
                         "evaluations": result.evaluations, **result.cost, "run_id": result.parent_run_id})
    table = Table(title=f"targeted vs untargeted on {args.dataset}, budget {args.budget}, seed {args.seed}")
    for col in ("system", "mode", "blamed", "optimized sites", "test before", "test after", "delta [95% CI]",
                "n test", "evaluations", "LLM calls", "model calls", "seconds"):
        table.add_column(col)
    for r in rows:
        low, high = r["delta_test_ci"]
        table.add_row(r["system"], r["mode"], ", ".join(r["blamed"]), ", ".join(r["optimized"]),
                      f"{r['test_before']:.3f}", f"{r['test_after']:.3f}",
                      f"{r['delta_test']:+.3f} [{low:+.3f}, {high:+.3f}]", str(r["n_test"]), str(r["evaluations"]),
                      f"{r['llm_calls']:.0f}", f"{r['model_calls']:.0f}", f"{r['seconds']:.1f}")
    console.print(table)
    return {"bench": "targeted", "dataset": args.dataset, "budget": args.budget, "seed": args.seed, "rows": rows}


def reuse(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    lm = bench_lm(args, tmp, [args.system])
    dataset = load_dataset(args.dataset)
    evaluator = Evaluator(args.system, lm, tmp / "reuse")
    try:
        ingest_sites = [n for n, stage in evaluator.stages.items() if stage == "ingest"]
        if not ingest_sites:
            raise SystemExit(f"{args.system} has no ingest prompt site: nothing to re-ingest")
        base = evaluator.baseline()
        answer_only = base.model_copy(deep=True)
        answer_only.sites[ANSWER] = SiteState(instructions=base.sites[ANSWER].instructions
                                                + " Answer in as few words as possible.")
        reingest = base.model_copy(deep=True)
        site = ingest_sites[0]
        reingest.sites[site] = SiteState(instructions=base.sites[site].instructions + " Keep every stated fact.",
                                         demos=base.sites[site].demos)
        results = {}
        for label, candidate in (("baseline", base), ("answer-only", answer_only), ("full re-ingest", reingest)):
            with console.status(f"{args.system}: {label}"):
                ev = evaluator.evaluate(candidate, dataset)
            results[label] = {"llm_calls": ev.llm_calls, "model_calls": ev.model_calls,
                              "ingest_calls": ev.ingest_calls, "stores_reused": ev.stores_reused,
                              "stores_built": ev.stores_built, "seconds": ev.seconds, "accuracy": ev.accuracy}
    finally:
        evaluator.close()
    sessions = sum(len(e.sessions) for e in dataset.episodes)
    questions = sum(len(e.questions) for e in dataset.episodes)
    ratio = results["answer-only"]["llm_calls"] / max(results["full re-ingest"]["llm_calls"], 1)
    table = Table(title=f"ingestion reuse: {args.system} on {args.dataset} ({sessions} sessions, {questions} "
                        f"questions); answer-only / full re-ingest = {ratio:.1%} of LLM calls")
    for col in ("candidate", "LLM calls", "ingest calls", "stores reused", "stores built", "seconds"):
        table.add_column(col)
    for label, r in results.items():
        table.add_row(label, str(r["llm_calls"]), str(r["ingest_calls"]), str(r["stores_reused"]),
                      str(r["stores_built"]), str(r["seconds"]))
    console.print(table)
    return {"bench": "reuse", "system": args.system, "dataset": args.dataset, "sessions": sessions,
            "questions": questions, "ratio": ratio, "results": results}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True)
    t = sub.add_parser("targeted", help="targeted vs untargeted at equal budget")
    t.add_argument("--systems", default="mem0,rag_bm25")
    t.add_argument("--dataset", default="memfail:coexisting?limit=8")
    t.add_argument("--budget", type=int, default=3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--tracking-uri", help="MLflow store (default: the project's mlruns/)")
    r = sub.add_parser("reuse", help="LLM calls: answer-only candidate vs full re-ingest")
    r.add_argument("--system", default="md_flat")
    r.add_argument("--dataset", default="synthetic:meme?episodes=2&fillers=12&questions=1")
    for p in (t, r):
        p.add_argument("--json", type=Path, metavar="OUT")
        p.add_argument("--verbose", action="store_true")
        add_lm_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    with tempfile.TemporaryDirectory(prefix="optloop-bench-loop-") as tmp:
        report = (targeted if args.bench == "targeted" else reuse)(args, Path(tmp))
    if args.json:
        write_atomic(args.json, json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
