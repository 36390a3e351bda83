"""``python -m optloop.run``: the closed loop (find which prompt makes a memory system fail,
rewrite only that one, measure), wired from its flags (:mod:`optloop.cli.run_args`, whose docstring
is the ``--help`` manual), the run it resumes (:mod:`optloop.cli.run_resume`) and what it prints
(:mod:`optloop.cli.run_tables`).

The run itself is the library's (:mod:`optloop.loop.runs.session`, shared with
``optloop.optimize``): :func:`~optloop.loop.runs.session.prepare` checks a
:class:`~optloop.loop.runs.request.RunRequest` (what the flags ask for) and builds its loop,
:meth:`~optloop.loop.runs.session.Session.run` runs it, and what the run says reaches this command
as events, which :class:`RunView` shows on the console (a status line on a terminal, plain lines
elsewhere: :class:`~optloop.cli.status.RunProgress`). Only this module parses flags, prints and
maps what a run raises to exit codes."""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import RenderableType
from rich.text import Text

from optloop import artifacts
from optloop.cli.command import parse_command
from optloop.cli.run_args import build_parser, run_request
from optloop.cli.run_resume import choose_run, resume_command
from optloop.cli.run_tables import (
    estimate_lines,
    estimate_table,
    fault_line,
    stopped_line,
    summary_table,
    tried_table,
)
from optloop.cli.status import RunProgress
from optloop.errors import CallsFailedError, EndpointDownError
from optloop.interrupt import interruptible
from optloop.loop.policy import questions
from optloop.loop.runs.session import (
    Finished,
    Projected,
    Retired,
    RunEvent,
    Said,
    Session,
    Stage,
    TrialDone,
    prepare,
)
from optloop.loop.spending.limits import ESTIMATE, EXIT_LIMIT, RunStopped
from optloop.output import make_console
from optloop.paths import write_atomic

__all__ = ["RunView", "build_parser", "choose_run", "main", "prepare"]

# In a log file (no terminal) the tables get room to be read ($COLUMNS, else 120 columns).
console = make_console(stderr=True)


class RunView:
    """What ``optloop run`` shows of a run's events (:data:`~optloop.loop.runs.session.RunEvent`)
    on the console: a broken run set aside as a line of its own; from the first line of the run on,
    a :class:`RunProgress` (its clock starts there): the lines that stay and the projection as they
    are, each stage on the status line (a plain line off a terminal), each trial as a line. The
    run's ``run.log`` is the session's (it already holds every event): what the command adds to
    the console to stay (:meth:`keep`) goes there too. :class:`Finished` is kept for the command
    to print once the status line is gone."""

    def __init__(self) -> None:
        self._progress: RunProgress | None = None
        self.session: Session | None = None
        self.finished: Finished | None = None

    @property
    def progress(self) -> RunProgress:
        if self._progress is None:
            self._progress = RunProgress(console)
        return self._progress

    def __call__(self, event: RunEvent) -> None:
        match event:
            case Retired(text=text):
                console.print(text, soft_wrap=True, markup=False, highlight=False)
            case Said():
                self.progress.show(event.renderable())
            case Projected():
                for renderable in event.renderables():
                    self.progress.show(renderable)
            case Stage(text=text):
                self.progress(text)
            case TrialDone():
                self.progress.line(event.text())
            case Finished():
                self.finished = event

    def keep(self, renderable: RenderableType) -> None:
        """On the console as it is, and in the run's ``run.log``."""
        self.progress.show(renderable)
        if self.session is not None:
            self.session.log.show(renderable)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_command(build_parser(), argv)
    if not args.verbose:  # DSPy's optimizers log every step; our status line says what runs
        logging.getLogger("dspy").setLevel(logging.ERROR)
    view = RunView()
    session = view.session = prepare(run_request(args), resume_command(argv), view)
    config, settings, loop = session.config, session.settings, session.loop
    dev, test, again = session.dev, session.test, session.again
    session.start()
    progress = view.progress
    with interruptible() as signals:
        try:
            with progress.shown():
                session.run()
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
            ckpt = session.checkpoint()
            if stop.reason != ESTIMATE:
                print(stopped_line(stop, ckpt, config, again), file=sys.stderr)
                return EXIT_LIMIT
            figures = loop.estimate(ckpt)
            view.keep(estimate_table(figures, config, settings))
            for line in estimate_lines(
                figures, ckpt, config, resume_command([a for a in argv if a != "--estimate"])
            ):
                view.keep(line)
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
                    f"({session.checkpoint().progress(config.budget)}), its MLflow runs "
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
    finished = view.finished
    assert finished is not None  # the session reports its result before it returns it
    show_result(view, finished)
    if args.json:
        write_atomic(Path(args.json), json.dumps(finished.as_json(), indent=1))
    return 0


def show_result(view: RunView, finished: Finished) -> None:
    """The result, on the console and in run.log: the summary, the candidates tried, the prompts'
    diff, a note, the LM faults and where the MLflow parent run is."""
    result = finished.result
    view.keep(summary_table(result))
    if result.tried:
        view.keep(tried_table(result))
    if result.prompt_diff:
        view.keep(Text("prompts, start -> best (also prompts.diff in MLflow):", style="bold"))
        view.keep(result.prompt_diff)
    if result.note:
        view.keep(f"note: {result.note}")
    if result.config.race and result.racing is not None and result.racing.candidates:
        view.keep(result.racing.line())
    if result.headroom:
        view.keep(result.headroom)
    if result.power:
        view.keep(result.power)
    if faults := fault_line(finished.usage):
        view.keep(faults)
    view.keep(
        f"MLflow parent run {result.parent_run_id} (experiment optloop-{result.config.system}); "
        "`make ui` to compare"
    )
