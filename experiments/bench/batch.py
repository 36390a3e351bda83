"""Trials in batches against an endpoint: ``optloop.run --budget 8`` at ``--concurrency 16``, one
candidate at a time against ``--batch K``, through the replay server at 1 s a call.

    flock /tmp/optloop-lm.lock python -m experiments.bench.batch --phase record
        [--system rag_bm25] [--query-rewrite] [--dataset synthetic:recall?seed=0&episodes=40]
        [--optimizer edit] [--budget 8] [--batches 1,4]
        [--n 16] [--latency-ms 1000] [--jitter-ms 150] [--work DIR]
        [--json experiments/results/batch.json] [--markdown experiments/results/batch.md]
    python -m experiments.bench.batch --phase replay [the same flags]

Each batch size K is one whole run of the real CLI (``python -m optloop.run``: baseline, optimizer,
trials, held-out test, MLflow), twice:

1. **record**: against :class:`~optloop.testing.replay.ReplayServer` with no latency, whose
   every answer is computed by the embedded model (SmolLM2 through llama.cpp, the system's own
   decoding bounds) the first time it is asked and kept (``<work>/responses.json``, shared by every
   K and every rerun): the run as the embedded model makes it, at ``--concurrency 1``, over HTTP,
   so every request of the replay is one the recording holds (a request made for a DSPy rollout is
   keyed by its body, as the server sees it, not by the rollout id);
2. **replay**: the same command at ``--concurrency N`` against the server replaying those answers
   at ``--latency-ms`` +- ``--jitter-ms`` (fixed by the request and the seed), timed (wall time of
   the process, startup included).

A row says the replay's wall time, its trials, dev and held-out accuracies, and whether its
candidates and accuracies are identical to the recording's (the same ``--seed`` and ``--batch`` at
another concurrency: deterministic), and how many requests the recording did not hold (must be 0).
Runs with other K try other candidates (a SIMBA step's best K, an edit round's K best edits at
once), so their accuracies may differ; what the table compares is the time the same budget takes.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from experiments.markdown import provenance_lines, table
from experiments.provenance import command_of, stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.errors import ConfigError
from optloop.paths import write_atomic
from optloop.testing.oracle import PLANTED
from optloop.testing.replay import ReplayConfig, ReplayServer, bundled_identity

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"


class Row(BaseModel):
    """One batch size: its recording and its timed replay."""

    batch: int
    n: int
    seconds: float = Field(
        description="wall time of the replayed run (the process, startup included)"
    )
    trials_seconds: float = Field(
        description="of which the trials: proposals (the optimizer's screening "
        "included) and evaluations, as the run's trial lines report them"
    )
    record_seconds: float = Field(
        description="wall time of the recording run (embedded model, N=1)"
    )
    trials: int
    tried: list[tuple[int, float]] = Field(
        description="(trial, dev accuracy) of the replay, in trial order"
    )
    baseline_dev: float
    best_dev: float
    test_before: float
    test_after: float
    delta_test: str = Field(
        description="the held-out delta with its 95% CI and n (paired bootstrap)"
    )
    identical: bool = Field(
        description="candidates, dev and held-out accuracies equal the recording's"
    )
    requests: int = Field(description="requests the replay server answered")
    misses: int = Field(description="requests the recording did not hold (answered HTTP 400)")


def _oracle(dataset: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The scripted answers of :class:`optloop.testing.oracle.OracleEndpoint` (no model; md_flat):
    the gold answer when the memories hold it, unless the answer instruction carries the planted
    sentence; md_flat's curation keeps the file's facts and adds the session's user lines (the full
    list its prompt asks for)."""
    from optloop.testing.loopback import chat_completion
    from optloop.testing.oracle import OracleEndpoint, prompt_section

    oracle = OracleEndpoint(dataset)  # its answers only: its own server is never started

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        kind, content = oracle._respond(body)
        messages = body.get("messages") or []
        user = str(messages[-1].get("content") or "") if messages else ""
        if (
            "[[ ## memory_file ## ]]" in user and kind == "ok"
        ):  # md_flat.curate: the full list, the file's facts kept
            file = prompt_section(user, "memory_file")
            kept = [line[2:].strip() for line in file.splitlines() if line.startswith("- ")]
            content = json.dumps(
                {"facts": kept + [f for f in json.loads(content)["facts"] if f not in kept]}
            )
        if kind != "ok":
            raise ConfigError(f"the oracle answered {kind!r} to a chat request")
        words = sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [])
        usage = {
            "prompt_tokens": words,
            "completion_tokens": len(str(content).split()),
            "total_tokens": words + len(str(content).split()),
        }
        return chat_completion(body, content, usage, model="oracle")

    return answer


