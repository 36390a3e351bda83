"""What a loop run logs to MLflow besides its prompts: the metrics of an evaluation, a CI, a
trial's cost and the blame (named as :mod:`optloop.loop.tracking.names` lists), the per-question
CSV, the attribution report, the plots, and text or JSON artifacts."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optloop.loop.cost import site_metrics
from optloop.loop.tracking.names import metric_key

if TYPE_CHECKING:
    from optloop.loop.evaluate import Evaluation
    from optloop.loop.interfaces import Summary
    from optloop.stats import Interval


def evaluation_metrics(evaluation: Evaluation, prefix: str = "acc_dev") -> dict[str, float]:
    metrics = {prefix: evaluation.accuracy}
    metrics |= {f"{prefix}/{metric_key(t)}": v for t, v in evaluation.per_task().items()}
    return metrics


def interval_metrics(name: str, interval: Interval) -> dict[str, float]:
    """``<name>_ci_low`` and ``<name>_ci_high``."""
    return {f"{name}_ci_low": interval.low, f"{name}_ci_high": interval.high}


def cost_metrics(evaluation: Evaluation) -> dict[str, float]:
    """A trial's cost: totals, ``cost_usd`` when its model is priced, and the same per prompt
    site."""
    priced = {"cost_usd": evaluation.cost_usd} if evaluation.cost_usd is not None else {}
    return {
        "llm_calls": evaluation.llm_calls,
        "model_calls": evaluation.model_calls,
        "tokens": evaluation.tokens,
        "seconds": evaluation.seconds,
        "ingest_calls": evaluation.ingest_calls,
        "stores_reused": evaluation.stores_reused,
        "lm_faults": evaluation.errors,
        "lm_failed_calls": evaluation.lm_failed_calls,
        **priced,
        **site_metrics(evaluation.sites),
    }


def race_metrics(evaluation: Evaluation) -> dict[str, float]:
    """A trial's dev questions answered and, when a race stopped it (:mod:`optloop.loop.racing`),
    the ``stopped`` flag, the split's size and the p-value it stopped at."""
    stop = evaluation.stopped
    if stop is None:
        return {"dev_questions": evaluation.n, "stopped": 0}
    return {
        "dev_questions": evaluation.n,
        "stopped": 1,
        "dev_questions_full": stop.of,
        "stopped_p": stop.p_value,
        "stopped_best_acc": stop.best_accuracy,
    }


def control_metrics(summary: Summary) -> dict[str, float]:
    """The trivial-instruction control's figures (:mod:`optloop.loop.trivial_control`; none when
    the run has no control): ``acc_dev_control``, ``acc_test_control`` and its CI,
    ``delta_test_control`` (best - control per test question) and its paired CI, their failed LM
    calls."""
    row, diffs = summary.comparison.row("control"), summary.comparison.differences
    against = next((d for d in diffs if d.against == "control"), None)
    if row.dev is None or row.test is None or against is None:
        return {}
    out = {
        "acc_dev_control": row.dev.estimate,
        "acc_test_control": row.test.estimate,
        "delta_test_control": against.test.estimate,
        **interval_metrics("acc_test_control", row.test),
        **interval_metrics("delta_test_control", against.test),
    }
    if summary.control_dev is not None:
        out["lm_failed_calls_dev_control"] = summary.control_dev.lm_failed_calls
    if summary.control_test is not None:
        out["lm_failed_calls_test_control"] = summary.control_test.lm_failed_calls
    return out


def summary_report(summary: Summary) -> dict[str, Any]:
    """``summary.json``: the report's comparison (the start program, the control and the best on
    dev and test, the paired differences on test), whether the best beat the control, and the
    control's prompt text at each site it rewrote."""
    comparison = summary.comparison
    return {
        **comparison.model_dump(mode="json"),
        "control_prompts": {s: summary.texts_control.get(s, "") for s in comparison.control_sites},
    }


def blame_metrics(
    entries: Sequence[Any], errors: Mapping[str, int], prefix: str = ""
) -> dict[str, float]:
    out = {f"{prefix}errors/{metric_key(t)}": float(n) for t, n in errors.items()}
    out |= {f"{prefix}blame_share/{metric_key(e.target)}": e.share for e in entries}
    out |= {
        f"{prefix}blame_rate/{metric_key(e.target)}": e.rate for e in entries if e.rate is not None
    }
    return out


def questions_csv(before: Evaluation, after: Evaluation | None = None) -> str:
    """One row per question: prediction and pass before (and after), and the attribution."""
    after_by = {o.question_id: o for o in after.outcomes} if after else {}
    buf = io.StringIO()
    writer = csv.writer(buf)
    header = [
        "episode",
        "question_id",
        "task",
        "question",
        "gold",
        "prediction_before",
        "passed_before",
        "error_before",
        "site_before",
    ]
    if after:
        header += ["prediction_after", "passed_after", "error_after", "site_after"]
    writer.writerow(header)
    for o in before.outcomes:
        a = o.attribution
        row = [
            o.episode_id,
            o.question_id,
            o.task_type,
            o.question,
            o.gold,
            o.prediction,
            o.passed,
            a.error_type.value if a else "",
            (a.target or "") if a else "",
        ]
        if after:
            n = after_by.get(o.question_id)
            na = n.attribution if n else None
            row += [
                n.prediction if n else "",
                n.passed if n else "",
                na.error_type.value if na else "",
                (na.target or "") if na else "",
            ]
        writer.writerow(row)
    return buf.getvalue()


def attribution_report(
    evaluations: Sequence[Evaluation], entries: Sequence[Any]
) -> dict[str, Any]:
    return {
        "blame": [e.model_dump() for e in entries],
        "attributions": [
            a.model_dump(mode="json") for ev in evaluations for a in ev.attributions()
        ],
    }


def plot_accuracy(trials: Sequence[tuple[int, float]], best: Sequence[float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [t for t, _ in trials]
    ax.plot(xs, [a for _, a in trials], "o", label="candidate (dev)")
    ax.step(xs, best, where="post", label="best so far")
    ax.set_xlabel("trial (0 = baseline)")
    ax.set_ylabel("dev accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(xs)
    ax.legend(loc="lower right")
    ax.set_title("accuracy by trial")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_blame(entries: Sequence[Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * max(len(entries), 1)))
    names = [e.target for e in entries][::-1]
    bars = ax.barh(names or ["(no failure)"], [e.failures for e in entries][::-1] or [0])
    rates = [f"{e.failures}/{e.reached} failed" if e.reached else "" for e in entries][::-1]
    if any(rates):
        ax.bar_label(bars, labels=rates, padding=3, fontsize=8)
    ax.set_xlabel("failures blamed (baseline, train + dev)")
    ax.set_title("blame by site / knob (ranked by failure rate given a correct input)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log_text(text: str, name: str) -> None:
    import mlflow

    mlflow.log_text(text, name)


def log_json(data: Any, name: str) -> None:
    log_text(json.dumps(data, indent=1, ensure_ascii=False, default=str), name)
