"""Throughput against an endpoint: one evaluation at ``--concurrency`` N = 1, 2, 4, 8, 16.

    python -m experiments.bench.throughput record [--systems md_flat,mem0,graphiti] [--dataset URI]
                                                  [--cache FILE]
    python -m experiments.bench.throughput replay [--systems ...] [--n 1,2,4,8,16]
                                                  [--latency-ms 300] [--jitter-ms 50]
                                                  [--rate-429 0,0.1] [--retry-after 1] [--seed 0]
                                                  [--json experiments/results/throughput.json]
                                                  [--markdown OUT]

``record`` runs one evaluation of each system (the baseline candidate, as ``optloop.run`` evaluates
it) on the dataset with the embedded LM (``--lm``, default ``local``; each system with its own
decoding bounds), writing every answer to a dedicated LM cache file (default
``$OPTLOOP_HOME/throughput/lm_cache.sqlite``) and, beside it, ``recording.json``: the dataset, the
model identity, the date and each system's figures. The default dataset,
``synthetic:suite?seed=0``, has 9 short episodes (1 or 2 sessions, 1 or 2 questions), so graphiti
on the embedded LM records in minutes.

``replay`` serves that cache from :mod:`optloop.testing.replay` on loopback (answers after
``--latency-ms`` +- ``--jitter-ms``, and HTTP 429 with ``Retry-After`` on a ``--rate-429`` fraction
of requests, all fixed by ``--seed`` and the request) and runs the same evaluation through it,
uncached, at every N (and every 429 rate), each on a fresh server, store directory and LM. Per row:

``seconds``        wall time of the evaluation (``Evaluator.evaluate``; the systems' construction
                   left out)
``calls``          LM requests it made (429 retries not counted)
``ideal_seconds``  ``max(calls x mean latency / N, longest chain x mean latency)``: the time N
                   requests always in flight would take, bounded below by the longest episode's
                   chain of calls that must go one after another, its ingestion calls (sessions go
                   in order) plus the calls of its costliest question (a question's calls go in
                   order; its questions run at once). The mean latency is the replay server's
                   injected mean for the run. graphiti makes some of a session's calls at once, so
                   for graphiti the chain overstates the true one, and an efficiency above 1 says
                   by how much.
``efficiency``     ``ideal_seconds / seconds``
``accuracy``       of the evaluation; it must be the same at every N and 429 rate (the run fails
                   otherwise)
``retries_429``    attempts the endpoint refused with 429 and optloop asked again
``misses``         requests the recording does not hold (answered HTTP 400: that question fails at
                   every N)

With ``--repeat K`` each row is the run of median seconds of K (its ``seconds_runs`` lists all K):
the injected latencies and 429s are the same in every run, so what varies is this machine's own
work.

Results go to ``--json`` (``{"rows": [...], "summary": [...], <settings>}``) and, with
``--markdown``, a table. The summary reads each system against the throughput targets
(:func:`summarize`): the speed-up at N = 8 as a share of the ideal speed-up (target >= 0.8), and
the time with 429s over the time without at each N (target <= 1.3x), beside the least that ratio
can be at N = 1 for any client that honours ``Retry-After`` (:func:`floor_429`: with 300 ms calls
and a 1 s Retry-After on 10 % of attempts it is 1.39x, so for calls made strictly one after
another, as md_flat's and mem0's are at N = 1, that target is out of reach by arithmetic; only
waits overlapped by other calls bring it lower, and graphiti overlaps some calls of a session even
at N = 1, since a call waiting out a Retry-After holds no slot). mem0's extraction prompt carries
the day's date (UTC), so its recording replays on the day it was made.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from experiments.bench._common import parse_systems
from experiments.provenance import stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.datasets import Dataset, load_dataset
from optloop.embed import Embedder, get_embedder
from optloop.errors import ConfigError
from optloop.lm import LMSettings, OptloopLM, Usage
from optloop.loop.cost import LMCost
from optloop.loop.evaluate import Evaluation, Evaluator
from optloop.loop.spending.estimate import evaluation_seconds
from optloop.paths import state_dir, write_atomic
from optloop.pipeline import EpisodeResult
from optloop.testing.replay import ReplayConfig, ReplayServer, load_cache
from systems import get_system

logger = logging.getLogger(__name__)

DEFAULT_SYSTEMS = "md_flat,mem0,graphiti"
DEFAULT_DATASET = "synthetic:suite?seed=0"
DEFAULT_N = "1,2,4,8,16"
MIN_EPISODES = 8
RESULTS = Path(__file__).resolve().parents[1] / "results"


class Recorded(BaseModel):
    """One system's recording run, on the embedded LM."""

    accuracy: float
    calls: int
    model_calls: int
    seconds: float
    sessions: int = Field(0, description="sessions ingested (calls and tokens per session)")
    sites: dict[str, LMCost] = Field(
        default_factory=dict,
        description="calls and tokens per prompt site (experiments.bench.estimate)",
    )


