"""The closed loop, wired: one ``optloop.run`` from the dataset to the result.

:class:`Loop` builds what :class:`optloop.loop.controller.Controller` runs on and owns what is not
the loop's logic: the run's state directory, the MLflow experiment and parent run, the real
implementations of the controller's interfaces, the optimizer from the registry, the run's cost
and its projection. :func:`run_evaluator` is the evaluator a run builds; :func:`check_start_sites`
refuses flags that name what the system lacks before anything is written. The data flow:
``docs/architecture.md``; resume, spending limits and exit codes: ``docs/loop.md``.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import dspy

from optloop import artifacts, failures
from optloop.attribution import blame
from optloop.datasets import Dataset, load_dataset
from optloop.errors import ConfigError
from optloop.loop.candidate import Candidate
from optloop.loop.controller import Controller
from optloop.loop.cost import site_costs, site_metrics
from optloop.loop.evaluate import Evaluator
from optloop.loop.optimizers import registry
from optloop.loop.optimizers.base import Optimizer, default_threads
from optloop.loop.optimizers.work import modeled_work
from optloop.loop.policy import (
    FEW_QUESTIONS,
    check_knobs,
    check_start,
    choose_targets,
    control_sites,
    held_out_intervals,
    promotion,
    questions,
    small_split_warning,
    split_dataset,
    start_candidate,
)
from optloop.loop.proposals.gate import logs_under, refusals
from optloop.loop.runs import checkpoint_guard
from optloop.loop.runs.context import RunContext
from optloop.loop.runs.dirs import Unfinished, in_use, matches, unfinished_runs
from optloop.loop.runs.dirs import lock_dir as _lock_dir
from optloop.loop.runs.split_evaluator import SplitEvaluator
from optloop.loop.spending.estimate import (
    Estimate,
    OptimizerWork,
    answer_path,
    estimate,
    measured_chains,
    measured_work,
    work_units,
)
from optloop.loop.spending.eta import Eta, TrialLine
from optloop.loop.spending.limits import STOPPED_BY, RunStopped, SpendingLimits
from optloop.loop.spending.shape import RunShape, run_shape
from optloop.loop.state import (
    MAX_BUDGET,
    Checkpoint,
    LoopConfig,
    LoopResult,
    Trial,
    Tried,
    check_fractions,
)
from optloop.loop.tracking import run as mlflow_run
from optloop.loop.tracking.sink import MlflowSink
from optloop.loop.trivial_control import widens
from optloop.loop.workers.coordinator import LocalCoordinator, SharedCoordinator
from optloop.paths import state_dir
from optloop.sites import PROPOSER
from systems import get_system

logger = logging.getLogger(__name__)

Coordinators = LocalCoordinator | SharedCoordinator


def check_start_sites(cfg: LoopConfig, lm: Any) -> None:
    """Refuse (:class:`ConfigError`) a ``--start`` or ``--sites`` naming no site of the system, a
    ``--knob`` the system lacks or of the wrong type, or ``--query-rewrite`` on a system that never
    searches, before any state of the run is written: the system is built with ``lm`` (its LM calls
    none) in a throwaway directory."""
    check_knobs(cfg, get_system(cfg.system))
    if not (cfg.start or cfg.query_rewrite or cfg.sites):
        return
    with tempfile.TemporaryDirectory(prefix="optloop-sites-") as tmp:
        probe = get_system(cfg.system)(lm, Path(tmp), query_site=cfg.query_rewrite)
        sites = list(probe.prompt_sites())
        check_start(cfg, sites)
        if cfg.sites:
            choose_targets([], cfg, sites)  # refuses an unknown --sites name
        getattr(probe, "close", lambda: None)()


def run_evaluator(
    config: LoopConfig,
    lm: Any,
    work: Path,
    *,
    dataset_uri: str,
    allowed_failed_share: float = failures.ALLOWED_SHARE,
) -> Evaluator:
    """The :class:`Evaluator` a run of ``config`` evaluates its candidates with, in ``work``: the
    system with the run's knobs and query-rewrite site, on ``lm``, for the dataset
    ``dataset_uri`` (``allowed_failed_share``: ``--max-failed-share``). :func:`start_candidate`
    of it is the program the run starts from."""
    return Evaluator(
        config.system,
        lm,
        work,
        knobs=config.knobs,
        dataset_uri=dataset_uri,
        query_site=config.query_rewrite,
        allowed_failed_share=allowed_failed_share,
    )


class Loop:
    """One ``optloop.run``: the wiring around :class:`~optloop.loop.controller.Controller`, which
    knows nothing of MLflow, Optuna or files beyond its checkpoint. A ``Loop`` owns:

    - the state directory and its lock (one process per directory; another worker of a shared run
      takes ``workers/<n>/``), and the checkpoint's settings check (:mod:`optloop.loop.runs.dirs`);
    - the MLflow experiment (created under a lock: workers starting together race for it) and the
      parent run (created by the leading worker, resumed by id, ended with the run's status:
      :mod:`optloop.loop.tracking.run`);
    - the real implementations of the controller's interfaces (:mod:`optloop.loop.interfaces`):
      :class:`~optloop.loop.runs.split_evaluator.SplitEvaluator` (the
      :class:`~optloop.loop.evaluate.Evaluator` over the run's splits),
      :class:`~optloop.loop.tracking.sink.MlflowSink`, and a
      :class:`~optloop.loop.workers.coordinator.LocalCoordinator` or, for an optimizer that shares
      a study (``--optimizer optuna``), a
      :class:`~optloop.loop.workers.coordinator.SharedCoordinator`;
    - the optimizer factory (:mod:`~optloop.loop.optimizers.registry`), the cost accounting and the
      projection after the baseline.

    The checkpoint, ``<state dir>/runs/<run name>/checkpoint.json``, is rewritten atomically after
    every step, so the same command resumes an interrupted run (found by
    :meth:`LoopConfig.resume_key`, or by ``--run-name``). An interrupt (``KeyboardInterrupt``:
    Ctrl-C, or SIGTERM as ``optloop.run`` maps it) ends the MLflow runs it leaves as KILLED; a
    spending limit (:class:`~optloop.loop.spending.limits.RunStopped`, at a step boundary) ends
    the parent run KILLED with the tag ``optloop.stopped_by``, which the next process to open the
    run removes.
    """

    def __init__(
        self,
        config: LoopConfig,
        lm: Any,
        proposer: Any,
        *,
        work: Path | None = None,
        progress: Callable[[str], None] | None = None,
        auto_named: bool = False,
        limits: SpendingLimits | None = None,
        prepared: tuple[Dataset, Dataset, Dataset, Dataset] | None = None,
    ):
        self.config = config
        # this process's --max-cost, --max-calls, --estimate
        self.limits = limits or SpendingLimits()
        # the run name was made up: the same command (no --run-name) resumes it
        self.auto_named = auto_named
        self.lm = lm
        self.proposer = proposer
        # created when claimed
        self.run_dir = work or state_dir(create=False) / "runs" / config.run_name
        # this worker's own directory (another one under workers/ when shared)
        self.state = self.run_dir
        self.progress = progress or (lambda msg: None)
        self.started = time.perf_counter()
        self._lock: Any = None
        # the dataset and its train, dev and test splits, once loaded and checked (see prepare)
        self._prepared = prepared
        # the system's prompt sites and their stages, once the run has begun
        self.site_stages: dict[str, str] = {}
        # the program the run starts from, once the run has begun
        self.start: Candidate | None = None
        # One line to the user (optloop.run prints it; a library caller gets a warning).
        self.announce: Callable[[str], None] = lambda line: logger.warning("%s", line)
        # Once the baseline is known and trials are to come: the projection of the whole run
        # (printed by the CLI)
        self.project: Callable[[Estimate, Checkpoint], None] = lambda figures, ckpt: None
        self.on_trial: Callable[[TrialLine], None] = lambda line: None  # one per evaluated trial

    # --- the run --------------------------------------------------------------------------

    def prepare(self) -> None:
        """Load and split the dataset and check ``--start``, ``--sites`` and ``--knob``: everything
        the run would refuse is refused here, before any state of the run is written (``run`` calls
        it when the caller did not)."""
        if self._prepared is not None:
            return
        cfg = self.config
        dataset = load_dataset(cfg.dataset)
        train, dev, test = split_dataset(dataset, cfg)
        check_start_sites(cfg, self.lm)
        self._prepared = (dataset, train, dev, test)

    def run(self) -> LoopResult:
        self.prepare()
        assert self._prepared is not None
        _, _, dev, test = self._prepared
        if warning := small_split_warning(questions(dev), questions(test)):
            logger.warning("%s", warning)
        self.state = self._claim_state_dir()
        try:
            return self._run(*self._prepared)
        finally:
            self._lock.close()
            # Stopped before its first checkpoint (a full disk, a store that cannot be made): leave
            # no empty run directory behind.
            with suppress(OSError):
                if [p.name for p in self.state.iterdir()] == [".lock"]:
                    (self.state / ".lock").unlink()
                    self.state.rmdir()

    def _claim_state_dir(self) -> Path:
        """The run directory, or for another worker of a shared run the first free
        ``workers/<n>``."""
        self._lock = _lock_dir(self.run_dir)
        if self._lock is not None:
            return self.run_dir
        if not registry.shared_study(self.config.optimizer):
            sharing = " or ".join(f"--optimizer {name}" for name in registry.sharing())
            raise ConfigError(
                f"run {self.config.run_name!r} is in use by another optloop.run process; wait "
                f"for it or pick another --run-name (only {sharing} splits a run "
                "between workers)"
            )
        n = 1
        while True:
            path = self.run_dir / "workers" / str(n)
            self._lock = _lock_dir(path)
            if self._lock is not None:
                return path
            n += 1

    def _storage(self) -> str:
        """The Optuna storage URL: ``--storage``, else the SQLite file in the run directory."""
        return self.config.storage or f"sqlite:///{(self.run_dir / 'optuna.db').resolve()}"

    def _run(self, dataset: Dataset, train: Dataset, dev: Dataset, test: Dataset) -> LoopResult:
        from optloop.services import tracking

        cfg = self.config
        ckpt_path = self.state / artifacts.CHECKPOINT
        ckpt = Checkpoint.load(ckpt_path) if ckpt_path.exists() else None
        if ckpt is not None and not matches(ckpt, cfg):
            raise ConfigError(
                f"run name {cfg.run_name!r} exists with other settings; resume it with the same "
                "command, or pick another --run-name"
            )
        tracking.configure(cfg.tracking_uri)
        experiment_id = mlflow_run.experiment(cfg.system, self.announce)
        ckpt = ckpt or Checkpoint(
            config_digest=cfg.digest(), resume_key=cfg.resume_key(), auto_named=self.auto_named
        )
        # a checkpoint from before resume keys existed
        ckpt.resume_key = ckpt.resume_key or cfg.resume_key()
        if ckpt.finished:
            raise ConfigError(
                f"run {cfg.run_name!r} already finished (MLflow run {ckpt.parent_run_id}); pick "
                "another --run-name to run again"
            )
        ckpt.split = {
            "train": [e.id for e in train.episodes],
            "dev": [e.id for e in dev.episodes],
            "test": [e.id for e in test.episodes],
        }
        # the worker id first: a restarted worker must find its slots and roles again
        ckpt.save(ckpt_path)
        coordinator: Coordinators = (
            SharedCoordinator.join(cfg, self._storage(), ckpt.worker, self.progress)
            if registry.shared_study(cfg.optimizer)
            else LocalCoordinator(cfg.budget, storage=self._storage(), study_name=cfg.run_name)
        )
        try:
            return self._run_parent(
                dataset, train, dev, test, ckpt, ckpt_path, experiment_id, coordinator
            )
        finally:
            coordinator.close()

    def _run_parent(
        self,
        dataset: Dataset,
        train: Dataset,
        dev: Dataset,
        test: Dataset,
        ckpt: Checkpoint,
        ckpt_path: Path,
        experiment_id: str,
        coordinator: Coordinators,
    ) -> LoopResult:
        import mlflow
        from mlflow.tracking import MlflowClient

        cfg = self.config
        dspy.configure(lm=self.lm, adapter=dspy.JSONAdapter())
        evaluator = run_evaluator(
            cfg,
            self.lm,
            self.state / "work",
            dataset_uri=dataset.uri,
            allowed_failed_share=self.limits.max_failed_share,
        )
        evaluator.register(train, dev, test)
        self.site_stages = {name: site.stage for name, site in evaluator.sites.items()}
        mark = self.lm.accounting.mark()
        proposer_mark = self.proposer.accounting.mark() if self.proposer is not self.lm else None
        run_id = ckpt.parent_run_id or coordinator.leader_parent_run_id()
        # another store than the run's first: a new parent run, the trials logged again
        relog = False
        if run_id and checkpoint_guard.parent_run_missing(run_id):
            uri = mlflow.get_tracking_uri()
            self.announce(checkpoint_guard.lost_parent_line(cfg, run_id, uri, ckpt))
            relog, run_id, ckpt.parent_run_id = True, None, None
        if run_id:
            parent = mlflow.start_run(run_id=run_id)
        else:
            parent = mlflow.start_run(
                experiment_id=experiment_id,
                run_name=cfg.run_name,
                tags={"optloop.system": cfg.system, "optloop.optimizer": cfg.optimizer},
            )
        ckpt.parent_run_id = parent.info.run_id
        ckpt.save(ckpt_path)
        # a limit stopped an earlier process; this one takes the run up again
        if parent.data.tags.get(STOPPED_BY):
            MlflowClient().delete_tag(parent.info.run_id, STOPPED_BY)
        status = "FAILED"
        try:
            coordinator.adopt_parent_run(ckpt.parent_run_id)
            if coordinator.leads and (relog or (not ckpt.trials and not ckpt.baseline_dev)):
                mlflow_run.log_params(cfg, evaluator, train, dev, test, self.lm.model)
            self.start = start_candidate(evaluator, cfg)
            splits = SplitEvaluator(
                evaluator, {"train": train, "dev": dev, "test": test}, self.progress
            )
            sink = MlflowSink(cfg.system, ckpt.parent_run_id, self.state, evaluator.modules)
            if relog:
                checkpoint_guard.relog_trials(
                    sink, ckpt, self.start, splits.prompt_texts, coordinator.trial_tags()
                )
                ckpt.save(ckpt_path)
            context = RunContext(
                config=cfg,
                checkpoint=ckpt,
                path=ckpt_path,
                base=self.start,
                progress=self.progress,
                cost=lambda: self._cost(mark, proposer_mark),
                limits=self.limits,
                baseline_done=self._projection,
                trial_done=self.on_trial,
                # every worker's gate logs on this host (the run's directory and workers/ in it)
                proposals=lambda: refusals(logs_under(self.run_dir)),
            )
            controller = Controller(
                context,
                splits,
                sink,
                coordinator,
                lambda sites, knobs: self._optimizer(evaluator, train, sites, knobs, coordinator),
            )
            result = controller.run()
            # What the proposal gate said of the optimizer's proposals, by reason (every process
            # of the run appended to the same logs: optloop.loop.proposals.gate), as published.
            if result.proposals:
                mlflow.log_metrics(
                    {f"proposals/{reason}": float(n) for reason, n in result.proposals.items()},
                    run_id=parent.info.run_id,
                )
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        except RunStopped as stop:  # a step boundary: the checkpoint is complete, no trial is open
            status = "KILLED"
            MlflowClient().set_tag(parent.info.run_id, STOPPED_BY, stop.reason)
            raise
        finally:
            if status != "FINISHED" and _quiet(coordinator.finished_elsewhere):
                status = "FINISHED"  # this worker failed after another one finished the run
            mlflow_run.end_runs(parent.info.run_id, status)
            evaluator.close()

    def _optimizer(
        self,
        evaluator: Evaluator,
        train: Dataset,
        sites: list[str],
        knobs: list[str],
        coordinator: Coordinators,
    ) -> Optimizer:
        cfg = self.config
        cls = registry.optimizer_class(cfg.optimizer)
        kwargs: dict[str, Any] = {
            "sites": sites,
            "knobs": knobs if registry.tunes_knobs(cfg.optimizer) else [],
            "seed": cfg.seed,
            "batch": cfg.batch,
        }
        if registry.shared_study(cfg.optimizer):
            kwargs |= coordinator.optimizer_kwargs()
        optimizer = cls(evaluator, self.proposer, train, **kwargs)
        optimizer.progress = lambda message: self.progress(message)
        return optimizer

    def estimate(self, ckpt: Checkpoint) -> Estimate:
        """``--estimate``'s projection of the whole run from ``ckpt``'s baseline
        (:func:`~optloop.loop.spending.estimate.estimate`):
        this run's splits, ``--concurrency``, ``--batch``, the optimizer's work and the proposer's
        price."""
        self.prepare()
        assert self._prepared is not None
        _, _, dev, test = self._prepared
        own_proposer = self.proposer is not self.lm
        price = (self.proposer if own_proposer else self.lm).settings.price()
        shape = self.run_shape(ckpt)
        work = self.optimizer_work(ckpt, shape)
        ingest = {name for name, stage in self.site_stages.items() if stage == "ingest"}
        trial = (
            None
            if shape.ingest_sites or ckpt.baseline_dev is None
            else answer_path(ckpt.baseline_dev, ingest)
        )
        return estimate(
            ckpt,
            budget=self.config.budget,
            concurrency=self.lm.settings.concurrency or 1,
            dev_units=work_units(dev),
            test_units=work_units(test),
            chains=measured_chains(ckpt, dev, test),
            optimizer=work,
            own_proposer=own_proposer,
            proposer_price=None if price is None else (price.input, price.output),
            batch=self.config.batch,
            trial=trial,
            control=self.has_control(ckpt),
            control_train=ckpt.control_train is not None or widens(ckpt, self.config),
        )

    def has_control(self, ckpt: Checkpoint) -> bool:
        """Whether the run of ``ckpt``'s baseline evaluates the trivial-instruction control: not
        with ``--no-control``, nor when the baseline's blame names no prompt site (the sites as
        the controller chooses them: :func:`~optloop.loop.policy.control_sites`)."""
        if not self.config.control:
            return False
        train, dev = ckpt.baseline_train, ckpt.baseline_dev
        if ckpt.control_dev is not None or train is None or dev is None:
            return ckpt.control_dev is not None
        entries = blame(
            [a for ev in (train, dev) for a in ev.attributions()], passed=train.passed + dev.passed
        )
        return bool(control_sites(entries, self.config, list(self.site_stages))[0])

    def _projection(self, ckpt: Checkpoint) -> Eta | None:
        """After the baseline, before the trials: the projection of the whole run, announced, and
        the ETA it starts (``None`` when it cannot be made: the run goes on without one)."""
        try:
            figures = self.estimate(ckpt)
        # a projection is advice: the run goes on without it
        except Exception as exc:  # noqa: BLE001
            logger.warning("no projection of the run's cost and time: %s", exc)
            return None
        self.project(figures, ckpt)
        return Eta.of(figures, self.config.budget)

    def optimizer_work(self, ckpt: Checkpoint, shape: RunShape) -> OptimizerWork | None:
        """The optimizer's own work over the whole run (for ``--estimate``), once ``ckpt`` holds
        the baseline: measured on its finished trials when it has some
        (:func:`~optloop.loop.spending.estimate.measured_work`), else the optimizer's model
        (:func:`~optloop.loop.optimizers.work.modeled_work`) on this run's ``shape``
        (:meth:`run_shape`); ``None`` when neither can say."""
        model = modeled_work(shape, self.config.optimizer)
        return measured_work(ckpt, model, self.config.budget) or model

    def run_shape(self, ckpt: Checkpoint) -> RunShape:
        """This run's shape once ``ckpt`` holds the baseline: its target sites, those at the
        ingest stage among them, its per-request rates
        (:func:`~optloop.loop.spending.shape.run_shape`).
        """
        self.prepare()
        assert self._prepared is not None
        _, train, _, _ = self._prepared
        return run_shape(
            ckpt,
            self.config,
            train,
            stages=self.site_stages,
            start=self.start,
            threads=default_threads(self.lm),
        )

    def _cost(self, mark: int, proposer_mark: int | None) -> dict[str, int | float]:
        """What this process spent since ``mark``: LLM calls, tokens, seconds, dollars where the
        model has a price (``cost_usd``), and the same per prompt site
        (:func:`~optloop.loop.cost.site_metrics`); a proposer LM of its own as ``proposer_*``."""
        usage = self.lm.accounting.totals(since=mark)
        cost: dict[str, int | float] = {
            "llm_calls": usage.calls,
            "model_calls": usage.model_calls,
            "tokens": usage.tokens,
            "seconds": round(time.perf_counter() - self.started, 1),
        }
        if usage.cost_usd is not None:
            cost["cost_usd"] = usage.cost_usd
        if proposer_mark is not None:
            p = self.proposer.accounting.totals(since=proposer_mark)
            cost |= {
                "proposer_llm_calls": p.calls,
                "proposer_model_calls": p.model_calls,
                "proposer_tokens": p.tokens,
            }
            if p.cost_usd is not None:
                cost["proposer_cost_usd"] = p.cost_usd
        cost["proposer_calls_in_system_lm"] = self.lm.accounting.totals(PROPOSER, since=mark).calls
        return cost | site_metrics(site_costs(self.lm.accounting.by_site(since=mark)))


def _quiet(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``None`` if it fails (for best-effort reads while a run is already failing)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None


__all__ = [
    "FEW_QUESTIONS",
    "MAX_BUDGET",
    "Checkpoint",
    "Loop",
    "LoopConfig",
    "LoopResult",
    "SplitEvaluator",
    "Trial",
    "Tried",
    "Unfinished",
    "check_fractions",
    "check_start",
    "check_start_sites",
    "choose_targets",
    "held_out_intervals",
    "in_use",
    "matches",
    "promotion",
    "run_evaluator",
    "small_split_warning",
    "split_dataset",
    "start_candidate",
    "unfinished_runs",
]
