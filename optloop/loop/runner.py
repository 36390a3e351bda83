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
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any, Literal

import dspy
from pydantic import BaseModel, Field

from optloop.attribution import blame
from optloop.attribution.taxonomy import KNOB_PREFIX, is_prompt_site
from optloop.datasets import Dataset, load_dataset, split_episodes
from optloop.errors import ConfigError, DatasetError
from optloop.loop import record
from optloop.loop.candidate import Candidate, prompt_diff, prompt_text
from optloop.loop.evaluate import Evaluation, Evaluator
from optloop.loop.optimizers import OPTIMIZERS, Optimizer
from optloop.paths import state_dir, write_atomic

logger = logging.getLogger(__name__)

MAX_BUDGET = 500


class LoopConfig(BaseModel):
    """Everything a run depends on (logged as the parent run's params)."""

    system: str
    dataset: str = "builtin:tiny"
    budget: int = Field(3, ge=1, le=MAX_BUDGET)
    optimizer: Literal["simba", "gepa", "optuna"] = "simba"
    seed: int = 0
    untargeted: bool = False
    sites: list[str] | None = None
    run_name: str
    tracking_uri: str | None = None
    storage: str | None = None
    lm: str = "local"
    proposer_lm: str = "same"
    knobs: dict[str, Any] = Field(default_factory=dict)
    fractions: tuple[float, float, float] = (0.5, 0.25, 0.25)

    def digest(self) -> str:
        """What must match for a run name to be resumed (the tracking URI may move)."""
        payload = self.model_dump(exclude={"tracking_uri"})
        return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Trial(BaseModel):
    trial: int
    candidate: Candidate
    evaluation: Evaluation | None = None
    child_run_id: str | None = None
    improved: bool = False


class Checkpoint(BaseModel):
    config_digest: str
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
    registered: dict[str, Any]
    cost: dict[str, float]
    note: str = ""

    @property
    def delta_test(self) -> float:
        return self.test_after - self.test_before


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


