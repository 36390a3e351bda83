"""The MLflow sink's part in crash consistency: a trial's child run ends KILLED when an interrupt
stops it, a discarded trial's runs are ended KILLED before they are deleted (an older leftover,
deleted while RUNNING, included), and a resumed run can ask which ``acc_dev`` points exist."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from optloop.loop.runs.runner import Loop
from optloop.loop.state import LoopConfig
from optloop.loop.tracking.sink import MlflowSink


@pytest.fixture
def parent(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.set_experiment("sink")
    run = mlflow.start_run(experiment_id=experiment.experiment_id, run_name="parent")
    try:
        yield MlflowClient(), run.info.run_id
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(previous)


def children(client, parent_id):
    from mlflow.entities import ViewType

    experiment = client.get_run(parent_id).info.experiment_id
    runs = client.search_runs(
        [experiment], f"tags.`mlflow.parentRunId` = '{parent_id}'", run_view_type=ViewType.ALL
    )
    return {r.info.run_name: (r.info.status, r.info.lifecycle_stage) for r in runs}


def test_an_interrupted_trial_ends_killed_a_failed_one_failed_and_discarding_ends_then_deletes(
    parent, tmp_path
):
    import mlflow

    client, parent_id = parent
    sink = MlflowSink("md_flat", parent_id, tmp_path, modules=lambda candidate: {})
    with pytest.raises(KeyboardInterrupt), sink.open_trial(1, None):
        raise KeyboardInterrupt  # SIGTERM or Ctrl-C during trial 1
    with pytest.raises(RuntimeError), sink.open_trial(2, None):
        raise RuntimeError("an evaluation failed")
    with sink.open_trial(4, {"optloop.worker": "0:w"}):
        pass
    leftover = mlflow.start_run(
        run_name="trial-3", nested=True
    ).info.run_id  # a kill left it RUNNING ...
    mlflow.end_run("RUNNING")  # (the fluent stack forgets it; its status stays RUNNING)
    client.delete_run(leftover)  # ... and an older optloop deleted it as it was
    assert children(client, parent_id) == {
        "trial-1": ("KILLED", "active"),
        "trial-2": ("FAILED", "active"),
        "trial-3": ("RUNNING", "deleted"),
        "trial-4": ("FINISHED", "active"),
    }
    for trial in (1, 3):
        sink.discard_trial(trial)
    assert children(client, parent_id) == {
        "trial-1": ("KILLED", "deleted"),
        "trial-2": ("FAILED", "active"),
        "trial-3": ("KILLED", "deleted"),
        "trial-4": ("FINISHED", "active"),
    }
    assert mlflow.active_run().info.run_id == parent_id  # the parent is still the active run


def test_the_dev_points_logged_so_far(parent, tmp_path):
    _, parent_id = parent
    sink = MlflowSink("md_flat", parent_id, tmp_path, modules=lambda candidate: {})
    assert sink.dev_steps() == set()
    sink.log_dev(0, 0.25, 0.25)
    sink.log_dev(2, 0.5, 0.5)
    assert sink.dev_steps() == {0, 2}


def test_the_run_cost_has_dollars_and_per_site_figures_when_the_lm_prices_calls():
    """``Loop._cost`` (what a process spent, saved in the checkpoint, logged on the parent run):
    dollars as ``cost_usd`` when the model has a price, none (not 0) when it has not, and the same
    per prompt site."""
    from optloop.lm.accounting import Accounting, CallRecord

    def lm(prices):
        accounting = Accounting()
        for site, price in prices:
            accounting.add(CallRecord(site, "m", 7, 3, 0.5, cached=False, cost_usd=price))
        return SimpleNamespace(accounting=accounting)

    unpriced = Loop(
        LoopConfig(system="md_flat", run_name="r"), lm([("answer", None), (None, None)]), None
    )
    unpriced.proposer = unpriced.lm
    cost = unpriced._cost(0, None)
    assert "cost_usd" not in cost and not any(k.startswith("cost_usd/") for k in cost)
    assert (
        cost["llm_calls/answer"] == 1 and cost["tokens/no_site"] == 10 and cost["model_calls"] == 2
    )
    priced = Loop(
        LoopConfig(system="md_flat", run_name="r"),
        lm([("answer", 0.25), ("answer", 0.5)]),
        lm([("proposer", 1.0)]),
    )
    cost = priced._cost(0, 0)
    assert (
        cost["cost_usd"] == 0.75
        and cost["cost_usd/answer"] == 0.75
        and cost["llm_calls/answer"] == 2
    )
    assert cost["proposer_cost_usd"] == 1.0 and cost["proposer_model_calls"] == 1


def test_a_trial_logs_its_cost_per_prompt_site_and_dollars_only_where_priced(parent, tmp_path):
    from optloop.loop.candidate import Candidate, SiteState
    from optloop.loop.cost import LMCost
    from optloop.loop.evaluate import Evaluation

    client, parent_id = parent
    sink = MlflowSink("md_flat", parent_id, tmp_path, modules=lambda candidate: {})
    base = Candidate(sites={"answer": SiteState(instructions="a")})
    candidate = Candidate(sites={"answer": SiteState(instructions="b")})
    evaluation = Evaluation(
        split="dev",
        candidate=candidate.digest(),
        outcomes=[],
        llm_calls=5,
        model_calls=4,
        tokens=40,
        cost_usd=0.003,
        lm_seconds=2.0,
        sites={
            "answer": LMCost(calls=3, model_calls=2, tokens=20, cost_usd=0.003),
            "no_site": LMCost(calls=2, model_calls=2, tokens=20),
        },
    )  # unpriced: no dollars
    with sink.open_trial(1, None) as run_id:
        sink.log_trial(1, candidate, evaluation, base=base, diff="")
    metrics = client.get_run(run_id).data.metrics
    assert metrics["cost_usd"] == 0.003 and metrics["llm_calls"] == 5 and metrics["tokens"] == 40
    assert (
        metrics["llm_calls/answer"] == 3
        and metrics["tokens/answer"] == 20
        and metrics["cost_usd/answer"] == 0.003
    )
    assert metrics["llm_calls/no_site"] == 2 and "cost_usd/no_site" not in metrics
    unpriced = evaluation.model_copy(update={"cost_usd": None, "sites": {}})
    with sink.open_trial(2, None) as run_id:
        sink.log_trial(2, candidate, unpriced, base=base, diff="")
    assert not any(key.startswith("cost_usd") for key in client.get_run(run_id).data.metrics)
