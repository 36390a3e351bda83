"""The closed loop: find which prompt makes a memory system fail, rewrite only that one, measure.

    python -m optloop.run --system mem0 --budget 3
    python -m optloop.run --system graphiti --dataset memfail:coexisting?limit=12 --budget 20 \\
        --optimizer gepa
    python -m optloop.run --system rag_bm25 --budget 10 --optimizer optuna --untargeted \\
        # the ablation

With no --dataset, a system runs on a dataset optloop generates (see --dataset and
optloop/datasets/defaults.py): synthetic:recall?seed=0&episodes=40, 20 dev and 20 test
questions, where the embedded model's baseline has room to rise and to fall. A dev or test
split of fewer than 20 questions is refused (exit 2) unless --allow-small-splits.

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

The control: a gain counts only if the loop's prompt also beats a trivial instruction (on
mem0 with a 0.5B model, mem0's own extraction prompt stores nothing, dev 0.00, while any short
instruction gets 0.95). So the run also evaluates the start program with each blamed site given
DSPy's default instruction for its signature ("Given the fields ..., produce the fields ..."),
on dev before the trials and on test at the end, and the summary shows three rows (the
system's own prompt, the trivial instruction, the loop's best) and the paired differences
loop - own prompt and loop - control on test; a difference whose CI includes 0 is "no
measurable change", and the note says when the loop's prompt does not beat the control. The
champion alias still moves on the gain over the start program. When the blame names no prompt
site (only knobs) there is no control, and the summary says so. --no-control skips it (two
evaluations fewer; the report then cannot say what the loop's writing earned).

Every accuracy is reported with its n and a 95% bootstrap CI over the questions: on a test
split of 12 questions one question is 0.083 of accuracy, and a 95% CI spans about ±0.3.

Time: once the baseline is evaluated, the run prints the projection of the whole run (the
--estimate table: calls, tokens, dollars where priced, hours) and its ETA, then one line per
trial with its ETA (measured on the trials done, the held-out test projected). --batch K
evaluates K candidates of one optimizer round at once, each on its own stores, under the one
--concurrency limit: on an endpoint, K trials floored by their longest episode's sequential
calls take about the time of one.

One evaluation (what --budget counts) = one candidate run over the dev split: ingest every
dev episode (reusing the stored result when the candidate's ingest prompts are unchanged),
answer every dev question, attribute every failure. SIMBA's and GEPA's own mini-batch runs
on train are the optimizer's cost: their LLM calls are reported, they are not evaluations.

Racing: each candidate answers dev episode by episode in a seeded order, its answers paired
with the best's on the same questions, and stops once Optuna's WilcoxonPruner finds it worse
(p < 0.1, after at least 5 questions): the trial line, run.log and MLflow (tag
optloop.stopped) say after how many questions and against which best. A stopped candidate
never becomes the best; --budget still counts it, and the summary says what racing saved
(questions and LLM calls against full evaluations). --no-race answers every dev question.

Power: before the baseline and in the summary, a line says the smallest held-out gain the
splits can show (the 95% CI half-width of an accuracy at the baseline's, on n questions); when
that is wider than --min-gain (default 0.05) it says how many test questions would show it.

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
goes on, unless failed calls pass 5 % of an evaluation's (--max-failed-share; exit code 4: a
failed call is never scored as a wrong answer, and the same command resumes). A request the
endpoint refuses (a field it does not take, a prompt longer than its context) is not retried: the
line says which field and what to change. An endpoint that
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

Outside services and stores: the tracking server (--tracking-uri), a database --storage and
the LM endpoint are each probed once at start with a bounded timeout, and the state directory
and the MLflow store must be writable, before anything is written. MLflow's own HTTP retries
are bounded (MLFLOW_HTTP_REQUEST_MAX_RETRIES=3, ..._TIMEOUT=10 unless set), so a tracking
server lost mid-run stops the run like a lost LM endpoint: saved, exit 75, the same command
resumes it. A full disk or a store that turns read-only stops it saved with exit 74. A
checkpoint the same command cannot read is refused (exit 2: --new starts afresh and ends
its MLflow run KILLED); one whose parent run the tracking store lacks (another
--tracking-uri, mlruns/ deleted) resumes into a new parent run there. docs/reliability.md
has every case.

Exit codes: 0 done (or --estimate printed); 2 bad input (an unknown system, a budget out of
range, a missing or malformed dataset, a dev or test split under 20 questions without
--allow-small-splits, a corrupt LM cache or checkpoint, a finished
--run-name, --max-cost on a model without a price: one line, before anything is written);
3 stopped at --max-cost or --max-calls (saved: raise the limit and rerun); 4 stopped because more
than 5 % of an evaluation's LM calls failed after their retries (saved: the line names the first
failure and what to change; a figure with fewer failures carries their count); 74 a full disk
or an unwritable state directory or MLflow store (EX_IOERR: free space or fix the
permission named, then rerun the same command); 75 the LM endpoint, the tracking server
or the --storage database unavailable (EX_TEMPFAIL: rerun when it is back); 130
interrupted.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from optloop.cli.command import CommandParser, dataset_help, lm_overrides
from optloop.datasets.defaults import defaults_help
from optloop.errors import ConfigError
from optloop.failures import ALLOWED_SHARE
from optloop.loop.config import MAX_BATCH, MAX_BUDGET, LoopConfig, check_fractions
from optloop.loop.optimizers import registry
from optloop.loop.policy import FEW_QUESTIONS
from optloop.loop.runs.request import ANSWER_SETTINGS as ANSWER_SETTINGS
from optloop.loop.runs.request import RunOptions, RunRequest, checked, loop_config, run_lms
from optloop.loop.runs.request import answer_settings as answer_settings
from optloop.loop.runs.request import default_optimizer as default_optimizer
from optloop.loop.spending.limits import SpendingLimits
from systems import SYSTEMS

if TYPE_CHECKING:
    from optloop.lm import LMSettings

# The flags' defaults are the config models' (optloop.loop.config, optloop.loop.runs.request):
# written there once, read by this parser and by optloop.optimize alike.
_LOOP = LoopConfig.model_fields
# --promote-if's choices, each with when it moves the champion alias.
_PROMOTE_IF = {
    "ci": "when the 95%% CI of its held-out gain lies above 0, i.e. the gain is unlikely to be "
    "noise",
    "delta": "when the point gain is above 0 (on a small test split that also promotes noise)",
}


def _whole_number(text: str, low: int, high: float, what: str) -> int:
    """``text`` as a whole number from ``low`` to ``high``, else argparse's one-line error
    (``what``: the range)."""
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


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share, e.g. 0.05 or 0.2") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a share from 0 to 1, e.g. 0.05")
    return value


def _max_cost(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of dollars, e.g. 5 or 0.50"
        ) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a limit above 0 dollars")
    return value


def _batch(text: str) -> int:
    return _whole_number(text, 1, MAX_BATCH, f"give 1 to {MAX_BATCH} candidates at once")


def _split(text: str) -> tuple[float, float, float]:
    try:
        fractions = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give three numbers TRAIN,DEV,TEST, e.g. 0.5,0.25,0.25"
        ) from None
    try:
        return check_fractions(fractions)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


class _OneLineParser(CommandParser):
    """argparse, but a usage error is one ``optloop: error:`` line (exit 2), like every other bad
    input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"optloop: error: {' '.join(message.split())}; see {self.prog} --help\n")