class Recording(BaseModel):
    """``recording.json``, beside the cache: what ``replay`` needs to ask exactly what was
    recorded."""

    dataset: str
    identity: str = Field(description="the model identity the cache entries were written under")
    recorded_on: str = Field(description="UTC date (mem0's prompts carry it)")
    systems: dict[str, Recorded] = Field(default_factory=dict)


class Row(BaseModel):
    system: str
    dataset: str = Field("", description="the dataset the system was recorded and replayed on")
    n: int
    rate_429: float
    seconds: float
    ideal_seconds: float
    efficiency: float
    accuracy: float
    calls: int
    retries_429: int
    misses: int
    chain: int = Field(description="the longest episode's chain of sequential calls")
    seconds_runs: list[float] = Field(
        default_factory=list,
        description="with --repeat: every run's seconds (``seconds`` is their median)",
    )
    mean_latency_s: float


class Summary(BaseModel):
    """One system's figures against the throughput targets, read off its rows."""

    system: str
    n: int = Field(description="the concurrency the speed-up is read at (the target's N = 8)")
    speedup: float | None = Field(description="seconds at N=1 / seconds at N, without 429s")
    ideal_speedup: float | None = Field(description="ideal seconds at N=1 / ideal seconds at N")
    share_of_ideal: float | None = Field(
        description="speed-up / ideal speed-up; the target is >= 0.8"
    )
    cost_429: dict[int, float] = Field(
        default_factory=dict,
        description="per N: seconds with the 429 rate / seconds without; target <= 1.3",
    )
    serial_429: dict[int, float] = Field(
        default_factory=dict,
        description="per N: what the 429s would cost if no other call went on "
        "during their waits, 1 + retries x wait / seconds without; "
        "cost_429 below it is the waits concurrency hid",
    )
    floor_429_n1: float | None = Field(
        None,
        description="the cost_429 expected at N=1 of calls made strictly one "
        "at a time by a client honouring Retry-After (floor_429)",
    )
    lost: int = Field(
        0, description="questions whose outcome differs from the first run's (target 0)"
    )


TARGET_SHARE = 0.8
TARGET_COST_429 = 1.3
RETRY_AFTER_JITTER = (
    0.05  # the mean of optloop's Retry-After jitter, uniform(0, 10 %) (optloop.lm.limits.Backoff)
)


def floor_429(rate: float, retry_after_s: float, latency_s: float) -> float:
    """The expected time with 429s over the time without, for calls made strictly one at a time by
    a client that honours ``Retry-After``.

    Each attempt gets a 429 with probability ``rate``, so a call meets ``rate / (1 - rate)`` 429s
    on average, each answered at once and followed by a wait of ``Retry-After`` (plus optloop's
    jitter) in which no other call runs. Against ``latency_s`` a call, the run takes this many
    times as long (LM time alone); only other calls going on during a wait bring it lower.
    """
    waits = rate / (1 - rate) * retry_after_s * (1 + RETRY_AFTER_JITTER)
    return 1 + waits / latency_s if latency_s else float("inf")


