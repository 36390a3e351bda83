"""The closed loop: baseline, attribute, blame, optimize the blamed sites, evaluate held out, register.

    split by episode ─► baseline on train + dev ─► attribute failures ─► blame
        ─► for trial 1..budget: optimizer proposes (only blamed sites) ─► evaluate on dev
           (child run) ─► if better: new best, re-attribute, retarget the optimizer
        ─► baseline and best on test ─► parent metrics, artifacts, prompt registry

State lives in ``<state dir>/runs/<run name>/checkpoint.json``, rewritten
atomically after every step, so the same command with the same ``--run-name``
resumes an interrupted run: finished evaluations are read back, a trial whose
child run was left half-done is deleted from MLflow and redone, nothing is
counted twice.

Several workers (``--optimizer optuna``): every process started with the same
command joins one Optuna study (``--storage``; the SQLite file in the run
directory by default, ``postgresql://...`` across machines) and they split
the budget through it (:mod:`optloop.loop.study`): the first worker creates the
MLflow parent run and evaluates the baseline, every worker logs its trials as
child runs of that parent, and the worker that sees the last evaluation done
runs the held-out test and the summary; the others print its result. Each
process holds a lock on its own state directory (the run directory, else
``workers/<n>/`` under it), so workers on one machine never share a checkpoint
or a store, and a restarted worker resumes a dead one's state.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any, Literal

import dspy
from pydantic import BaseModel, Field, field_validator

from optloop.attribution import blame
from optloop.attribution.taxonomy import KNOB_PREFIX, is_prompt_site
from optloop.datasets import Dataset, load_dataset, split_episodes
from optloop.errors import ConfigError, DatasetError, OptloopError
from optloop.loop import record
from optloop.loop.candidate import Candidate, prompt_diff, prompt_text
from optloop.loop.evaluate import Evaluation, Evaluator
from optloop.loop.optimizers import OPTIMIZERS, Optimizer
from optloop.lm import redact_url
from optloop.loop.study import SharedStudy
from optloop.paths import state_dir, write_atomic
from systems import get_system
from optloop.stats import Interval, bootstrap_mean, paired_bootstrap_delta

logger = logging.getLogger(__name__)

MAX_BUDGET = 500
FEW_QUESTIONS = 20  # fewer dev or test questions than this and a 95% CI spans more than about ±0.2


def check_fractions(fractions: tuple[float, ...]) -> tuple[float, float, float]:
    """``fractions`` if they are three shares above 0 summing to 1 (within 1e-6), else a ValueError saying
    what to fix."""
    if len(fractions) != 3:
        raise ValueError(f"give three fractions TRAIN,DEV,TEST (e.g. 0.5,0.25,0.25), not {len(fractions)}")
    if any(not f > 0 for f in fractions):
        raise ValueError("every fraction must be above 0: each split needs episodes")
    if abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"the fractions sum to {sum(fractions):g}; they must sum to 1")
    return fractions[0], fractions[1], fractions[2]


class LoopConfig(BaseModel):
    """Everything a run depends on (logged as the parent run's params)."""

    system: str
    dataset: str = "builtin:tiny"
    budget: int = Field(3, ge=1, le=MAX_BUDGET)
    optimizer: Literal["simba", "gepa", "optuna", "edit"] = "simba"
    seed: int = 0
    untargeted: bool = False
    sites: list[str] | None = None
    run_name: str
    tracking_uri: str | None = None
    storage: str | None = None
    lm: str = "local"
    proposer_lm: str = "same"
    knobs: dict[str, Any] = Field(default_factory=dict)
    start: dict[str, str] = Field(default_factory=dict,
                                  description="site -> instruction the run starts from instead of the system's own ('+TEXT': appended to it) "
                                              "(a product's current prompt, or a benchmark's sabotage)")
    fractions: tuple[float, float, float] = (0.5, 0.25, 0.25)
    promote_if: Literal["ci", "delta"] = Field("ci", description="the champion alias moves when the held-out "
                                                                 "delta's CI is above 0 (ci) or its point (delta)")

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        return check_fractions(value)

    def digest(self, *, shared: bool = False) -> str:
        """What must match for a run name to be resumed (the tracking URI may move), or, with ``shared``,
        for a worker to join a study (reached by another URL on another machine, perhaps)."""
        payload = self.model_dump(exclude={"tracking_uri", "storage"} if shared else {"tracking_uri"})
        return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Trial(BaseModel):
    trial: int
    candidate: Candidate
    evaluation: Evaluation | None = None
    child_run_id: str | None = None
    improved: bool = False


class Checkpoint(BaseModel):
    config_digest: str
    worker: str = Field(default_factory=lambda: uuid.uuid4().hex[:12],
                        description="this worker's id in a shared study (kept across resumes)")
    parent_run_id: str | None = None
    split: dict[str, list[str]] = Field(default_factory=dict)
    baseline_train: Evaluation | None = None
    baseline_dev: Evaluation | None = None
    targets: list[str] = Field(default_factory=list)
    trials: list[Trial] = Field(default_factory=list)
    queue: list[Candidate] = Field(default_factory=list)
    test_before: Evaluation | None = None
    test_after: Evaluation | None = None
    registered: dict[str, Any] = Field(default_factory=dict)
    finished: bool = False

    def save(self, path: Path) -> None:
        write_atomic(path, self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            return cls.model_validate_json(path.read_text())
        except Exception as exc:  # noqa: BLE001 - a corrupt checkpoint is the user's to remove
            raise ConfigError(f"checkpoint {path} is unreadable ({type(exc).__name__}); delete that run directory "
                              "or pick another --run-name") from None


class Tried(BaseModel):
    """One evaluated candidate, for the summary: what the optimizer tried and how it scored on dev."""

    trial: int
    origin: str
    changed: list[str]
    dev: float

    @classmethod
    def of(cls, trial: int, candidate: Candidate, dev: float, base: Candidate) -> Tried:
        return cls(trial=trial, origin=candidate.origin, dev=dev,
                   changed=candidate.changed_sites(base) + [f"knob:{k}" for k in candidate.changed_knobs(base)])


class LoopResult(BaseModel):
    config: LoopConfig
    parent_run_id: str
    targets: list[str]
    tunable_sites: list[str]
    tunable_knobs: list[str]
    baseline_dev: float
    best_dev: float
    best_trial: int
    test_before: float
    test_after: float
    evaluations: int
    changed_sites: list[str]
    changed_knobs: dict[str, Any]
    promoted: bool
    promotion_reason: str = Field(description="why the champion alias moved or did not (see promotion())")
    registered: dict[str, Any]
    cost: dict[str, int | float]
    n_dev: int = Field(description="dev questions")
    n_test: int = Field(description="held-out test questions")
    test_before_ci: Interval = Field(description="baseline's test accuracy, bootstrap CI over test questions")
    test_after_ci: Interval = Field(description="best candidate's test accuracy, bootstrap CI over test questions")
    delta_test_ci: Interval = Field(description="after - before per test question, paired bootstrap CI")
    tried: list[Tried] = Field(default_factory=list, description="every evaluated candidate, in trial order")
    prompt_diff: str = Field("", description="unified diff of the start prompts and the best candidate's")
    note: str = ""

    @property
    def delta_test(self) -> float:
        return self.test_after - self.test_before


def held_out_intervals(before: Evaluation, after: Evaluation, *, seed: int) -> tuple[Interval, Interval, Interval]:
    """(test accuracy before, after, delta), each with its bootstrap CI over the test questions; the delta
    pairs each question's pass before with its pass after by (episode, question)."""
    passed_after = {(o.episode_id, o.question_id): float(o.passed) for o in after.outcomes}
    pairs = [(float(o.passed), passed_after[key]) for o in before.outcomes
             if (key := (o.episode_id, o.question_id)) in passed_after]
    return (bootstrap_mean([float(o.passed) for o in before.outcomes], seed=seed),
            bootstrap_mean([float(o.passed) for o in after.outcomes], seed=seed),
            paired_bootstrap_delta([b for b, _ in pairs], [a for _, a in pairs], seed=seed))


def promotion(rule: Literal["ci", "delta"], changed: bool, delta: Interval) -> tuple[bool, str]:
    """(move the ``champion`` alias?, why): with ``ci`` only when the held-out delta's CI lies above 0,
    with ``delta`` when its point value is above 0; a candidate that changed nothing never moves it."""
    if not changed:
        return False, "the baseline stayed best on dev: no new prompt to promote"
    level = f"{delta.confidence:.0%} CI"
    where = "is above 0" if delta.above_zero else "is below 0" if delta.high < 0 else "includes 0"
    if rule == "ci":
        moved, why = delta.above_zero, f"its {level} {where}"
    else:
        moved = delta.estimate > 0
        why = f"the point delta is {'above' if moved else 'not above'} 0 (its {level} {where})"
    return moved, (f"held-out delta {delta}: {why}, champion {'moved' if moved else 'not moved'} "
                   f"(--promote-if {rule})")


def small_split_warning(n_dev: int, n_test: int) -> str | None:
    """A warning when dev or test is too small for its accuracy to mean much (``None`` when both are fine)."""
    if min(n_dev, n_test) >= FEW_QUESTIONS:
        return None
    spread = 1.96 * 0.5 / math.sqrt(max(min(n_dev, n_test), 1))  # a 95% CI's half-width at accuracy 0.5
    return (f"dev has {n_dev} questions, test {n_test}: a 95% CI this small spans about \u00b1{spread:.1f}; "
            "use more episodes (?limit=) or --split")


def split_dataset(dataset: Dataset, config: LoopConfig) -> tuple[Dataset, Dataset, Dataset]:
    if len(dataset.episodes) < 3:
        raise DatasetError(f"{dataset.uri}: the loop splits train/dev/test by episode and needs at least 3 "
                           f"episodes; this dataset has {len(dataset.episodes)}")
    train, dev, test = split_episodes(dataset, config.fractions, seed=config.seed)
    for part in (train, dev, test):
        if not any(e.questions for e in part.episodes):
            raise DatasetError(f"{part.name} has no question; use a dataset with more episodes")
    return train, dev, test


def choose_targets(entries: list[Any], config: LoopConfig, all_sites: list[str]) -> tuple[list[str], list[str], str]:
    """(sites, knobs, note): what the optimizer may change."""
    if config.sites:
        unknown = sorted(set(config.sites) - set(all_sites))
        if unknown:
            raise ConfigError(f"--sites {','.join(unknown)}: no such site on {config.system}; its sites are "
                              f"{', '.join(all_sites)}")
        return list(config.sites), [], "sites given by --sites"
    knobs = [e.target.removeprefix(KNOB_PREFIX) for e in entries if e.is_knob]
    if config.untargeted:
        return list(all_sites), knobs, "untargeted: every prompt site"
    sites = [e.target for e in entries if is_prompt_site(e.target) and e.target in all_sites]
    if sites:
        return sites, knobs, ""
    note = ("no prompt site is to blame" + (f" (blame: {', '.join(e.target for e in entries)})" if entries else
                                            " (no failure was attributed to a site)")
            + "; the optimizer targets the answer site" + ("; --optimizer optuna also tunes the blamed knobs"
                                                           if knobs else ""))
    return ["answer"], knobs, note


def start_candidate(evaluator: Evaluator, config: LoopConfig) -> Candidate:
    """The program the run starts from: the system's own prompts, with ``config.start``'s instructions."""
    base = evaluator.baseline()
    check_start(config, list(base.sites))
    if not config.start:
        return base
    sites = {name: state.model_copy(update={"instructions": _start_text(state.instructions, config.start[name])})
             if name in config.start else state for name, state in base.sites.items()}
    return Candidate(sites=sites, knobs=base.knobs, origin="baseline (start instructions)")


def check_start(config: LoopConfig, sites: list[str]) -> None:
    unknown = sorted(set(config.start) - set(sites))
    if unknown:
        raise ConfigError(f"--start {', '.join(unknown)}: no such site on {config.system}; its sites are "
                          f"{', '.join(sites)}")


def _start_text(own: str, start: str) -> str:
    """A start instruction: ``start`` itself, or with a leading ``+`` the site's own instruction with it appended."""
    return f"{own.rstrip()} {start[1:].strip()}" if start.startswith("+") else start


def _lock_dir(path: Path) -> Any | None:
    """An exclusive lock on ``path`` for this process's lifetime (the open file holds it); ``None`` when
    another process holds it."""
    path.mkdir(parents=True, exist_ok=True)
    handle = open(path / ".lock", "a+")  # noqa: SIM115 - held open until the run ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


class Loop:
    """One ``optloop.run``: see the module docstring."""

    def __init__(self, config: LoopConfig, lm: Any, proposer: Any, *, work: Path | None = None,
                 progress: Callable[[str], None] | None = None):
        self.config = config
        self.lm = lm
        self.proposer = proposer
        self.run_dir = work or state_dir() / "runs" / config.run_name
        self.state = self.run_dir  # this worker's own directory (another one under workers/ when shared)
        self.progress = progress or (lambda msg: None)
        self.started = time.perf_counter()
        self._lock: Any = None

    # --- the run --------------------------------------------------------------------------

    def run(self) -> LoopResult:
        cfg = self.config
        dataset = load_dataset(cfg.dataset)
        train, dev, test = split_dataset(dataset, cfg)
        if warning := small_split_warning(_questions(dev), _questions(test)):
            logger.warning("%s", warning)
        if cfg.start:  # an unknown site is refused before any state of the run is written
            import tempfile

            with tempfile.TemporaryDirectory(prefix="optloop-sites-") as tmp:
                probe = get_system(cfg.system)(self.lm, Path(tmp))
                check_start(cfg, list(probe.prompt_sites()))
                getattr(probe, "close", lambda: None)()
        self.state = self._claim_state_dir()
        try:
            return self._run(dataset, train, dev, test)
        finally:
            self._lock.close()

    def _claim_state_dir(self) -> Path:
        """The run directory, or for another worker of a shared run the first free ``workers/<n>``."""
        self._lock = _lock_dir(self.run_dir)
        if self._lock is not None:
            return self.run_dir
        if self.config.optimizer != "optuna":
            raise ConfigError(f"run {self.config.run_name!r} is in use by another optloop.run process; wait for it "
                              "or pick another --run-name (only --optimizer optuna splits a run between workers)")
        n = 1
        while True:
            path = self.run_dir / "workers" / str(n)
            self._lock = _lock_dir(path)
            if self._lock is not None:
                return path
            n += 1

    def _run(self, dataset: Dataset, train: Dataset, dev: Dataset, test: Dataset) -> LoopResult:
        from optloop import tracking

        cfg = self.config
        ckpt_path = self.state / "checkpoint.json"
        ckpt = Checkpoint.load(ckpt_path) if ckpt_path.exists() else None
        if ckpt is not None and ckpt.config_digest != cfg.digest():
            raise ConfigError(f"run name {cfg.run_name!r} exists with other settings; resume it with the same "
                              "command, or pick another --run-name")
        tracking.configure(cfg.tracking_uri)
        experiment_id = self._experiment()
        ckpt = ckpt or Checkpoint(config_digest=cfg.digest())
        if ckpt.finished:
            raise ConfigError(f"run {cfg.run_name!r} already finished (MLflow run {ckpt.parent_run_id}); pick another "
                              "--run-name to run again")
        ckpt.split = {"train": [e.id for e in train.episodes], "dev": [e.id for e in dev.episodes],
                      "test": [e.id for e in test.episodes]}
        ckpt.save(ckpt_path)  # the worker id first: a restarted worker must find its slots and roles again
        shared = self._join(ckpt) if cfg.optimizer == "optuna" else None
        try:
            return self._run_parent(dataset, train, dev, test, ckpt, ckpt_path, experiment_id, shared)
        finally:
            if shared is not None:
                shared.close()

    def _run_parent(self, dataset: Dataset, train: Dataset, dev: Dataset, test: Dataset, ckpt: Checkpoint,
                    ckpt_path: Path, experiment_id: str, shared: SharedStudy | None) -> LoopResult:
        import mlflow

        cfg = self.config
        dspy.configure(lm=self.lm, adapter=dspy.JSONAdapter())
        evaluator = Evaluator(cfg.system, self.lm, self.state / "work", knobs=cfg.knobs, dataset_uri=dataset.uri)
        evaluator.register(train, dev, test)
        mark = self.lm.accounting.mark()
        proposer_mark = self.proposer.accounting.mark() if self.proposer is not self.lm else None
        leads = shared is None or shared.leader
        if ckpt.parent_run_id:
            parent = mlflow.start_run(run_id=ckpt.parent_run_id)
        elif leads:
            parent = mlflow.start_run(experiment_id=experiment_id, run_name=cfg.run_name,
                                      tags={"optloop.system": cfg.system, "optloop.optimizer": cfg.optimizer})
        else:
            parent = mlflow.start_run(run_id=self._wait_for_leader(shared, "optloop:parent_run_id",
                                                                   "the MLflow parent run"))
        ckpt.parent_run_id = parent.info.run_id
        ckpt.save(ckpt_path)
        status = "FAILED"
        try:
            if shared is not None and leads and shared.claim("optloop:parent_run_id", ckpt.parent_run_id) != \
                    ckpt.parent_run_id:
                raise ConfigError(f"study {cfg.run_name!r} already has another MLflow parent run; pick another "
                                  "--run-name")
            if leads and not ckpt.trials and not ckpt.baseline_dev:
                params = cfg.model_dump(exclude={"knobs", "fractions", "start"})
                params["start_sites"] = ",".join(cfg.start) or "-"  # the texts are in prompts_before.json
                params |= {"storage": redact_url(cfg.storage), "tracking_uri": redact_url(cfg.tracking_uri)}
                mlflow.log_params({**{k: str(v) for k, v in params.items()},
                                   "knobs": json.dumps(evaluator.template.knobs()), "fractions": str(cfg.fractions),
                                   "split_train": len(train.episodes), "split_dev": len(dev.episodes),
                                   "split_test": len(test.episodes), "lm_identity": self.lm.model})
            result = self._loop(evaluator, ckpt, ckpt_path, train, dev, test, mark, proposer_mark, shared)
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            if status != "FINISHED" and shared is not None and _quiet(lambda: shared.get("optloop:result")):
                status = "FINISHED"  # this worker failed after another one finished the run
            mlflow.end_run(status)
            evaluator.close()

    def _experiment(self) -> str:
        """The experiment id. Workers starting together race to create the experiment, and on one machine
        to create the SQLite store's tables (MLflow's migrations are not safe to run twice at once): the
        latter is serialized by a lock file beside the store, the former retried."""
        import mlflow

        from optloop import tracking

        uri = mlflow.get_tracking_uri()
        lock = None
        if uri.startswith("sqlite:///"):
            db = Path(uri.removeprefix("sqlite:///"))
            db.parent.mkdir(parents=True, exist_ok=True)
            lock = open(db.with_name(f".{db.name}.lock"), "a+")  # noqa: SIM115 - closed below
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for attempt in range(3):
                try:
                    return tracking.experiment(f"optloop-{self.config.system}")
                except Exception:  # noqa: BLE001 - the loser of a creation race finds it on the next try
                    if attempt == 2:
                        raise
                    time.sleep(0.5 + attempt)
            raise AssertionError("unreachable")
        finally:
            if lock is not None:
                lock.close()

    def _join(self, ckpt: Checkpoint) -> SharedStudy:
        cfg = self.config
        storage = cfg.storage or f"sqlite:///{(self.run_dir / 'optuna.db').resolve()}"
        shared = SharedStudy(storage, cfg.run_name, worker=ckpt.worker, budget=cfg.budget, seed=cfg.seed)
        try:
            if shared.get("optloop:result") is not None:
                raise ConfigError(f"run {cfg.run_name!r} already finished (MLflow run "
                                  f"{shared.get('optloop:parent_run_id')}); pick another --run-name to run again")
            rank = shared.join(cfg.digest(shared=True))
        except BaseException:
            shared.close()
            raise
        if rank:
            self.progress(f"joined run {cfg.run_name} as worker {rank}")
            logger.info("joined study %s as worker %d (%s)", cfg.run_name, rank, ckpt.worker)
        return shared

    def _wait_for_leader(self, shared: SharedStudy | None, key: str, what: str) -> Any:
        assert shared is not None
        leader = shared.leader_id() or ""
        value = shared.wait_for(key, holder=leader, what=what, progress=self.progress)
        if value is None:
            raise OptloopError(f"{shared.describe(leader)}, the first worker of run {self.config.run_name!r}, "
                               f"stopped before publishing {what}; rerun the same command on that host to resume it")
        return value

    def _evaluate(self, evaluator: Evaluator, candidate: Candidate, dataset: Dataset, split: str) -> Evaluation:
        self.progress(f"evaluating {candidate.origin} on {split} ({sum(len(e.questions) for e in dataset.episodes)} "
                      "questions)")
        return evaluator.evaluate(candidate, dataset, split=split)

    def _loop(self, evaluator: Evaluator, ckpt: Checkpoint, ckpt_path: Path, train: Dataset, dev: Dataset,
              test: Dataset, mark: int, proposer_mark: int | None, shared: SharedStudy | None = None) -> LoopResult:
        import mlflow

        cfg = self.config
        base = start_candidate(evaluator, cfg)
        leads = shared is None or shared.leader
        if ckpt.baseline_dev is None and not leads:  # the first worker evaluates the baseline once for all
            for split in ("train", "dev"):
                data = self._wait_for_leader(shared, f"optloop:baseline_{split}", "the baseline evaluation")
                setattr(ckpt, f"baseline_{split}", Evaluation.model_validate(data))
            ckpt.save(ckpt_path)
        if ckpt.baseline_train is None:
            ckpt.baseline_train = self._evaluate(evaluator, base, train, "train")
            ckpt.save(ckpt_path)
        if ckpt.baseline_dev is None:
            ckpt.baseline_dev = self._evaluate(evaluator, base, dev, "dev")
            ckpt.save(ckpt_path)
            mlflow.log_metrics({"acc_dev": ckpt.baseline_dev.accuracy, "acc_dev_best": ckpt.baseline_dev.accuracy},
                               step=0)
        if shared is not None and leads:
            for split, ev in (("train", ckpt.baseline_train), ("dev", ckpt.baseline_dev)):
                shared.claim(f"optloop:baseline_{split}", ev.model_dump(mode="json"))
        base_evals = [ckpt.baseline_train, ckpt.baseline_dev]
        entries = blame([a for ev in base_evals for a in ev.attributions()])
        errors = dict(sum((Counter(ev.error_counts()) for ev in base_evals), Counter()))
        ckpt.targets = [e.target for e in entries]
        sites, knobs, note = choose_targets(entries, cfg, list(evaluator.sites))
        if leads:
            mlflow.log_metrics(record.blame_metrics(entries, errors))
            mlflow.set_tags({"optloop.targets": ",".join(ckpt.targets) or "-",
                             "optloop.tunable_sites": ",".join(sites), "optloop.tunable_knobs": ",".join(knobs) or "-",
                             "optloop.targeting_note": note or "-"})
        if note:
            logger.warning("%s", note)
        client = mlflow.tracking.MlflowClient()
        for t in [t for t in ckpt.trials if t.evaluation is None]:  # killed mid-trial: redo it cleanly
            if t.child_run_id:
                client.delete_run(t.child_run_id)
            ckpt.trials.remove(t)
            ckpt.queue.insert(0, t.candidate)
        ckpt.save(ckpt_path)
        if shared is not None:  # killed between its checkpoint and its report: report the evaluations now
            done = shared.done()
            for t in ckpt.trials:
                if t.trial - 1 not in done and t.evaluation is not None:
                    shared.publish_done(t.trial - 1, self._done_record(t))
        optimizer = self._optimizer(evaluator, train, sites, knobs, shared)
        optimizer.mark_seen(base)
        best, best_eval, best_trial = base, ckpt.baseline_dev, 0
        for t in ckpt.trials:
            optimizer.mark_seen(t.candidate)
            if t.evaluation is not None and t.evaluation.accuracy > best_eval.accuracy:
                best, best_eval, best_trial = t.candidate, t.evaluation, t.trial
        if best_trial:
            optimizer.retarget(*choose_targets(best_eval.blame(), cfg, list(evaluator.sites))[:2])
        if isinstance(getattr(optimizer, "queue", None), list):
            optimizer.queue = [c for c in ckpt.queue if c.digest() not in optimizer.seen]  # type: ignore[attr-defined]
            optimizer.seen |= {c.digest() for c in optimizer.queue}
        while self._budget_left(ckpt, shared):
            upcoming = len(ckpt.trials) + 1 if shared is None else len(shared.slots()) + 1
            self.progress(f"trial {upcoming}/{cfg.budget}: {optimizer.name} proposing for {', '.join(optimizer.sites)}")
            candidate = optimizer.propose(best, best_eval)
            ckpt.queue = list(getattr(optimizer, "queue", []))
            if candidate is None:
                note = (note + "; " if note else "") + f"{optimizer.name} proposed nothing new after " \
                       f"{len(ckpt.trials)} evaluation(s)" + (" by this worker" if shared is not None else "")
                break
            trial_no = self._take(ckpt, shared, optimizer, candidate)
            if trial_no is None:  # other workers took the rest of the budget meanwhile
                optimizer.release(candidate)
                break
            tags = {"optloop.worker": f"{shared.rank}:{shared.worker}"} if shared is not None else None
            with mlflow.start_run(run_name=f"trial-{trial_no}", nested=True, tags=tags) as child:
                trial = Trial(trial=trial_no, candidate=candidate, child_run_id=child.info.run_id)
                ckpt.trials.append(trial)
                ckpt.save(ckpt_path)
                evaluation = self._evaluate(evaluator, candidate, dev, "dev")
                self._log_child(evaluator, trial_no, base, candidate, evaluation)
            trial.evaluation = evaluation
            optimizer.observe(candidate, evaluation, trial_no)
            if evaluation.accuracy > best_eval.accuracy:
                trial.improved = True
                best, best_eval, best_trial = candidate, evaluation, trial_no
                new_entries = evaluation.blame()
                new_sites, new_knobs, _ = choose_targets(new_entries, cfg, list(evaluator.sites))
                if (new_sites, new_knobs) != (optimizer.sites, optimizer.knobs):
                    self.progress(f"re-attribution: blame moved to {', '.join(new_sites + new_knobs)}")
                    optimizer.retarget(new_sites, new_knobs)
            ckpt.save(ckpt_path)
            best_so_far = best_eval.accuracy
            if shared is not None:
                shared.publish_done(trial_no - 1, self._done_record(trial))
                shared.put_cost(self._cost(mark, proposer_mark))
                best_so_far = shared.best_accuracy(ckpt.baseline_dev.accuracy)
            mlflow.log_metrics({"acc_dev": evaluation.accuracy, "acc_dev_best": best_so_far}, step=trial_no)
        if shared is not None:
            return self._settle(shared, evaluator, ckpt, ckpt_path, base, test, entries, errors, sites, knobs, note,
                                mark, proposer_mark)
        if ckpt.test_before is None:
            ckpt.test_before = self._evaluate(evaluator, base, test, "test")
            ckpt.save(ckpt_path)
        if ckpt.test_after is None:
            ckpt.test_after = (ckpt.test_before if best is base else
                               self._evaluate(evaluator, best, test, "test"))
            ckpt.save(ckpt_path)
        points = [(0, ckpt.baseline_dev.accuracy)] + [(t.trial, t.evaluation.accuracy) for t in ckpt.trials
                                                      if t.evaluation is not None]
        tried = [Tried.of(t.trial, t.candidate, t.evaluation.accuracy, base) for t in ckpt.trials
                 if t.evaluation is not None]
        return self._finish(evaluator, ckpt, ckpt_path, base, best, best_trial, entries, errors, sites, knobs, note,
                            mark, proposer_mark, points=points, evaluations=len(ckpt.trials), tried=tried)

    def _budget_left(self, ckpt: Checkpoint, shared: SharedStudy | None) -> bool:
        return len(ckpt.trials) < self.config.budget if shared is None else shared.can_take()

    @staticmethod
    def _take(ckpt: Checkpoint, shared: SharedStudy | None, optimizer: Optimizer, candidate: Candidate) -> int | None:
        """The trial number ``candidate`` is evaluated as: the next of this checkpoint, or a budget slot of the
        shared study (``None`` when other workers took the last ones)."""
        if shared is None:
            return len(ckpt.trials) + 1
        slot = shared.take_slot(candidate.digest(), getattr(optimizer, "study_trial", lambda c: None)(candidate))
        return None if slot is None else slot + 1

    @staticmethod
    def _done_record(trial: Trial) -> dict[str, Any]:
        assert trial.evaluation is not None
        return {"trial": trial.trial, "accuracy": trial.evaluation.accuracy, "child_run_id": trial.child_run_id,
                "candidate": trial.candidate.model_dump(mode="json")}

    def _settle(self, shared: SharedStudy, evaluator: Evaluator, ckpt: Checkpoint, ckpt_path: Path, base: Candidate,
                test: Dataset, entries: list[Any], errors: dict[str, int], sites: list[str], knobs: list[str],
                note: str, mark: int, proposer_mark: int | None) -> LoopResult:
        """After this worker's last trial: finish the run if every evaluation is done and no other worker
        does it, else wait for the worker that finishes it; every worker returns the same result."""
        cfg = self.config
        if voided := shared.void_my_open_slots():
            logger.warning("trial(s) %s of an interrupted run of this worker were not redone: nothing new to propose",
                           ", ".join(str(k + 1) for k in voided))
        shared.put_cost(self._cost(mark, proposer_mark))
        shared.leave()
        while True:
            result = shared.get("optloop:result")
            if result is not None:
                ckpt.finished = True
                ckpt.save(ckpt_path)
                return LoopResult.model_validate(result)
            settled, waiting_on = shared.settled()
            if settled:
                finisher = shared.claim("optloop:finisher", shared.worker)
                if finisher == shared.worker:
                    return self._finish_shared(shared, evaluator, ckpt, ckpt_path, base, test, entries, errors, sites,
                                               knobs, note, mark, proposer_mark)
                waiting_on = [finisher]
            dead = [w for w in waiting_on if not shared.alive(w)]
            if dead:
                raise OptloopError(f"{shared.describe(dead[0])} of run {cfg.run_name!r} stopped before its part was "
                                   "done; rerun the same command on that host to resume it (this worker's trials are "
                                   "saved)")
            self.progress(f"budget spent or taken; waiting for {', '.join(shared.describe(w) for w in waiting_on)} "
                          "to finish the run")
            time.sleep(shared.poll)

    def _finish_shared(self, shared: SharedStudy, evaluator: Evaluator, ckpt: Checkpoint, ckpt_path: Path,
                       base: Candidate, test: Dataset, entries: list[Any], errors: dict[str, int], sites: list[str],
                       knobs: list[str], note: str, mark: int, proposer_mark: int | None) -> LoopResult:
        """The held-out test and the summary over every worker's trials (the best is the best of them all)."""
        assert ckpt.baseline_dev is not None
        done = sorted(shared.results().values(), key=lambda d: d["trial"])
        best, best_trial, best_accuracy = base, 0, ckpt.baseline_dev.accuracy
        for d in done:
            if d["accuracy"] > best_accuracy:
                best, best_trial, best_accuracy = Candidate.model_validate(d["candidate"]), d["trial"], d["accuracy"]
        if ckpt.test_before is None:
            ckpt.test_before = self._evaluate(evaluator, base, test, "test")
            ckpt.save(ckpt_path)
        if ckpt.test_after is None:
            ckpt.test_after = (ckpt.test_before if best is base else self._evaluate(evaluator, best, test, "test"))
            ckpt.save(ckpt_path)
        points = [(0, ckpt.baseline_dev.accuracy)] + [(d["trial"], d["accuracy"]) for d in done]
        result = self._finish(evaluator, ckpt, ckpt_path, base, best, best_trial, entries, errors, sites, knobs, note,
                              mark, proposer_mark, points=points, evaluations=len(done),
                              tried=[Tried.of(d["trial"], Candidate.model_validate(d["candidate"]), d["accuracy"], base)
                                     for d in done],
                              extra_cost=shared.others_cost(),
                              publish=lambda r: shared.claim("optloop:result", _shareable(r)))
        return LoopResult.model_validate(_shareable(result))  # the very result every other worker prints

    def _optimizer(self, evaluator: Evaluator, train: Dataset, sites: list[str], knobs: list[str],
                   shared: SharedStudy | None = None) -> Optimizer:
        cfg = self.config
        cls = OPTIMIZERS[cfg.optimizer]
        kwargs: dict[str, Any] = {"sites": sites, "knobs": knobs if cfg.optimizer == "optuna" else [], "seed": cfg.seed}
        if cfg.optimizer == "optuna":
            if shared is not None:
                kwargs["shared"] = shared
            else:
                storage = cfg.storage or f"sqlite:///{(self.run_dir / 'optuna.db').resolve()}"
                kwargs |= {"storage": storage, "study_name": cfg.run_name, "budget": cfg.budget}
        return cls(evaluator, self.proposer, train, **kwargs)

    # --- MLflow ---------------------------------------------------------------------------

    def _log_child(self, evaluator: Evaluator, trial: int, base: Candidate, candidate: Candidate,
                   evaluation: Evaluation) -> None:
        import mlflow

        changed = candidate.changed_sites(base)
        mlflow.log_params({"trial": trial, "origin": candidate.origin, "candidate": candidate.digest(),
                           "changed_sites": ",".join(changed) or "-",
                           "changed_knobs": json.dumps({k: candidate.knobs[k] for k in candidate.changed_knobs(base)})})
        mlflow.log_metrics({**record.evaluation_metrics(evaluation), **record.cost_metrics(evaluation),
                            **record.blame_metrics(evaluation.blame(), evaluation.error_counts())})
        record.log_json(candidate.model_dump(mode="json"), "candidate.json")
        record.log_text(prompt_diff(self._texts(evaluator, base), self._texts(evaluator, candidate)), "prompts.diff")
        record.log_json(record.attribution_report([evaluation], evaluation.blame()), "attribution.json")
        record.log_text(record.questions_csv(evaluation), "questions_dev.csv")

    @staticmethod
    def _texts(evaluator: Evaluator, candidate: Candidate) -> dict[str, str]:
        return {n: prompt_text(evaluator.sites[n], s) for n, s in candidate.sites.items() if n in evaluator.sites}

    def _cost(self, mark: int, proposer_mark: int | None) -> dict[str, int | float]:
        """What this process spent since ``mark``: LLM calls, tokens, seconds."""
        usage = self.lm.accounting.totals(since=mark)
        cost = {"llm_calls": usage.calls, "model_calls": usage.model_calls, "tokens": usage.tokens,
                "seconds": round(time.perf_counter() - self.started, 1)}
        if proposer_mark is not None:
            p = self.proposer.accounting.totals(since=proposer_mark)
            cost |= {"proposer_llm_calls": p.calls, "proposer_tokens": p.tokens}
        cost["proposer_calls_in_system_lm"] = self.lm.accounting.totals("optimizer.proposer", since=mark).calls
        return cost

    def _finish(self, evaluator: Evaluator, ckpt: Checkpoint, ckpt_path: Path, base: Candidate, best: Candidate,
                best_trial: int, entries: list[Any], errors: dict[str, int], sites: list[str], knobs: list[str],
                note: str, mark: int, proposer_mark: int | None, *, points: list[tuple[int, float]],
                evaluations: int, tried: list[Tried], extra_cost: dict[str, float] | None = None,
                publish: Callable[[LoopResult], Any] | None = None) -> LoopResult:
        """Parent metrics, artifacts and the prompt registry. ``points``: (trial, dev accuracy), baseline
        first; ``extra_cost``: what other workers of a shared run spent; ``publish``: hands the result to
        them before this checkpoint says finished."""
        import mlflow

        from optloop.loop.program import AllSites

        cfg = self.config
        before, after = ckpt.test_before, ckpt.test_after
        assert before is not None and after is not None and ckpt.baseline_dev is not None
        best_curve = list(accumulate((a for _, a in points), max))
        delta = after.accuracy - before.accuracy
        before_ci, after_ci, delta_ci = held_out_intervals(before, after, seed=cfg.seed)
        promoted, reason = promotion(cfg.promote_if, best is not base, delta_ci)
        n_dev, n_test = ckpt.baseline_dev.n, before.n
        cost = self._cost(mark, proposer_mark)
        for key, value in (extra_cost or {}).items():  # other workers' share (seconds: worker-seconds)
            cost[key] = round(cost.get(key, 0) + value, 1)
        mlflow.log_metrics({"acc_dev_baseline": ckpt.baseline_dev.accuracy,
                            "acc_dev_best_final": max(best_curve), "acc_test_before": before.accuracy,
                            "acc_test_after": after.accuracy, "delta_test": delta,
                            "n_dev": n_dev, "n_test": n_test, **record.interval_metrics("delta_test", delta_ci),
                            **record.interval_metrics("acc_test_before", before_ci),
                            **record.interval_metrics("acc_test_after", after_ci),
                            "evaluations": evaluations, **cost,
                            **record.evaluation_metrics(before, "acc_test_before"),
                            **record.evaluation_metrics(after, "acc_test_after"),
                            **{f"errors_test_before/{record.metric_key(t)}": n for t, n in before.error_counts().items()},
                            **{f"errors_test_after/{record.metric_key(t)}": n for t, n in after.error_counts().items()}})
        texts_before, texts_after = self._texts(evaluator, base), self._texts(evaluator, best)
        record.log_json(texts_before, "prompts_before.json")
        record.log_json(texts_after, "prompts_after.json")
        diff = prompt_diff(texts_before, texts_after)
        record.log_text(diff, "prompts.diff")
        record.log_json(best.model_dump(mode="json"), "best_candidate.json")
        record.log_json(record.attribution_report([ckpt.baseline_train, ckpt.baseline_dev], entries),  # type: ignore[list-item]
                        "attribution_report.json")
        record.log_text(record.questions_csv(before, after), "questions_test.csv")
        with_plots = self.state / "plots"
        with_plots.mkdir(parents=True, exist_ok=True)
        mlflow.log_artifact(str(record.plot_accuracy(points, best_curve, with_plots / "accuracy_by_trial.png")))
        mlflow.log_artifact(str(record.plot_blame(entries, with_plots / "blame_by_site.png")))
        program_path = self.state / "program.json"
        AllSites(evaluator.modules(best)).save(str(program_path))
        mlflow.log_artifact(str(program_path))
        changed = best.changed_sites(base)
        if changed and not ckpt.registered:
            message = f"optloop run {cfg.run_name}: test {before.accuracy:.3f} -> {after.accuracy:.3f}; {reason}"
            ckpt.registered = record.register_prompts(cfg.system, {s: texts_after[s] for s in changed},
                                                      run_id=ckpt.parent_run_id or "", promote=promoted,
                                                      message=message)
        if warning := small_split_warning(n_dev, n_test):
            note = warning + ("; " + note if note else "")
        mlflow.set_tags({"optloop.promoted": str(promoted), "optloop.promotion_reason": reason,
                         "optloop.note": note or "-"})
        result = LoopResult(config=cfg, parent_run_id=ckpt.parent_run_id or "", targets=ckpt.targets,
                            tunable_sites=sites, tunable_knobs=knobs, baseline_dev=ckpt.baseline_dev.accuracy,
                            best_dev=max(best_curve), best_trial=best_trial, test_before=before.accuracy,
                            test_after=after.accuracy, evaluations=evaluations, changed_sites=changed,
                            changed_knobs={k: best.knobs[k] for k in best.changed_knobs(base)}, promoted=promoted,
                            promotion_reason=reason, registered=ckpt.registered, cost=cost, n_dev=n_dev,
                            n_test=n_test, test_before_ci=before_ci, test_after_ci=after_ci, delta_test_ci=delta_ci,
                            tried=tried, prompt_diff=diff, note=note)
        if publish is not None:
            publish(result)
        ckpt.finished = True
        ckpt.save(ckpt_path)
        return result


def _questions(dataset: Dataset) -> int:
    return sum(len(e.questions) for e in dataset.episodes)


def _shareable(result: LoopResult) -> dict[str, Any]:
    """``result`` as JSON for the other workers, with no password from a storage or tracking URL."""
    config = result.config.model_copy(update={"storage": redact_url(result.config.storage),
                                              "tracking_uri": redact_url(result.config.tracking_uri)})
    return json.loads(result.model_copy(update={"config": config}).model_dump_json())


def _quiet(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``None`` if it fails (for best-effort reads while a run is already failing)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return None
