"""A worked cost estimate of a whole loop run on an endpoint, from measured calls and tokens per
session.

    python -m experiments.bench.estimate [--system graphiti] [--budget 50] [--optimizer simba]
                                         [--sites S,S]
                                         [--model openai:gpt-4o-mini]
                                         [--dataset locomo:../shared/data/locomo/locomo_dev5.json]
                                         [--conversations 10] [--latency-ms 1000] [--n 1,16]

What a user asks before ``python -m optloop.run --system graphiti --budget 50`` on LoCoMo with
gpt-4o-mini, without spending anything: how many calls, tokens, dollars and hours. ``optloop.run
--estimate`` answers it after a real baseline on the endpoint; this answers it from a recording
instead (``python -m experiments.bench.throughput record``: one evaluation of the system on the
embedded LM, its calls and tokens per prompt site in ``recording.json``). Nothing here calls or
loads an LM.

The run model is ``optloop.run --estimate``'s own (:func:`optloop.loop.spending.estimate.project`):
what differs is only where the baseline's figures come from. Here they are modeled:

- **per session**: the recording's ingestion calls and tokens over its sessions; **per question**:
  its other calls (answer, query rewriting) over its questions. Tokens split into prompt and
  completion, each priced from litellm's bundled cost map (:func:`optloop.lm.pricing.model_price`);
  every request computed (an endpoint's LM cache starts empty), each taking ``--latency-ms`` (an
  assumption about the endpoint, not a measurement).
- **the dataset**: LoCoMo's conversations (``--dataset``; the sessions and questions per
  conversation are averaged and scaled to ``--conversations``, LoCoMo's 10 by default), split
  train/dev/test by conversation as ``optloop.run`` does (0.5/0.25/0.25, largest remainder); the
  baseline's train and dev evaluations are those per-conversation figures times the split's
  conversations (:func:`evaluation`).
- **the run** (``optloop.run --estimate``'s model): the baseline, ``--budget`` trials each one
  evaluation of dev with every session re-ingested (an upper bound: a trial that leaves the
  ingestion prompts alone reuses the stores), the optimizer's own calls, and the held-out test
  twice (the dev evaluation scaled by sessions + questions); an evaluation at concurrency N
  takes ``max(requests x latency / N, chain x latency)``: N requests always in flight, but
  never less than its longest conversation's chain, whose sessions are ingested one after
  another before a question's requests (:class:`~optloop.loop.spending.estimate.Chains`). Each
  split is taken to hold a conversation as long as the dataset's longest (:meth:`Shape.chain`),
  the modeled baseline's evaluations included; the output says which parts the chain timed.
- **the optimizer** (``--optimizer``, ``optloop.run``'s default ``simba``): its model in
  each optimizer's ``work`` on a :class:`~optloop.loop.spending.shape.RunShape` built from the
  recording and LoCoMo's shape (:func:`run_shape`): the train split's questions and
  conversations, the calls and tokens per question and per conversation above, the optimizer's
  threads on an endpoint, the proposer being ``--model`` too. The target sites are the system's
  recorded ingest sites plus ``answer`` unless ``--sites`` names them: ``optloop.run`` chooses
  them from the baseline's blame, which a recording does not hold (it has no failures), so the
  default is every site a run could target but query rewriting, the dearest case for an optimizer
  that re-ingests for an ingest site. The sites' start instructions are not read (that takes
  building the system, an LM with it): the proposer's prompts count the recorded prompts of those
  sites, which carry them, but not the instructions once more on their own.

The embedded model's extraction bounds (at most 3 items a list, 80 characters a string for
graphiti) make it extract fewer entities and facts than gpt-4o-mini would, so graphiti's calls per
session here are a lower bound too.
"""

from __future__ import annotations