def summarize(rows: Sequence[Row], *, at: int = 8, retry_after_s: float = 1.0) -> list[Summary]:
    """Per system: the speed-up at N=``at`` against the ideal, and what 429s cost at each N."""
    out: list[Summary] = []
    for system in dict.fromkeys(row.system for row in rows):
        mine = [row for row in rows if row.system == system]
        clean = {row.n: row for row in mine if row.rate_429 == 0}
        one, top = clean.get(1), clean.get(at)
        speedup = ideal = share = None
        if one and top and top.seconds and top.ideal_seconds:
            speedup = one.seconds / top.seconds
            ideal = one.ideal_seconds / top.ideal_seconds
            share = speedup / ideal
        limited = [row for row in mine if row.rate_429 > 0]
        cost = {
            row.n: round(row.seconds / clean[row.n].seconds, 3)
            for row in limited
            if row.n in clean and clean[row.n].seconds
        }
        wait = retry_after_s * (1 + RETRY_AFTER_JITTER)
        serial = {
            row.n: round(1 + row.retries_429 * wait / clean[row.n].seconds, 3)
            for row in limited
            if row.n in clean and clean[row.n].seconds
        }
        floor = None
        if limited and 1 in clean:
            floor = round(
                floor_429(limited[0].rate_429, retry_after_s, clean[1].mean_latency_s), 3
            )
        out.append(
            Summary(
                system=system,
                n=at,
                speedup=_round(speedup),
                ideal_speedup=_round(ideal),
                share_of_ideal=_round(share),
                cost_429=cost,
                serial_429=serial,
                floor_429_n1=floor,
            )
        )
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def chain(result: EpisodeResult) -> int:
    """An episode's calls that must go one after another: its ingestion's, then its costliest
    question's."""
    graph = result.graph
    questions = (
        [sum(op.llm_calls for op in graph.question_ops(q.id)) for q in result.episode.questions]
        if graph is not None
        else []
    )
    return result.ingest_calls + max(questions, default=0)


def evaluate(
    system: str, lm: OptloopLM, dataset: Dataset, work: Path, embedder: Embedder
) -> tuple[Evaluation, list[EpisodeResult], float]:
    """One evaluation of ``system``'s baseline over ``dataset``: (evaluation, episode results, wall
    seconds)."""
    evaluator = Evaluator(system, lm, work, embedder=embedder, dataset_uri=dataset.uri)
    episodes: list[EpisodeResult] = []
    try:
        started = time.perf_counter()
        evaluation = evaluator.evaluate(evaluator.baseline(), dataset, on_episode=episodes.append)
        return evaluation, episodes, time.perf_counter() - started
    finally:
        evaluator.close()


# --- record ----------------------------------------------------------------------------------


def record(args: argparse.Namespace, console: Console) -> int:
    systems = parse_systems(args.systems)
    dataset = load_dataset(args.dataset)
    if len(dataset.episodes) < MIN_EPISODES:
        console.print(
            f"[yellow]{args.dataset} has {len(dataset.episodes)} episodes; the benchmark wants "
            f"at least {MIN_EPISODES} so that N = 8 has an episode per thread[/yellow]"
        )
    cache: Path = args.cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    embedder = get_embedder()
    recording = Recording(dataset=dataset.uri, identity="", recorded_on=today())
    with Progress(console=console) as progress:
        task = progress.add_task("record", total=len(systems))
        for system in systems:
            progress.update(task, description=f"record {system}")
            settings = LMSettings.from_spec(
                args.lm, cache_path=cache, **get_system(system).local_decoding
            )
            lm = OptloopLM(settings)
            with tempfile.TemporaryDirectory(prefix="optloop-throughput-") as tmp:
                evaluation, _, seconds = evaluate(system, lm, dataset, Path(tmp), embedder)
            recording.identity = lm.backend.identity
            recording.systems[system] = Recorded(
                accuracy=evaluation.accuracy,
                calls=evaluation.llm_calls,
                model_calls=evaluation.model_calls,
                seconds=round(seconds, 1),
                sessions=sum(len(e.sessions) for e in dataset.episodes),
                sites=evaluation.sites,
            )
            progress.advance(task)
    write_atomic(manifest_path(cache), recording.model_dump_json(indent=2))
    table = Table(title=f"recorded on {recording.identity} ({dataset.uri}) into {cache}")
    for column in ("system", "accuracy", "calls", "model calls", "seconds"):
        table.add_column(column, justify="left" if column == "system" else "right")
    for system, done in recording.systems.items():
        table.add_row(
            system,
            f"{done.accuracy:.3f}",
            str(done.calls),
            str(done.model_calls),
            f"{done.seconds:.1f}",
        )
    console.print(table)
    return 0


def manifest_path(cache: Path) -> Path:
    return cache.with_name("recording.json")


