"""Which run a run request works on: a new one, the one named, or the latest unfinished run of the
same settings (:func:`choose_run`), and where a run a fault stopped stands (:func:`saved_line`).
Both entry points, ``optloop.optimize`` and ``optloop run``, choose the same way
(:mod:`optloop.loop.runs.session`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from optloop.errors import ConfigError
from optloop.loop.optimizers import registry
from optloop.loop.runs import checkpoint_guard
from optloop.loop.runs.runner import Checkpoint, LoopConfig, matches, unfinished_runs


class Asked(Protocol):
    """Which run was asked for: by name (``run_name``), or a new one (``new``); else the latest
    unfinished run of the same settings. :class:`~optloop.loop.runs.request.RunOptions` is one, and
    so is ``optloop run``'s parsed flags."""

    @property
    def run_name(self) -> str | None: ...

    @property
    def new(self) -> bool: ...


@dataclass(frozen=True)
class Choice:
    """Which run this command works on: a new one, or the one it resumes (its checkpoint), and the
    line that says so."""

    name: str
    checkpoint: Checkpoint | None
    line: str


def choose_run(args: Asked, config: LoopConfig, runs: Path) -> Choice:
    """``--run-name`` (refused when finished or started with other settings); else, unless
    ``--new``, the latest unfinished run started without ``--run-name`` from the same settings (one
    a live process holds is left to it, unless its optimizer shares the run between workers); else
    a new name. Reads only."""
    what = f"{config.system} on {config.dataset}, {config.optimizer}, budget {config.budget}"
    if args.run_name:
        name = args.run_name
        path = runs / name / "checkpoint.json"
        ckpt = Checkpoint.load(path) if path.exists() else None
        if ckpt is None:
            return Choice(name, None, f"[bold]optloop.run[/] {name}: {what}")
        if ckpt.finished:
            raise ConfigError(
                f"run {name!r} already finished (MLflow run {ckpt.parent_run_id}); pick another "
                "--run-name to run again"
            )
        if not matches(ckpt, config.model_copy(update={"run_name": name})):
            raise ConfigError(
                f"run name {name!r} exists with other settings; resume it with the same "
                "command, or pick another --run-name"
            )
        return Choice(
            name, ckpt, f"[bold]optloop.run[/] resuming {name}: {what} ({_so_far(ckpt, config)})"
        )
    busy: list[str] = []
    if not args.new and (broken := checkpoint_guard.broken_runs(runs, config)):  # not skipped
        raise ConfigError(checkpoint_guard.refusal(broken[0]))
    if not args.new:
        for run in unfinished_runs(runs, config):
            if run.in_use and not registry.shared_study(config.optimizer):
                busy.append(run.name)
                continue
            how = "joining" if run.in_use else "resuming"
            return Choice(
                run.name,
                run.checkpoint,
                f"[bold]optloop.run[/] {how} {run.name}, the latest unfinished run of these "
                f"settings ({_so_far(run.checkpoint, config)}); --new starts afresh",
            )
    name = f"{config.system}-{config.optimizer}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while (runs / name).exists():
        n += 1
        name = f"{config.system}-{config.optimizer}-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
    extra = f"; {', '.join(busy)} with these settings is in use by another process" if busy else ""
    return Choice(
        name,
        None,
        f"[bold]optloop.run[/] {name}: {what} (a new run: the same command resumes it if it "
        f"stops{extra})",
    )


def _so_far(ckpt: Checkpoint, config: LoopConfig) -> str:
    return f"{ckpt.progress(config.budget)}, {ckpt.processes} process(es) so far"


def saved_line(checkpoint: Path, run_name: str, budget: int, again: str) -> str:
    """Where a run a fault stopped stands (from its checkpoint on disk) and the command that goes
    on."""
    if not checkpoint.exists():
        return (
            f"run {run_name} had saved nothing yet; once that is fixed, rerun the same "
            f"command: {again}"
        )
    ckpt = Checkpoint.load(checkpoint)
    if ckpt.finished:
        return f"run {run_name} had finished (MLflow parent run {ckpt.parent_run_id}) before that"
    progress = ckpt.progress(budget)
    return (
        f"run {run_name} is saved ({progress}); once that is fixed, rerun the same command to "
        f"resume it: {again}"
    )