def _embedded(system: str, cache: Path) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The embedded model behind the recording server (the system's decoding bounds, its own LM
    cache file)."""
    from optloop.testing.replay import request_of

    engine = _embedded_engine(system, cache)
    return lambda body: engine.call(request_of(body))


def _embedded_engine(system: str, cache: Path) -> Any:
    """The embedded model behind the recording server: the system's decoding bounds, its own LM
    cache file."""
    from optloop.cli.command import lm_settings_from_args
    from optloop.cli.run import build_parser
    from optloop.lm import OptloopLM
    from systems import get_system

    args = build_parser().parse_args(["--system", system])
    settings = lm_settings_from_args(args, get_system(system).local_decoding)
    lm = OptloopLM(settings.model_copy(update={"cache_path": cache}))
    return lm.optloop_engine


def _run(
    args: argparse.Namespace, base_url: str, home: Path, batch: int, n: int, out: Path
) -> float:
    """``python -m optloop.run`` against ``base_url``, its state under ``home``; its wall
    seconds."""
    cmd = [
        sys.executable,
        "-m",
        "optloop.run",
        "--system",
        args.system,
        "--dataset",
        args.dataset,
        "--optimizer",
        args.optimizer,
        "--budget",
        str(args.budget),
        "--batch",
        str(batch),
        "--seed",
        str(args.seed),
        "--lm",
        "openai:replay",
        "--lm-base-url",
        base_url,
        "--lm-timeout",
        "900",
        "--concurrency",
        str(n),
        "--run-name",
        f"batch-{batch}",
        "--allow-small-splits",
        "--tracking-uri",
        f"sqlite:///{home / 'mlruns' / 'mlflow.db'}",
        "--json",
        str(out),
        *(["--query-rewrite"] if args.query_rewrite else []),
        *(["--start", f"answer=+{PLANTED}"] if args.answers == "oracle" and args.plant else []),
        *(["--sites", args.sites] if args.sites else []),
    ]
    env = {
        **os.environ,
        "OPTLOOP_HOME": str(home / "state"),
        "OPTLOOP_MLRUNS": str(home / "mlruns"),
    }
    started = time.perf_counter()
    with (home / "run.log").open("w") as log:
        done = subprocess.run(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
        )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(cmd[3:])} exited {done.returncode}; see {home / 'run.log'}")
    return seconds


def _outcome(result: dict[str, Any]) -> tuple[Any, ...]:
    """What must match between the recording and the replay."""
    return (
        result["baseline_dev"],
        [(t["trial"], t["origin"], t["dev"]) for t in result["tried"]],
        result["test_before"],
        result["test_after"],
        result["changed_sites"],
    )


def _fresh(home: Path) -> Path:
    if home.exists():
        import shutil

        shutil.rmtree(home)
    home.mkdir(parents=True)
    return home


def record_batch(
    args: argparse.Namespace,
    batch: int,
    responses: dict[str, Any],
    fallback: Callable[[dict[str, Any]], dict[str, Any]],
    console: Console,
) -> None:
    """The run with ``--batch batch`` on the embedded model through the recording server (answers
    kept)."""
    home = _fresh(args.work / f"batch-{batch}" / "record")
    console.print(f"batch {batch}: recording ({args.answers} answers, --concurrency 1)")
    config = ReplayConfig(latency_ms=0.0, jitter_ms=0.0, seed=args.seed)
    started = time.perf_counter()
    with ReplayServer(
        responses, identity=bundled_identity(), config=config, fallback=fallback
    ) as server:
        _run(args, server.base_url, home, batch, 1, home / "result.json")
    (home / "seconds").write_text(f"{time.perf_counter() - started:.1f}")
    _save(args.work / "responses.json", responses)


def one_batch(
    args: argparse.Namespace, batch: int, responses: dict[str, Any], console: Console
) -> Row:
    """Replay the recorded run with ``--batch batch`` at ``--n``, timed."""
    work: Path = args.work / f"batch-{batch}"
    identity = bundled_identity()
    record_home, replay_home = work / "record", _fresh(work / "replay")
    if not (record_home / "result.json").exists():
        raise ConfigError(
            f"no recording of --batch {batch} in {record_home}; run with --phase record first"
        )
    record_seconds = float((record_home / "seconds").read_text())
    console.print(f"batch {batch}: replaying at N={args.n}, {args.latency_ms:g} ms a call")
    config = ReplayConfig(latency_ms=args.latency_ms, jitter_ms=args.jitter_ms, seed=args.seed)
    with ReplayServer(responses, identity=identity, config=config) as server:
        seconds = _run(
            args, server.base_url, replay_home, batch, args.n, replay_home / "result.json"
        )
        stats = server.stats
    lines = re.findall(
        r"^trial \d+/\d+ dev \S+ \(best \S+\) (\d+) s", (replay_home / "run.log").read_text(), re.M
    )
    recorded = json.loads((record_home / "result.json").read_text())
    replayed = json.loads((replay_home / "result.json").read_text())
    delta = replayed["delta_test_ci"]
    return Row(
        batch=batch,
        n=args.n,
        seconds=round(seconds, 1),
        trials_seconds=sum(float(x) for x in lines),
        record_seconds=round(record_seconds, 1),
        trials=replayed["evaluations"],
        tried=[(t["trial"], t["dev"]) for t in replayed["tried"]],
        baseline_dev=replayed["baseline_dev"],
        best_dev=replayed["best_dev"],
        test_before=replayed["test_before"],
        test_after=replayed["test_after"],
        delta_test=f"{delta['estimate']:+.3f} [{delta['low']:+.3f}, {delta['high']:+.3f}] "
        f"n={delta['n']}",
        identical=_outcome(recorded) == _outcome(replayed),
        requests=stats.requests,
        misses=stats.misses,
    )


_save_lock = threading.Lock()


def _save(path: Path, responses: dict[str, Any]) -> None:
    with _save_lock:
        write_atomic(path, json.dumps(responses))


def to_markdown(rows: Sequence[Row], results: dict[str, Any]) -> str:
    head = (
        f"# Trials in batches: `optloop.run --budget {results['budget']}` at --concurrency "
        f"{results['n']}, replayed at {results['latency_ms']:g} ms +- {results['jitter_ms']:g} "
        "a call\n\n"
        + provenance_lines(results["provenance"]).rstrip("\n")
        + f"\n- run: {results['system']}"
        f"{' --query-rewrite' if results['query_rewrite'] else ''}"
        f"{' --sites ' + results['sites'] if results.get('sites') else ''} on "
        f"`{results['dataset']}`, --optimizer {results['optimizer']}, --seed {results['seed']}"
        "\n\n"
    )
    header = [
        "--batch",
        "wall s (replay)",
        "speed-up",
        "of which trials, s",
        "speed-up",
        "trials",
        "dev baseline -> best",
        "held-out before -> after",
        "delta [95% CI] n",
        "same as recording (N=1)",
        "misses",
    ]
    first = rows[0].seconds if rows else 0.0
    first_trials = rows[0].trials_seconds if rows else 0.0
    cells = [
        [
            r.batch,
            f"{r.seconds:.1f}",
            f"{first / r.seconds:.2f}x",
            f"{r.trials_seconds:.0f}",
            f"{first_trials / r.trials_seconds if r.trials_seconds else 0:.2f}x",
            r.trials,
            f"{r.baseline_dev:.3f} -> {r.best_dev:.3f}",
            f"{r.test_before:.3f} -> {r.test_after:.3f}",
            r.delta_test,
            "yes" if r.identical else "NO",
            r.misses,
        ]
        for r in rows
    ]
    return head + table(header, cells) + "\n"


def estimate_markdown(paths: Sequence[Path], n: int) -> str:
    """The projections ``experiments.bench.estimate --json`` wrote (one per --batch), at
    concurrency ``n``."""
    estimates = [json.loads(p.read_text()) for p in paths]
    if not estimates:
        return ""
    first = estimates[0]
    head = (
        f"\n## The projection: `--system {first['system']} --budget {first['budget']}` on "
        f"LoCoMo with {first['model']} at --concurrency {n}\n\n- command: `python -m "
        f"experiments.bench.estimate --n {n} --batch K --json OUT` (the run model of "
        "`optloop.run --estimate`, optloop/loop/spending/estimate.py, on a baseline modeled "
        f"from a recording of {first['recording']} made {first['recorded_on']}; "
        f"{first['conversations']} conversations of `{first['dataset']}`; "
        f"{first['latency_ms']:g} ms a call assumed; optimizer {first['optimizer']})\n\n"
    )
    parts = [p["part"].split(" (")[0] for p in first["levels"][str(n)]["parts"]]
    lines = [
        "| --batch | " + " | ".join(parts) + " | total | calls | dollars |",
        "|---|" + "---|" * (len(parts) + 3),
    ]
    for e in estimates:
        figures = e["levels"][str(n)]
        hours = [
            f"{p['hours']:.2f} h" if p["hours"] is not None else "unknown"
            for p in figures["parts"]
        ]
        total = figures["total"]
        dollars = "unknown" if total["cost_usd"] is None else f"${total['cost_usd']:.2f}"
        lines.append(
            f"| {e['batch']} | " + " | ".join(hours) + f" | **{total['hours']:.2f} h** | "
            f"{total['calls']:,} | {dollars} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.batch", __doc__)
    parser.add_argument("--system", default="rag_bm25")
    parser.add_argument("--query-rewrite", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--dataset", default="synthetic:recall?seed=0&episodes=40")
    parser.add_argument("--optimizer", default="edit")
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument(
        "--batches", default="1,4", help="batch sizes to compare, the first the reference"
    )
    parser.add_argument("--n", type=int, default=16, help="--concurrency of the replayed runs")
    parser.add_argument("--latency-ms", type=float, default=1000.0)
    parser.add_argument("--jitter-ms", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/optloop-batch-bench"))
    parser.add_argument("--json", type=Path, default=RESULTS / "batch.json")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "batch.md")
    parser.add_argument(
        "--estimates",
        default="",
        help="comma-separated experiments.bench.estimate --json files "
        "to add to the markdown (one per --batch)",
    )
    parser.add_argument(
        "--answers",
        choices=["embedded", "oracle"],
        default="embedded",
        help="who answers what the recording lacks: the embedded model (hold the LM lock), or the "
        "scripted oracle of optloop.testing.oracle (md_flat; no model; with --start "
        "answer=+<its planted sentence>, which the edit optimizer can delete)",
    )
    parser.add_argument(
        "--plant",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --answers oracle, start from the answer instruction with the oracle's planted "
        "sentence (default; --no-plant: the system's own)",
    )
    parser.add_argument(
        "--sites",
        help="optloop.run --sites: the sites to optimize (e.g. md_flat.curate: every trial "
        "re-ingests its split, one session after another)",
    )
    parser.add_argument(
        "--phase",
        choices=["record", "replay", "both"],
        default="both",
        help="record (needs the embedded model: hold the LM lock), replay (no model), or both",
    )
    args = parse_command(parser, argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise ConfigError(f"--batches {args.batches!r}: give whole numbers, e.g. 1,4") from None
    console = Console(stderr=True)
    args.work.mkdir(parents=True, exist_ok=True)
    kept = args.work / "responses.json"
    responses: dict[str, Any] = json.loads(kept.read_text()) if kept.exists() else {}
    if args.phase in ("record", "both"):
        fallback = (
            _oracle(args.dataset)
            if args.answers == "oracle"
            else _embedded(args.system, args.work / "lm_cache.sqlite")
        )
        for b in batches:
            record_batch(args, b, responses, fallback, console)
        if args.phase == "record":
            return 0
    rows = [one_batch(args, b, responses, console) for b in batches]
    model = (
        bundled_identity()
        if args.answers == "embedded"
        else "the scripted oracle (optloop.testing.oracle.OracleEndpoint)"
    )
    results = {
        "answers": args.answers,
        "system": args.system,
        "sites": args.sites,
        "query_rewrite": args.query_rewrite,
        "dataset": args.dataset,
        "optimizer": args.optimizer,
        "budget": args.budget,
        "n": args.n,
        "latency_ms": args.latency_ms,
        "jitter_ms": args.jitter_ms,
        "seed": args.seed,
        "rows": [r.model_dump() for r in rows],
    }
    estimates = [Path(p) for p in args.estimates.split(",") if p]
    results["estimates"] = [json.loads(p.read_text()) for p in estimates]
    results = stamped(
        results,
        f"{model}, answers recorded once, then replayed",
        command_of("experiments.bench.batch", argv),
    )
    write_atomic(args.json, json.dumps(results, indent=1))
    write_atomic(args.markdown, to_markdown(rows, results) + estimate_markdown(estimates, args.n))
    table = Table(
        title=f"--budget {args.budget} at --concurrency {args.n}, {args.latency_ms:g} ms a call"
    )
    for col in (
        "--batch",
        "wall s",
        "trials",
        "best dev",
        "held-out delta",
        "same as recording",
        "misses",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r.batch),
            f"{r.seconds:.1f}",
            str(r.trials),
            f"{r.best_dev:.3f}",
            r.delta_test,
            "yes" if r.identical else "NO",
            str(r.misses),
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
