"""Checkpoints the world broke: a file cut short, or a parent run the tracking store lacks.

**An unreadable checkpoint** (a disk that failed under it, a hand edit, a copy cut short; optloop
itself writes checkpoints atomically) of the run the same command would resume is not skipped
in silence: :func:`broken_runs` finds it and ``optloop.run`` refuses with one line (exit 2)
naming the run directory and the two ways on: ``--new`` starts afresh, after
:func:`retire` has ended the broken run's MLflow parent run KILLED (when the store holds it
RUNNING) and set the file aside as ``checkpoint.json.unreadable``; or delete the directory.
Which run a broken file belonged to is read from what is left of it: the checkpoint's first
fields (``resume_key``, ``auto_named``, ``parent_run_id``) come first in the file; when even
those are gone, a run directory named like this command's runs (``<system>-<optimizer>-...``)
counts as one.

**A parent run the tracking store does not hold** (the same command with another
``--tracking-uri``, or ``mlruns/`` deleted): the run resumes into a new parent run in the
current store, says so in one line (:func:`lost_parent_line`), and logs the checkpoint's
evaluated trials again as its child runs (:func:`relog_trials`; their ``acc_dev`` points
follow from the controller's resume). Nothing evaluated is redone. For a run shared by
Optuna workers, whose study records the old parent run, the leader refuses instead (start
such a run afresh with ``--new``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from optloop import artifacts
from optloop.loop.candidate import Candidate, prompt_diff
from optloop.loop.state import Checkpoint, LoopConfig

if TYPE_CHECKING:
    from optloop.loop.interfaces import TrackingSink

logger = logging.getLogger(__name__)

UNREADABLE_SUFFIX = ".unreadable"
_FIELD = r'"{name}"\s*:\s*("(?P<s>[^"\\]*)"|(?P<b>true|false|null))'


@dataclass(frozen=True)
class Broken:
    """An unreadable checkpoint of the run the same command would resume."""

    name: str
    path: Path
    reason: str
    parent_run_id: str | None


def _field(text: str, name: str) -> str | bool | None:
    """Field ``name`` of a checkpoint's (possibly truncated) JSON text, when its value is all
    there."""
    match = re.search(_FIELD.format(name=re.escape(name)), text)
    if match is None:
        return None
    if match["s"] is not None:
        return match["s"]
    return {"true": True, "false": False}.get(match["b"])


def _problem(path: Path) -> tuple[str, str] | None:
    """(why the checkpoint at ``path`` is unreadable, what is left of its text), or ``None`` when
    it reads."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return exc.strerror or type(exc).__name__, ""
    text = raw.decode("utf-8", errors="replace")
    try:
        Checkpoint.model_validate_json(raw)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        first = str(exc).splitlines()
        kind = (
            "not valid JSON: cut short?"
            if "json_invalid" in str(exc) or not raw.strip()
            else (first[-1].strip() if first else type(exc).__name__)
        )
        return f"{len(raw)} bytes, {kind}", text
    return None


def broken_runs(runs: Path, config: LoopConfig) -> list[Broken]:
    """Unreadable checkpoints under ``runs`` of runs the same command would resume (module
    docstring); reads only."""
    found: list[Broken] = []
    key, prefix = config.resume_key(), f"{config.system}-{config.optimizer}-"
    for path in sorted(runs.glob(f"*/{artifacts.CHECKPOINT}")) if runs.is_dir() else []:
        problem = _problem(path)
        if problem is None:
            continue
        reason, text = problem
        resume_key, auto_named = _field(text, "resume_key"), _field(text, "auto_named")
        if isinstance(resume_key, str):
            ours = (
                resume_key == key
                and auto_named is not False
                and _field(text, "finished") is not True
            )
        else:
            ours = path.parent.name.startswith(prefix)
        if ours:
            parent = _field(text, "parent_run_id")
            found.append(
                Broken(path.parent.name, path, reason, parent if isinstance(parent, str) else None)
            )
    return found


