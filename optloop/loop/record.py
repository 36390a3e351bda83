"""What a loop run leaves in MLflow: metric names, artifacts, plots and the prompt registry.

Metric names (parent run = one ``optloop.run``; child run = one candidate):

=========================== ======= ===========================================================
name                        run     meaning
=========================== ======= ===========================================================
``acc_dev``                 both    dev accuracy; on the parent with step = trial (0 = baseline)
``acc_dev_best``            parent  best dev accuracy so far, step = trial
``acc_dev/<task>``          child   dev accuracy per task type
``acc_test_before``         parent  held-out test accuracy of the baseline
``acc_test_after``          parent  held-out test accuracy of the best candidate
``delta_test``              parent  ``acc_test_after - acc_test_before``
``acc_test_{before,after}_ci_{low,high}`` parent  95% bootstrap CI of that accuracy over the test questions
``delta_test_ci_{low,high}`` parent  95% paired bootstrap CI of ``delta_test`` (per question, after - before);
                                    ``--promote-if ci`` moves ``champion`` only when ``delta_test_ci_low > 0``
``n_dev`` ``n_test``        parent  questions in the dev and test splits (the n of those CIs)
``acc_test_{before,after}/<task>`` parent  per task type
``errors/<type>``           both    attributed failures per error type (child: dev; parent: baseline train+dev)
``errors_test_{before,after}/<type>`` parent  on test
``blame_share/<target>``    both    share of failures blamed on a site or knob (``knob_top_k``)
``llm_calls`` ``model_calls`` ``tokens`` ``seconds``  both  cost (model_calls: not from the cache); parent: every
                                    process of the run, summed
``cost_usd``                both    dollars, when the model has a price (litellm's table; none: tokens only)
``llm_calls/<site>`` ``tokens/<site>`` ``cost_usd/<site>``  both  the same per prompt site (``no_site``: calls
                                    outside any); child: the trial's evaluation, parent: the whole run
``proposer_*``              parent  the same for a ``--proposer-lm`` of its own
``processes``               parent  processes that worked on the run (resumes, workers)
``ingest_calls`` ``stores_reused``  child  ingestion cost of the candidate, stores it reused
``lm_faults``               child   questions lost to an LM fault the retries did not cure (counted failed)
``lm_failed_calls``         both    LM calls that failed after their retries (child: its evaluation; parent:
                                    ``lm_failed_calls_{dev_baseline,test_before,test_after}``); past 5 % of an
                                    evaluation's calls the run stops instead (``optloop.failures``)
``evaluations``             parent  candidate evaluations used (``<= --budget``)
=========================== ======= ===========================================================
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optloop.loop.evaluate import Evaluation
    from optloop.stats import Interval


def metric_key(name: str) -> str:
    """A metric-safe name: ``knob:top_k`` -> ``knob_top_k``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


def evaluation_metrics(evaluation: Evaluation, prefix: str = "acc_dev") -> dict[str, float]:
    metrics = {prefix: evaluation.accuracy}
    metrics |= {f"{prefix}/{metric_key(t)}": v for t, v in evaluation.per_task().items()}
    return metrics


def interval_metrics(name: str, interval: Interval) -> dict[str, float]:
    """``<name>_ci_low`` and ``<name>_ci_high``."""
    return {f"{name}_ci_low": interval.low, f"{name}_ci_high": interval.high}


def cost_metrics(evaluation: Evaluation) -> dict[str, float]:
    """A trial's cost: totals, ``cost_usd`` when its model is priced, and the same per prompt site."""
    from optloop.loop.cost import site_metrics

    priced = {"cost_usd": evaluation.cost_usd} if evaluation.cost_usd is not None else {}
    return {"llm_calls": evaluation.llm_calls, "model_calls": evaluation.model_calls, "tokens": evaluation.tokens,
            "seconds": evaluation.seconds, "ingest_calls": evaluation.ingest_calls,
            "stores_reused": evaluation.stores_reused, "lm_faults": evaluation.errors,
            "lm_failed_calls": evaluation.lm_failed_calls, **priced,
            **site_metrics(evaluation.sites)}