def read_recording(cache: Path, systems: Sequence[str]) -> Recording:
    path = manifest_path(cache)
    if not path.is_file():
        raise ConfigError(
            f"no recording at {path}; run `python -m experiments.bench.throughput record` first"
        )
    recording = Recording.model_validate_json(path.read_text())
    missing = [s for s in systems if s not in recording.systems]
    if missing:
        raise ConfigError(f"{path} holds no recording of {', '.join(missing)}; record them first")
    if "mem0" in systems and recording.recorded_on != today():
        raise ConfigError(
            "mem0's extraction prompt carries the date (UTC): its recording of "
            f"{recording.recorded_on} cannot be replayed on {today()}; record again (or leave "
            "mem0 out with --systems)"
        )
    return recording


# --- replay ----------------------------------------------------------------------------------


def replay_one(
    system: str,
    n: int,
    rate_429: float,
    dataset: Dataset,
    responses: dict[str, Any],
    identity: str,
    args: argparse.Namespace,
    embedder: Embedder,
) -> tuple[Row, list[tuple[str, str, bool]]]:
    """One evaluation through a fresh replay server at concurrency ``n``: its row, and its outcomes
    (question id, prediction, passed) to compare across N."""
    config = ReplayConfig(
        latency_ms=args.latency_ms,
        jitter_ms=args.jitter_ms,
        seed=args.seed,
        rate_429=rate_429,
        retry_after=args.retry_after,
    )
    with (
        ReplayServer(responses, identity=identity, config=config) as server,
        tempfile.TemporaryDirectory(prefix="optloop-throughput-") as tmp,
    ):
        lm = OptloopLM(
            LMSettings.from_spec(
                "openai:replay",
                base_url=server.base_url,
                cache=False,
                concurrency=n,
                timeout_s=args.timeout,
            )
        )
        evaluation, episodes, seconds = evaluate(system, lm, dataset, Path(tmp), embedder)
        stats = server.stats
    usage = Usage.of(lm.accounting.records)
    mean = stats.latency_s / stats.hits if stats.hits else args.latency_ms / 1000
    longest = max((chain(result) for result in episodes), default=0)
    ideal = evaluation_seconds(evaluation.llm_calls, mean, n, longest)  # the estimate's time model
    row = Row(
        system=system,
        dataset=dataset.uri,
        n=n,
        rate_429=rate_429,
        seconds=round(seconds, 2),
        ideal_seconds=round(ideal, 2),
        efficiency=round(ideal / seconds, 3) if seconds else 0.0,
        accuracy=evaluation.accuracy,
        calls=evaluation.llm_calls,
        retries_429=usage.retries_429,
        misses=stats.misses,
        chain=longest,
        mean_latency_s=round(mean, 4),
    )
    return row, [(o.question_id, o.prediction, o.passed) for o in evaluation.outcomes]


def median_run(runs: Sequence[Row]) -> Row:
    """The run of median seconds (the lower middle one of an even count), carrying every run's
    seconds."""
    if len(runs) == 1:
        return runs[0]
    ordered = sorted(runs, key=lambda row: row.seconds)
    return ordered[(len(ordered) - 1) // 2].model_copy(
        update={"seconds_runs": [row.seconds for row in runs]}
    )


