"""``python -m optloop.run``: the closed loop (find which prompt makes a memory system fail,
rewrite only that one, measure), wired from its flags (:mod:`optloop.cli.run_args`, whose docstring
is the ``--help`` manual), the run it resumes (:mod:`optloop.cli.run_resume`) and what it prints
(:mod:`optloop.cli.run_tables`).

The work after the flags is a function of typed objects, shared with ``optloop.optimize``:
:func:`prepare` checks a :class:`~optloop.loop.request.RunRequest` (what the flags, or the API's
arguments, ask for) against the world and builds its :class:`Loop`; :func:`execute` runs it and
returns the result. Only :func:`main` parses flags and prints."""

from __future__ import annotations

import os

from optloop.offline import offline_defaults, quiet_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported
if __name__ == "__main__":  # run as a command (not imported): tqdm's bars off unless --verbose
    os.environ.update(quiet_defaults())

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.text import Text

from optloop import artifacts
from optloop.cli.command import parse_command, run_cli
from optloop.cli.run_args import build_parser, run_request
from optloop.cli.run_resume import choose_run, resume_command, saved_line
from optloop.cli.run_tables import (
    estimate_lines,
    estimate_table,
    fault_line,
    model_name,
    print_projection,
    stopped_line,
    summary_table,
    tried_table,
)
from optloop.cli.status import RunProgress
from optloop.datasets import Dataset
from optloop.errors import CallsFailedError, ConfigError, EndpointDownError, LMUnreachableError
from optloop.interrupt import interruptible
from optloop.lm import LMSettings, OptloopLM
from optloop.loop import checkpoint_guard
from optloop.loop.budget.limits import ESTIMATE, EXIT_LIMIT, RunStopped
from optloop.loop.config import LoopConfig
from optloop.loop.policy import check_split_sizes, questions
from optloop.loop.request import RunRequest
from optloop.loop.runner import Checkpoint, Loop, check_start_sites, split_dataset
from optloop.loop.state import LoopResult
from optloop.output import make_console
from optloop.paths import state_dir, write_atomic
from optloop.progress import LOG_NAME
from optloop.services import preflight
from optloop.services.outside import RunPlace, describe_run
from optloop.services.tracking import resolve_uri

# What a run started from Python (optloop.optimize) says resumes it, where the command names
# itself.
API_AGAIN = "the same optloop.optimize(...) call"

# In a log file (no terminal) the tables get room to be read ($COLUMNS, else 120 columns).
console = make_console(stderr=True)


def probe_lm(settings: LMSettings, lines: list[str] | None = None) -> OptloopLM:
    """The LM of ``settings`` without its cache, checked (:meth:`OptloopLM.check_endpoint`): an
    :class:`EndpointDownError` (exit 75) when an endpoint cannot be reached or answers only server
    errors; an LM error of another kind (a wrong key, an unknown model) is bad input (exit 2).
    Nothing is written (no cache file), so it can serve the input's checks before the run's state
    exists."""
    probe = OptloopLM(settings.model_copy(update={"cache": False}))
    try:
        found = probe.check_endpoint()  # the schema mode and concurrency chosen, and why
        if lines is not None:
            lines += found
    except LMUnreachableError as exc:
        raise EndpointDownError(
            f"{exc}; nothing was written: rerun the same command once the endpoint is up"
        ) from None
    return probe


