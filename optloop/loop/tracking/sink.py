"""The controller's :class:`~optloop.loop.interfaces.TrackingSink` on MLflow.

It writes into the active parent run (``Loop`` starts and ends it): ``acc_dev`` with step =
trial, the blame and targets, one nested child run per trial, and at the end the parent
metrics (the trivial-instruction control's among them), artifacts (``summary.json``: the
report's comparison of the start program, the control and the best), tags (whether the best
beat the control: ``optloop.beats_control``) and the prompt registry. Metric names are listed in
:mod:`optloop.loop.tracking.names`, built by :mod:`optloop.loop.tracking.metrics`. See
``docs/architecture.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optloop import artifacts
from optloop.loop.candidate import Candidate
from optloop.loop.tracking import metrics
from optloop.loop.tracking.names import BEATS_CONTROL, metric_key
from optloop.loop.tracking.prompt_registry import register_prompts

if TYPE_CHECKING:
    import dspy

    from optloop.loop.evaluate import Evaluation
    from optloop.loop.interfaces import Summary, Targeting


class MlflowSink:
    """Records one run in MLflow. ``system`` names the registry prompts; ``parent_run_id`` tags
    them; ``state`` is where plots and ``program.json`` are written before they are logged;
    ``modules`` gives a candidate's DSPy modules (for ``program.json``)."""

    def __init__(
        self,
        system: str,
        parent_run_id: str,
        state: Path,
        modules: Callable[[Candidate], dict[str, dspy.Predict]],
    ):
        self.system = system
        self.parent_run_id = parent_run_id
        self.state = state
        self.modules = modules

    def log_dev(self, trial: int, accuracy: float, best: float) -> None:
        import mlflow

        mlflow.log_metrics({"acc_dev": accuracy, "acc_dev_best": best}, step=trial)

    def dev_steps(self) -> set[int]:
        from mlflow.tracking import MlflowClient

        return {m.step for m in MlflowClient().get_metric_history(self.parent_run_id, "acc_dev")}

    def log_targets(self, targeting: Targeting) -> None:
        import mlflow

        mlflow.log_metrics(metrics.blame_metrics(targeting.entries, targeting.errors))
        mlflow.set_tags(
            {
                "optloop.targets": ",".join(targeting.targets) or "-",
                "optloop.tunable_sites": ",".join(targeting.sites),
                "optloop.tunable_knobs": ",".join(targeting.knobs) or "-",
                "optloop.targeting_note": targeting.note or "-",
            }
        )

    @contextmanager
    def open_trial(self, trial: int, tags: Mapping[str, str] | None) -> Iterator[str]:
        """The trial's child run, ended FINISHED, or KILLED when an interrupt (a kill signal,
        Ctrl-C) stops it, or FAILED on an error (MLflow's own context manager says FAILED for
        both)."""
        import mlflow

        child = mlflow.start_run(
            run_name=f"trial-{trial}", nested=True, tags=dict(tags) if tags else None
        )
        status = "FAILED"
        try:
            yield child.info.run_id
            status = "FINISHED"
        except (KeyboardInterrupt, SystemExit):
            status = "KILLED"
            raise
        finally:
            mlflow.end_run(status)

    def log_trial(
        self,
        trial: int,
        candidate: Candidate,
        evaluation: Evaluation,
        *,
        base: Candidate,
        diff: str,
    ) -> None:
        import mlflow

        changed = candidate.changed_sites(base)
        mlflow.log_params(
            {
                "trial": trial,
                "origin": candidate.origin,
                "candidate": candidate.digest(),
                "changed_sites": ",".join(changed) or "-",
                "changed_knobs": json.dumps(
                    {k: candidate.knobs[k] for k in candidate.changed_knobs(base)}
                ),
            }
        )
        mlflow.log_metrics(
            {
                **metrics.evaluation_metrics(evaluation),
                **metrics.cost_metrics(evaluation),
                **metrics.blame_metrics(evaluation.blame(), evaluation.error_counts()),
                **metrics.race_metrics(evaluation),
            }
        )
        if evaluation.stopped is not None:
            mlflow.set_tag("optloop.stopped", evaluation.stopped.line(evaluation.accuracy))
        metrics.log_json(candidate.model_dump(mode="json"), artifacts.CANDIDATE)
        metrics.log_text(diff, artifacts.PROMPTS_DIFF)
        metrics.log_json(
            metrics.attribution_report([evaluation], evaluation.blame()), artifacts.ATTRIBUTION
        )
        metrics.log_text(metrics.questions_csv(evaluation), artifacts.QUESTIONS_DEV)

    def discard_trial(self, trial: int) -> None:
        """End as KILLED, then delete, every child run named ``trial-<trial>`` under the parent run
        (one a kill left behind before the checkpoint learnt its id included), so no deleted run
        stays RUNNING. A run an older version deleted while RUNNING is restored, ended KILLED and
        deleted again."""
        from mlflow.entities import RunStatus, ViewType
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        experiment_id = client.get_run(self.parent_run_id).info.experiment_id
        query = (
            f"tags.`mlflow.parentRunId` = '{self.parent_run_id}' and attributes.run_name = "
            f"'trial-{trial}'"
        )
        for run in client.search_runs(
            [experiment_id], filter_string=query, run_view_type=ViewType.ALL
        ):
            deleted = run.info.lifecycle_stage == "deleted"
            if run.info.status in (
                RunStatus.to_string(RunStatus.RUNNING),
                RunStatus.to_string(RunStatus.SCHEDULED),
            ):
                if deleted:
                    client.restore_run(run.info.run_id)
                client.set_terminated(run.info.run_id, "KILLED")
            elif deleted:
                continue
            client.delete_run(run.info.run_id)

    def log_summary(self, summary: Summary) -> None:
        import mlflow

        from optloop.loop.program import AllSites

        before, after = summary.test_before, summary.test_after
        mlflow.log_metrics(
            {
                "acc_dev_baseline": summary.baseline_dev.accuracy,
                "acc_dev_best_final": max(summary.best_curve),
                "acc_test_before": before.accuracy,
                "acc_test_after": after.accuracy,
                "delta_test": after.accuracy - before.accuracy,
                "n_dev": summary.baseline_dev.n,
                "n_test": before.n,
                **metrics.interval_metrics("delta_test", summary.delta_test_ci),
                **metrics.interval_metrics("acc_test_before", summary.test_before_ci),
                **metrics.interval_metrics("acc_test_after", summary.test_after_ci),
                "evaluations": summary.evaluations,
                **summary.cost,
                "lm_failed_calls_dev_baseline": summary.baseline_dev.lm_failed_calls,
                "lm_failed_calls_test_before": before.lm_failed_calls,
                "lm_failed_calls_test_after": after.lm_failed_calls,
                **metrics.evaluation_metrics(before, "acc_test_before"),
                **metrics.evaluation_metrics(after, "acc_test_after"),
                **{
                    f"errors_test_before/{metric_key(t)}": n
                    for t, n in before.error_counts().items()
                },
                **{
                    f"errors_test_after/{metric_key(t)}": n
                    for t, n in after.error_counts().items()
                },
            }
        )
        mlflow.log_metrics(metrics.control_metrics(summary))
        beats = summary.comparison.beats_control
        mlflow.set_tags({BEATS_CONTROL: "no control" if beats is None else str(beats)})
        metrics.log_json(metrics.summary_report(summary), artifacts.SUMMARY)
        metrics.log_json(summary.texts_before, artifacts.PROMPTS_BEFORE)
        metrics.log_json(summary.texts_after, artifacts.PROMPTS_AFTER)
        metrics.log_text(summary.diff, artifacts.PROMPTS_DIFF)
        metrics.log_json(summary.best.model_dump(mode="json"), artifacts.BEST_CANDIDATE)
        metrics.log_json(
            metrics.attribution_report(
                [summary.baseline_train, summary.baseline_dev], summary.entries
            ),
            artifacts.ATTRIBUTION_REPORT,
        )
        metrics.log_text(metrics.questions_csv(before, after), artifacts.QUESTIONS_TEST)
        plots = self.state / "plots"
        plots.mkdir(parents=True, exist_ok=True)
        mlflow.log_artifact(
            str(
                metrics.plot_accuracy(
                    summary.points, summary.best_curve, plots / artifacts.ACCURACY_PLOT
                )
            )
        )
        mlflow.log_artifact(str(metrics.plot_blame(summary.entries, plots / artifacts.BLAME_PLOT)))
        program_path = self.state / artifacts.PROGRAM
        AllSites(self.modules(summary.best)).save(str(program_path))
        mlflow.log_artifact(str(program_path))

    def register(self, texts: Mapping[str, str], *, promote: bool, message: str) -> dict[str, Any]:
        return register_prompts(
            self.system, texts, run_id=self.parent_run_id, promote=promote, message=message
        )

    def tag_result(self, promoted: bool, reason: str, note: str) -> None:
        import mlflow

        mlflow.set_tags(
            {
                "optloop.promoted": str(promoted),
                "optloop.promotion_reason": reason,
                "optloop.note": note or "-",
            }
        )


__all__ = ["MlflowSink"]
