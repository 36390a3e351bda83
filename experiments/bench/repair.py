"""The repair benchmark: a prompt made worse at one site must be found and mended by the loop.

    python -m experiments.bench.repair                # md_flat cases, every arm, seeds 0,1,2
    python -m experiments.bench.repair --cases answer-echo --seeds 0 --arms targeted \\
        --optimizers edit
    python -m experiments.bench.repair --bite-only    # only measure which sabotages bite

The closed loop's promise under control. A **sabotage** is a written instruction
(the optimizer rewrites instructions, so the fault must live in one): the site's
instruction replaced, or a sentence appended to it. The cases are in
:data:`optloop.faults.sabotages.SABOTAGES`, written down before any was run.

1. **Bite check**: the clean program and the sabotaged one run over the whole
   dataset; the margin (clean - sabotaged accuracy) gets a paired-bootstrap 95% CI
   over questions. A sabotage whose CI does not lie above 0 does not bite on this
   model: it is dropped, and listed with its figure.
2. **Arms**, each from the sabotaged program at equal ``--budget``: ``targeted``
   (``optloop.run``: the blamed sites), ``untargeted`` (every site) and
   ``random`` (one site picked at random, seeded), per optimizer and seed.
3. **Report on the held-out test split**: clean, sabotaged, after; the recovered
   share of the loss, (after - sabotaged) / (clean - sabotaged), with a paired
   bootstrap CI over the test questions; whether the first blame named the
   sabotaged site; LLM calls (cached ones included, so arms compare), tokens and
   seconds.
4. **The clean instruction never reaches the optimizer**: the run starts from the
   sabotaged instruction (``LoopConfig.start``), and a witness on the LM checks
   every proposer request and every candidate's demos. Where the sabotage
   replaces the instruction, the clean text must appear in none of them
   (``leaks`` counts the ones that did; the benchmark fails on any). Where it
   appends or prepends, the start instruction itself carries the clean text, so
   that check cannot apply (``leaks`` is null).

All arms share one LM cache (``--cache``; a temporary one by default), so an
evaluation repeated across arms costs nothing the second time; ``llm_calls``
counts every call, cached or not, and ``model_calls`` the computed ones. MLflow
runs go to a temporary store unless ``--tracking-uri`` is given.
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
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from experiments.provenance import model_of, stamped
from optloop.artifacts import CHECKPOINT
from optloop.cli import CommandParser, lm_settings_from_args, parse_command, run_cli
from optloop.datasets import load_dataset
from optloop.faults.model import InstructionFault
from optloop.faults.sabotages import DEFAULT_CASES, RECALL, RECALL_CASES, SABOTAGES
from optloop.lm import OptloopLM
from optloop.loop.candidate import Candidate
from optloop.loop.evaluate import Evaluation, Evaluator
from optloop.loop.optimizers import PROPOSER_SITE
from optloop.loop.runner import Checkpoint, Loop, LoopConfig, start_candidate
from optloop.paths import write_atomic
from optloop.stats import Interval, bootstrap_mean, paired_bootstrap_delta, recovered_share
from systems import get_system

logger = logging.getLogger(__name__)
console = Console(width=None if sys.stdout.isatty() else 200)

ARMS = ("targeted", "untargeted", "random")


class Witness:
    """Watches an LM's requests for a text that must never reach the proposer."""

    def __init__(self, lm: OptloopLM, text: str | None):
        self.text = " ".join(text.split()) if text else None
        self.proposer_requests = 0
        self.leaks = 0
        self.lm = lm

    def __call__(self, site: str | None, messages: list[dict[str, Any]]) -> None:
        if site != PROPOSER_SITE:
            return
        self.proposer_requests += 1
        if self.text and any(
            self.text in " ".join(str(m.get("content", "")).split()) for m in messages
        ):
            self.leaks += 1

    def __enter__(self) -> Witness:
        self.lm.watchers.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.lm.watchers.remove(self)

    def check_demos(self, candidates: Sequence[Candidate]) -> None:
        for candidate in candidates:
            for state in candidate.sites.values():
                if self.text and any(
                    self.text in " ".join(json.dumps(d).split()) for d in state.demos
                ):
                    self.leaks += 1