def blame_metrics(entries: Sequence[Any], errors: Mapping[str, int], prefix: str = "") -> dict[str, float]:
    out = {f"{prefix}errors/{metric_key(t)}": float(n) for t, n in errors.items()}
    out |= {f"{prefix}blame_share/{metric_key(e.target)}": e.share for e in entries}
    out |= {f"{prefix}blame_rate/{metric_key(e.target)}": e.rate for e in entries if e.rate is not None}
    return out


def questions_csv(before: Evaluation, after: Evaluation | None = None) -> str:
    """One row per question: prediction and pass before (and after), and the attribution."""
    after_by = {o.question_id: o for o in after.outcomes} if after else {}
    buf = io.StringIO()
    writer = csv.writer(buf)
    header = ["episode", "question_id", "task", "question", "gold", "prediction_before", "passed_before",
              "error_before", "site_before"]
    if after:
        header += ["prediction_after", "passed_after", "error_after", "site_after"]
    writer.writerow(header)
    for o in before.outcomes:
        a = o.attribution
        row = [o.episode_id, o.question_id, o.task_type, o.question, o.gold, o.prediction, o.passed,
               a.error_type.value if a else "", (a.target or "") if a else ""]
        if after:
            n = after_by.get(o.question_id)
            na = n.attribution if n else None
            row += [n.prediction if n else "", n.passed if n else "", na.error_type.value if na else "",
                    (na.target or "") if na else ""]
        writer.writerow(row)
    return buf.getvalue()


def attribution_report(evaluations: Sequence[Evaluation], entries: Sequence[Any]) -> dict[str, Any]:
    return {"blame": [e.model_dump() for e in entries],
            "attributions": [a.model_dump(mode="json") for ev in evaluations for a in ev.attributions()]}


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


def registry_name(system: str, site: str) -> str:
    """The Prompt Registry name of a site: ``optloop.mem0.extract``, ``optloop.mem0.answer``.

    A library site already carries its system (``mem0.extract``, ``graphiti.extract_edges.edge``)
    and is not prefixed twice; a shared site (``answer``, ``retrieve.query``) gets the system.
    """
    return f"optloop.{site}" if site.startswith(f"{system}.") else f"optloop.{system}.{site}"


def register_prompts(system: str, texts: Mapping[str, str], *, run_id: str, promote: bool,
                     message: str) -> dict[str, dict[str, Any]]:
    """Register each changed site's prompt as a new version of :func:`registry_name` (tags: site, system).

    The ``champion`` alias moves to the new version only when ``promote`` (held-out gain). A version this
    run already registered with the same text (a resumed run killed before its checkpoint said so) is
    reused, not registered again.
    """
    import mlflow

    registered = {}
    for site, text in texts.items():
        name = registry_name(system, site)
        version = registered_by(name, run_id, text) if run_id else None
        if version is None:
            version = mlflow.genai.register_prompt(name=name, template=text, commit_message=message,
                                                   tags={"optloop_run_id": run_id, "site": site,
                                                         "system": system}).version
        if promote:
            mlflow.genai.set_prompt_alias(name, alias="champion", version=version)
        registered[site] = {"name": name, "version": version, "champion": promote}
    return registered


def registered_by(name: str, run_id: str, text: str) -> int | None:
    """The version of prompt ``name`` that run ``run_id`` registered with ``text``, if there is one."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    token = None
    while True:
        try:
            page = client.search_prompt_versions(name, page_token=token)
        except MlflowException:
            return None  # no prompt of that name yet
        for version in page:
            if version.tags.get("optloop_run_id") == run_id and version.template == text:
                return version.version
        token = getattr(page, "token", None)
        if not token:
            return None


def log_text(text: str, name: str) -> None:
    import mlflow

    mlflow.log_text(text, name)


def log_json(data: Any, name: str) -> None:
    log_text(json.dumps(data, indent=1, ensure_ascii=False, default=str), name)