class Loop:
    """One ``optloop.run``: see the module docstring."""

    def __init__(self, config: LoopConfig, lm: Any, proposer: Any, *, work: Path | None = None,
                 progress: Callable[[str], None] | None = None):
        self.config = config
        self.lm = lm
        self.proposer = proposer
        self.run_dir = work or state_dir() / "runs" / config.run_name
        self.progress = progress or (lambda msg: None)
        self.started = time.perf_counter()

    # --- the run --------------------------------------------------------------------------

    def run(self) -> LoopResult:
        import mlflow

        from optloop import tracking

        cfg = self.config
        dataset = load_dataset(cfg.dataset)
        train, dev, test = split_dataset(dataset, cfg)
        ckpt_path = self.run_dir / "checkpoint.json"
        ckpt = Checkpoint.load(ckpt_path) if ckpt_path.exists() else None
        if ckpt is not None and ckpt.config_digest != cfg.digest():
            raise ConfigError(f"run name {cfg.run_name!r} exists with other settings; resume it with the same "
                              "command, or pick another --run-name")
        tracking.configure(cfg.tracking_uri)
        experiment_id = tracking.experiment(f"optloop-{cfg.system}")
        ckpt = ckpt or Checkpoint(config_digest=cfg.digest())
        if ckpt.finished:
            raise ConfigError(f"run {cfg.run_name!r} already finished (MLflow run {ckpt.parent_run_id}); pick another "
                              "--run-name to run again")
        ckpt.split = {"train": [e.id for e in train.episodes], "dev": [e.id for e in dev.episodes],
                      "test": [e.id for e in test.episodes]}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        dspy.configure(lm=self.lm, adapter=dspy.JSONAdapter())
        evaluator = Evaluator(cfg.system, self.lm, self.run_dir / "work", knobs=cfg.knobs, dataset_uri=dataset.uri)
        evaluator.register(train, dev, test)
        mark = self.lm.accounting.mark()
        proposer_mark = self.proposer.accounting.mark() if self.proposer is not self.lm else None
        parent = mlflow.start_run(run_id=ckpt.parent_run_id) if ckpt.parent_run_id else mlflow.start_run(
            experiment_id=experiment_id, run_name=cfg.run_name,
            tags={"optloop.system": cfg.system, "optloop.optimizer": cfg.optimizer})
        ckpt.parent_run_id = parent.info.run_id
        ckpt.save(ckpt_path)
        status = "FAILED"
        try:
            if not ckpt.trials and not ckpt.baseline_dev:
                mlflow.log_params({**{k: str(v) for k, v in cfg.model_dump(exclude={"knobs", "fractions"}).items()},
                                   "knobs": json.dumps(evaluator.template.knobs()), "fractions": str(cfg.fractions),
                                   "split_train": len(train.episodes), "split_dev": len(dev.episodes),
                                   "split_test": len(test.episodes), "lm_identity": self.lm.model})
            result = self._loop(evaluator, ckpt, ckpt_path, train, dev, test, mark, proposer_mark)
            status = "FINISHED"
            return result
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            mlflow.end_run(status)
            evaluator.close()

    def _evaluate(self, evaluator: Evaluator, candidate: Candidate, dataset: Dataset, split: str) -> Evaluation:
        self.progress(f"evaluating {candidate.origin} on {split} ({sum(len(e.questions) for e in dataset.episodes)} "
                      "questions)")
        return evaluator.evaluate(candidate, dataset, split=split)

    def _loop(self, evaluator: Evaluator, ckpt: Checkpoint, ckpt_path: Path, train: Dataset, dev: Dataset,
              test: Dataset, mark: int, proposer_mark: int | None) -> LoopResult:
        import mlflow

        cfg = self.config
        base = evaluator.baseline()
        if ckpt.baseline_train is None:
            ckpt.baseline_train = self._evaluate(evaluator, base, train, "train")
            ckpt.save(ckpt_path)
        if ckpt.baseline_dev is None:
            ckpt.baseline_dev = self._evaluate(evaluator, base, dev, "dev")
            ckpt.save(ckpt_path)
            mlflow.log_metrics({"acc_dev": ckpt.baseline_dev.accuracy, "acc_dev_best": ckpt.baseline_dev.accuracy},
                               step=0)
        base_evals = [ckpt.baseline_train, ckpt.baseline_dev]
        entries = blame([a for ev in base_evals for a in ev.attributions()])
        errors = dict(sum((Counter(ev.error_counts()) for ev in base_evals), Counter()))
        ckpt.targets = [e.target for e in entries]
        sites, knobs, note = choose_targets(entries, cfg, list(evaluator.sites))
        mlflow.log_metrics(record.blame_metrics(entries, errors))
        mlflow.set_tags({"optloop.targets": ",".join(ckpt.targets) or "-", "optloop.tunable_sites": ",".join(sites),
                         "optloop.tunable_knobs": ",".join(knobs) or "-", "optloop.targeting_note": note or "-"})
        if note:
            logger.warning("%s", note)
        client = mlflow.tracking.MlflowClient()
        for t in [t for t in ckpt.trials if t.evaluation is None]:  # killed mid-trial: redo it cleanly
            if t.child_run_id:
                client.delete_run(t.child_run_id)
            ckpt.trials.remove(t)
            ckpt.queue.insert(0, t.candidate)
        ckpt.save(ckpt_path)
        optimizer = self._optimizer(evaluator, train, sites, knobs)
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
        while len(ckpt.trials) < cfg.budget:
            trial_no = len(ckpt.trials) + 1
            self.progress(f"trial {trial_no}/{cfg.budget}: {optimizer.name} proposing for {', '.join(optimizer.sites)}")
            candidate = optimizer.propose(best, best_eval)
            ckpt.queue = list(getattr(optimizer, "queue", []))
            if candidate is None:
                note = (note + "; " if note else "") + f"{optimizer.name} proposed nothing new after " \
                       f"{len(ckpt.trials)} evaluation(s)"
                break
            with mlflow.start_run(run_name=f"trial-{trial_no}", nested=True) as child:
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
            mlflow.log_metrics({"acc_dev": evaluation.accuracy, "acc_dev_best": best_eval.accuracy}, step=trial_no)
        if ckpt.test_before is None:
            ckpt.test_before = self._evaluate(evaluator, base, test, "test")
            ckpt.save(ckpt_path)
        if ckpt.test_after is None:
            ckpt.test_after = (ckpt.test_before if best is base else
                               self._evaluate(evaluator, best, test, "test"))
            ckpt.save(ckpt_path)
        return self._finish(evaluator, ckpt, ckpt_path, base, best, best_trial, entries, errors, sites, knobs, note,
                            mark, proposer_mark)

    def _optimizer(self, evaluator: Evaluator, train: Dataset, sites: list[str], knobs: list[str]) -> Optimizer:
        cfg = self.config
        cls = OPTIMIZERS[cfg.optimizer]
        kwargs: dict[str, Any] = {"sites": sites, "knobs": knobs if cfg.optimizer == "optuna" else [], "seed": cfg.seed}
        if cfg.optimizer == "optuna":
            storage = cfg.storage or f"sqlite:///{(self.run_dir / 'optuna.db').resolve()}"
            kwargs |= {"storage": storage, "study_name": cfg.run_name}
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

    def _finish(self, evaluator: Evaluator, ckpt: Checkpoint, ckpt_path: Path, base: Candidate, best: Candidate,
                best_trial: int, entries: list[Any], errors: dict[str, int], sites: list[str], knobs: list[str],
                note: str, mark: int, proposer_mark: int | None) -> LoopResult:
        import mlflow

        from optloop.loop.program import AllSites

        cfg = self.config
        before, after = ckpt.test_before, ckpt.test_after
        assert before is not None and after is not None and ckpt.baseline_dev is not None
        points = [(0, ckpt.baseline_dev.accuracy)] + [(t.trial, t.evaluation.accuracy) for t in ckpt.trials
                                                      if t.evaluation is not None]
        best_curve = list(accumulate((a for _, a in points), max))
        delta = after.accuracy - before.accuracy
        promoted = best is not base and delta > 0
        usage = self.lm.accounting.totals(since=mark)
        cost = {"llm_calls": usage.calls, "model_calls": usage.model_calls, "tokens": usage.tokens,
                "seconds": round(time.perf_counter() - self.started, 1)}
        if proposer_mark is not None:
            p = self.proposer.accounting.totals(since=proposer_mark)
            cost |= {"proposer_llm_calls": p.calls, "proposer_tokens": p.tokens}
        cost["proposer_calls_in_system_lm"] = self.lm.accounting.totals("optimizer.proposer", since=mark).calls
        mlflow.log_metrics({"acc_dev_baseline": ckpt.baseline_dev.accuracy,
                            "acc_dev_best_final": max(best_curve), "acc_test_before": before.accuracy,
                            "acc_test_after": after.accuracy, "delta_test": delta,
                            "evaluations": len(ckpt.trials), **cost,
                            **record.evaluation_metrics(before, "acc_test_before"),
                            **record.evaluation_metrics(after, "acc_test_after"),
                            **{f"errors_test_before/{record.metric_key(t)}": n for t, n in before.error_counts().items()},
                            **{f"errors_test_after/{record.metric_key(t)}": n for t, n in after.error_counts().items()}})
        texts_before, texts_after = self._texts(evaluator, base), self._texts(evaluator, best)
        record.log_json(texts_before, "prompts_before.json")
        record.log_json(texts_after, "prompts_after.json")
        record.log_text(prompt_diff(texts_before, texts_after), "prompts.diff")
        record.log_json(best.model_dump(mode="json"), "best_candidate.json")
        record.log_json(record.attribution_report([ckpt.baseline_train, ckpt.baseline_dev], entries),  # type: ignore[list-item]
                        "attribution_report.json")
        record.log_text(record.questions_csv(before, after), "questions_test.csv")
        with_plots = self.run_dir / "plots"
        with_plots.mkdir(parents=True, exist_ok=True)
        mlflow.log_artifact(str(record.plot_accuracy(points, best_curve, with_plots / "accuracy_by_trial.png")))
        mlflow.log_artifact(str(record.plot_blame(entries, with_plots / "blame_by_site.png")))
        program_path = self.run_dir / "program.json"
        AllSites(evaluator.modules(best)).save(str(program_path))
        mlflow.log_artifact(str(program_path))
        changed = best.changed_sites(base)
        if changed and not ckpt.registered:
            message = (f"optloop run {cfg.run_name}: test {before.accuracy:.3f} -> {after.accuracy:.3f}"
                       + ("" if promoted else " (not promoted: no held-out gain)"))
            ckpt.registered = record.register_prompts(cfg.system, {s: texts_after[s] for s in changed},
                                                      run_id=ckpt.parent_run_id or "", promote=promoted,
                                                      message=message)
        if best is not base and not promoted:
            note = (note + "; " if note else "") + "the best dev candidate did not improve held-out test accuracy: " \
                                                   "nothing promoted"
        mlflow.set_tags({"optloop.promoted": str(promoted), "optloop.note": note or "-"})
        ckpt.finished = True
        ckpt.save(ckpt_path)
        return LoopResult(config=cfg, parent_run_id=ckpt.parent_run_id or "", targets=ckpt.targets,
                          tunable_sites=sites, tunable_knobs=knobs, baseline_dev=ckpt.baseline_dev.accuracy,
                          best_dev=max(best_curve), best_trial=best_trial, test_before=before.accuracy,
                          test_after=after.accuracy, evaluations=len(ckpt.trials), changed_sites=changed,
                          changed_knobs={k: best.knobs[k] for k in best.changed_knobs(base)}, promoted=promoted,
                          registered=ckpt.registered, cost=cost, note=note)
