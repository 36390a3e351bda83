"""A run's own records on MLflow, around what the controller's sink records
(:mod:`optloop.loop.tracking.sink`: the trials' child runs, the metrics, the registry): the
experiment the run goes into, made once however many workers start together
(:func:`experiment`), the parent run's params (:func:`log_params`), and the runs a run leaves
open when it ends, ended with its status (:func:`end_runs`)."""

from __future__ import annotations

import fcntl
import json
import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from optloop.lm import redact_url
from optloop.services import outside

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.evaluate import Evaluator
    from optloop.loop.state import LoopConfig

logger = logging.getLogger(__name__)


def experiment(system: str, announce: Callable[[str], None]) -> str:
    """The id of ``system``'s experiment (``optloop-<system>``). Workers starting together race to
    create the experiment, and on one machine to create the SQLite store's tables (MLflow's
    migrations are not safe to run twice at once): the latter is serialized by a lock file beside
    the store, the former retried. ``announce`` gets the line that says a half-made store was
    mended."""
    import mlflow

    from optloop.services import tracking, tracking_store

    uri = mlflow.get_tracking_uri()
    lock = None
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        db.parent.mkdir(parents=True, exist_ok=True)
        lock = open(db.with_name(f".{db.name}.lock"), "a+")  # noqa: SIM115 - closed below
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        # The store made whole or not at all; one a full disk left half-made, mended.
        if lock is not None and (mended := tracking_store.ensure_sqlite_store(db)):
            announce(mended)
        for attempt in range(3):
            try:
                return tracking.experiment(f"optloop-{system}")
            # the loser of a creation race finds it on the next try
            except Exception:  # noqa: BLE001
                if attempt == 2:
                    raise
                time.sleep(0.5 + attempt)
        raise AssertionError("unreachable")
    finally:
        if lock is not None:
            lock.close()


def log_params(
    cfg: LoopConfig,
    evaluator: Evaluator,
    train: Dataset,
    dev: Dataset,
    test: Dataset,
    lm_identity: str,
) -> None:
    """The run's settings (``cfg``, the system's knobs, the splits' sizes, the system LM's
    identity) as the parent run's params (secrets in URLs masked)."""
    import mlflow

    params = cfg.model_dump(exclude={"knobs", "fractions", "start"})
    params["start_sites"] = ",".join(cfg.start) or "-"  # the texts are in prompts_before.json
    params |= {
        "storage": redact_url(cfg.storage),
        "tracking_uri": redact_url(cfg.tracking_uri),
    }
    mlflow.log_params(
        {
            **{k: str(v) for k, v in params.items()},
            "knobs": json.dumps(evaluator.template.knobs()),
            "fractions": str(cfg.fractions),
            "split_train": len(train.episodes),
            "split_dev": len(dev.episodes),
            "split_test": len(test.episodes),
            "lm_identity": lm_identity,
        }
    )


def end_runs(parent_run_id: str, status: str) -> None:
    """End the active MLflow runs as ``status``: a child run an interrupt left open, then the
    parent run ``parent_run_id``. A run that cannot be ended (a full disk, a lost server) raises
    when ``status`` is ``FINISHED`` and is left as it is otherwise: the run is saved, and the same
    command, resuming it, ends it."""
    import mlflow

    while (active := mlflow.active_run()) is not None:
        failing = status != "FINISHED"
        try:
            with outside.muted("mlflow.store.db.utils") if failing else nullcontext():
                mlflow.end_run(status)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            if not failing:
                raise
            logger.debug("could not end MLflow run %s as %s: %s", active.info.run_id, status, exc)
        if active.info.run_id == parent_run_id:
            break


__all__ = ["end_runs", "experiment", "log_params"]
