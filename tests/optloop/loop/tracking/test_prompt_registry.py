"""Prompt Registry names: one ``optloop.`` prefix, the system only where the site lacks it."""

from __future__ import annotations

from optloop.loop.tracking.prompt_registry import registry_name


def test_library_sites_are_not_prefixed_twice_and_shared_sites_get_the_system():
    assert registry_name("mem0", "mem0.extract") == "optloop.mem0.extract"
    assert registry_name("mem0", "answer") == "optloop.mem0.answer"
    assert (
        registry_name("graphiti", "graphiti.extract_edges.edge")
        == "optloop.graphiti.extract_edges.edge"
    )
    assert registry_name("graphiti", "retrieve.query") == "optloop.graphiti.retrieve.query"
    assert registry_name("md_flat", "md_flat.curate") == "optloop.md_flat.curate"
    assert registry_name("mem0", "mem0x.extract") == "optloop.mem0.mem0x.extract"


def test_the_mlflow_sink_discards_every_record_of_a_trial_and_registers_a_prompt_once(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    from optloop.loop.tracking.sink import MlflowSink

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.set_experiment(
        "optloop-sink"
    ).experiment_id  # as optloop.services.tracking.experiment does
    with mlflow.start_run(run_name="parent") as parent:
        sink = MlflowSink("mem0", parent.info.run_id, tmp_path, modules=lambda candidate: {})
        for trial in (
            1,
            2,
            2,
        ):  # trial 2 twice: a kill left a record the checkpoint never learnt of
            with sink.open_trial(trial, {"optloop.worker": "0:w"}):
                pass
        sink.discard_trial(2)
        client = MlflowClient()
        children = client.search_runs(
            [experiment], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
        )
        assert sorted(r.info.run_name for r in children) == ["trial-1"]
        first = sink.register({"mem0.extract": "Extract facts."}, promote=True, message="m")
        again = sink.register(
            {"mem0.extract": "Extract facts."}, promote=True, message="m"
        )  # resumed: reused
        other = sink.register({"mem0.extract": "Extract more facts."}, promote=False, message="m")
    assert (
        first
        == again
        == {"mem0.extract": {"name": "optloop.mem0.extract", "version": 1, "champion": True}}
    )
    assert other["mem0.extract"]["version"] == 2