def optimizers_help() -> str:
    """The registered optimizers as ``--optimizer``'s help lists them, each with its summary
    (``simba, gepa, optuna (TPE ...), or edit (GrIPS-style ...)``)."""
    words = [
        f"{spec.name} ({spec.summary})" if spec.summary else spec.name
        for spec in registry.OPTIMIZERS.values()
    ]
    return ", or ".join([", ".join(words[:-1]), words[-1]]) if len(words) > 1 else words[0]


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser("python -m optloop.run", __doc__, lm=True)
    parser.add_argument(
        "--system",
        default=_LOOP["system"].default,
        choices=list(SYSTEMS),
        metavar="SYSTEM",
        help=f"memory system: {', '.join(SYSTEMS)} (default %(default)s)",
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help=dataset_help("a dataset optloop generates, see below")
        + ". The default: "
        + defaults_help(),
    )
    parser.add_argument(
        "--budget",
        type=_budget,
        default=_LOOP["budget"].default,
        help="candidate evaluations on dev (default %(default)s)",
    )
    parser.add_argument(
        "--optimizer",
        choices=registry.names(),
        default=None,
        help=f"{optimizers_help()}. Default: {registry.WITHOUT_WRITER} when the instructions "
        "would be written by the embedded model (a 135M model writes rules no one would ship), "
        f"{registry.DEFAULT} when --proposer-lm or --lm is an endpoint",
    )
    parser.add_argument(
        "--proposer-lm",
        metavar="SPEC",
        help="LM that writes new instructions (SIMBA rules, GEPA reflection, Optuna proposals); "
        "same spec syntax as --lm; default: the system's LM. To have the loop write "
        "instructions, give local:qwen2.5-coder-1.5b (mem0: --lm local:qwen2.5-coder-0.5b "
        "--proposer-lm local:qwen2.5-coder-1.5b; docs/models.md)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=_LOOP["seed"].default,
        help="split, optimizer and bootstrap seed (default %(default)s)",
    )
    parser.add_argument(
        "--split",
        type=_split,
        default=_LOOP["fractions"].default,
        metavar="TRAIN,DEV,TEST",
        help="shares of the episodes for train, dev and test (default "
        + ",".join(f"{share:g}" for share in _LOOP["fractions"].default)
        + "; each above 0, summing to 1). A 95%% CI on n questions spans about ±1/sqrt(n): 24 "
        "test questions, ±0.2; give dev and test more (0.4,0.3,0.3) or use more episodes",
    )
    parser.add_argument(
        "--allow-small-splits",
        action="store_true",
        help=f"run even when dev or test has fewer than {FEW_QUESTIONS} questions (refused "
        "otherwise, exit 2: accuracies on so few questions are noise)",
    )
    parser.add_argument(
        "--batch",
        type=_batch,
        default=_LOOP["batch"].default,
        metavar="K",
        help="candidates evaluated at once, one optimizer round's (an edit round, SIMBA's best K "
        "new programs of a step, K Optuna asks), each on its own stores, under the one "
        "--concurrency limit (default %(default)s). On an endpoint, where one evaluation is "
        "floored by its longest episode's sequential calls, K candidates share that floor (see "
        "experiments/results/batch.md); on the embedded model, one call at a time, it gains "
        "nothing. Which candidates a run tries depends on K (same --seed and K: same run)",
    )
    parser.add_argument(
        "--promote-if",
        choices=list(_PROMOTE_IF),
        default=_LOOP["promote_if"].default,
        help="when the prompt registry's champion alias moves to the best candidate: "
        + "; ".join(
            f"{name}{' (default)' if name == _LOOP['promote_if'].default else ''} {when}"
            for name, when in _PROMOTE_IF.items()
        ),
    )
    parser.add_argument(
        "--min-gain",
        type=float,
        metavar="G",
        default=_LOOP["min_gain"].default,
        help="the smallest held-out gain the run is meant to show (default %(default)s): the "
        "power line before the baseline and in the summary says when the dev and test splits are "
        "too small to show it, and what to change",
    )
    parser.add_argument(
        "--stall",
        type=int,
        metavar="N",
        default=_LOOP["stall"].default,
        help="after N trials in a row without a new best (default %(default)s; 0: never), check "
        "again whether the prompt at the control's sites can matter: the start program, the "
        "control and the best trial that rewrote those sites on the same dev questions; when all "
        "three agree within --min-gain, the rest of the budget goes to the other blamed sites and "
        "knobs",
    )
    parser.add_argument(
        "--no-race",
        dest="race",
        action="store_false",
        help="evaluate every candidate on every dev question (by default each candidate is raced "
        "against the best so far and stopped once a Wilcoxon test finds it worse at p < 0.1: "
        "a losing candidate costs a few episodes, not the whole dev split)",
    )
    parser.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="do not evaluate the trivial-instruction control (the start program with each blamed "
        "site given DSPy's default instruction for its signature) on dev and test: two "
        "evaluations fewer, but the report then cannot say what the loop's writing earned beyond "
        "a trivial instruction",
    )
    parser.add_argument(
        "--untargeted",
        action="store_true",
        help="ablation: let the optimizer rewrite every site, not only the blamed ones",
    )
    parser.add_argument(
        "--sites", help="comma-separated sites to optimize instead of the blamed ones"
    )
    parser.add_argument(
        "--start",
        action="append",
        default=[],
        metavar="SITE=TEXT",
        help="start from this instruction at SITE instead of the system's own (repeatable): your "
        "product's current prompt, or a planted fault; SITE=+TEXT appends TEXT to the site's "
        "own instruction, SITE=TEXT+ puts it in front (see optloop.faults.sabotages)",
    )
    parser.add_argument(
        "--query-rewrite",
        action="store_true",
        help="give the system a retrieve.query site: the LM rewrites each question into a search "
        "query before retrieval, and that prompt is optimized like the others (not for "
        "long_context, which never searches)",
    )
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="start from this knob value (repeatable), e.g. --knob top_k=3",
    )
    parser.add_argument(
        "--run-name",
        help="MLflow run name; starts that run, or resumes it if unfinished (default: "
        "resume the latest unfinished run of these settings, else a new "
        "<system>-<optimizer>-<time>)",
    )
    parser.add_argument(
        "--new",
        action="store_true",
        help="start a new run even if an unfinished run of these settings exists",
    )
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default sqlite:///mlruns/mlflow.db)"
    )
    parser.add_argument(
        "--storage",
        help="Optuna storage URL (default SQLite in the run directory; "
        "postgresql://... to share a study)",
    )
    parser.add_argument(
        "--json", metavar="OUT", help="also write the result (or the --estimate) as JSON here"
    )
    spend = parser.add_argument_group(
        "spending",
        "checked at step boundaries against the run's total over every process; not part of the "
        "run's settings, so the same command with a higher limit resumes a stopped run (exit "
        "code 3)",
    )
    spend.add_argument(
        "--max-cost",
        type=_max_cost,
        metavar="USD",
        help="stop once the run has spent this many dollars (a model with a price only; the run "
        "may pass it by one step)",
    )
    spend.add_argument(
        "--max-calls",
        type=_max_calls,
        metavar="N",
        help="stop once the models have computed this many calls (LM cache hits are free)",
    )
    spend.add_argument(
        "--max-failed-share",
        type=_share,
        default=ALLOWED_SHARE,
        metavar="SHARE",
        help="the share of an evaluation's LM calls that may fail after their retries, counted "
        "and shown beside its figures; past it the run stops with exit code 4, resumable "
        "(default %(default)s)",
    )
    spend.add_argument(
        "--estimate",
        action="store_true",
        help="evaluate the baseline, print the expected calls, tokens, dollars and hours of the "
        "whole run, the optimizer's own calls included, and stop (the same command without "
        "--estimate goes on from that baseline)",
    )
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


