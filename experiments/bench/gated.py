"""Retrieval-only context metrics of ``gated`` against ``rag_embedding`` on generated agentic
probes.

    python -m experiments.bench.gated [--records 2000] [--seed 0] [--top-k 5]
                                      [--json experiments/results/gated.json] [--markdown OUT]

No LLM is called. Each episode of ``agentic:generate?records=N&seed=S`` is ingested into a
fresh ``rag_embedding`` and a fresh ``gated`` store (same MiniLM embedder, same ``top_k``).
For every probe the bench takes what each system would put in front of the answer:

- ``rag_embedding``: the retrieved turns, all positive context;
- ``gated``: the retrieved candidates through the admission gate with knob
  ``gate=floors_only``: the deterministic floors decide and the ``gated.admit`` LLM is not
  asked (what the floors leave open is admitted). Under strict floors the LLM can only
  reject or demote candidates the floors left open, all of them active, completed-run
  memories of the question's workspace, so the floors-only contamination and leakage are
  the most the full gate can show, and its recall the most it can keep;
- two ablations on the same ``gated`` stores and candidates: ``floors=off`` (the workspace
  and path filter of retrieval alone) and ``floors=lenient`` (the workspace floor alone).

Metrics per probe (:func:`optloop.datasets.agentic.score_context`): recall (recall markers
in the positive context), contamination (a distractor marker there), cross-workspace leakage
(a foreign marker anywhere in the context, negative evidence included) and clean context
(neither). Each is a mean over probes with a seeded 95% bootstrap interval
(:func:`optloop.stats.bootstrap_mean`), overall and per category; ``gated`` minus
``rag_embedding`` is a paired bootstrap delta over the same probes
(:func:`optloop.stats.paired_bootstrap_delta`).
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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dspy
from dspy.utils import DummyLM
from rich.console import Console
from rich.table import Table

from experiments.provenance import stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.datasets import Episode, Question, load_dataset
from optloop.datasets.agentic import (
    CATEGORIES,
    ContextScore,
    parse_scope,
    parse_tag,
    score_context,
)
from optloop.embed import CachedEmbedder, Embedder, get_embedder
from optloop.stats import Interval, bootstrap_mean, paired_bootstrap_delta
from systems.baselines import EmbeddingRagSystem
from systems.gated import GatedSystem

DEFAULT_JSON = Path("experiments/results/gated.json")
RAG = "rag_embedding"
GATED = "gated"
ARMS = (RAG, GATED, "gated floors=off", "gated floors=lenient")
ABLATIONS = {"gated floors=off": "off", "gated floors=lenient": "lenient"}
METRICS: dict[str, Callable[[ContextScore], float]] = {
    "recall": lambda s: s.recall,
    "recall_any": lambda s: s.recall_any,
    "contamination": lambda s: float(s.contaminated),
    "leakage": lambda s: float(s.leaked),
    "clean_context": lambda s: float(s.clean),
    "positive_items": lambda s: float(s.positive),
}


def _no_llm() -> dspy.LM:
    """An LM that fails on any call: the benchmark must not make one."""
    lm = DummyLM([])
    return lm


def run(
    records: int,
    seed: int,
    top_k: int,
    embedder: Embedder,
    work: Path,
    progress: Callable[[str], None] | None = None,
) -> tuple[str, dict[str, list[ContextScore]], dict[str, float]]:
    """Every probe's context score per arm, and seconds spent per system."""
    uri = f"agentic:generate?records={records}&seed={seed}"
    dataset = load_dataset(uri)
    lm = _no_llm()
    embedder = _prewarmed(embedder, dataset.episodes, progress)
    scores: dict[str, list[ContextScore]] = {arm: [] for arm in ARMS}
    seconds = {RAG: 0.0, GATED: 0.0}
    for i, episode in enumerate(dataset.episodes):
        started = time.perf_counter()
        rag = EmbeddingRagSystem(
            lm,
            work / RAG / episode.id,
            embedder=embedder,  # type: ignore[arg-type]
            knobs={"top_k": top_k},
        )
        rag.ingest(episode.sessions)
        for q in episode.questions:
            scores[RAG].append(score_context(q, [item.text for item in rag.retrieve(q.question)]))
        seconds[RAG] += time.perf_counter() - started
        started = time.perf_counter()
        gated = GatedSystem(
            lm,
            work / GATED / episode.id,
            embedder=embedder,  # type: ignore[arg-type]
            knobs={"top_k": top_k, "gate": "floors_only"},
        )
        gated.ingest(episode.sessions)
        for q in episode.questions:
            candidates = gated.retrieve(q.question)
            scores[GATED].append(_gated_score(gated, q, candidates))
            for arm, floors in ABLATIONS.items():
                gated.set_knob("floors", floors)
                scores[arm].append(_gated_score(gated, q, candidates))
            gated.set_knob("floors", "strict")
        seconds[GATED] += time.perf_counter() - started
        if progress and (i + 1) % 25 == 0:
            progress(f"{i + 1}/{len(dataset.episodes)} episodes")
    return dataset.uri, scores, seconds


