"""A real MLflow store holding what ``optloop.run`` leaves behind, for the export and product
tests.

The runs are made with real MLflow calls and optloop's own record/candidate code,
laid out as ``Loop._finish`` lays out a parent run: ``prompts_after.json`` (site ->
exact prompt text), ``best_candidate.json``, ``program.json`` (DSPy), params with
``system``, tag ``optloop.system``; the changed sites registered through
``prompt_registry.register_prompts`` with the ``champion`` alias. Building a store costs
seconds (MLflow creates its schema), so a module builds one and every test works
on a copy of its database in the test's own ``OPTLOOP_MLRUNS`` (see ``use_store``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from optloop import artifacts
from optloop.loop.candidate import SiteState, apply_state, candidate_from_modules, prompt_text
from optloop.loop.program import AllSites
from optloop.loop.tracking.metrics import log_json
from optloop.loop.tracking.prompt_registry import register_prompts
from optloop.services import tracking
from signatures.common import AnswerFromMemories
from signatures.graphiti import SIGNATURES as GRAPHITI_SIGNATURES
from signatures.mem0 import Mem0Extract, Mem0Rerank
from systems.base import PromptSite

MEM0_RULE = "Rule: store one memory per fact, in the user's own words."
EDGE_RULE = "Rule: every fact names both entities."
EDGE_SITE = "graphiti.extract_edges.edge"
DEMO = {
    "user_content": "New Messages:\nuser: I drink green tea every morning.",
    "memory": [
        {
            "id": "0",
            "text": "User drinks green tea every morning",
            "attributed_to": "user",
            "linked_memory_ids": [],
        }
    ],
}


@dataclass
class Store:
    """The template store and what it holds."""

    mlruns: Path
    runs: dict[str, str] = field(default_factory=dict)  # label -> run id
    texts: dict[str, dict[str, str]] = field(default_factory=dict)  # system -> prompts_after.json
    programs: dict[str, str] = field(default_factory=dict)  # system -> program.json text
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)


def _sites(system: str) -> dict[str, PromptSite]:
    sites = {
        "answer": PromptSite.from_signature("answer", "answer", AnswerFromMemories, layout="dspy")
    }
    if system == "mem0":
        sites["mem0.extract"] = PromptSite.from_signature("mem0.extract", "ingest", Mem0Extract)
        sites["mem0.rerank"] = PromptSite.from_signature("mem0.rerank", "retrieve", Mem0Rerank)
    else:
        sites |= {
            name: PromptSite.from_signature(name, "ingest", sig)
            for name, sig in GRAPHITI_SIGNATURES.items()
        }
    return sites


def _finished_run(
    store: Store, system: str, changes: dict[str, SiteState], knobs: dict[str, Any]
) -> str:
    """A parent run as ``Loop._finish`` leaves it, with ``changes`` as the best candidate."""
    import mlflow

    sites = _sites(system)
    modules = {n: s.module for n, s in sites.items()}
    base = candidate_from_modules(modules, knobs, "baseline")
    best = base.model_copy(update={"sites": {**base.sites, **changes}, "origin": "simba"})
    for name, state in best.sites.items():
        apply_state(modules[name], state)
    texts = {n: prompt_text(sites[n], s) for n, s in best.sites.items()}
    experiment_id = tracking.experiment(f"optloop-{system}")
    with mlflow.start_run(
        experiment_id=experiment_id,
        run_name=f"{system}-test",
        tags={"optloop.system": system, "optloop.optimizer": "simba"},
    ) as run:
        mlflow.log_params({"system": system, "dataset": "builtin:tiny", "budget": "1"})
        with mlflow.start_run(run_name="trial-1", nested=True) as child:
            mlflow.log_params({"trial": 1})
        log_json(texts, artifacts.PROMPTS_AFTER)
        log_json(best.model_dump(mode="json"), artifacts.BEST_CANDIDATE)
        program = store.mlruns / system / artifacts.PROGRAM
        program.parent.mkdir(parents=True, exist_ok=True)
        AllSites(modules).save(str(program))
        mlflow.log_artifact(str(program))
    run_id = run.info.run_id
    register_prompts(
        system, {n: texts[n] for n in changes}, run_id=run_id, promote=True, message="test run"
    )
    store.runs[system] = run_id
    store.runs[f"{system}-child"] = child.info.run_id
    store.texts[system] = texts
    store.programs[system] = program.read_text()
    store.knobs[system] = knobs
    return run_id


def build_store(root: Path) -> Store:
    """A store with a finished mem0 run, a finished graphiti run, an unfinished run and a foreign
    run."""
    import mlflow

    store = Store(mlruns=root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPTLOOP_MLRUNS", str(root))
        mp.delenv(
            "MLFLOW_TRACKING_URI", raising=False
        )  # mlflow.set_tracking_uri exports it: drop an earlier one
        tracking.configure()
        extract_seed = Mem0Extract.instructions
        _finished_run(
            store,
            "mem0",
            {
                "mem0.extract": SiteState(
                    instructions=f"{extract_seed}\n\n{MEM0_RULE}", demos=[DEMO]
                ),
                "answer": SiteState(instructions="Answer with one word from the memories."),
            },
            {"top_k": 3, "threshold": 0.1, "rerank": True},
        )
        edge_seed = GRAPHITI_SIGNATURES[EDGE_SITE].instructions
        _finished_run(
            store,
            "graphiti",
            {EDGE_SITE: SiteState(instructions=f"{edge_seed}\n\n{EDGE_RULE}")},
            {"top_k": 10, "search_recipe": "EDGE_HYBRID_SEARCH_RRF"},
        )
        with mlflow.start_run(
            experiment_id=tracking.experiment("optloop-mem0"),
            run_name="unfinished",
            tags={"optloop.system": "mem0"},
        ) as run:
            mlflow.log_params({"system": "mem0"})
        store.runs["unfinished"] = run.info.run_id
        with mlflow.start_run(
            experiment_id=tracking.experiment("someone-else"), run_name="foreign"
        ) as run:
            mlflow.log_params({"lr": "0.1"})
        store.runs["foreign"] = run.info.run_id
    return store


def use_store(store: Store, mlruns: Path) -> str:
    """Copy the template store's database into ``mlruns`` (the test's OPTLOOP_MLRUNS); returns its
    URI.

    Artifacts stay in the template's directory (runs point at them by absolute path).
    """
    mlruns.mkdir(parents=True, exist_ok=True)
    shutil.copy(store.mlruns / "mlflow.db", mlruns / "mlflow.db")
    return f"sqlite:///{mlruns / 'mlflow.db'}"


# Fixtures for the test modules that import them: one template store per module, a copy per test.


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Store:
    return build_store(tmp_path_factory.mktemp("template-store"))


@pytest.fixture
def store(
    template: Store, isolated_state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Store:
    """The template store, copied into this test's own OPTLOOP_MLRUNS (the default tracking URI).

    ``mlflow.set_tracking_uri`` also sets ``MLFLOW_TRACKING_URI``, which ``tracking.configure``
    prefers to the default: an earlier test's store would leak in, so it is removed here.
    """
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    use_store(template, tmp_path / "mlruns")
    return template