def scores(evaluation: Evaluation, keys: Sequence[tuple[str, str]] | None = None) -> list[float]:
    """Per-question 0/1 (passed), in the order of ``keys`` ((episode, question) ids) when given."""
    by_key = {(o.episode_id, o.question_id): float(o.passed) for o in evaluation.outcomes}
    return [by_key[k] for k in keys] if keys is not None else list(by_key.values())


def ci(interval: Interval) -> list[float]:
    return [round(interval.low, 3), round(interval.high, 3)]


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args = args
        self.tmp = tmp
        self.lms: dict[str, OptloopLM] = {}

    def lm(self, system: str) -> OptloopLM:
        """One LM per system (its local decoding bounds), all on the bench's one cache."""
        if system not in self.lms:
            settings = lm_settings_from_args(self.args, get_system(system).local_decoding)
            self.lms[system] = OptloopLM(
                settings.model_copy(update={"cache_path": self.args.cache})
            )
        return self.lms[system]

    # --- 1. does it bite ------------------------------------------------------------------

    def bite(self, sabotage: InstructionFault) -> dict[str, Any]:
        lm = self.lm(sabotage.system)
        dataset = load_dataset(sabotage.dataset)
        evaluator = Evaluator(
            sabotage.system,
            lm,
            self.tmp / "bite" / sabotage.name,
            dataset_uri=dataset.uri,
            query_site=sabotage.query_rewrite,
        )
        try:
            clean = evaluator.baseline()
            config = LoopConfig(
                system=sabotage.system,
                run_name="bite",
                query_rewrite=sabotage.query_rewrite,
                start={
                    sabotage.site: sabotage.instruction(clean.sites[sabotage.site].instructions)
                },
            )
            sabotaged = start_candidate(evaluator, config)
            with console.status(f"{sabotage.name}: clean over {dataset.uri}"):
                clean_eval = evaluator.evaluate(clean, dataset, split="all")
            with console.status(f"{sabotage.name}: sabotaged over {dataset.uri}"):
                sab_eval = evaluator.evaluate(sabotaged, dataset, split="all")
        finally:
            evaluator.close()
        keys = [(o.episode_id, o.question_id) for o in clean_eval.outcomes]
        margin = paired_bootstrap_delta(scores(sab_eval, keys), scores(clean_eval, keys), seed=0)
        blamed = sab_eval.blame()
        return {
            "name": sabotage.name,
            "system": sabotage.system,
            "site": sabotage.site,
            "mode": sabotage.mode,
            "dataset": sabotage.dataset,
            "n": margin.n,
            "clean": round(clean_eval.accuracy, 3),
            "sabotaged": round(sab_eval.accuracy, 3),
            "margin": round(margin.estimate, 3),
            "margin_ci": ci(margin),
            "bites": margin.low > 0,
            "first_blame_all": blamed[0].target if blamed else None,
            "clean_instruction": clean.sites[sabotage.site].instructions,
            "_sites": list(evaluator.sites),
            "_clean_eval": clean_eval,
        }

    # --- 2. the arms ----------------------------------------------------------------------

    def arm(
        self, sabotage: InstructionFault, bite: dict[str, Any], arm: str, optimizer: str, seed: int
    ) -> dict[str, Any]:
        lm = self.lm(sabotage.system)
        clean_text = bite["clean_instruction"]
        start = {sabotage.site: sabotage.instruction(clean_text)}
        sites = None
        if arm == "random":
            sites = [random.Random(f"{sabotage.name}/{seed}").choice(bite["_sites"])]
        name = f"repair-{sabotage.name}-{arm}-{optimizer}-s{seed}"
        config = LoopConfig(
            system=sabotage.system,
            dataset=sabotage.dataset,
            budget=self.args.budget,
            optimizer=optimizer,
            seed=seed,
            untargeted=arm == "untargeted",
            sites=sites,
            run_name=name,
            tracking_uri=self.args.tracking_uri,
            start=start,
            lm=self.args.lm or "local",
            query_rewrite=sabotage.query_rewrite,
        )
        work = self.tmp / "runs" / name
        started = time.perf_counter()
        with (
            Witness(lm, clean_text if sabotage.mode == "replace" else None) as witness,
            console.status(name) as status,
        ):
            result = Loop(
                config,
                lm,
                lm,
                work=work,
                progress=lambda msg, s=status: s.update(f"{name}: {msg}"),
            ).run()
        ckpt = Checkpoint.load(work / CHECKPOINT)
        witness.check_demos([t.candidate for t in ckpt.trials])
        assert ckpt.test_before is not None and ckpt.test_after is not None
        keys = [(o.episode_id, o.question_id) for o in ckpt.test_before.outcomes]
        clean_v = scores(bite["_clean_eval"], keys)
        sab_v, after_v = scores(ckpt.test_before, keys), scores(ckpt.test_after, keys)
        recovered = recovered_share(clean_v, sab_v, after_v, seed=seed)
        gain = paired_bootstrap_delta(
            sab_v, after_v, seed=seed
        )  # stable where clean - sabotaged is small on test
        return {
            "case": sabotage.name,
            "site": sabotage.site,
            "mode": sabotage.mode,
            "optimizer": optimizer,
            "arm": arm,
            "seed": seed,
            "optimized": result.tunable_sites,
            "clean": round(statistics.fmean(clean_v), 3) if clean_v else 0.0,
            "sabotaged": round(result.test_before, 3),
            "after": round(result.test_after, 3),
            "n_test": len(keys),
            "recovered": None
            if recovered.estimate != recovered.estimate
            else round(recovered.estimate, 3),
            "recovered_ci": ci(recovered),
            "gain": round(gain.estimate, 3),
            "gain_ci": ci(gain),
            "first_blame": result.targets[0] if result.targets else None,
            "first_blame_correct": bool(result.targets) and result.targets[0] == sabotage.site,
            "blame": _blame_counts(ckpt),
            "site_blamed": sabotage.site in result.targets,
            "changed": result.changed_sites,
            "best_trial": result.best_trial,
            "llm_calls": int(result.cost["llm_calls"]),
            "model_calls": int(result.cost["model_calls"]),
            "tokens": int(result.cost["tokens"]),
            "seconds": round(time.perf_counter() - started, 1),
            "proposer_requests": witness.proposer_requests,
            "leaks": witness.leaks if sabotage.mode == "replace" else None,
            "after_instruction": _best_instruction(ckpt, result.best_trial, sabotage.site, start),
            "trials": [
                {
                    "trial": t.trial,
                    "origin": t.candidate.origin,
                    "dev": None if t.evaluation is None else round(t.evaluation.accuracy, 3),
                }
                for t in ckpt.trials
            ],
        }