def replay(args: argparse.Namespace, console: Console) -> int:
    systems = parse_systems(args.systems)
    recording = read_recording(args.cache, systems)
    dataset = load_dataset(recording.dataset)
    responses = load_cache(args.cache)
    if args.repeat < 1:
        raise ConfigError(f"--repeat must be at least 1, not {args.repeat}")
    ns = parse_numbers(args.n, int)
    rates = parse_numbers(args.rate_429, float)
    embedder = get_embedder()
    embedder.embed(["warm up"])  # loaded now, not inside the first run's seconds
    rows: list[Row] = []
    different: list[str] = []
    lost: dict[str, int] = {}
    with Progress(console=console) as progress:
        task = progress.add_task("replay", total=len(systems) * len(ns) * len(rates))
        for system in systems:
            first: list[tuple[str, str, bool]] | None = None
            for rate in rates:
                for n in ns:
                    progress.update(
                        task, description=f"{system} N={n}" + (f" 429s {rate:g}" if rate else "")
                    )
                    runs: list[Row] = []
                    for _ in range(args.repeat):
                        row, outcomes = replay_one(
                            system, n, rate, dataset, responses, recording.identity, args, embedder
                        )
                        runs.append(row)
                        first = outcomes if first is None else first
                        if outcomes != first:
                            different.append(f"{system} at N={n}, 429s {rate:g}")
                            changed = sum(a != b for a, b in zip(outcomes, first)) + abs(
                                len(outcomes) - len(first)
                            )
                            lost[system] = max(lost.get(system, 0), changed)
                    rows.append(median_run(runs))
                    progress.advance(task)
    settings = {
        "latency_ms": args.latency_ms,
        "jitter_ms": args.jitter_ms,
        "retry_after_s": args.retry_after,
        "seed": args.seed,
        "repeat": args.repeat,
    }
    kept = kept_results(args.json, systems, settings) if args.update else None
    if kept is not None:
        rows = [Row.model_validate(r) for r in kept["rows"]] + rows
        lost = {**{s["system"]: s["lost"] for s in kept["summary"]}, **lost}
        different = kept["different"] + different
    summaries = summarize(rows, retry_after_s=args.retry_after)
    for summary in summaries:
        summary.lost = lost.get(summary.system, 0)
    datasets = dict.fromkeys(row.dataset for row in rows)
    results = {
        "rows": [row.model_dump() for row in rows],
        "summary": [s.model_dump() for s in summaries],
        "dataset": next(iter(datasets))
        if len(datasets) == 1
        else "; ".join(
            f"{system}: {row.dataset}" for system, row in {r.system: r for r in rows}.items()
        ),
        "identity": recording.identity,
        "systems": list(dict.fromkeys(row.system for row in rows)),
        "n": ns,
        "rate_429": rates,
        **settings,
        "identical": not different,
        "different": different,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        args.json, json.dumps(stamped(results, f"{recording.identity}, replayed"), indent=2) + "\n"
    )
    if args.markdown:
        write_atomic(
            args.markdown, to_markdown(rows, results) + "\n" + summary_markdown(summaries)
        )
    print_table(rows, results, console)
    for line in summary_lines(summaries):
        console.print(line)
    if any(row.misses for row in rows):
        console.print(
            "[yellow]some requests were not in the recording (misses): those questions failed "
            "at every N; was the recording made with these systems and this dataset?[/yellow]"
        )
    if different:
        console.print(f"[red]the evaluation differs across N: {'; '.join(different)}[/red]")
        return 1
    return 0


def kept_results(
    path: Path, systems: Sequence[str], settings: dict[str, Any]
) -> dict[str, Any] | None:
    """``--update``: the rows (and their summaries) of the systems not replayed now, from the
    ``--json`` file there; None if there is none. Its replay settings must be these, or the rows
    would not compare."""
    if not path.is_file():
        return None
    old = json.loads(path.read_text())
    there = {
        key: old.get(key, 1 if key == "repeat" else None) for key in settings
    }  # files before --repeat: 1 run
    differ = [
        f"{key} {there[key]} there, {value} now"
        for key, value in settings.items()
        if there[key] != value
    ]
    if differ:
        raise ConfigError(
            f"--update: {path} was replayed with other settings ({'; '.join(differ)}); "
            "replay with the same ones, or write a new --json"
        )
    return {
        "rows": [r for r in old["rows"] if r["system"] not in systems],
        "summary": [s for s in old.get("summary", []) if s["system"] not in systems],
        "different": [d for d in old.get("different", []) if d.split(" at ")[0] not in systems],
    }


def parse_numbers(text: str, kind: type) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"not a comma-separated list of numbers: {text!r}") from None
    if not values:
        raise ConfigError(f"no numbers in {text!r}")
    return values


COLUMNS = (
    "system",
    "N",
    "429s",
    "seconds",
    "ideal s",
    "efficiency",
    "accuracy",
    "calls",
    "429 retries",
    "misses",
)


def _cells(row: Row) -> list[str]:
    return [
        row.system,
        str(row.n),
        f"{row.rate_429:g}",
        f"{row.seconds:.1f}",
        f"{row.ideal_seconds:.1f}",
        f"{row.efficiency:.2f}",
        f"{row.accuracy:.3f}",
        str(row.calls),
        str(row.retries_429),
        str(row.misses),
    ]


def _settings(results: dict[str, Any]) -> str:
    return (
        f"{results['dataset']}, answers recorded from {results['identity']}, replayed at "
        f"{results['latency_ms']:g} ms +- {results['jitter_ms']:g} (Retry-After "
        f"{results['retry_after_s']:g} s)"
        + (
            f", the median of {results['repeat']} runs a row"
            if results.get("repeat", 1) > 1
            else ""
        )
        + f"; accuracy identical across N: {'yes' if results['identical'] else 'NO'}"
    )


