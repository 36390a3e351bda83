"""``optloop.loop.runs.session`` as a benchmark uses it: a run kept in a runs folder of the
caller's (``RunOptions.runs_dir``), opened for its LM, start program and checkpoint (``opened``),
and the run's own evaluator outside a run (``evaluator``). The loop is stubbed and no LM is
called."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from optloop.datasets import load_dataset
from optloop.lm import LMSettings, OptloopLM
from optloop.loop.policy import start_candidate
from optloop.loop.runs import session
from optloop.loop.runs.request import RunOptions, RunRequest, loop_config, run_lms


@pytest.fixture
def endpoint(oracle_state):
    """A loopback endpoint that needs no model, the state and MLflow store under ``tmp_path``."""
    return oracle_state


def test_the_default_runs_folder_is_the_state_dirs():
    assert RunOptions().runs_dir is None  # prepare: <state dir>/runs


def test_a_run_is_kept_in_the_runs_folder_it_is_given_and_opened_forgets_it_on_leaving(
    endpoint, tmp_path, monkeypatch
):
    from optloop.loop.runs.runner import Loop

    def fake_run(self: Loop) -> Any:
        self.progress("evaluating baseline on train (4 questions)")
        return self.config

    monkeypatch.setattr(Loop, "run", fake_run)
    described: list[Any] = []
    monkeypatch.setattr(session, "describe_run", described.append)
    settings, proposer = run_lms("rag_bm25", "openai:oracle", base_url=endpoint.base_url)
    config = loop_config(settings, proposer, system="rag_bm25", budget=1, run_name="kept")
    runs = tmp_path / "bench-runs"
    options = RunOptions(run_name="kept", allow_small_splits=True, runs_dir=runs)
    with session.opened(RunRequest(config, settings, proposer, options)) as run:
        assert run.loop.run_dir == runs / "kept" and run.config.run_name == "kept"
        assert run.lm is run.proposer  # one LM: a watcher on it sees the proposer's requests too
        run.start()
        assert run.run().run_name == "kept"
        assert described[-1] is not None  # a fault from outside would name this run
    assert described[-1] is None  # and after it, none
    log = (runs / "kept" / "run.log").read_text()
    assert "optloop.run kept: rag_bm25" in log and "evaluating baseline on train" in log
    assert not (tmp_path / "state" / "runs").exists()


def test_the_evaluator_outside_a_run_is_the_one_the_run_builds(endpoint, tmp_path):
    settings = LMSettings.from_spec("openai:oracle", base_url=endpoint.base_url, cache=False)
    dataset = load_dataset("builtin:tiny")
    config = loop_config(
        settings,
        system="rag_bm25",
        run_name="-",
        knobs={"top_k": 3},
        query_rewrite=True,
        start={"answer": "+Be brief."},
    )
    closed: list[str] = []
    with session.evaluator(config, OptloopLM(settings), tmp_path / "work", dataset) as evaluator:
        assert evaluator.dataset_uri == dataset.uri
        assert evaluator.query_site and "retrieve.query" in evaluator.sites
        assert evaluator.template.knobs()["top_k"] == 3
        start = start_candidate(evaluator, config)
        assert start.sites["answer"].instructions.endswith("Be brief.")
        evaluator.template.close = lambda: closed.append("closed")  # type: ignore[method-assign]
    assert closed == ["closed"]
    assert Path(tmp_path / "work" / "template").exists()
