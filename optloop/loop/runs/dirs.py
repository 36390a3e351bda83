"""A run's directory under ``<state dir>/runs/``: the lock that gives it to one process
(:func:`lock_dir`, :func:`in_use`), whether a checkpoint was written by a run of the same settings
(:func:`matches`), and the unfinished runs the same command resumes (:func:`unfinished_runs`)."""

from __future__ import annotations

import fcntl
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optloop.loop.state import Checkpoint, LoopConfig

logger = logging.getLogger(__name__)


def lock_dir(path: Path) -> Any | None:
    """An exclusive lock on ``path`` for this process's lifetime (the open file holds it); ``None``
    when another process holds it."""
    path.mkdir(parents=True, exist_ok=True)
    handle = open(path / ".lock", "a+")  # noqa: SIM115 - held open until the run ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def in_use(path: Path) -> bool:
    """Whether a live process holds run directory ``path`` (its lock; nothing is created or
    changed)."""
    lock = path / ".lock"
    if not lock.exists():
        return False
    with open(lock) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


@dataclass(frozen=True)
class Unfinished:
    """A run that can be resumed: its name, its checkpoint, whether a live process holds it now."""

    name: str
    checkpoint: Checkpoint
    in_use: bool


def unfinished_runs(runs: Path, config: LoopConfig) -> list[Unfinished]:
    """Every unfinished run under ``runs`` that was started without ``--run-name`` from
    ``config``'s settings (:meth:`LoopConfig.resume_key`), the latest first. Reads only; an
    unreadable checkpoint is skipped."""
    key, found = config.resume_key(), []
    for path in runs.glob("*/checkpoint.json") if runs.is_dir() else []:
        try:
            ckpt = Checkpoint.model_validate_json(path.read_text())
            mtime = path.stat().st_mtime
        # another run's broken state is no reason to refuse this one
        except Exception as exc:  # noqa: BLE001
            logger.debug("skipping %s: %s", path, exc)
            continue
        if ckpt.auto_named and ckpt.resume_key == key and not ckpt.finished:
            found.append((mtime, Unfinished(path.parent.name, ckpt, in_use(path.parent))))
    return [u for _, u in sorted(found, key=lambda pair: pair[0], reverse=True)]


def matches(ckpt: Checkpoint, config: LoopConfig) -> bool:
    """Whether ``ckpt`` was written by a run of ``config`` (a checkpoint from before
    ``lm_settings`` counted included)."""
    return ckpt.config_digest in (config.digest(), config.digest(legacy=True))


__all__ = ["Unfinished", "in_use", "lock_dir", "matches", "unfinished_runs"]