def run_options(args: argparse.Namespace) -> RunOptions:
    """How this process takes part in the run, from the flags: --run-name, --new (not both),
    --allow-small-splits and the spending limits."""
    return checked(
        RunOptions,
        run_name=args.run_name,
        new=args.new,
        allow_small_splits=args.allow_small_splits,
        limits=SpendingLimits(
            max_cost=args.max_cost,
            max_calls=args.max_calls,
            estimate=args.estimate,
            max_failed_share=args.max_failed_share,
        ),
    )


def run_config(
    args: argparse.Namespace, settings: LMSettings, proposer: LMSettings | None = None
) -> LoopConfig:
    """The run's settings from the flags, on the LM ``settings`` (``proposer``: --proposer-lm's);
    what a flag leaves unset follows :func:`optloop.loop.runs.request.loop_config`'s rules (the run
    name is chosen later: see :func:`choose_run`)."""
    return loop_config(
        settings,
        proposer,
        system=args.system,
        dataset=args.dataset,
        budget=args.budget,
        optimizer=args.optimizer,
        seed=args.seed,
        untargeted=args.untargeted,
        sites=[s.strip() for s in args.sites.split(",") if s.strip()] if args.sites else None,
        run_name=args.run_name,
        tracking_uri=args.tracking_uri,
        storage=args.storage,
        lm=args.lm,
        proposer_lm=args.proposer_lm,
        knobs=_knobs(args.knob),
        start=_pairs(args.start, "--start", "SITE=TEXT, e.g. --start 'answer=+Be brief.'"),
        fractions=args.split,
        promote_if=args.promote_if,
        query_rewrite=args.query_rewrite,
        batch=args.batch,
        control=args.control,
        race=args.race,
        min_gain=args.min_gain,
        stall=args.stall,
    )


def run_request(args: argparse.Namespace) -> RunRequest:
    """The run the flags ask for, as :func:`optloop.loop.runs.session.prepare` takes it: the same
    objects ``optloop.optimize`` builds from its arguments."""
    options = run_options(args)  # --new with --run-name is refused before anything else
    settings, proposer = run_lms(args.system, args.lm, args.proposer_lm, **lm_overrides(args))
    return RunRequest(run_config(args, settings, proposer), settings, proposer, options)