import json
import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from experiments.bench.throughput import Recorded, Recording, manifest_path
from experiments.markdown import provenance_lines
from experiments.markdown import table as markdown_table
from experiments.provenance import provenance, stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.cli.run_tables import optimizer_line, projected
from optloop.datasets import Dataset, load_dataset
from optloop.datasets.split import split_counts
from optloop.errors import ConfigError
from optloop.lm.pricing import ModelPrice, model_price
from optloop.loop.cost import LMCost
from optloop.loop.optimizers import registry
from optloop.loop.optimizers.base import ENDPOINT_THREADS
from optloop.loop.optimizers.work import cost_model
from optloop.loop.spending.estimate import (
    Chains,
    Estimate,
    ModeledFigures,
    OptimizerWork,
    chain_requests,
    evaluation_seconds,
    project,
)
from optloop.loop.spending.shape import RunShape
from optloop.loop.state import LoopConfig
from optloop.paths import state_dir, write_atomic
from optloop.sites import ANSWER, QUERY_REWRITE

ANSWER_SIDE = {ANSWER, QUERY_REWRITE}  # prompt sites of the question path; the rest is ingestion
SHARED_LOCOMO = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "locomo" / "locomo_dev5.json"
)


class PerUnit(BaseModel):
    """Calls and tokens per ingested session and per answered question, from a recording."""

    session_calls: float
    session_prompt: float
    session_completion: float
    question_calls: float
    question_prompt: float
    question_completion: float

    @property
    def session_tokens(self) -> float:
        return self.session_prompt + self.session_completion

    @property
    def question_tokens(self) -> float:
        return self.question_prompt + self.question_completion


class Shape(BaseModel):
    """A dataset's conversations on average: what a split of ``n`` of them has to do."""

    conversations: int
    sessions: float
    questions: float
    longest: int = Field(description="the most sessions of one conversation")

    @classmethod
    def of(cls, dataset: Dataset) -> Shape:
        n = len(dataset.episodes)
        return cls(
            conversations=n,
            sessions=sum(len(e.sessions) for e in dataset.episodes) / n,
            questions=sum(len(e.questions) for e in dataset.episodes) / n,
            longest=max(len(e.sessions) for e in dataset.episodes),
        )

    def units(self, conversations: int) -> float:
        """:func:`~optloop.loop.spending.estimate.work_units` of ``conversations`` of them:
        sessions plus questions."""
        return conversations * (self.sessions + self.questions)

    def chain(self, unit: PerUnit) -> float:
        """Sequential requests of the longest conversation at ``unit``'s rates: its sessions, then
        a question."""
        return chain_requests(self.longest, unit.session_calls, unit.question_calls)


def recorded(recording: Recording, system: str) -> Recorded:
    done = recording.systems.get(system)
    if done is None:
        raise ConfigError(
            f"the recording holds no {system}; run `python -m experiments.bench.throughput record "
            f"--systems {system}` first"
        )
    if not done.sites or not done.sessions:
        raise ConfigError("the recording has no per-site figures; record again with this version")
    return done


def per_unit(recording: Recording, system: str, questions: int) -> PerUnit:
    """``system``'s calls and tokens per session and per question in ``recording``."""
    done = recorded(recording, system)
    ingest = [c for s, c in done.sites.items() if s not in ANSWER_SIDE]
    asked = [c for s, c in done.sites.items() if s in ANSWER_SIDE]

    def total(costs: list[LMCost], field: str) -> float:
        """Summed over sites; tokens, which only computed requests report, scaled up to every
        request (a recording resumed from its cache served some of them)."""
        if field == "calls":
            return float(sum(c.calls for c in costs))
        return float(
            sum(getattr(c, field) * c.calls / c.model_calls for c in costs if c.model_calls)
        )

    sessions = done.sessions
    return PerUnit(
        session_calls=total(ingest, "calls") / sessions,
        session_prompt=total(ingest, "prompt_tokens") / sessions,
        session_completion=(total(ingest, "tokens") - total(ingest, "prompt_tokens")) / sessions,
        question_calls=total(asked, "calls") / questions,
        question_prompt=total(asked, "prompt_tokens") / questions,
        question_completion=(total(asked, "tokens") - total(asked, "prompt_tokens")) / questions,
    )