def _blame_counts(ckpt: Checkpoint) -> dict[str, int]:
    """Failures of the sabotaged baseline (train + dev) per blamed target: what the first blame was
    chosen from."""
    counts: dict[str, int] = {}
    for ev in (ckpt.baseline_train, ckpt.baseline_dev):
        for a in ev.attributions() if ev is not None else []:
            counts[a.target or "-"] = counts.get(a.target or "-", 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _best_instruction(ckpt: Checkpoint, best_trial: int, site: str, start: dict[str, str]) -> str:
    for t in ckpt.trials:
        if t.trial == best_trial:
            return t.candidate.sites[site].instructions
    return start[site]


def aggregate(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (optimizer, arm): first-blame rate, share recovering >= 50%, mean recovered with a CI
    over cases, cost."""
    rows = []
    for optimizer in sorted({c["optimizer"] for c in cases}):
        for arm in ARMS:
            group = [c for c in cases if c["optimizer"] == optimizer and c["arm"] == arm]
            if not group:
                continue
            rec = [c["recovered"] for c in group if c["recovered"] is not None]
            mean = bootstrap_mean(rec, seed=0)
            rows.append(
                {
                    "optimizer": optimizer,
                    "arm": arm,
                    "cases": len(group),
                    "first_blame_correct": round(
                        sum(c["first_blame_correct"] for c in group) / len(group), 3
                    ),
                    "recovered_half": round(sum(r >= 0.5 for r in rec) / len(group), 3),
                    "recovered_mean": round(mean.estimate, 3),
                    "recovered_mean_ci": ci(mean),
                    "llm_calls_mean": round(statistics.fmean(c["llm_calls"] for c in group), 1),
                    "tokens_mean": round(statistics.fmean(c["tokens"] for c in group)),
                    "leaks": sum(c["leaks"] or 0 for c in group),
                }
            )
    return rows


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, each as a met/missed line."""
    out = []
    for optimizer in sorted({r["optimizer"] for r in rows}):
        by_arm = {r["arm"]: r for r in rows if r["optimizer"] == optimizer}
        t = by_arm.get("targeted")
        if t is None:
            continue
        out.append(
            f"{optimizer}: first blame names the sabotaged site in "
            f"{t['first_blame_correct']:.0%} of cases "
            f"(target >= 90%): {'met' if t['first_blame_correct'] >= 0.9 else 'MISSED'}"
        )
        out.append(
            f"{optimizer}: targeted recovers >= 50% of the loss in "
            f"{t['recovered_half']:.0%} of cases "
            f"(target >= 70%): {'met' if t['recovered_half'] >= 0.7 else 'MISSED'}"
        )
        for other, strict in (("untargeted", False), ("random", True)):
            o = by_arm.get(other)
            if o is None:
                continue
            better = (
                t["recovered_mean"] > o["recovered_mean"]
                if strict
                else t["recovered_mean"] >= o["recovered_mean"]
            )
            cheaper = t["llm_calls_mean"] < o["llm_calls_mean"]
            out.append(
                f"{optimizer}: targeted recovers {t['recovered_mean']:+.2f} vs {other} "
                f"{o['recovered_mean']:+.2f}"
                f" ({'more' if strict else 'at least as much'}: {'met' if better else 'MISSED'}), "
                f"{t['llm_calls_mean']:.0f} vs {o['llm_calls_mean']:.0f} LLM calls "
                f"(fewer: {'met' if cheaper else 'MISSED'})"
            )
    return out


def render(report: dict[str, Any]) -> None:
    bites = Table(
        title=f"bite check ({report['model']}): clean vs sabotaged over the whole dataset, paired "
        "bootstrap"
    )
    for col in ("case", "site", "mode", "n", "clean", "sabotaged", "margin [95% CI]", "kept"):
        bites.add_column(col)
    for b in report["bites"]:
        bites.add_row(
            b["name"],
            b["site"],
            b["mode"],
            str(b["n"]),
            f"{b['clean']:.3f}",
            f"{b['sabotaged']:.3f}",
            f"{b['margin']:+.3f} [{b['margin_ci'][0]:+.3f}, {b['margin_ci'][1]:+.3f}]",
            "yes" if b["bites"] else "dropped",
        )
    console.print(bites)
    if not report["cases"]:
        return
    table = Table(title=f"repair on held-out test, budget {report['budget']} ({report['model']})")
    for col in (
        "case",
        "optimizer",
        "arm",
        "seed",
        "n",
        "clean",
        "sab.",
        "after",
        "gain [95% CI]",
        "recovered [95% CI]",
        "1st blame ok",
        "LLM calls",
        "tokens",
        "s",
        "leaks",
    ):
        table.add_column(col)
    for c in report["cases"]:
        rec = (
            "n/a"
            if c["recovered"] is None
            else f"{c['recovered']:+.2f} [{c['recovered_ci'][0]:+.2f}, "
            f"{c['recovered_ci'][1]:+.2f}]"
        )
        gain = (
            f"{c['gain']:+.2f} [{c['gain_ci'][0]:+.2f}, {c['gain_ci'][1]:+.2f}]"
            if "gain" in c
            else "n/a"
        )
        table.add_row(
            c["case"],
            c["optimizer"],
            c["arm"],
            str(c["seed"]),
            str(c["n_test"]),
            f"{c['clean']:.2f}",
            f"{c['sabotaged']:.2f}",
            f"{c['after']:.2f}",
            gain,
            rec,
            "yes" if c["first_blame_correct"] else "no",
            str(c["llm_calls"]),
            str(c["tokens"]),
            f"{c['seconds']:.0f}",
            "-" if c["leaks"] is None else str(c["leaks"]),
        )
    console.print(table)
    agg = Table(
        title="aggregate per optimizer and arm (recovered: mean over cases, bootstrap CI over "
        "cases)"
    )
    for col in (
        "optimizer",
        "arm",
        "cases",
        "1st blame ok",
        ">= 50% recovered",
        "recovered mean [95% CI]",
        "LLM calls (mean)",
        "tokens (mean)",
    ):
        agg.add_column(col)
    for r in report["aggregate"]:
        agg.add_row(
            r["optimizer"],
            r["arm"],
            str(r["cases"]),
            f"{r['first_blame_correct']:.0%}",
            f"{r['recovered_half']:.0%}",
            f"{r['recovered_mean']:+.2f} [{r['recovered_mean_ci'][0]:+.2f}, "
            f"{r['recovered_mean_ci'][1]:+.2f}]",
            f"{r['llm_calls_mean']:.0f}",
            f"{r['tokens_mean']}",
        )
    console.print(agg)
    for line in report["targets"]:
        console.print(line)


def to_markdown(report: dict[str, Any]) -> str:
    """The report's tables as Markdown (the README's and ``experiments/results/repair.md``)."""

    def ci_text(v: Any, lo_hi: list[float]) -> str:
        return "n/a" if v is None else f"{v:+.2f} [{lo_hi[0]:+.2f}, {lo_hi[1]:+.2f}]"

    lines = [
        f"Model: {report.get('model', '?')}; budget {report['budget']}; seeds {report['seeds']}.",
        "",
        "| case | site | mode | n | clean | sabotaged | margin [95% CI] | kept |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {b['name']} | {b['site']} | {b['mode']} | {b['n']} | {b['clean']:.3f} | "
        f"{b['sabotaged']:.3f} | {ci_text(b['margin'], b['margin_ci'])} | "
        f"{'yes' if b['bites'] else 'dropped'} |"
        for b in report["bites"]
    ]
    if report["cases"]:
        lines += [
            "",
            "| case | optimizer | arm | seed | n test | clean | sabotaged | after | after - "
            "sabotaged [95% CI] | recovered [95% CI] | first blame | changed | LLM calls | "
            "tokens | s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {c['case']} | {c['optimizer']} | {c['arm']} | {c['seed']} | {c['n_test']} | "
            f"{c['clean']:.2f} | {c['sabotaged']:.2f} | {c['after']:.2f} | "
            f"{ci_text(c['gain'], c['gain_ci']) if 'gain' in c else 'n/a'} | "
            f"{ci_text(c['recovered'], c['recovered_ci'])} | "
            f"{c['first_blame']}{'' if c['first_blame_correct'] else ' (wrong)'} | "
            f"{', '.join(c['changed']) or '-'} | {c['llm_calls']} | {c['tokens']} | "
            f"{c['seconds']:.0f} |"
            for c in report["cases"]
        ]
    if report.get("aggregate"):
        lines += [
            "",
            "| optimizer | arm | cases | first blame right | recovered >= 50% | recovered, mean "
            "[95% CI] | LLM calls (mean) |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['optimizer']} | {r['arm']} | {r['cases']} | {r['first_blame_correct']:.0%} | "
            f"{r['recovered_half']:.0%} | "
            f"{ci_text(r['recovered_mean'], r['recovered_mean_ci'])} | "
            f"{r['llm_calls_mean']:.0f} |"
            for r in report["aggregate"]
        ]
        lines += ["", *[f"- {t}" for t in report.get("targets", [])]]
    return "\n".join(lines) + "\n"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("python -m experiments.bench.repair", __doc__, lm=True)
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help=f"sabotages to run (default the md_flat ones; 'recall': the rag_bm25 ones on "
        f"{RECALL}); all: {', '.join(s.name for s in SABOTAGES)}",
    )
    parser.add_argument(
        "--seeds", default="0,1,2", help="split and optimizer seeds (default 0,1,2)"
    )
    parser.add_argument(
        "--arms", default=",".join(ARMS), help="targeted, untargeted, random (default all)"
    )
    parser.add_argument(
        "--optimizers",
        default="edit,simba",
        help="optimizers to run the arms with (default edit,simba)",
    )
    parser.add_argument(
        "--budget", type=int, default=4, help="dev evaluations per arm (default 4)"
    )
    parser.add_argument(
        "--bite-only",
        action="store_true",
        help="only the bite check: which sabotages lower accuracy",
    )
    parser.add_argument(
        "--cache", type=Path, help="the LM cache all arms share (default: a fresh temporary one)"
    )
    parser.add_argument("--tracking-uri", help="MLflow store (default: a temporary one)")
    parser.add_argument(
        "--json",
        type=Path,
        metavar="OUT",
        help="write the report here (experiments/results/repair.json)",
    )
    parser.add_argument(
        "--markdown", type=Path, metavar="OUT", help="write the tables as Markdown here"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    if not args.verbose:
        logging.getLogger("dspy").setLevel(logging.ERROR)
    known = {s.name: s for s in SABOTAGES}
    if args.cases == "recall":
        args.cases = ",".join(RECALL_CASES)
    unknown = [c for c in _csv(args.cases) if c not in known]
    if unknown:
        raise SystemExit(
            f"repair: unknown case(s) {', '.join(unknown)}; the cases are {', '.join(known)}"
        )
    chosen = [known[c] for c in _csv(args.cases)]
    seeds = [int(s) for s in _csv(args.seeds)]
    arms = _csv(args.arms)
    if set(arms) - set(ARMS):
        raise SystemExit(f"repair: --arms takes {', '.join(ARMS)}")
    with tempfile.TemporaryDirectory(prefix="optloop-bench-repair-") as tmp_name:
        tmp = Path(tmp_name)
        args.tracking_uri = args.tracking_uri or f"sqlite:///{tmp / 'mlflow.db'}"
        args.cache = args.cache or tmp / "cache.sqlite"
        bench = Bench(args, tmp)
        report: dict[str, Any] = {
            "bench": "repair",
            "budget": args.budget,
            "seeds": seeds,
            "arms": arms,
            "optimizers": _csv(args.optimizers),
            "bites": [],
            "cases": [],
            "dropped": [],
        }
        for sabotage in chosen:
            bite = bench.bite(sabotage)
            report["model"] = bench.lm(sabotage.system).model
            report["bites"].append({k: v for k, v in bite.items() if not k.startswith("_")})
            console.print(
                f"{sabotage.name}: clean {bite['clean']:.3f}, sabotaged "
                f"{bite['sabotaged']:.3f}, margin "
                f"{bite['margin']:+.3f} {bite['margin_ci']} (n={bite['n']}): "
                f"{'bites' if bite['bites'] else 'does not bite, dropped'}"
            )
            if not bite["bites"]:
                report["dropped"].append(
                    {
                        k: bite[k]
                        for k in (
                            "name",
                            "site",
                            "mode",
                            "n",
                            "clean",
                            "sabotaged",
                            "margin",
                            "margin_ci",
                        )
                    }
                )
            if args.json:  # partial results survive a long run's interruption
                write_atomic(
                    args.json, json.dumps(stamped(report, model_of(args)), indent=1, default=str)
                )
            if not bite["bites"] or args.bite_only:
                continue
            for seed in seeds:
                for optimizer in _csv(args.optimizers):
                    for arm in arms:
                        case = bench.arm(sabotage, bite, arm, optimizer, seed)
                        report["cases"].append(case)
                        console.print(
                            f"{case['case']} {optimizer} {arm} s{seed}: test "
                            f"{case['sabotaged']:.2f} -> {case['after']:.2f} (clean "
                            f"{case['clean']:.2f}, n={case['n_test']}), recovered "
                            f"{case['recovered']} {case['recovered_ci']}, {case['llm_calls']} "
                            "LLM calls"
                        )
                        if args.json:  # partial results survive a long run's interruption
                            write_atomic(
                                args.json,
                                json.dumps(stamped(report, model_of(args)), indent=1, default=str),
                            )
        report["aggregate"] = aggregate(report["cases"])
        report["targets"] = targets(report["aggregate"])
    render(report)
    if args.json:
        write_atomic(args.json, json.dumps(stamped(report, model_of(args)), indent=1, default=str))
    if args.markdown:
        write_atomic(args.markdown, to_markdown(report))
    leaks = sum(c["leaks"] or 0 for c in report["cases"])
    if leaks:
        console.print(
            f"[red]the clean instruction reached the proposer or a demo {leaks} time(s)[/]"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