@dataclass
class PreparedRun:
    """A run whose input is checked: its settings, its LMs and its :class:`Loop`, not started."""

    config: LoopConfig
    settings: LMSettings
    proposer_settings: LMSettings | None
    lm: OptloopLM
    proposer: OptloopLM
    loop: Loop
    line: str = field(repr=False)  # which run this is, said once before it starts
    again: str = field(repr=False)  # the command that resumes it
    dev: Dataset = field(repr=False)
    test: Dataset = field(repr=False)
    endpoint: list[str] = field(
        default_factory=list, repr=False
    )  # the schema mode and concurrency chosen

    def start(self) -> RunProgress:
        """Say which run this is, and where the run will say what it does: the console (a status
        line on a terminal, plain lines elsewhere) and its ``run.log``, which also gets these first
        lines, the projection and, at the end, the result (:meth:`RunProgress.show`)."""
        progress = RunProgress(console, self.loop.run_dir / LOG_NAME)
        progress.show(Text.from_markup(self.line))
        for line in self.endpoint:
            progress.show(line)
        fractions = ",".join(f"{f:g}" for f in self.config.fractions)
        progress.show(
            f"dataset {self.config.dataset}: {questions(self.dev)} dev and "
            f"{questions(self.test)} test "
            f"questions (split {fractions} by episode)"
        )
        self.loop.announce = progress.show
        self.loop.project = lambda figures, ckpt: print_projection(
            progress.show, figures, ckpt, self.config, self.settings
        )
        self.loop.on_trial = lambda line: progress.line(line.text())
        return progress


def check_priced(settings: LMSettings, proposer: LMSettings | None) -> None:
    """``--max-cost`` needs every LM of the run to have a price: without one its calls cost
    "nothing" and the limit would never stop the run. A :class:`ConfigError` (exit 2) naming the
    model, before anything is written."""
    for which, lm in (("", settings), ("the proposer LM ", proposer)):
        if lm is not None and lm.price() is None:
            raise ConfigError(
                f"--max-cost: {which}{model_name(lm)} has no price in litellm's model cost map, "
                "so its dollars are unknown; limit the run with --max-calls N instead"
            )


def prepare(request: RunRequest, again: str) -> PreparedRun:
    """Everything a run checks before it starts, in order, and the run it starts: bad input fails
    here (:class:`ConfigError`, exit 2) with nothing written, an unavailable endpoint with
    :class:`EndpointDownError` (exit 75). ``again`` says how to resume the run (the command, for
    ``optloop run``), in the line a fault from outside ends with."""
    config, settings, proposer_settings, options = (
        request.config,
        request.lm,
        request.proposer,
        request.options,
    )
    from optloop.datasets import load_dataset

    dataset = load_dataset(
        config.dataset
    )  # a malformed dataset fails here, before any LLM call or any state
    if options.limits.max_cost is not None:
        check_priced(settings, proposer_settings)
    # Everything the loop would refuse is refused now, before the LM (and its cache file) exists.
    train, dev, test = split_dataset(dataset, config)
    if not options.allow_small_splits:
        check_split_sizes(config.dataset, questions(dev), questions(test))
    choice = choose_run(options, config, state_dir(create=False) / "runs")
    config = config.model_copy(update={"run_name": choice.name})
    endpoint_lines: list[str] = []
    probe = probe_lm(
        settings, endpoint_lines
    )  # an unavailable endpoint fails now, before any state is written
    if proposer_settings is not None:
        probe_lm(proposer_settings, endpoint_lines)
    check_start_sites(config, probe)  # --start names a site of the system (no LM cache file yet)
    runs = state_dir(create=False) / "runs"
    tracking_uri = resolve_uri(config.tracking_uri, create=False)
    # The tracking server and the storage answer, the stores are writable: before any write.
    preflight.check_run(tracking_uri, config.storage, state_dir(create=False), runs / choice.name)
    checkpoint = runs / choice.name / artifacts.CHECKPOINT
    describe_run(
        RunPlace(
            lambda: tracking_uri,
            state_dir(create=False),
            lambda: saved_line(checkpoint, choice.name, config.budget, again),
        )
    )
    broken = checkpoint_guard.broken_runs(runs, config) if options.new else []
    for line in checkpoint_guard.retire(broken, tracking_uri):  # --new past a broken checkpoint
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    lm = OptloopLM(
        settings
    )  # the input is valid: now the LM cache may be opened (or found corrupt)
    proposer = OptloopLM(proposer_settings) if proposer_settings is not None else lm
    loop = Loop(
        config,
        lm,
        proposer,
        auto_named=not options.run_name,
        limits=options.limits,
        prepared=(dataset, train, dev, test),
    )
    return PreparedRun(
        config,
        settings,
        proposer_settings,
        lm,
        proposer,
        loop,
        choice.line,
        again,
        dev,
        test,
        endpoint_lines,
    )