def evaluation(
    unit: PerUnit,
    shape: Shape,
    conversations: int,
    *,
    price: ModelPrice,
    latency_s: float,
    concurrency: int,
) -> ModeledFigures:
    """An evaluation of ``conversations`` of ``shape``'s, every request computed in ``latency_s``,
    ``concurrency`` at a time but no sooner than its longest conversation's chain (its wall time:
    the run model's hours)."""
    sessions, questions = conversations * shape.sessions, conversations * shape.questions
    calls = sessions * unit.session_calls + questions * unit.question_calls
    prompt = sessions * unit.session_prompt + questions * unit.question_prompt
    completion = sessions * unit.session_completion + questions * unit.question_completion
    return ModeledFigures(
        llm_calls=calls,
        model_calls=calls,
        tokens=prompt + completion,
        cost_usd=prompt * price.input + completion * price.output,
        lm_seconds=calls * latency_s,
        seconds=evaluation_seconds(calls, latency_s, concurrency, shape.chain(unit)),
    )


def run_shape(
    recording: Recording,
    system: str,
    unit: PerUnit,
    shape: Shape,
    *,
    budget: int,
    train: int,
    targets: Sequence[str] = (),
    threads: int = ENDPOINT_THREADS,
    batch: int = 1,
) -> RunShape:
    """What the optimizer's model reads (see the module docstring): ``train`` conversations of
    ``shape``'s, ``targets`` as the target sites (by default the system's recorded ingest sites
    plus ``answer``), the optimizer's ``threads`` on an endpoint (``optloop.run``'s: its
    --concurrency, at least 4), ``batch`` its --batch."""
    sites = recorded(recording, system).sites
    ingest = sorted(s for s in sites if s not in ANSWER_SIDE)
    if unknown := sorted(set(targets) - set(sites)):
        raise ConfigError(
            f"--sites {','.join(unknown)}: not in the recording of {system}; its sites are "
            f"{', '.join(sites)}"
        )
    chosen = list(targets) or [*ingest, ANSWER]
    return RunShape(
        budget=budget,
        train_questions=round(train * shape.questions),
        train_episodes=train,
        sites=chosen,
        ingest_sites=[s for s in chosen if s in ingest],
        prompt_tokens={
            s: sites[s].prompt_tokens / sites[s].model_calls
            for s in chosen
            if sites[s].model_calls
        },
        question_calls=unit.question_calls,
        ingest_calls=shape.sessions * unit.session_calls,
        question_tokens=unit.question_tokens / unit.question_calls
        if unit.question_calls
        else None,
        ingest_tokens=unit.session_tokens / unit.session_calls if unit.session_calls else None,
        threads=threads,
        batch=batch,
    )


def run_estimate(
    unit: PerUnit,
    shape: Shape,
    splits: Sequence[int],
    *,
    budget: int,
    work: OptimizerWork | None,
    price: ModelPrice,
    latency_s: float,
    concurrency: int,
    batch: int = 1,
) -> Estimate:
    """``optloop.run --estimate``'s projection (:func:`~optloop.loop.spending.estimate.project`) of
    a run on ``splits`` (train, dev, test conversations of ``shape``'s), its baseline modeled from
    ``unit``;
    the proposer priced as the LM."""
    train, dev, test = splits

    def modeled(conversations: int) -> ModeledFigures:
        return evaluation(
            unit, shape, conversations, price=price, latency_s=latency_s, concurrency=concurrency
        )

    chain = shape.chain(
        unit
    )  # dev's and test's: each split holds a conversation as long as the longest
    return project(
        modeled(train),
        modeled(dev),
        budget=budget,
        concurrency=concurrency,
        dev_units=shape.units(dev),
        test_units=shape.units(test),
        optimizer=work,
        proposer_price=(price.input, price.output),
        chains=Chains(dev=chain, test=chain),
        baseline="baseline (train + dev)",
        batch=batch,
    )