def _prewarmed(
    embedder: Embedder, episodes: Sequence[Episode], progress: Callable[[str], None] | None
) -> Embedder:
    """``embedder`` behind a cache filled, in large batches, with every text either system will
    embed: a small embedding call costs far more than its share of a batch, and the vectors are the
    same."""
    texts: dict[str, None] = {}
    for episode in episodes:
        for turn in episode.all_turns():
            texts[f"{turn.speaker or turn.role}: {turn.content}"] = (
                None  # rag_embedding's turn text
            )
            body, kind, _ = parse_tag(turn.content)
            if kind == "fact":
                texts[body] = None  # gated's memory content
        for q in episode.questions:
            texts[q.question] = None
            texts[parse_scope(q.question)[2]] = None  # gated searches without the scope header
    cached = embedder if isinstance(embedder, CachedEmbedder) else CachedEmbedder(embedder)
    if progress:
        progress(f"embedding {len(texts)} distinct texts")
    cached.embed(list(texts))
    return cached


def _gated_score(
    system: GatedSystem, question: Question, candidates: Sequence[Any]
) -> ContextScore:
    admission = system.admit(question.question, candidates)
    return score_context(
        question, [m.text for m in admission.positive], [m.text for m in admission.negative]
    )


def summarize(scores: dict[str, list[ContextScore]], seed: int) -> dict[str, Any]:
    """Intervals per arm (overall and per category) and the paired deltas of each arm against
    rag_embedding."""

    def block(rows: Sequence[ContextScore]) -> dict[str, Interval]:
        return {
            name: bootstrap_mean([fn(s) for s in rows], seed=seed) for name, fn in METRICS.items()
        }

    def delta(arm: str, category: str | None) -> dict[str, Interval]:
        pairs = [
            (r, g)
            for r, g in zip(scores[RAG], scores[arm], strict=True)
            if category is None or r.category == category
        ]
        return {
            name: paired_bootstrap_delta(
                [fn(r) for r, _ in pairs], [fn(g) for _, g in pairs], seed=seed
            )
            for name, fn in METRICS.items()
            if name != "recall_any"
        }

    out: dict[str, Any] = {"arms": {}, "deltas_vs_rag": {}}
    for arm in ARMS:
        rows = scores[arm]
        out["arms"][arm] = {
            "all": block(rows),
            "by_category": {c: block([s for s in rows if s.category == c]) for c in CATEGORIES},
        }
        if arm != RAG:
            out["deltas_vs_rag"][arm] = {
                "all": delta(arm, None),
                "by_category": {c: delta(arm, c) for c in CATEGORIES},
            }
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, Interval):
        return {
            "estimate": round(value.estimate, 4),
            "low": round(value.low, 4),
            "high": round(value.high, 4),
            "n": value.n,
            "confidence": value.confidence,
        }
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def markdown(report: dict[str, Any]) -> str:
    """The overall table and the per-category table, as the README quotes them."""
    shown = ("recall", "contamination", "leakage", "clean_context")
    lines = [
        f"# gated vs rag_embedding: retrieval-only context metrics ({report['dataset']})",
        "",
        f"top_k={report['top_k']}, embedder {report['embedder']}, gated with "
        "gate=floors_only (no LLM). "
        "Mean over probes [95% bootstrap interval] (n).",
        "",
        "| arm | " + " | ".join(shown) + " |",
        "|---" * (len(shown) + 1) + "|",
    ]
    for arm, data in report["summary"]["arms"].items():
        lines.append(
            f"| {arm} | " + " | ".join(data["all"][m].format(signed=False) for m in shown) + " |"
        )
    lines += [
        "",
        "Paired delta against rag_embedding (same probes):",
        "",
        "| arm | " + " | ".join(shown) + " |",
        "|---" * (len(shown) + 1) + "|",
    ]
    for arm, data in report["summary"]["deltas_vs_rag"].items():
        lines.append(f"| {arm} | " + " | ".join(data["all"][m].format() for m in shown) + " |")
    lines += [
        "",
        "By category (rag_embedding -> gated):",
        "",
        "| category | " + " | ".join(shown) + " |",
        "|---" * (len(shown) + 1) + "|",
    ]
    for category in CATEGORIES:
        rag = report["summary"]["arms"][RAG]["by_category"][category]
        gated = report["summary"]["arms"][GATED]["by_category"][category]
        lines.append(
            f"| {category} (n={rag['recall'].n}) | "
            + " | ".join(f"{rag[m].estimate:.3f} -> {gated[m].estimate:.3f}" for m in shown)
            + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.gated", __doc__)
    parser.add_argument(
        "--records", type=int, default=2000, help="probes to generate (default 2000)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="generator and bootstrap seed (default 0)"
    )
    parser.add_argument("--top-k", type=int, default=5, help="top_k of both systems (default 5)")
    parser.add_argument("--embed", default="local", help="embedder spec (default local: MiniLM)")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help=f"JSON report (default {DEFAULT_JSON})"
    )
    parser.add_argument("--markdown", type=Path, help="also write the tables as markdown")
    args = parse_command(parser, argv)
    console = Console(stderr=True)
    embedder = get_embedder(args.embed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="optloop-gated-") as tmp:
        uri, scores, seconds = run(
            args.records,
            args.seed,
            args.top_k,
            embedder,
            Path(tmp),
            progress=lambda text: console.print(text),
        )
    summary = summarize(scores, args.seed)
    report = {
        "bench": "gated",
        "dataset": uri,
        "n": len(scores[RAG]),
        "top_k": args.top_k,
        "embedder": embedder.name,
        "llm_calls": 0,
        "gated_mode": "gate=floors_only (deterministic floors; the gated.admit LLM is not asked)",
        "seconds": {
            k: round(v, 1) for k, v in seconds.items()
        },  # ingest + retrieval, embeddings prewarmed
        "wall_seconds": round(time.perf_counter() - started, 1),
        "summary": summary,
    }
    table = Table(title=f"context metrics, n={report['n']} probes ({uri})")
    for column in ("arm", "recall", "contamination", "leakage", "clean context"):
        table.add_column(column)
    for arm, data in summary["arms"].items():
        table.add_row(
            arm,
            *(
                data["all"][m].format(signed=False)
                for m in ("recall", "contamination", "leakage", "clean_context")
            ),
        )
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(stamped(_jsonable(report), "none (no LLM: the gate's floors only)"), indent=1)
        + "\n",
        encoding="utf-8",
    )
    if args.markdown:
        args.markdown.write_text(markdown(report), encoding="utf-8")
    console.print(f"wrote {args.json}" + (f" and {args.markdown}" if args.markdown else ""))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