def to_markdown(rows: Sequence[Row], results: dict[str, Any]) -> str:
    lines = [
        _settings(results) + ".",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---" * len(COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def summary_lines(summaries: Sequence[Summary]) -> list[str]:
    """Each system against the targets: >= 0.8 of the ideal speed-up at N = 8; 429s at most 1.3x
    the time."""
    lines: list[str] = []
    for s in summaries:
        if s.share_of_ideal is not None:
            lines.append(
                f"{s.system}: speed-up at N={s.n} {s.speedup:.2f}x of an ideal "
                f"{s.ideal_speedup:.2f}x, {s.share_of_ideal:.2f} of it (target >= "
                f"{TARGET_SHARE}: {_verdict(s.share_of_ideal >= TARGET_SHARE)})"
            )
        if s.cost_429:
            costs = ", ".join(
                f"N={n} {c:.2f}x ({_verdict(c <= TARGET_COST_429)}; {s.serial_429[n]:.2f}x if "
                "nothing overlapped the waits)"
                for n, c in s.cost_429.items()
            )
            floor = (
                f"; calls made strictly one at a time expect {s.floor_429_n1:.2f}x at N=1, "
                "Retry-After waits that nothing overlaps"
                if s.floor_429_n1 is not None
                else ""
            )
            lines.append(
                f"{s.system}: 429s cost {costs} (target <= {TARGET_COST_429}x){floor}; "
                f"questions lost: {s.lost}"
            )
    return lines


def summary_markdown(summaries: Sequence[Summary]) -> str:
    return "".join(f"- {line}\n" for line in summary_lines(summaries))


def print_table(rows: Sequence[Row], results: dict[str, Any], console: Console) -> None:
    table = Table(title=_settings(results))
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "system" else "right")
    for row in rows:
        table.add_row(*_cells(row))
    console.print(table)


# --- the command line ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.throughput", __doc__)
    steps = parser.add_subparsers(dest="step", required=True)
    rec = steps.add_parser(
        "record", help="record each system's evaluation on the embedded LM into an LM cache"
    )
    rep = steps.add_parser("replay", help="replay it through a loopback endpoint at each N")
    for sub in (rec, rep):
        sub.add_argument(
            "--systems",
            default=DEFAULT_SYSTEMS,
            help=f"comma-separated (default {DEFAULT_SYSTEMS})",
        )
        sub.add_argument(
            "--cache",
            type=Path,
            default=None,
            help="the recording's LM cache (default $OPTLOOP_HOME/throughput/lm_cache.sqlite)",
        )
    rec.add_argument(
        "--dataset", default=DEFAULT_DATASET, help=f"dataset URI (default {DEFAULT_DATASET})"
    )
    rec.add_argument(
        "--lm", default="local", help="LM spec to record from (default: the embedded model)"
    )
    rep.add_argument("--n", default=DEFAULT_N, help=f"concurrencies (default {DEFAULT_N})")
    rep.add_argument("--latency-ms", type=float, default=300.0)
    rep.add_argument("--jitter-ms", type=float, default=50.0)
    rep.add_argument(
        "--rate-429", default="0", help="fractions of requests refused with HTTP 429, e.g. 0,0.1"
    )
    rep.add_argument(
        "--retry-after", type=float, default=1.0, help="seconds in the 429s' Retry-After"
    )
    rep.add_argument("--seed", type=int, default=0)
    rep.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per cell; the row is the run of median seconds (default 1)",
    )
    rep.add_argument("--timeout", type=float, default=60.0, help="per-attempt LM timeout, seconds")
    rep.add_argument("--json", type=Path, default=RESULTS / "throughput.json")
    rep.add_argument(
        "--markdown", type=Path, metavar="OUT", help="also write the table to this Markdown file"
    )
    rep.add_argument(
        "--update",
        action="store_true",
        help="keep the --json file's rows of other systems (replayed with the same settings, "
        "perhaps from another recording) and replace only these systems'",
    )
    args = parse_command(parser, argv)
    args.cache = args.cache or state_dir() / "throughput" / "lm_cache.sqlite"
    console = Console()
    return record(args, console) if args.step == "record" else replay(args, console)


if __name__ == "__main__":
    sys.exit(run_cli(main))
