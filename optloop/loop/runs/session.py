"""A run, from what it is asked for to its result: :func:`prepare` checks a
:class:`~optloop.loop.runs.request.RunRequest` against the world and builds its :class:`Loop` (a
:class:`Session`, not started); :func:`run` runs it and returns the result. ``optloop.optimize``
calls :func:`run`; ``optloop run`` (:mod:`optloop.cli.run`) calls :func:`prepare` and
:meth:`Session.run`, then prints the result. A benchmark that needs more of a run than its result
(its LM, its start program, its checkpoint) runs it through :func:`opened`, and evaluates programs
outside a run with the run's own evaluator (:func:`evaluator`).

Nothing here writes to a console. What a run says while it runs reaches the caller as events
(:data:`RunEvent`), through the ``on_event`` callback it hands in: which run this is and the
lines that stay (:class:`Said`), what the run does now (:class:`Stage`), each finished trial
(:class:`TrialDone`), the projection before the first trial (:class:`Projected`), a broken run
that ``new`` set aside (:class:`Retired`) and the result (:class:`Finished`). Each event also
says its words (``text()``, ``renderable()``); the run's ``run.log``
(:class:`~optloop.progress.RunLog`, in the run's directory) gets them whoever started the run.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from optloop import artifacts
from optloop.datasets import Dataset
from optloop.errors import ConfigError, EndpointDownError, LMUnreachableError
from optloop.lm import LMSettings, OptloopLM, Usage
from optloop.loop.config import LoopConfig
from optloop.loop.evaluate import Evaluator
from optloop.loop.policy import check_split_sizes, power_line, questions
from optloop.loop.runs import checkpoint_guard
from optloop.loop.runs.request import RunRequest
from optloop.loop.runs.resume import choose_run, saved_line
from optloop.loop.runs.runner import Loop, check_start_sites, run_evaluator, split_dataset
from optloop.loop.spending.estimate import Estimate
from optloop.loop.spending.eta import TrialLine
from optloop.loop.spending.report import estimate_table, model_name, projection_line
from optloop.loop.state import Checkpoint, LoopResult
from optloop.paths import state_dir
from optloop.progress import LOG_NAME, RunLog
from optloop.services import preflight
from optloop.services.outside import RunPlace, describe_run
from optloop.services.tracking import resolve_uri

# What a run started from Python (optloop.optimize) says resumes it, where the command names
# itself.
API_AGAIN = "the same optloop.optimize(...) call"


@dataclass(frozen=True)
class Said:
    """A line that stays: which run this is, what the endpoint probe chose, the dataset's split, a
    line the loop announces (a parent run replaced, a store mended). ``markup``: ``text`` holds
    rich markup (the run's name in bold)."""

    text: str
    markup: bool = False

    def renderable(self) -> str | Text:
        return Text.from_markup(self.text) if self.markup else self.text


@dataclass(frozen=True)
class Stage:
    """What the run does now (``evaluating baseline on train (40 questions)``, an optimizer's
    step): a status line's text."""

    text: str


@dataclass(frozen=True)
class TrialDone:
    """One evaluated trial: its dev accuracy, the best so far, its time and the run's ETA."""

    line: TrialLine

    def text(self) -> str:
        """``trial 3/50 dev 0.550 (best 0.650) 41 s, ETA 18 min``"""
        return self.line.text()


@dataclass(frozen=True)
class Projected:
    """Before the first trial: what the whole run is expected to take (``--estimate``'s figures,
    from the measured baseline) and its ETA, so a run that would take hours can be stopped now and
    resumed later."""

    figures: Estimate
    checkpoint: Checkpoint
    config: LoopConfig
    settings: LMSettings

    def renderables(self) -> list[RenderableType]:
        """The estimate's table, then the line with the ETA."""
        return [
            estimate_table(self.figures, self.config, self.settings),
            projection_line(self.figures, self.checkpoint, self.config),
        ]


@dataclass(frozen=True)
class Retired:
    """A broken run that ``new`` set aside before the run starts (not kept in ``run.log``: it is
    another run's)."""

    text: str


@dataclass(frozen=True)
class Finished:
    """The run's result, and the LM calls this process made for it (``proposer_usage``: the
    proposer's, when it has an LM of its own)."""

    result: LoopResult
    usage: Usage
    proposer_usage: Usage | None = None

    def as_json(self) -> dict[str, Any]:
        """The result as JSON data, with this process's calls (faults, cured, errors, retries)."""
        out = self.result.model_dump(mode="json")
        out["lm"] = self.usage.as_dict()
        if self.proposer_usage is not None:
            out["proposer_lm"] = self.proposer_usage.as_dict()
        return out


RunEvent = Said | Stage | TrialDone | Projected | Retired | Finished
"""What a run reports to its ``on_event`` callback."""

OnEvent = Callable[[RunEvent], None]


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


def _ignore(event: RunEvent) -> None:
    """No caller listening: the run says nothing (its ``run.log`` still gets every line)."""


@dataclass
class Session:
    """A run whose input is checked: its settings, its LMs and its :class:`Loop`, not started.
    Every event goes to ``run.log`` (:attr:`log`) and then to ``on_event``."""

    config: LoopConfig
    settings: LMSettings
    proposer_settings: LMSettings | None
    lm: OptloopLM
    proposer: OptloopLM
    loop: Loop
    line: str = field(repr=False)  # which run this is (rich markup), said once before it starts
    again: str = field(repr=False)  # what resumes it
    dev: Dataset = field(repr=False)
    test: Dataset = field(repr=False)
    # the schema mode and concurrency chosen
    endpoint: list[str] = field(default_factory=list, repr=False)
    on_event: OnEvent = field(default=_ignore, repr=False)
    log: RunLog = field(init=False, repr=False)  # the run's run.log, in its directory

    def __post_init__(self) -> None:
        self.log = RunLog(self.loop.run_dir / LOG_NAME)

    def emit(self, event: RunEvent) -> None:
        """``event`` into ``run.log`` (as its words), then to the caller."""
        match event:
            case Stage(text=text):
                self.log.write(text)
            case TrialDone():
                self.log.write(event.text())
            case Said():
                self.log.show(event.renderable())
            case Projected():
                for renderable in event.renderables():
                    self.log.show(renderable)
        self.on_event(event)

    def start(self) -> None:
        """Say which run this is, what the endpoint probe chose and the dataset's split, and wire
        the loop's reports to events."""
        self.emit(Said(self.line, markup=True))
        for line in self.endpoint:
            self.emit(Said(line))
        fractions = ",".join(f"{f:g}" for f in self.config.fractions)
        self.emit(
            Said(
                f"dataset {self.config.dataset}: {questions(self.dev)} dev and "
                f"{questions(self.test)} test "
                f"questions (split {fractions} by episode)"
            )
        )
        self.emit(
            Said(power_line(questions(self.dev), questions(self.test), None, self.config.min_gain))
        )
        self.loop.announce = lambda line: self.emit(Said(line))
        self.loop.project = lambda figures, ckpt: self.emit(
            Projected(figures, ckpt, self.config, self.settings)
        )
        self.loop.on_trial = lambda line: self.emit(TrialDone(line))
        self.loop.progress = lambda message: self.emit(Stage(message))

    def run(self) -> LoopResult:
        """Run the loop (after :meth:`start`) and report the result (:class:`Finished`).

        Raises what the command turns into exit codes: :class:`~optloop.errors.OptloopError`,
        :class:`~optloop.loop.spending.limits.RunStopped` (a spending limit or ``--estimate``: the
        run is saved), :class:`KeyboardInterrupt`."""
        result = self.loop.run()
        own = self.proposer is not self.lm
        self.emit(
            Finished(
                result,
                self.lm.accounting.totals(),
                self.proposer.accounting.totals() if own else None,
            )
        )
        return result

    def checkpoint(self) -> Checkpoint:
        """What the run has saved (after it stopped)."""
        return Checkpoint.load(self.loop.state / artifacts.CHECKPOINT)


def prepare(
    request: RunRequest, again: str = API_AGAIN, on_event: OnEvent | None = None
) -> Session:
    """Everything a run checks before it starts, in order, and the run it starts: bad input fails
    here (:class:`ConfigError`, exit 2) with nothing written, an unavailable endpoint with
    :class:`EndpointDownError` (exit 75). ``again`` says how to resume the run (the command, for
    ``optloop run``), in the line a fault from outside ends with."""
    emit = on_event or _ignore
    config, settings, proposer_settings, options = (
        request.config,
        request.lm,
        request.proposer,
        request.options,
    )
    from optloop.datasets import load_dataset

    # a malformed dataset fails here, before any LLM call or any state
    dataset = load_dataset(config.dataset)
    if options.limits.max_cost is not None:
        check_priced(settings, proposer_settings)
    # Everything the loop would refuse is refused now, before the LM (and its cache file) exists.
    train, dev, test = split_dataset(dataset, config)
    if not options.allow_small_splits:
        check_split_sizes(config.dataset, questions(dev), questions(test))
    runs = options.runs_dir or state_dir(create=False) / "runs"
    choice = choose_run(options, config, runs)
    config = config.model_copy(update={"run_name": choice.name})
    endpoint_lines: list[str] = []
    # an unavailable endpoint fails now, before any state is written
    probe = probe_lm(settings, endpoint_lines)
    if proposer_settings is not None:
        probe_lm(proposer_settings, endpoint_lines)
    check_start_sites(config, probe)  # --start names a site of the system (no LM cache file yet)
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
        emit(Retired(line))
    # the input is valid: now the LM cache may be opened (or found corrupt)
    lm = OptloopLM(settings)
    proposer = OptloopLM(proposer_settings) if proposer_settings is not None else lm
    loop = Loop(
        config,
        lm,
        proposer,
        work=runs / choice.name,
        auto_named=not options.run_name,
        limits=options.limits,
        prepared=(dataset, train, dev, test),
    )
    return Session(
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
        emit,
    )


@contextmanager
def opened(
    request: RunRequest, again: str = API_AGAIN, on_event: OnEvent | None = None
) -> Iterator[Session]:
    """:func:`prepare` of ``request``: the :class:`Session`, not started, for a caller that needs
    more of the run than its result (a benchmark: its LM, to watch the requests; its start program
    and checkpoint). What the run said of itself for faults from outside
    (:func:`~optloop.services.outside.describe_run`) ends on leaving, so a process that runs many
    loops names none of them after it ended. :func:`run` is ``opened``, ``start``, ``run``."""
    try:
        yield prepare(request, again, on_event)
    finally:
        describe_run(None)


def run(
    request: RunRequest, again: str = API_AGAIN, on_event: OnEvent | None = None
) -> LoopResult:
    """The run ``request`` asks for, its result returned (``optloop.optimize``); what it says
    while it runs goes to ``on_event`` (nothing when :obj:`None`) and to its ``run.log``.

    Raises what the command turns into exit codes: :class:`~optloop.errors.OptloopError` (bad
    input, an unavailable endpoint, an unwritable state),
    :class:`~optloop.loop.spending.limits.RunStopped`
    (a spending limit or ``--estimate``: the run is saved), :class:`KeyboardInterrupt`."""
    with opened(request, again, on_event) as session:
        session.start()
        return session.run()


@contextmanager
def evaluator(
    config: LoopConfig, lm: OptloopLM, work: Path, dataset: Dataset
) -> Iterator[Evaluator]:
    """Programs of a run of ``config`` evaluated outside a run (a benchmark's plain evaluations,
    e.g. a whole dataset): the :class:`Evaluator` the run would build
    (:func:`~optloop.loop.runs.runner.run_evaluator`, its system, knobs and query-rewrite site) on
    ``lm``, in ``work``, for ``dataset``; closed on leaving.
    :func:`~optloop.loop.policy.start_candidate` of it and ``config`` is the run's start program,
    :meth:`Evaluator.evaluate` evaluates a program."""
    evaluating = run_evaluator(config, lm, work, dataset_uri=dataset.uri)
    try:
        yield evaluating
    finally:
        evaluating.close()
