"""The closed loop: find which prompt makes a memory system fail, rewrite only that one, measure.

    python -m optloop.run --system mem0 --budget 3
    python -m optloop.run --system graphiti --dataset memfail:coexisting?limit=12 --budget 20 --optimizer gepa
    python -m optloop.run --system rag_bm25 --budget 10 --optimizer optuna --untargeted   # the ablation

What happens:
  1. the dataset is split train / dev / test by episode (a conversation never straddles splits);
  2. the baseline (the library's own prompts) runs on train and dev, every wrong answer is
     attributed to its decisive operation, and blame is summed per prompt site and knob;
  3. the optimizer rewrites only the blamed sites (every site with --untargeted); each
     candidate is evaluated on dev, one MLflow child run per candidate; when a candidate
     becomes the best, its failures are re-attributed and the optimizer follows the blame;
  4. the baseline and the best candidate run on the held-out test split; changed prompts are
     registered in the MLflow Prompt Registry as optloop.<site> (optloop.mem0.extract;
     optloop.<system>.answer), and the `champion` alias moves only when the held-out gain is
     more than noise: the 95% CI of the per-question delta lies above 0 (--promote-if).

Every accuracy is reported with its n and a 95% bootstrap CI over the questions: on a test
split of 12 questions one question is 0.083 of accuracy, and a 95% CI spans about ±0.3.

One evaluation (what --budget counts) = one candidate run over the dev split: ingest every
dev episode (reusing the stored result when the candidate's ingest prompts are unchanged),
answer every dev question, attribute every failure. SIMBA's and GEPA's own mini-batch runs
on train are the optimizer's cost: their LLM calls are reported, they are not evaluations.

Results: `make ui` (MLflow UI on mlruns/, offline-safe; see the README), experiment
optloop-<system>. An interrupted run resumes with the same command and --run-name.

LM faults: transient faults of an OpenAI-compatible endpoint (HTTP 5xx, dropped
connections, truncated or non-JSON bodies, timeouts) are retried (--lm-retries,
--lm-timeout); one that outlasts the retries fails the question it hit and the run
goes on. An endpoint that stays unreachable (refused, timing out twice in a call,
or answering only HTTP 5xx to 3 calls in a row) stops the run (exit code 75) with the
state saved: rerun the same command, with --run-name, to resume.

Bad input (an unknown system, a budget out of range, a missing or malformed dataset,
a corrupt LM cache or checkpoint) exits with code 2 and one line, before anything
is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from optloop import artifacts
from optloop.attribution.taxonomy import Target
from optloop.cli import add_lm_arguments, lm_from_args, run_cli, setup_logging
from optloop.errors import ConfigError, EndpointDownError
from optloop.lm import Usage
from optloop.loop.runner import MAX_BUDGET, Checkpoint, Loop, LoopConfig, LoopResult, check_fractions, split_dataset
from optloop.paths import state_dir
from optloop.stats import Interval, bootstrap_mean
from systems import SYSTEMS, get_system

console = Console(stderr=True)


def _budget(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_BUDGET:
        raise argparse.ArgumentTypeError(f"{value} is out of range: give 1 to {MAX_BUDGET} candidate evaluations")
    return value


def _split(text: str) -> tuple[float, float, float]:
    try:
        fractions = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give three numbers TRAIN,DEV,TEST, e.g. 0.5,0.25,0.25") from None
    try:
        return check_fractions(fractions)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``optloop: error:`` line (exit 2), like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"optloop: error: {' '.join(message.split())}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m optloop.run", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", default="mem0", choices=list(SYSTEMS), metavar="SYSTEM",
                        help=f"memory system: {', '.join(SYSTEMS)} (default mem0)")
    parser.add_argument("--dataset", default="builtin:tiny",
                        help="dataset URI (default builtin:tiny): builtin:tiny, memfail:<task>, locomo:<path>, "
                             "longmemeval:<path>, meme:<path>, synthetic:meme?seed=K, jsonl:<path>; "
                             "?limit=N keeps the first N episodes")
    parser.add_argument("--budget", type=_budget, default=3, help="candidate evaluations on dev (default 3)")
    parser.add_argument("--optimizer", choices=["simba", "gepa", "optuna", "edit"], default="simba",
                        help="simba (default), gepa, optuna (TPE over proposed instructions and knobs), or edit "
                             "(GrIPS-style phrase edits of the blamed instruction: delete, swap, paraphrase, add "
                             "back; needs no strong proposer)")
    parser.add_argument("--proposer-lm", metavar="SPEC",
                        help="LM that writes new instructions (SIMBA rules, GEPA reflection, Optuna proposals); "
                             "same spec syntax as --lm; default: the system's LM")
    parser.add_argument("--seed", type=int, default=0, help="split, optimizer and bootstrap seed (default 0)")
    parser.add_argument("--split", type=_split, default=LoopConfig.model_fields["fractions"].default,
                        metavar="TRAIN,DEV,TEST",
                        help="shares of the episodes for train, dev and test (default 0.5,0.25,0.25; each above 0, "
                             "summing to 1). A 95%% CI on n questions spans about ±1/sqrt(n): 24 test questions, "
                             "±0.2; give dev and test more (0.4,0.3,0.3) or use more episodes")
    parser.add_argument("--promote-if", choices=["ci", "delta"], default="ci",
                        help="when the prompt registry's champion alias moves to the best candidate: ci (default) "
                             "when the 95%% CI of its held-out gain lies above 0, i.e. the gain is unlikely to be "
                             "noise; delta when the point gain is above 0 (on a small test split that also promotes "
                             "noise)")
    parser.add_argument("--untargeted", action="store_true",
                        help="ablation: let the optimizer rewrite every site, not only the blamed ones")
    parser.add_argument("--sites", help="comma-separated sites to optimize instead of the blamed ones")
    parser.add_argument("--start", action="append", default=[], metavar="SITE=TEXT",
                        help="start from this instruction at SITE instead of the system's own (repeatable): your "
                             "product's current prompt, or a planted fault; SITE=+TEXT appends TEXT to the site's "
                             "own instruction (see experiments.bench.repair)")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                        help="start from this knob value (repeatable), e.g. --knob top_k=3")
    parser.add_argument("--run-name", help="MLflow run name and resume key (default <system>-<optimizer>-<time>)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--storage", help="Optuna storage URL (default SQLite in the run directory; "
                                          "postgresql://... to share a study)")
    parser.add_argument("--json", metavar="OUT", help="also write the result as JSON here")
    parser.add_argument("--verbose", action="store_true")
    add_lm_arguments(parser)
    return parser


def _pairs(pairs: list[str], flag: str, example: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ConfigError(f"{flag} {pair!r}: write {example}")
        out[name.strip()] = value
    return out


def _knobs(pairs: list[str]) -> dict[str, object]:
    knobs: dict[str, object] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--knob {pair!r}: write NAME=VALUE, e.g. --knob top_k=3")
        try:
            knobs[name] = json.loads(value)
        except json.JSONDecodeError:
            knobs[name] = value
    return knobs


def _accuracy(interval: Interval) -> str:
    """``0.458 [0.250, 0.667] n=24``"""
    return f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}] n={interval.n}"


def _dev_accuracy(accuracy: float, n: int, seed: int) -> str:
    """A dev accuracy with its CI, from its count alone (a bootstrap of 0/1 scores depends only on how
    many passed)."""
    passes = round(accuracy * n)
    return _accuracy(bootstrap_mean([1.0] * passes + [0.0] * (n - passes), seed=seed))


def summary_table(result: LoopResult) -> Table:
    cfg = result.config
    cost = result.cost
    table = Table(title=f"optloop.run {cfg.run_name}: {cfg.system} on {cfg.dataset}, {cfg.optimizer}, "
                        f"budget {cfg.budget}" + (" (untargeted)" if cfg.untargeted else ""))
    table.add_column("")
    table.add_column("baseline", justify="right")
    table.add_column("best", justify="right")
    table.add_column("delta", justify="right")
    table.add_row("dev accuracy", _dev_accuracy(result.baseline_dev, result.n_dev, cfg.seed),
                  _dev_accuracy(result.best_dev, result.n_dev, cfg.seed),
                  f"{result.best_dev - result.baseline_dev:+.3f} (best of {result.evaluations + 1} on dev)")
    table.add_row("test accuracy (held out)", _accuracy(result.test_before_ci), _accuracy(result.test_after_ci),
                  str(result.delta_test_ci))
    table.add_section()
    table.add_row("blamed", ", ".join(result.targets) or "(no failure attributed to a site)", "", "")
    table.add_row("optimized", ", ".join(result.tunable_sites + [str(Target.knob(k)) for k in result.tunable_knobs]), "", "")
    changed = result.changed_sites + [f"{k}={v}" for k, v in result.changed_knobs.items()]
    table.add_row("changed (best)", ", ".join(changed) or "nothing (baseline stays best)",
                  f"trial {result.best_trial}", "")
    table.add_row("promoted", result.promotion_reason, "", "")
    table.add_section()
    table.add_row("evaluations / budget", f"{result.evaluations} / {cfg.budget}", "", "")
    table.add_row("cost", f"{cost['llm_calls']:.0f} LLM calls ({cost['model_calls']:.0f} computed), "
                          f"{cost['tokens']:.0f} tokens, {cost['seconds']:.1f} s", "", "")
    return table


def tried_table(result: LoopResult) -> Table:
    """What the optimizer tried: every evaluated candidate with its dev accuracy (a 0 -> 0 run says what failed)."""
    table = Table(title=f"candidates tried on dev (baseline {result.baseline_dev:.3f}, n={result.n_dev})")
    for col, justify in (("trial", "right"), ("dev", "right"), ("changed", "left"), ("how", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for t in result.tried:
        mark = " best" if t.trial == result.best_trial else ""
        table.add_row(str(t.trial), f"{t.dev:.3f}{mark}", ", ".join(t.changed) or "-", t.origin)
    return table


def fault_line(usage: Usage) -> str | None:
    """What LM faults did to this run, in one line (``None`` when there were none)."""
    if not usage.faults:
        return None
    surfaced = usage.faults - usage.cured
    return (f"LM faults: {usage.faults} failed attempt(s); {usage.cured} cured by a retry, {surfaced} in "
            f"{usage.errors} call(s) that failed after their retries (see lm_faults in MLflow, fault graphs in the "
            "run directory)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if not args.verbose:  # DSPy's optimizers log every step; our status line says what runs
        logging.getLogger("dspy").setLevel(logging.ERROR)
    get_system(args.system)
    from optloop.datasets import load_dataset

    dataset = load_dataset(args.dataset)  # a malformed dataset fails here, before any LLM call or any state
    run_name = args.run_name or f"{args.system}-{args.optimizer}-{time.strftime('%Y%m%d-%H%M%S')}"
    config = LoopConfig(system=args.system, dataset=args.dataset, budget=args.budget, optimizer=args.optimizer,
                        seed=args.seed, untargeted=args.untargeted,
                        sites=[s.strip() for s in args.sites.split(",") if s.strip()] if args.sites else None,
                        run_name=run_name, tracking_uri=args.tracking_uri, storage=args.storage,
                        lm=args.lm or "local", proposer_lm=args.proposer_lm or "same", knobs=_knobs(args.knob),
                        start=_pairs(args.start, "--start", "SITE=TEXT, e.g. --start 'answer=+Be brief.'"),
                        fractions=args.split, promote_if=args.promote_if)
    # Everything the loop would refuse is refused now, before the LM (and its cache file) exists.
    split_dataset(dataset, config)
    checkpoint = state_dir() / "runs" / run_name / artifacts.CHECKPOINT
    if checkpoint.exists():
        Checkpoint.load(checkpoint)
    decoding = get_system(args.system).local_decoding
    lm = lm_from_args(args, decoding)
    proposer = lm
    if args.proposer_lm:
        proposer_args = argparse.Namespace(**{**vars(args), "lm": args.proposer_lm})
        proposer = lm_from_args(proposer_args, decoding)
    for model in {id(lm): lm, id(proposer): proposer}.values():
        if model.settings.backend != "local":  # an unreachable endpoint fails now, before any state is written
            model.text("ping", max_tokens=1, cache=False)
    console.print(f"[bold]optloop.run[/] {run_name}: {args.system} on {args.dataset}, {args.optimizer}, "
                  f"budget {args.budget} (resume with --run-name {run_name})")
    try:
        with console.status("starting") as status:
            result = Loop(config, lm, proposer, progress=lambda msg: status.update(msg)).run()
    except EndpointDownError as exc:
        again = "rerun the same command" if args.run_name else f"rerun the same command with --run-name {run_name}"
        raise EndpointDownError(f"{exc}; the run is saved: {again} to resume") from None
    console.print(summary_table(result))
    if result.tried:
        console.print(tried_table(result))
    if result.prompt_diff:
        console.print("prompts, start -> best (also prompts.diff in MLflow):", style="bold")
        console.print(result.prompt_diff, markup=False, highlight=False, soft_wrap=True)
    if result.note:
        console.print(f"note: {result.note}")
    if line := fault_line(lm.accounting.totals()):
        console.print(line, soft_wrap=True, markup=False)
    console.print(f"MLflow parent run {result.parent_run_id} (experiment optloop-{args.system}); `make ui` to compare")
    if args.json:
        from pathlib import Path

        from optloop.paths import write_atomic

        out = result.model_dump(mode="json")
        out["lm"] = lm.accounting.totals().as_dict()  # this process's calls: faults, cured, errors, retries ...
        if proposer is not lm:
            out["proposer_lm"] = proposer.accounting.totals().as_dict()
        write_atomic(Path(args.json), json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
