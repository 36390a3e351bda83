"""Benchmark the LM layer: calls/s, tokens/s and the cache speed-up.

    python -m experiments.bench.lm [--calls 24] [--lm local] [--json out.json]

Runs a fixed workload of schema-constrained memory-style calls (fact
extraction, yes/no, multiple choice, short answers) and a few free-text calls
against a fresh cache (every call reaches the model), then the same workload
again (every call is a cache hit). Also times the bundled embedder. Figures go to the terminal and
optionally JSON.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.embed import get_embedder
from optloop.lm import LMSettings, OptloopLM

FACTS_SCHEMA = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "subject": {"type": "string"},
                    "attribute": {"type": "string"},
                    "value": {"type": "string"},
                },
                "required": ["subject", "attribute", "value"],
            },
        }
    },
    "required": ["facts"],
}
YES_NO_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "boolean"}},
    "required": ["answer"],
}
CHOICE_SCHEMA = {
    "type": "object",
    "properties": {"choice": {"enum": ["A", "B", "C", "D"]}},
    "required": ["choice"],
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}

PEOPLE = ["Maria", "Kenji", "Ana", "Tom", "Priya", "Lee", "Sam", "Zoe"]
CITIES = ["Porto", "Osaka", "Oslo", "Leeds", "Denver", "Lyon", "Quito", "Perth"]
HOBBIES = ["piano", "climbing", "chess", "pottery", "sailing", "baking", "running", "birding"]


def workload(n: int) -> list[dict[str, Any]]:
    """``n`` deterministic, distinct calls cycling through four call shapes."""
    calls = []
    for i in range(n):
        person, city, hobby = PEOPLE[i % 8], CITIES[(i * 3) % 8], HOBBIES[(i * 5) % 8]
        memory = f"{person} lives in {city}, is {20 + i} years old and enjoys {hobby}."
        shape = i % 4
        if shape == 0:
            messages = [
                {"role": "system", "content": "Extract facts as subject/attribute/value triples."},
                {"role": "user", "content": memory},
            ]
            calls.append(
                {
                    "messages": messages,
                    "response_format": {"type": "json_object", "schema": FACTS_SCHEMA},
                }
            )
        elif shape == 1:
            messages = [
                {
                    "role": "user",
                    "content": f"Memory: {memory}\nDoes {person} live in {CITIES[i % 8]}?",
                }
            ]
            calls.append(
                {
                    "messages": messages,
                    "response_format": {"type": "json_object", "schema": YES_NO_SCHEMA},
                }
            )
        elif shape == 2:
            options = " ".join(f"({c}) {h}" for c, h in zip("ABCD", HOBBIES[i % 4 : i % 4 + 4]))
            messages = [
                {
                    "role": "user",
                    "content": f"Memory: {memory}\nWhat does {person} enjoy? {options}",
                }
            ]
            calls.append(
                {
                    "messages": messages,
                    "response_format": {"type": "json_object", "schema": CHOICE_SCHEMA},
                }
            )
        else:
            messages = [
                {
                    "role": "user",
                    "content": f"Memory: {memory}\nWhere does {person} live? Answer briefly.",
                }
            ]
            fmt = {"type": "json_object", "schema": ANSWER_SCHEMA} if i % 8 == 3 else None
            calls.append({"messages": messages, "response_format": fmt, "max_tokens": 32})
    return calls


def _run(lm: OptloopLM, calls: list[dict[str, Any]], label: str, quiet: bool) -> dict[str, float]:
    mark = lm.accounting.mark()
    latencies = []
    started = time.perf_counter()
    for call in track(calls, description=label, disable=quiet):
        t0 = time.perf_counter()
        lm.complete(**call)
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - started
    usage = lm.accounting.totals(since=mark)
    return {
        "calls": usage.calls,
        "model_calls": usage.model_calls,
        "cache_hits": usage.cache_hits,
        "errors": usage.errors,
        "seconds": wall,
        "calls_per_s": usage.calls / wall,
        "completion_tokens": usage.completion_tokens,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens_per_s": usage.completion_tokens / wall,
        "median_latency_ms": statistics.median(latencies) * 1000,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.lm", __doc__, lm=True)
    parser.add_argument("--calls", type=int, default=24, help="calls in the workload (default 24)")
    parser.add_argument(
        "--embed-texts", type=int, default=512, help="texts for the embedding benchmark"
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parse_command(parser, argv)
    console = Console()

    with tempfile.TemporaryDirectory() as tmp:
        settings = LMSettings.from_spec(
            args.lm,
            base_url=args.lm_base_url,
            timeout_s=args.lm_timeout,
            cache_path=Path(tmp) / "bench_cache.sqlite",
        )
        lm = OptloopLM(settings)
        calls = workload(args.calls)
        t0 = time.perf_counter()
        lm.complete(
            [{"role": "user", "content": "warm up"}], max_tokens=1, cache=False
        )  # model load
        load_s = time.perf_counter() - t0
        cold = _run(lm, calls, "uncached (model)", args.quiet)
        warm = _run(lm, calls, "cached", args.quiet)

    embedder = get_embedder()
    texts = [
        f"{p} lives in {c} and enjoys {h} (note {i})."
        for i, (p, c, h) in enumerate(zip(PEOPLE * 999, CITIES * 999, HOBBIES * 999))
    ][: args.embed_texts]
    embedder.embed(texts[:8])  # load
    t0 = time.perf_counter()
    embedder.embed(texts)
    embed_s = time.perf_counter() - t0

    figures = {
        "lm": lm.backend.identity,
        "model_load_s": load_s,
        "uncached": cold,
        "cached": warm,
        "cache_speedup": cold["seconds"] / warm["seconds"],
        "embed": {
            "model": embedder.name,
            "texts": len(texts),
            "seconds": embed_s,
            "texts_per_s": len(texts) / embed_s,
        },
    }
    table = Table(title=f"LM benchmark: {figures['lm']} ({args.calls} calls)")
    for col in (
        "run",
        "calls/s",
        "completion tok/s",
        "median ms",
        "model calls",
        "cache hits",
        "errors",
        "seconds",
    ):
        table.add_column(col)
    for name, run in (("uncached", cold), ("cached", warm)):
        table.add_row(
            name,
            f"{run['calls_per_s']:.2f}",
            f"{run['completion_tokens_per_s']:.1f}",
            f"{run['median_latency_ms']:.1f}",
            str(run["model_calls"]),
            str(run["cache_hits"]),
            str(run["errors"]),
            f"{run['seconds']:.2f}",
        )
    console.print(table)
    console.print(
        f"cache speed-up: [bold]{figures['cache_speedup']:.0f}x[/bold]   model load: "
        f"{load_s:.2f}s   embeddings ({embedder.name}): {figures['embed']['texts_per_s']:.0f} "
        "texts/s"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if cold["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
