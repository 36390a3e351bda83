"""Racing against no racing: the same seeded loop run twice, once with optloop's default racing on
dev and once with ``--no-race``, and what each spent and chose.

    python -m experiments.bench.racing --json experiments/results/racing_demo.json \\
        --markdown experiments/results/racing_demo.md -- \\
        --system rag_bm25 --query-rewrite --dataset "synthetic:recall?seed=0&episodes=40" \\
        --optimizer edit --budget 3

Everything after ``--`` is ``python -m optloop.run``'s flags, the same for both arms; each arm runs
with ``--new --json`` in its own ``OPTLOOP_HOME`` (``<work>/race``, ``<work>/no-race``, emptied
first), so neither replays the other's LM calls and their wall times compare. Per arm: the
candidates evaluated, those a race stopped, the dev questions and LLM calls the trials spent
(against full evaluations), the run's LLM calls and wall time, the best chosen and its held-out
figures. Then the two targets: a losing candidate (one that did not become the best) costs on
average at most a third of a full dev evaluation under racing; and racing's best is not measurably
worse on the held-out questions than the best chosen without it (the paired bootstrap of
raced best − unraced best on the same test questions, read from both runs' checkpoints).
``--report-only`` writes the markdown again from ``--json``.

An arm that takes hours can run on its own: ``--arms race`` runs only that arm, and a later
``--arms no-race`` reads the race arm back from ``<work>/race`` (its ``figures.json``, or its
result and checkpoint, its wall time then the run's own ``seconds``). ``--cache-from race`` starts
each arm run now with a copy of that arm's LM cache: the calls both arms make alike (the baseline,
the control, the held-out start program, every question a race answered) are replayed free, so
the questions and LLM calls (cache hits counted) still compare and the wall times do not; the
table says so. The same requests then get the same answers in both arms, which a fresh llama.cpp
context does not quite promise.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(offline_defaults())  # first: litellm and Hugging Face read them when imported

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.markdown import provenance_lines, table
from experiments.provenance import command_of, model_of, stamped
from optloop.artifacts import CHECKPOINT
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.paths import write_atomic
from optloop.stats import paired_bootstrap_delta

REPO = Path(__file__).resolve().parents[2]
ARMS = {"race": [], "no-race": ["--no-race"]}
# A losing candidate's mean share of a full dev evaluation under racing, at most.
LOSER_SHARE_TARGET = 1 / 3


def _lm_flags(run_args: Sequence[str]) -> argparse.Namespace:
    """The ``--lm`` and ``--proposer-lm`` of optloop.run's flags, as :func:`model_of` reads."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--lm")
    flags.add_argument("--proposer-lm")
    return flags.parse_known_args(list(run_args))[0]


def _checkpoint(home: Path) -> dict[str, Any]:
    """The one run's checkpoint under ``home`` (each arm runs once in a fresh home)."""
    (path,) = sorted((home / "runs").glob(f"*/{CHECKPOINT}"))
    data: dict[str, Any] = json.loads(path.read_text())
    return data


FIGURES = "figures.json"  # an arm's figures, kept in its home for a later call to read back


def _read_arm(home: Path) -> dict[str, Any] | None:
    """An arm an earlier call ran: its saved figures, or, when that call did not save them, its
    result and checkpoint with the run's own seconds as its wall time. None: not finished there."""
    if (home / FIGURES).exists():
        saved: dict[str, Any] = json.loads((home / FIGURES).read_text())
        return saved
    if not (home / "result.json").exists():
        return None
    result = json.loads((home / "result.json").read_text())
    return arm_figures(result, _checkpoint(home), float(result["cost"].get("seconds", 0.0))) | {
        "cache_from": None
    }


def arm_figures(result: Mapping[str, Any], ckpt: Mapping[str, Any], seconds: float) -> dict:
    """One arm's figures from its ``--json`` result and its checkpoint."""
    trials = [t for t in ckpt["trials"] if t.get("evaluation")]
    losers = [t["evaluation"] for t in trials if not t.get("improved")]

    def share(e: Mapping[str, Any]) -> float:
        stopped = e.get("stopped")
        return 1.0 if not stopped else len(e["outcomes"]) / stopped["of"]

    racing = result.get("racing") or {}
    return {
        "candidates": len(trials),
        "stopped": racing.get("stopped", 0),
        "dev_questions": racing.get("questions"),
        "dev_questions_full": racing.get("full_questions"),
        "trial_llm_calls": racing.get("llm_calls"),
        "trial_llm_calls_full": racing.get("full_calls"),
        "losers": len(losers),
        "loser_share": round(sum(map(share, losers)) / len(losers), 3) if losers else None,
        "run_llm_calls": result["cost"].get("llm_calls"),
        "wall_s": round(seconds, 1),
        "best_trial": result["best_trial"],
        "best_origin": next(
            (t["origin"] for t in result["tried"] if t["trial"] == result["best_trial"]), "start"
        ),
        "best_dev": result["best_dev"],
        "test_before_ci": result["test_before_ci"],
        "test_after_ci": result["test_after_ci"],
        "delta_test_ci": result["delta_test_ci"],
        "test_after_passed": [o["passed"] for o in ckpt["test_after"]["outcomes"]],
        "test_after_ids": [
            f"{o['episode_id']}/{o['question_id']}" for o in ckpt["test_after"]["outcomes"]
        ],
    }