def refusal(broken: Broken) -> str:
    """The one line that refuses to go on past ``broken``."""
    return (
        f"run {broken.name}'s checkpoint {broken.path} is unreadable ({broken.reason}), and "
        "it is the run this "
        "command would resume: rerun with --new to start afresh (its MLflow run is then "
        "ended KILLED), or "
        f"delete {broken.path.parent}"
    )


def retire(broken: list[Broken], tracking_uri: str) -> list[str]:
    """Set each broken checkpoint aside (``checkpoint.json.unreadable``) and end its MLflow parent
    run KILLED when the store at ``tracking_uri`` holds it RUNNING; one line per run saying what
    was done."""
    lines = []
    for run in broken:
        ended = _end_killed(run.parent_run_id, tracking_uri)
        run.path.replace(run.path.with_name(run.path.name + UNREADABLE_SUFFIX))
        lines.append(
            f"optloop.run: run {run.name}'s unreadable checkpoint set aside as "
            f"{run.path.name}{UNREADABLE_SUFFIX}"
            + (f"; its MLflow run {run.parent_run_id} ended KILLED" if ended else "")
        )
    return lines


def _end_killed(run_id: str | None, tracking_uri: str) -> bool:
    """End MLflow run ``run_id`` KILLED if the store holds it unfinished; whether it did."""
    from optloop.services.preflight import sqlite_path

    db = sqlite_path(tracking_uri)
    if run_id is None or (db is not None and not db.is_file()):
        return False  # no store to look in (a SQLite store is never created just for this)
    from mlflow.entities import RunStatus
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    try:
        run = client.get_run(run_id)
        if run.info.status not in (
            RunStatus.to_string(RunStatus.RUNNING),
            RunStatus.to_string(RunStatus.SCHEDULED),
        ):
            return False
        client.set_terminated(run_id, "KILLED")
    except MlflowException as exc:  # not in this store: nothing to end
        logger.debug("MLflow run %s: %s", run_id, exc)
        return False
    return True


# --- a parent run the store lost ------------------------------------------------------------


def parent_run_missing(run_id: str) -> bool:
    """Whether the tracking store MLflow points at has no run ``run_id`` (deleted runs count as
    held)."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient().get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            return True
        raise
    return False


def lost_parent_line(config: LoopConfig, run_id: str, tracking_uri: str, ckpt: Checkpoint) -> str:
    """What the same command says when the store lost the run's parent run."""
    from optloop.lm import redact_url

    done = sum(t.evaluation is not None for t in ckpt.trials)
    store = tracking_uri if tracking_uri.startswith("sqlite:") else redact_url(tracking_uri)
    return (
        f"optloop.run: run {config.run_name}'s MLflow parent run {run_id} is not in the "
        "tracking store "
        f"{store} (another --tracking-uri, or mlruns/ deleted): resuming into a new parent "
        "run there, the "
        f"baseline and {done} evaluated trial(s) logged again from the checkpoint"
    )


def relog_trials(
    sink: TrackingSink,
    ckpt: Checkpoint,
    base: Candidate,
    prompt_texts: Callable[[Candidate], dict[str, str]],
    tags: Mapping[str, str] | None,
) -> None:
    """Every evaluated trial of ``ckpt`` as a child run of the sink's (new) parent run, as it was
    first logged (candidate, evaluation, prompt diff against ``base``); the checkpoint's child run
    ids follow."""
    texts_base = prompt_texts(base)
    for trial in sorted(ckpt.trials, key=lambda t: t.trial):
        if trial.evaluation is None:
            continue  # a half-done trial: the controller redoes it
        with sink.open_trial(trial.trial, tags) as run_id:
            sink.log_trial(
                trial.trial,
                trial.candidate,
                trial.evaluation,
                base=base,
                diff=prompt_diff(texts_base, prompt_texts(trial.candidate)),
            )
        trial.child_run_id = run_id


__all__ = [
    "Broken",
    "broken_runs",
    "lost_parent_line",
    "parent_run_missing",
    "refusal",
    "relog_trials",
    "retire",
]