def execute(request: RunRequest, again: str = API_AGAIN) -> LoopResult:
    """The run ``request`` asks for, its result returned instead of printed (``optloop.optimize``;
    ``optloop run`` prints it).

    Raises what the command turns into exit codes: :class:`~optloop.errors.OptloopError` (bad
    input, an unavailable endpoint, an unwritable state),
    :class:`~optloop.loop.budget.limits.RunStopped`
    (a spending limit or ``--estimate``: the run is saved), :class:`KeyboardInterrupt`."""
    try:
        run = prepare(request, again)
        with run.start().shown() as progress:
            run.loop.progress = progress
            return run.loop.run()
    finally:
        describe_run(None)  # what the call said of its run ends with it


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_command(build_parser(), argv)
    if not args.verbose:  # DSPy's optimizers log every step; our status line says what runs
        logging.getLogger("dspy").setLevel(logging.ERROR)
    run = prepare(run_request(args), resume_command(argv))
    config, settings, lm, proposer, loop = (
        run.config,
        run.settings,
        run.lm,
        run.proposer,
        run.loop,
    )
    dev, test, again = run.dev, run.test, run.again
    progress = run.start()
    with interruptible() as signals:
        try:
            with progress.shown() as say:
                loop.progress = say
                result = loop.run()
        except EndpointDownError as exc:
            raise EndpointDownError(
                f"{exc}; the run is saved: rerun the same command to resume it: {again}"
            ) from None
        except CallsFailedError as exc:
            raise CallsFailedError(
                f"{exc}; the run is saved: fix that, then rerun the same command to resume it: "
                f"{again}"
            ) from None
        except RunStopped as stop:
            ckpt = Checkpoint.load(loop.state / artifacts.CHECKPOINT)
            if stop.reason != ESTIMATE:
                print(stopped_line(stop, ckpt, config, again), file=sys.stderr)
                return EXIT_LIMIT
            figures = loop.estimate(ckpt)
            progress.show(estimate_table(figures, config, settings))
            for line in estimate_lines(
                figures, ckpt, config, resume_command([a for a in argv if a != "--estimate"])
            ):
                progress.show(line)
            if args.json:
                out = figures.model_dump(mode="json")
                out |= {
                    "dataset": config.dataset,
                    "n_dev_questions": questions(dev),
                    "n_test_questions": questions(test),
                    "hours": figures.total.hours,
                }
                write_atomic(Path(args.json), json.dumps(out, indent=1))
            return 0
        except KeyboardInterrupt:
            where = loop.state / artifacts.CHECKPOINT
            why = signals[0] if signals else "SIGINT"
            if where.exists():
                print(
                    f"optloop: interrupted ({why}): run {config.run_name} is saved "
                    f"({Checkpoint.load(where).progress(config.budget)}), its MLflow runs "
                    "marked KILLED; resume it "
                    f"with the same command: {again}",
                    file=sys.stderr,
                )
            else:
                print(
                    f"optloop: interrupted ({why}) before run {config.run_name} started; "
                    "nothing was saved",
                    file=sys.stderr,
                )
            return 130
    # The result, on the console and in run.log.
    progress.show(summary_table(result))
    if result.tried:
        progress.show(tried_table(result))
    if result.prompt_diff:
        progress.show(Text("prompts, start -> best (also prompts.diff in MLflow):", style="bold"))
        progress.show(result.prompt_diff)
    if result.note:
        progress.show(f"note: {result.note}")
    if faults := fault_line(lm.accounting.totals()):
        progress.show(faults)
    progress.show(
        f"MLflow parent run {result.parent_run_id} (experiment optloop-{config.system}); "
        "`make ui` to compare"
    )
    if args.json:
        out = result.model_dump(mode="json")
        out["lm"] = (
            lm.accounting.totals().as_dict()
        )  # this process's calls: faults, cured, errors, retries ...
        if proposer is not lm:
            out["proposer_lm"] = proposer.accounting.totals().as_dict()
        write_atomic(Path(args.json), json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
