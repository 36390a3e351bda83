"""The closed loop end to end on the embedded LM: MLflow runs and artifacts, resume, determinism.

These run the real SmolLM2 through real DSPy SIMBA; a fresh LM cache per test.
"""

from __future__ import annotations

import json

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from optloop.artifacts import CHILD_ARTIFACTS, PARENT_ARTIFACTS
from optloop.cli.run import main
from optloop.loop.runs.runner import SplitEvaluator
from optloop.loop.tracking.sink import MlflowSink

TINY = [
    "--dataset",
    "builtin:tiny",
    "--allow-small-splits",
]  # a few minutes on the embedded model, not hours

PARENT_METRICS = {
    "acc_dev",
    "acc_dev_best",
    "acc_test_before",
    "acc_test_after",
    "delta_test",
    "llm_calls",
    "model_calls",
    "tokens",
    "seconds",
    "evaluations",
}


def runs_of(uri: str, system: str):
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(f"optloop-{system}")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return client, parents, runs


def check_store(uri: str, system: str, budget: int, result: dict) -> None:
    client, parents, runs = runs_of(uri, system)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == result["evaluations"] == budget
    assert sorted(int(c.data.params["trial"]) for c in children) == list(range(1, budget + 1))
    assert PARENT_METRICS <= set(parent.data.metrics)
    assert parent.data.metrics["delta_test"] == pytest.approx(
        result["test_after"] - result["test_before"]
    )
    assert (
        len(client.get_metric_history(parent.info.run_id, "acc_dev")) == budget + 1
    )  # baseline + each trial
    assert PARENT_ARTIFACTS <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    for child in children:
        assert CHILD_ARTIFACTS <= {a.path for a in client.list_artifacts(child.info.run_id)}
        assert "acc_dev" in child.data.metrics and "llm_calls" in child.data.metrics
    for site, reg in result["registered"].items():  # changed prompts are versions in the registry
        prompt = mlflow.genai.load_prompt(f"prompts:/{reg['name']}/{reg['version']}")
        assert prompt.template and site in reg["name"]


@pytest.mark.integration
def test_interrupted_run_resumes_without_redoing_or_double_counting(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    args = [
        "--system",
        "md_flat",
        *TINY,
        "--budget",
        "2",
        "--run-name",
        "it",
        "--tracking-uri",
        uri,
        "--json",
        str(tmp_path / "result.json"),
    ]
    calls = {"n": 0}
    original = MlflowSink.log_trial

    def interrupt_second(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # a Ctrl-C in the middle of trial 2
        return original(self, *a, **kw)

    monkeypatch.setattr(MlflowSink, "log_trial", interrupt_second)
    assert (
        main(args) == 130
    )  # interrupted: checkpointed, MLflow runs KILLED, the resume command printed
    monkeypatch.setattr(MlflowSink, "log_trial", original)
    evaluated = []
    real_evaluate = SplitEvaluator.evaluate
    monkeypatch.setattr(
        SplitEvaluator,
        "evaluate",
        lambda self, cand, split, **race: (
            evaluated.append((cand.origin, split)),
            real_evaluate(self, cand, split, **race),
        )[1],
    )
    assert main(args) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    # resumed: the baseline and trial 1 were not evaluated again; trial 2 was redone once
    assert ("baseline", "train") not in evaluated and ("baseline", "dev") not in evaluated
    assert [s for _, s in evaluated].count("dev") == 1
    check_store(uri, "md_flat", 2, result)
    assert result["tunable_sites"] and result["cost"]["llm_calls"] > 0


@pytest.mark.slow
def test_same_seed_and_cache_give_the_same_result(tmp_path):
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    outs = []
    for name in ("first", "second"):
        out = tmp_path / f"{name}.json"
        assert (
            main(
                [
                    "--system",
                    "md_flat",
                    *TINY,
                    "--budget",
                    "2",
                    "--run-name",
                    name,
                    "--tracking-uri",
                    uri,
                    "--json",
                    str(out),
                ]
            )
            == 0
        )
        outs.append(json.loads(out.read_text()))
    keys = (
        "baseline_dev",
        "best_dev",
        "best_trial",
        "test_before",
        "test_after",
        "changed_sites",
        "targets",
    )
    assert [{k: o[k] for k in keys} for o in outs][0] == [{k: o[k] for k in keys} for o in outs][1]
    assert outs[1]["cost"]["model_calls"] == 0  # the second run came entirely from the cache


@pytest.mark.slow
@pytest.mark.parametrize("system", ["mem0", "graphiti"])
def test_budget_3_on_the_real_libraries(system, tmp_path):
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    out = tmp_path / "result.json"
    assert (
        main(
            [
                "--system",
                system,
                *TINY,
                "--budget",
                "3",
                "--run-name",
                f"{system}-3",
                "--tracking-uri",
                uri,
                "--json",
                str(out),
            ]
        )
        == 0
    )
    check_store(uri, system, 3, json.loads(out.read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["gepa", "optuna"])
def test_other_optimizers_spend_the_budget(optimizer, tmp_path):
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    out = tmp_path / "result.json"
    assert (
        main(
            [
                "--system",
                "md_flat",
                *TINY,
                "--budget",
                "2",
                "--optimizer",
                optimizer,
                "--run-name",
                optimizer,
                "--tracking-uri",
                uri,
                "--json",
                str(out),
            ]
        )
        == 0
    )
    check_store(uri, "md_flat", 2, json.loads(out.read_text()))