def compare(arms: Mapping[str, Mapping[str, Any]], seed: int = 0) -> dict[str, Any]:
    """The two targets: racing's losers' mean share, and raced best − unraced best on test."""
    race, full = arms["race"], arms["no-race"]
    assert race["test_after_ids"] == full["test_after_ids"], "the arms' test splits differ"
    delta = paired_bootstrap_delta(
        [float(x) for x in full["test_after_passed"]],
        [float(x) for x in race["test_after_passed"]],
        seed=seed,
    )
    return {
        "loser_share": race["loser_share"],
        "loser_share_met": race["loser_share"] is None
        or race["loser_share"] <= LOSER_SHARE_TARGET,
        "best_race_minus_no_race": delta.model_dump(),
        "not_worse_met": delta.high >= 0,
        "same_best": race["best_origin"] == full["best_origin"],
    }


def _interval(ci: Mapping[str, Any], signed: bool = False) -> str:
    f = "+.3f" if signed else ".3f"
    return f"{ci['estimate']:{f}} [{ci['low']:{f}}, {ci['high']:{f}}] n={ci['n']}"


HEADER = [
    "arm",
    "candidates (stopped)",
    "dev questions (of full)",
    "trial LLM calls (full: est.)",
    "losers' mean share of a full dev evaluation",
    "run LLM calls",
    "wall s",
    "best",
    "test after",
    "held-out delta",
]


def figures(results: Mapping[str, Any]) -> list[str]:
    """The arms' table and the two targets, as markdown blocks (the page's section reads them
    too)."""
    arms: Mapping[str, Mapping[str, Any]] = results["arms"]
    rows = [
        [
            arm,
            f"{a['candidates']} ({a['stopped']})",
            f"{a['dev_questions']} ({a['dev_questions_full']})",
            f"{a['trial_llm_calls']:,} ({a['trial_llm_calls_full']:,})",
            "-" if a["loser_share"] is None else f"{a['loser_share']:.2f} of {a['losers']}",
            f"{a['run_llm_calls']:,}",
            f"{a['wall_s']:.0f}"
            + (f" ({a['cache_from']}'s LM cache)" if a.get("cache_from") else ""),
            f"trial {a['best_trial']}: {a['best_origin']} (dev {a['best_dev']:.3f})",
            _interval(a["test_after_ci"]),
            _interval(a["delta_test_ci"], signed=True),
        ]
        for arm, a in arms.items()
    ]
    c = results["comparison"]
    delta = _interval(c["best_race_minus_no_race"], signed=True)
    share = "-" if c["loser_share"] is None else f"{c['loser_share']:.2f}"
    return [
        f"Command (each arm adds its flag): `python -m optloop.run {results['run_args']}`",
        table(HEADER, rows),
        f"- a losing candidate's mean share of a full dev evaluation under racing: {share} "
        f"(target at most {LOSER_SHARE_TARGET:.2f}: "
        f"{'met' if c['loser_share_met'] else 'not met'})\n"
        f"- held-out accuracy, racing's best − the best without racing, paired by question: "
        f"{delta} ({'not measurably worse: met' if c['not_worse_met'] else 'measurably worse'}"
        f"; {'the same best' if c['same_best'] else 'different bests'})",
    ]


def to_markdown(results: Mapping[str, Any]) -> str:
    return (
        "\n\n".join(
            [
                "# Racing against no racing: the same seeded run both ways",
                provenance_lines(results["provenance"]).rstrip("\n"),
                *figures(results),
            ]
        )
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.racing", __doc__)
    parser.add_argument("--work", type=Path, default=Path("/tmp/optloop-racing"))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        help="the arms to run now (default both); the others are read back from <work>/<arm>",
    )
    parser.add_argument(
        "--cache-from",
        choices=list(ARMS),
        help="start each arm run now with a copy of that arm's LM cache (its calls replayed free: "
        "questions and calls compare, wall times do not)",
    )
    parser.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then optloop.run's flags")
    args = parse_command(parser, argv)
    run_args = [a for a in args.run_args if a != "--"]
    if args.report_only:
        results = json.loads(args.json.read_text())
    else:
        if not run_args:
            parser.error("give optloop.run's flags after --")
        now = [a.strip() for a in args.arms.split(",") if a.strip()]
        if unknown := sorted(set(now) - set(ARMS)):
            parser.error(f"--arms: unknown {', '.join(unknown)} (arms: {', '.join(ARMS)})")
        arms: dict[str, Any] = {}
        for arm, flags in ARMS.items():
            home = args.work / arm
            if arm not in now:
                if (read := _read_arm(home)) is None:
                    parser.error(f"{arm}: no finished arm in {home}; run it with --arms {arm}")
                arms[arm] = read
                continue
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            cache_from = args.cache_from if args.cache_from != arm else None
            if cache_from is not None:
                for cache in (args.work / cache_from).glob("lm_cache.sqlite*"):
                    shutil.copy2(cache, home / cache.name)
            out = home / "result.json"
            cmd = [*run_args, *flags, "--new", "--json", str(out)]
            print(f"racing: {arm}: python -m optloop.run {shlex.join(cmd)}", flush=True)
            env = {**os.environ, "OPTLOOP_HOME": str(home), "OPTLOOP_MLRUNS": str(home / "ml")}
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "optloop.run", *cmd], cwd=REPO, env=env, check=False
            )
            if done.returncode != 0:
                print(f"racing: {arm} exited {done.returncode}", file=sys.stderr)
                return done.returncode
            arms[arm] = arm_figures(
                json.loads(out.read_text()), _checkpoint(home), time.perf_counter() - started
            ) | {"cache_from": cache_from}
            write_atomic(home / FIGURES, json.dumps(arms[arm], indent=1))
        results = stamped(
            {"arms": arms, "comparison": compare(arms), "run_args": shlex.join(run_args)},
            model_of(_lm_flags(run_args)),
            command_of("experiments.bench.racing", argv),
        )
        write_atomic(args.json, json.dumps(results, indent=1))
    text = to_markdown(results)
    write_atomic(args.markdown, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