def cell(value: float | None, fmt: str) -> str:
    return "unknown" if value is None else fmt.format(value)


def duration_cell(hours: float | None) -> str:
    return "unknown" if hours is None else projected(hours * 3600)


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.estimate", __doc__)
    parser.add_argument("--system", default="graphiti")
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument(
        "--optimizer",
        choices=registry.names(),
        default=LoopConfig.model_fields["optimizer"].default,
        help="whose own calls to model (optloop.run's default: %(default)s)",
    )
    parser.add_argument(
        "--sites",
        default="",
        help="the optimizer's target sites, comma-separated (optloop.run --sites; default: the "
        "system's recorded ingest sites plus answer)",
    )
    parser.add_argument(
        "--model",
        default="openai:gpt-4o-mini",
        help="the endpoint model whose price to use (the proposer's too)",
    )
    parser.add_argument(
        "--dataset", default=f"locomo:{SHARED_LOCOMO}", help="LoCoMo file whose shape to use"
    )
    parser.add_argument(
        "--conversations",
        type=int,
        default=10,
        help="scale to this many conversations (LoCoMo: 10)",
    )
    parser.add_argument(
        "--latency-ms", type=float, default=1000.0, help="assumed seconds per call, in ms"
    )
    parser.add_argument("--n", default="1,16", help="concurrency levels to give hours for")
    parser.add_argument(
        "--batch", type=int, default=1, help="optloop.run --batch: trials evaluated at once"
    )
    parser.add_argument("--json", type=Path, help="also write each level's estimate here")
    parser.add_argument("--markdown", type=Path, help="and the table with its notes here")
    parser.add_argument(
        "--recording",
        type=Path,
        default=None,
        help="recording.json (default: $OPTLOOP_HOME/throughput/recording.json)",
    )
    args = parse_command(parser, argv)
    path = args.recording or manifest_path(state_dir() / "throughput" / "lm_cache.sqlite")
    if not path.is_file():
        raise ConfigError(
            f"no recording at {path}; run `python -m experiments.bench.throughput record` first"
        )
    recording = Recording.model_validate_json(path.read_text())
    source = load_dataset(recording.dataset)
    unit = per_unit(recording, args.system, sum(len(e.questions) for e in source.episodes))
    price = model_price(args.model.split(":", 1)[-1])
    if price is None:
        raise ConfigError(f"{args.model} has no price in litellm's cost map; pick a priced model")
    shape = Shape.of(load_dataset(args.dataset))
    config = LoopConfig(
        system=args.system,
        dataset=args.dataset,
        budget=args.budget,
        optimizer=args.optimizer,
        run_name="estimate",
        batch=args.batch,
    )
    splits = split_counts(args.conversations, config.fractions)
    targets = [site for site in args.sites.split(",") if site]
    levels = [int(n) for n in args.n.split(",")]
    works = {
        n: cost_model(args.optimizer)(
            run_shape(
                recording,
                args.system,
                unit,
                shape,
                budget=args.budget,
                train=splits[0],
                targets=targets,
                threads=max(ENDPOINT_THREADS, n),
                batch=args.batch,
            )
        )
        for n in levels
    }
    latency = args.latency_ms / 1000
    figures = {
        n: run_estimate(
            unit,
            shape,
            splits,
            budget=args.budget,
            work=works[n],
            price=price,
            latency_s=latency,
            concurrency=n,
            batch=args.batch,
        )
        for n in levels
    }
    first = figures[levels[0]]
    if args.json:
        write_atomic(
            args.json,
            json.dumps(
                stamped(
                    {
                        "system": args.system,
                        "budget": args.budget,
                        "batch": args.batch,
                        "optimizer": args.optimizer,
                        "model": args.model,
                        "dataset": args.dataset,
                        "conversations": args.conversations,
                        "latency_ms": args.latency_ms,
                        "recording": recording.identity,
                        "recorded_on": recording.recorded_on,
                        "levels": {str(n): f.model_dump(mode="json") for n, f in figures.items()},
                    },
                    model=f"{args.model}, modeled from a recording on {recording.identity}",
                ),
                indent=1,
            ),
        )

    console = Console()
    table = Table(
        title=f"{args.system}, --budget {args.budget}, --batch {args.batch}, --optimizer "
        f"{args.optimizer}, LoCoMo "
        f"({args.conversations} conversations: {'/'.join(map(str, splits))} train/dev/test), "
        f"{args.model}"
    )
    for col in [
        "part",
        "evaluations",
        "calls",
        "tokens",
        "dollars",
        *(f"time at N={n}" for n in levels),
    ]:
        table.add_column(col, justify="left" if col == "part" else "right")
    rows = {n: [*estimated.parts, estimated.total] for n, estimated in figures.items()}
    body = [
        [
            part.part,
            str(part.evaluations),
            f"{part.calls:,}",
            cell(part.tokens, "{:,}"),
            cell(part.cost_usd, "${:,.2f}"),
            *(duration_cell(rows[n][i].hours) for n in levels),
        ]
        for i, part in enumerate(rows[levels[0]])
    ]
    for part, row in zip(rows[levels[0]], body, strict=True):
        if part is first.total:
            table.add_section()
        table.add_row(*row)
    console.print(table)
    chain = shape.chain(unit)
    lines = [
        f"measured on {recording.identity} ({recording.dataset}, {recording.recorded_on}): "
        f"{unit.session_calls:.1f} calls, {unit.session_prompt:,.0f} + "
        f"{unit.session_completion:,.0f} tokens per session; {unit.question_calls:.1f} calls, "
        f"{unit.question_prompt:,.0f} + {unit.question_completion:,.0f} tokens per question. "
        f"LoCoMo shape from {shape.conversations} conversations of {args.dataset}: "
        f"{shape.sessions:.1f} sessions, {shape.questions:.0f} questions each, the longest "
        f"{shape.longest} sessions. Price: ${price.input * 1e6:.3f} / ${price.output * 1e6:.3f} "
        "per million prompt / completion tokens.",
        "how: optloop.run --estimate's run model (optloop/loop/spending/estimate.py), its "
        "baseline's train and dev modeled from "
        f"the recording, every request computed in an assumed {args.latency_ms:.0f} ms.",
        optimizer_line(first, config)
        + "; target sites: "
        + (
            ", ".join(targets) + " (--sites)"
            if targets
            else f"the recorded ingest sites plus {ANSWER} (the run picks them from the "
            "baseline's blame, which a "
            "recording lacks; --sites names others)"
        )
        + "; the proposer is the same model.",
        "time: an evaluation takes max(requests x latency / N, chain x latency): N in "
        "flight, but an episode's "
        "sessions go in order, then a question; the longest conversation's chain, "
        f"{shape.longest} sessions x "
        f"{unit.session_calls:.1f} + {unit.question_calls:.1f} requests = {chain:,.0f}, "
        f"takes {chain * latency:,.0f} s "
        "at any N, taken to be in every split (the baseline's evaluations too). The "
        "optimizer's part is not floored: "
        "its time is its requests / its threads.",
        *(line for n in levels for line in figures[n].floor_lines()),
    ]
    for line in lines:
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if args.markdown:
        record = provenance(f"{args.model}, modeled from a recording on {recording.identity}")
        write_atomic(
            args.markdown,
            f"# {table.title}\n\n"
            + provenance_lines(record)
            + markdown_table([str(column.header) for column in table.columns], body)
            + "\n\n"
            + "\n".join(f"- {line}" for line in lines)
            + "\n",
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
