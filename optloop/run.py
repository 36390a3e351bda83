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
optloop-<system>.

Resume: the same command resumes the latest unfinished run of the same settings
(system, dataset, optimizer, seed, budget, targeting, start, knobs, split, LM settings)
and says so in one line; --new starts afresh; --run-name NAME starts or resumes that
run by name. Everything evaluated is read back, a half-done trial is redone, and the
costs of every process that worked on the run add up. SIGTERM or Ctrl-C checkpoints
the run, marks its MLflow runs KILLED, prints the command that resumes it and exits
with code 130.

LM faults: transient faults of an OpenAI-compatible endpoint (HTTP 5xx, dropped
connections, truncated or non-JSON bodies, timeouts) are retried (--lm-retries,
--lm-timeout); one that outlasts the retries fails the question it hit and the run
goes on, unless failed calls pass 5 % of an evaluation's (exit code 4: a failed call is never
scored as a wrong answer). A request the endpoint refuses (a field it does not take, a prompt longer
than its context) is not retried: the line says which field and what to change. An endpoint that
is unavailable at startup, or stays unreachable during the
run (refused, timing out twice in a call, or answering only HTTP 5xx to 3 calls in a
row), stops it with exit code 75, the state saved: rerun the same command to resume.

Spending limits: --max-cost USD and --max-calls N stop the run at the next step boundary
(after the baseline, after a trial, before a held-out evaluation) once the run's total over
every process has reached them: the checkpoint is kept, the MLflow parent run ends KILLED
with the tag optloop.stopped_by, and the same command with a higher limit resumes it (the
limits are not part of the run's settings). The total may pass a limit by one step.
--max-cost needs a model with a price (litellm's table): for any other, use --max-calls.
--estimate evaluates the baseline, prints the expected calls, tokens, dollars and hours of
the whole run (the trials' evaluations and the optimizer's own calls on train and to the
proposer), and stops; the same command without --estimate goes on from that baseline.

Exit codes: 0 done (or --estimate printed); 2 bad input (an unknown system, a budget out of
range, a missing or malformed dataset, a corrupt LM cache or checkpoint, a finished
--run-name, --max-cost on a model without a price: one line, before anything is written);
3 stopped at --max-cost or --max-calls (saved: raise the limit and rerun); 4 stopped because more
than 5 % of an evaluation's LM calls failed after their retries (saved: the line names the first
failure and what to change; a figure with fewer failures carries their count); 75 LM endpoint
unavailable; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from optloop import artifacts
from optloop.attribution.taxonomy import Target
from optloop.cli import add_lm_arguments, lm_settings_from_args, run_cli, setup_logging
from optloop.errors import CallsFailedError, ConfigError, EndpointDownError, LMUnreachableError
from optloop.failures import mark
from optloop.lm import LMSettings, OptloopLM, Usage
from optloop.loop.runner import (MAX_BUDGET, Checkpoint, Loop, LoopConfig, LoopResult, check_fractions, matches,
                                 split_dataset, unfinished_runs)
from optloop.loop.spend import (ESTIMATE, EXIT_LIMIT, MAX_COST, STOPPED_BY, Estimate, RunStopped,
                                SpendingLimits, estimate, measured_chains, run_dollars, work_units)
from optloop.paths import state_dir, write_atomic
from optloop.stats import Interval, bootstrap_mean
from systems import SYSTEMS, get_system

console = Console(stderr=True)

# The LM settings that change what the model answers: part of a run's settings (LoopConfig.lm_settings), so
# the same command with another context window or decoding bound is another run. The endpoint's URL,
# timeout and retries are not (a server that moved still serves the same run).
ANSWER_SETTINGS = ("backend", "model", "schema_mode", "temperature", "max_tokens", "seed", "n_ctx",
                   "max_string_chars", "max_array_items")


def _whole_number(text: str, low: int, high: float, what: str) -> int:
    """``text`` as a whole number from ``low`` to ``high``, else argparse's one-line error (``what``: the range)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{value} is out of range: {what}")
    return value


def _budget(text: str) -> int:
    return _whole_number(text, 1, MAX_BUDGET, f"give 1 to {MAX_BUDGET} candidate evaluations")


def _max_calls(text: str) -> int:
    return _whole_number(text, 1, float("inf"), "give at least 1 model call")


def _max_cost(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of dollars, e.g. 5 or 0.50") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a limit above 0 dollars")
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
                             "own instruction, SITE=TEXT+ puts it in front (see experiments.bench.repair)")
    parser.add_argument("--query-rewrite", action="store_true",
                        help="give the system a retrieve.query site: the LM rewrites each question into a search "
                             "query before retrieval, and that prompt is optimized like the others (not for "
                             "long_context, which never searches)")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                        help="start from this knob value (repeatable), e.g. --knob top_k=3")
    parser.add_argument("--run-name", help="MLflow run name; starts that run, or resumes it if unfinished (default: "
                                           "resume the latest unfinished run of these settings, else a new "
                                           "<system>-<optimizer>-<time>)")
    parser.add_argument("--new", action="store_true",
                        help="start a new run even if an unfinished run of these settings exists")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default sqlite:///mlruns/mlflow.db)")
    parser.add_argument("--storage", help="Optuna storage URL (default SQLite in the run directory; "
                                          "postgresql://... to share a study)")
    parser.add_argument("--json", metavar="OUT", help="also write the result (or the --estimate) as JSON here")
    spend = parser.add_argument_group(
        "spending", "checked at step boundaries against the run's total over every process; not part of the run's "
                    "settings, so the same command with a higher limit resumes a stopped run (exit code 3)")
    spend.add_argument("--max-cost", type=_max_cost, metavar="USD",
                       help="stop once the run has spent this many dollars (a model with a price only; the run may "
                            "pass it by one step)")
    spend.add_argument("--max-calls", type=_max_calls, metavar="N",
                       help="stop once the models have computed this many calls (LM cache hits are free)")
    spend.add_argument("--estimate", action="store_true",
                       help="evaluate the baseline, print the expected calls, tokens, dollars and hours of the whole "
                            "run, the optimizer's own calls included, and stop (the same command without --estimate "
                            "goes on from that baseline)")
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
    failed = result.failed_calls  # figures with failed LM calls carry the count (optloop.failures)
    table.add_row("dev accuracy", mark(_dev_accuracy(result.baseline_dev, result.n_dev, cfg.seed),
                                       failed.get("baseline_dev", 0)),
                  mark(_dev_accuracy(result.best_dev, result.n_dev, cfg.seed), failed.get("best_dev", 0)),
                  f"{result.best_dev - result.baseline_dev:+.3f} (best of {result.evaluations + 1} on dev)")
    table.add_row("test accuracy (held out)", mark(_accuracy(result.test_before_ci), failed.get("test_before", 0)),
                  mark(_accuracy(result.test_after_ci), failed.get("test_after", 0)), str(result.delta_test_ci))
    table.add_section()
    table.add_row("blamed", ", ".join(result.targets) or "(no failure attributed to a site)", "", "")
    table.add_row("optimized", ", ".join(result.tunable_sites + [str(Target.knob(k)) for k in result.tunable_knobs]), "", "")
    changed = result.changed_sites + [f"{k}={v}" for k, v in result.changed_knobs.items()]
    table.add_row("changed (best)", ", ".join(changed) or "nothing (baseline stays best)",
                  f"trial {result.best_trial}", "")
    table.add_row("promoted", result.promotion_reason, "", "")
    table.add_section()
    table.add_row("evaluations / budget", f"{result.evaluations} / {cfg.budget}", "", "")
    table.add_row("cost", cost_line(cost), "", "")
    return table


def cost_line(cost: dict[str, int | float]) -> str:
    """The run's cost in one line: every process that worked on it, added up (and how many there were)."""
    processes = int(cost.get("processes", 1))
    dollars = f", {money(run_dollars(cost))}" if "cost_usd" in cost or "proposer_cost_usd" in cost else ""
    return (f"{cost.get('llm_calls', 0):.0f} LLM calls ({cost.get('model_calls', 0):.0f} computed), "
            f"{cost.get('tokens', 0):.0f} tokens, {cost.get('seconds', 0):.1f} s{dollars}; "
            f"the run took {processes} process{'es' if processes != 1 else ''}")


def money(dollars: float) -> str:
    """``$12.35``, ``$0.0123``, or a tiny amount with its digits (``$2.9e-06``) rather than ``$0.0000``."""
    if dollars == 0 or dollars >= 1:
        return f"${dollars:.2f}"
    return f"${dollars:.4f}" if dollars >= 0.0001 else f"${dollars:.2g}"


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


def _run_config(args: argparse.Namespace, settings: LMSettings) -> LoopConfig:
    """The run's settings from the flags (the run name is chosen later: see :func:`choose_run`)."""
    return LoopConfig(system=args.system, dataset=args.dataset, budget=args.budget, optimizer=args.optimizer,
                      seed=args.seed, untargeted=args.untargeted,
                      sites=[s.strip() for s in args.sites.split(",") if s.strip()] if args.sites else None,
                      run_name=args.run_name or "-", tracking_uri=args.tracking_uri, storage=args.storage,
                      lm=args.lm or "local", proposer_lm=args.proposer_lm or "same", knobs=_knobs(args.knob),
                      start=_pairs(args.start, "--start", "SITE=TEXT, e.g. --start 'answer=+Be brief.'"),
                      fractions=args.split, promote_if=args.promote_if, query_rewrite=args.query_rewrite,
                      lm_settings=answer_settings(settings))


def answer_settings(settings: LMSettings) -> dict[str, Any]:
    """:data:`ANSWER_SETTINGS` of ``settings``. The embedded model decodes every schema in-process, whatever
    the schema mode: its runs keep the mode they were started under (json_schema), so they still resume."""
    out = settings.model_dump(mode="json", include=set(ANSWER_SETTINGS))
    if settings.backend == "local":
        out["schema_mode"] = "json_schema"
    return out


@dataclass(frozen=True)
class Choice:
    """Which run this command works on: a new one, or the one it resumes (its checkpoint), and the line
    that says so."""

    name: str
    checkpoint: Checkpoint | None
    line: str


def choose_run(args: argparse.Namespace, config: LoopConfig, runs: Path) -> Choice:
    """``--run-name`` (refused when finished or started with other settings); else, unless ``--new``, the
    latest unfinished run started without ``--run-name`` from the same settings (one a live process holds is
    left to it, unless its optimizer shares the run between workers); else a new name. Reads only."""
    what = f"{config.system} on {config.dataset}, {config.optimizer}, budget {config.budget}"
    if args.run_name:
        name = args.run_name
        path = runs / name / "checkpoint.json"
        ckpt = Checkpoint.load(path) if path.exists() else None
        if ckpt is None:
            return Choice(name, None, f"[bold]optloop.run[/] {name}: {what}")
        if ckpt.finished:
            raise ConfigError(f"run {name!r} already finished (MLflow run {ckpt.parent_run_id}); pick another "
                              "--run-name to run again")
        if not matches(ckpt, config.model_copy(update={"run_name": name})):
            raise ConfigError(f"run name {name!r} exists with other settings; resume it with the same command, or "
                              "pick another --run-name")
        return Choice(name, ckpt, f"[bold]optloop.run[/] resuming {name}: {what} ({_so_far(ckpt, config)})")
    busy: list[str] = []
    if not args.new:
        for run in unfinished_runs(runs, config):
            if run.in_use and config.optimizer != "optuna":
                busy.append(run.name)
                continue
            how = "joining" if run.in_use else "resuming"
            return Choice(run.name, run.checkpoint,
                          f"[bold]optloop.run[/] {how} {run.name}, the latest unfinished run of these settings "
                          f"({_so_far(run.checkpoint, config)}); --new starts afresh")
    name = f"{config.system}-{config.optimizer}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while (runs / name).exists():
        n += 1
        name = f"{config.system}-{config.optimizer}-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    extra = f"; {', '.join(busy)} with these settings is in use by another process" if busy else ""
    return Choice(name, None, f"[bold]optloop.run[/] {name}: {what} (a new run: the same command resumes it if it "
                              f"stops{extra})")


def _so_far(ckpt: Checkpoint, config: LoopConfig) -> str:
    return f"{ckpt.progress(config.budget)}, {ckpt.processes} process(es) so far"


def model_name(settings: LMSettings) -> str:
    """The model as the user named it: ``openai:gpt-4o-mini``, a GGUF path, or the embedded model."""
    if settings.backend == "openai":
        return f"openai:{settings.model}"
    return settings.model or "the embedded model"


def check_priced(settings: LMSettings, proposer: LMSettings | None) -> None:
    """``--max-cost`` needs every LM of the run to have a price: without one its calls cost "nothing" and the limit
    would never stop the run. A :class:`ConfigError` (exit 2) naming the model, before anything is written."""
    for which, lm in (("", settings), ("the proposer LM ", proposer)):
        if lm is not None and lm.price() is None:
            raise ConfigError(f"--max-cost: {which}{model_name(lm)} has no price in litellm's model cost map, so its "
                              "dollars are unknown; limit the run with --max-calls N instead")


def stopped_line(stop: RunStopped, ckpt: Checkpoint, config: LoopConfig, again: str) -> str:
    """What a run stopped by a spending limit says: the limit, what the run spent, where it stands, how to go on."""
    flag = "--max-cost" if stop.reason == MAX_COST else "--max-calls"
    return (f"optloop: stopped: {stop} ({cost_line(ckpt.total_cost())}); run {config.run_name} is saved "
            f"({ckpt.progress(config.budget)}), its MLflow parent run marked KILLED ({STOPPED_BY}={stop.reason}); "
            f"re-run the same command with a higher {flag} to go on: {again}")


def _cell(value: float | None, fmt: str) -> str:
    return "unknown" if value is None else format(value, fmt)


def duration(hours: float) -> str:
    """``37.5 h``, ``25 min``, ``12 s``: an estimate's time in the unit that reads best."""
    if hours >= 1:
        return f"{hours:.1f} h"
    return f"{hours * 60:.0f} min" if hours >= 1 / 60 else f"{hours * 3600:.0f} s"


def estimate_table(figures: Estimate, config: LoopConfig, settings: LMSettings) -> Table:
    """The ``--estimate`` of a run, one row per part (see :mod:`optloop.loop.spend` for the model)."""
    table = Table(title=f"estimate for {config.run_name}: {config.system} on {config.dataset}, {config.optimizer}, "
                        f"budget {config.budget}, {model_name(settings)}, --concurrency {figures.concurrency}")
    for column in ("part", "evaluations", "calls", "tokens", "dollars", "time"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part in [*figures.parts, figures.total]:
        if part is figures.total:
            table.add_section()
        dollars = ("unknown" if figures.priced else "no price") if part.cost_usd is None else money(part.cost_usd)
        table.add_row(part.part, str(part.evaluations), str(part.calls), _cell(part.tokens, "d"), dollars,
                      "unknown" if part.hours is None else duration(part.hours))
    return table


def optimizer_line(figures: Estimate, config: LoopConfig) -> str:
    """What the optimizer's part stands for: its calls a trial and where the figure comes from."""
    work = figures.optimizer
    if work is None:
        return f"optimizer: {config.optimizer}'s own calls are not estimated (no model of them)"
    source = "" if work.measured else f"the {work.optimizer} model (optloop/loop/overhead.py): "
    return (f"optimizer: {work.per_trial(config.budget):.1f} calls a trial ({work.calls:.0f} on train with the system "
            f"LM, {work.proposer_calls:.0f} to the proposer, over the run), from {source}{work.basis}")


def estimate_lines(figures: Estimate, ckpt: Checkpoint, config: LoopConfig, go_on: str) -> list[str]:
    """The estimate's model and what to do next, in plain lines."""
    latency = "unknown (no call was computed: the LM cache served them all)" if figures.latency_s is None else \
        f"{figures.latency_s:.3f} s, measured on the baseline's dev evaluation"
    return [f"how: {figures.model}",
            optimizer_line(figures, config),
            f"mean latency of one computed call: {latency}",
            *figures.floor_lines(),
            f"spent so far: {cost_line(ckpt.total_cost())}",
            f"nothing else ran: the baseline is saved in run {config.run_name}; the same command without --estimate "
            f"goes on from it: {go_on}"]


def probe_lm(settings: LMSettings, lines: list[str] | None = None) -> OptloopLM:
    """The LM of ``settings`` without its cache, checked (:meth:`OptloopLM.check_endpoint`): an
    :class:`EndpointDownError` (exit 75) when an endpoint cannot be reached or answers only server errors; an
    LM error of another kind (a wrong key, an unknown model) is bad input (exit 2). Nothing is written (no cache
    file), so it can serve the input's checks before the run's state exists."""
    probe = OptloopLM(settings.model_copy(update={"cache": False}))
    try:
        found = probe.check_endpoint()  # the schema mode and concurrency chosen, and why
        if lines is not None:
            lines += found
    except LMUnreachableError as exc:
        raise EndpointDownError(f"{exc}; nothing was written: rerun the same command once the endpoint is up") from None
    return probe


@contextmanager
def interruptible() -> Iterator[list[str]]:
    """SIGTERM and SIGINT (Ctrl-C) raise ``KeyboardInterrupt`` in the main thread, once: the run checkpoints,
    ends its MLflow runs as KILLED and stops. A repeated signal is ignored while it does (SIGKILL still
    stops it at once). Yields the names of the signals received."""
    got: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum: int, frame: Any) -> None:
        got.append(signal.Signals(signum).name)
        if len(got) == 1:
            raise KeyboardInterrupt(got[0])
        print(f"optloop: {got[-1]} again: still saving the run (SIGKILL stops at once)", file=sys.stderr)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield got
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def resume_command(argv: Sequence[str]) -> str:
    """The command that resumes this run: the same one, without ``--new``."""
    return shlex.join(["python", "-m", "optloop.run", *(a for a in argv if a != "--new")])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if not args.verbose:  # DSPy's optimizers log every step; our status line says what runs
        logging.getLogger("dspy").setLevel(logging.ERROR)
    if args.new and args.run_name:
        raise ConfigError("--new and --run-name exclude each other: --run-name names the run to start or resume")
    get_system(args.system)
    from optloop.datasets import load_dataset

    dataset = load_dataset(args.dataset)  # a malformed dataset fails here, before any LLM call or any state
    decoding = get_system(args.system).local_decoding
    settings = lm_settings_from_args(args, decoding)
    proposer_settings = (lm_settings_from_args(argparse.Namespace(**{**vars(args), "lm": args.proposer_lm}), decoding)
                         if args.proposer_lm else None)
    config = _run_config(args, settings)
    if args.max_cost is not None:
        check_priced(settings, proposer_settings)
    limits = SpendingLimits(max_cost=args.max_cost, max_calls=args.max_calls, estimate=args.estimate)
    # Everything the loop would refuse is refused now, before the LM (and its cache file) exists.
    _, dev, test = split_dataset(dataset, config)
    choice = choose_run(args, config, state_dir(create=False) / "runs")
    config = config.model_copy(update={"run_name": choice.name})
    endpoint_lines: list[str] = []
    probe = probe_lm(settings, endpoint_lines)  # an unavailable endpoint fails now, before any state is written
    if proposer_settings is not None:
        probe_lm(proposer_settings, endpoint_lines)
    loop = Loop(config, probe, probe, auto_named=not args.run_name, limits=limits)
    loop.prepare()  # --start names a site of the system (checked with the probe: no LM cache file yet)
    lm = OptloopLM(settings)  # the input is valid: now the LM cache may be opened (or found corrupt)
    proposer = OptloopLM(proposer_settings) if proposer_settings is not None else lm
    loop.lm, loop.proposer = lm, proposer
    console.print(choice.line, soft_wrap=True)
    for line in endpoint_lines:
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    again = resume_command(argv)
    with interruptible() as signals:
        try:
            with console.status("starting") as status:
                loop.progress = lambda msg: status.update(msg)
                result = loop.run()
        except EndpointDownError as exc:
            raise EndpointDownError(f"{exc}; the run is saved: rerun the same command to resume it: {again}") from None
        except CallsFailedError as exc:
            raise CallsFailedError(f"{exc}; the run is saved: fix that, then rerun the same command to resume it: "
                                   f"{again}") from None
        except RunStopped as stop:
            ckpt = Checkpoint.load(loop.state / artifacts.CHECKPOINT)
            if stop.reason != ESTIMATE:
                print(stopped_line(stop, ckpt, config, again), file=sys.stderr)
                return EXIT_LIMIT
            price = (proposer_settings or settings).price()
            figures = estimate(ckpt, budget=config.budget, concurrency=lm.settings.concurrency or 1,
                               dev_units=work_units(dev), test_units=work_units(test),
                               chains=measured_chains(ckpt, dev, test),
                               optimizer=loop.optimizer_work(ckpt), own_proposer=proposer_settings is not None,
                               proposer_price=None if price is None else (price.input, price.output))
            console.print(estimate_table(figures, config, settings))
            for line in estimate_lines(figures, ckpt, config, resume_command([a for a in argv if a != "--estimate"])):
                console.print(line, soft_wrap=True, markup=False, highlight=False)
            if args.json:
                write_atomic(Path(args.json), figures.model_dump_json(indent=1))
            return 0
        except KeyboardInterrupt:
            where = loop.state / artifacts.CHECKPOINT
            why = signals[0] if signals else "SIGINT"
            if where.exists():
                print(f"optloop: interrupted ({why}): run {config.run_name} is saved "
                      f"({Checkpoint.load(where).progress(config.budget)}), its MLflow runs marked KILLED; resume it "
                      f"with the same command: {again}", file=sys.stderr)
            else:
                print(f"optloop: interrupted ({why}) before run {config.run_name} started; nothing was saved",
                      file=sys.stderr)
            return 130
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
        out = result.model_dump(mode="json")
        out["lm"] = lm.accounting.totals().as_dict()  # this process's calls: faults, cured, errors, retries ...
        if proposer is not lm:
            out["proposer_lm"] = proposer.accounting.totals().as_dict()
        write_atomic(Path(args.json), json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
