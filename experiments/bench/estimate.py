"""A worked cost estimate of a whole loop run on an endpoint, from measured calls and tokens per session.

    python -m experiments.bench.estimate [--system graphiti] [--budget 50] [--model openai:gpt-4o-mini]
                                         [--dataset locomo:../shared/data/locomo/locomo_dev5.json]
                                         [--conversations 10] [--latency-ms 1000] [--n 1,16]

What a user asks before ``python -m optloop.run --system graphiti --budget 50`` on LoCoMo with
gpt-4o-mini, without spending anything: how many calls, tokens, dollars and hours. ``optloop.run
--estimate`` answers it after a real baseline on the endpoint; this answers it from a recording
instead (``python -m experiments.bench.throughput record``: one evaluation of the system on the
embedded LM, its calls and tokens per prompt site in ``recording.json``).

The model (stated in the output too):

- **per session**: the recording's ingestion calls and tokens over its sessions; **per question**:
  its other calls (answer, query rewriting) over its questions. Tokens split into prompt and
  completion, each priced from litellm's bundled cost map (:func:`optloop.lm.pricing.model_price`).
- **the dataset**: LoCoMo's conversations (``--dataset``; the sessions and questions per
  conversation are averaged and scaled to ``--conversations``, LoCoMo's 10 by default), split
  train/dev/test by conversation as ``optloop.run`` does (0.5/0.25/0.25, largest remainder).
- **the run**: the baseline on train and dev, ``--budget`` trials each one evaluation of dev (every
  session re-ingested: an upper bound, as a trial that leaves the ingestion prompts alone reuses the
  stores), and the held-out test twice (baseline and best). The optimizer's own calls (SIMBA and
  GEPA mini-batches on train, the edit optimizer's screening, the proposer) are **not** included:
  they depend on the optimizer and the blame, and on a small scripted run they were about twice the
  evaluations' calls, so read the figures as a floor for those.
- **hours** at concurrency N: per evaluation, ingestion takes ``max(ingestion calls x latency / N,
  the longest conversation's sessions x calls per session x latency)`` (sessions of one conversation
  go in order, conversations in parallel), then the questions ``calls x latency / N``; evaluations
  run one after another. ``--latency-ms`` is an assumption about the endpoint, not a measurement.

The embedded model's extraction bounds (at most 3 items a list, 80 characters a string for
graphiti) make it extract fewer entities and facts than gpt-4o-mini would, so graphiti's calls per
session here are a lower bound too.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from experiments.bench.throughput import Recording, manifest_path
from optloop.cli import run_cli, setup_logging
from optloop.datasets import load_dataset
from optloop.datasets.split import split_counts
from optloop.errors import ConfigError
from optloop.lm.pricing import model_price
from optloop.loop.state import LoopConfig
from optloop.paths import state_dir

ANSWER_SIDE = {"answer", "retrieve.query"}  # prompt sites of the question path; the rest is ingestion
SHARED_LOCOMO = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "locomo" / "locomo_dev5.json"


class PerUnit(BaseModel):
    """Calls and tokens per ingested session and per answered question, from a recording."""

    session_calls: float
    session_prompt: float
    session_completion: float
    question_calls: float
    question_prompt: float
    question_completion: float


class Row(BaseModel):
    part: str
    evaluations: int
    calls: float
    prompt_tokens: float
    completion_tokens: float
    dollars: float | None
    hours: dict[int, float]


def per_unit(recording: Recording, system: str, questions: int) -> PerUnit:
    """``system``'s calls and tokens per session and per question in ``recording``."""
    done = recording.systems.get(system)
    if done is None:
        raise ConfigError(f"the recording holds no {system}; run `python -m experiments.bench.throughput record "
                          f"--systems {system}` first")
    if not done.sites or not done.sessions:
        raise ConfigError("the recording has no per-site figures; record again with this version")
    ingest = [c for s, c in done.sites.items() if s not in ANSWER_SIDE]
    asked = [c for s, c in done.sites.items() if s in ANSWER_SIDE]

    def total(costs: list[Any], field: str) -> float:
        """Summed over sites; tokens, which only computed requests report, scaled up to every request (a
        recording resumed from its cache served some of them)."""
        if field == "calls":
            return float(sum(c.calls for c in costs))
        return float(sum(getattr(c, field) * c.calls / c.model_calls for c in costs if c.model_calls))

    sessions = done.sessions
    return PerUnit(
        session_calls=total(ingest, "calls") / sessions,
        session_prompt=total(ingest, "prompt_tokens") / sessions,
        session_completion=(total(ingest, "tokens") - total(ingest, "prompt_tokens")) / sessions,
        question_calls=total(asked, "calls") / questions,
        question_prompt=total(asked, "prompt_tokens") / questions,
        question_completion=(total(asked, "tokens") - total(asked, "prompt_tokens")) / questions)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.bench.estimate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", default="graphiti")
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--model", default="openai:gpt-4o-mini", help="the endpoint model whose price to use")
    parser.add_argument("--dataset", default=f"locomo:{SHARED_LOCOMO}", help="LoCoMo file whose shape to use")
    parser.add_argument("--conversations", type=int, default=10, help="scale to this many conversations (LoCoMo: 10)")
    parser.add_argument("--latency-ms", type=float, default=1000.0, help="assumed seconds per call, in ms")
    parser.add_argument("--n", default="1,16", help="concurrency levels to give hours for")
    parser.add_argument("--recording", type=Path, default=None,
                        help="recording.json (default: $OPTLOOP_HOME/throughput/recording.json)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    path = args.recording or manifest_path(state_dir() / "throughput" / "lm_cache.sqlite")
    if not path.is_file():
        raise ConfigError(f"no recording at {path}; run `python -m experiments.bench.throughput record` first")
    recording = Recording.model_validate_json(path.read_text())
    recorded = load_dataset(recording.dataset)
    unit = per_unit(recording, args.system, sum(len(e.questions) for e in recorded.episodes))
    price = model_price(args.model.split(":", 1)[-1])
    if price is None:
        raise ConfigError(f"{args.model} has no price in litellm's cost map; pick a priced model")
    locomo = load_dataset(args.dataset)
    convs = len(locomo.episodes)
    sessions = sum(len(e.sessions) for e in locomo.episodes) / convs
    questions = sum(len(e.questions) for e in locomo.episodes) / convs
    longest = max(len(e.sessions) for e in locomo.episodes)
    train, dev, test = split_counts(args.conversations, LoopConfig.model_fields["fractions"].default)
    levels = [int(n) for n in args.n.split(",")]
    latency = args.latency_ms / 1000

    def evaluation(conversations: int) -> tuple[float, float, float, dict[int, float]]:
        ingest_calls = conversations * sessions * unit.session_calls
        ask_calls = conversations * questions * unit.question_calls
        prompt = conversations * (sessions * unit.session_prompt + questions * unit.question_prompt)
        completion = conversations * (sessions * unit.session_completion + questions * unit.question_completion)
        hours = {n: (max(ingest_calls * latency / n, longest * unit.session_calls * latency)
                     + ask_calls * latency / n) / 3600 for n in levels}
        return ingest_calls + ask_calls, prompt, completion, hours

    def row(part: str, parts: list[tuple[int, int]]) -> Row:
        """``parts``: (evaluations, conversations each)."""
        calls = prompt = completion = 0.0
        hours = dict.fromkeys(levels, 0.0)
        for times, conversations in parts:
            c, p, q, h = evaluation(conversations)
            calls, prompt, completion = calls + times * c, prompt + times * p, completion + times * q
            hours = {n: hours[n] + times * h[n] for n in levels}
        dollars = prompt * price.input + completion * price.output
        return Row(part=part, evaluations=sum(t for t, _ in parts), calls=calls, prompt_tokens=prompt,
                   completion_tokens=completion, dollars=dollars, hours=hours)

    rows = [row("baseline (train + dev)", [(1, train), (1, dev)]),
            row(f"{args.budget} trials (dev each)", [(args.budget, dev)]),
            row("held-out test (twice)", [(2, test)])]
    total = row("total", [(1, train), (1 + args.budget, dev), (2, test)])
    console = Console()
    table = Table(title=f"{args.system}, --budget {args.budget}, LoCoMo ({args.conversations} conversations: "
                        f"{train}/{dev}/{test} train/dev/test), {args.model}")
    for col in ["part", "evaluations", "calls", "tokens (prompt + completion)", "dollars",
                *(f"hours at N={n}" for n in levels)]:
        table.add_column(col, justify="left" if col == "part" else "right")
    for r in [*rows, total]:
        table.add_row(r.part, str(r.evaluations), f"{r.calls:,.0f}",
                      f"{r.prompt_tokens + r.completion_tokens:,.0f} ({r.prompt_tokens:,.0f} + {r.completion_tokens:,.0f})",
                      f"${r.dollars:,.2f}", *(f"{r.hours[n]:,.1f}" for n in levels))
    console.print(table)
    console.print(
        f"measured on {recording.identity} ({recording.dataset}, {recording.recorded_on}): {unit.session_calls:.1f} "
        f"calls, {unit.session_prompt:,.0f} + {unit.session_completion:,.0f} tokens per session; "
        f"{unit.question_calls:.1f} calls, {unit.question_prompt:,.0f} + {unit.question_completion:,.0f} tokens per "
        f"question. LoCoMo shape from {convs} conversations of {args.dataset}: {sessions:.1f} sessions, "
        f"{questions:.0f} questions each, the longest {longest} sessions. Latency assumed {args.latency_ms:.0f} ms a "
        f"call. Not included: the optimizer's own calls (see the module docstring). Price: "
        f"${price.input * 1e6:.3f} / ${price.output * 1e6:.3f} per million prompt / completion "
        "tokens.")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
