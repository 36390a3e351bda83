"""The optimizer registry: one :class:`OptimizerSpec` per optimizer in ``OPTIMIZERS``, which every
list of names reads (the config's check, ``--optimizer``'s choices and help, the demo's flag, the
run's wiring, ``--estimate``'s cost model), and ``optloop.optimize(optimizer=...)`` taking a spec
or an :class:`Optimizer` subclass, recorded by name.

A fake optimizer is registered by one entry, in a copy of ``OPTIMIZERS`` (monkeypatched);
``optloop.loop.runs.session.run`` is stubbed, so nothing runs.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import optloop
import optloop.loop.runs.session
from optloop.cli import demo_repair
from optloop.cli.run_args import build_parser, run_request
from optloop.errors import ConfigError
from optloop.loop.candidate import Candidate
from optloop.loop.config import LoopConfig
from optloop.loop.evaluate import Evaluation
from optloop.loop.optimizers import registry
from optloop.loop.optimizers.base import Optimizer
from optloop.loop.optimizers.registry import OptimizerSpec
from optloop.loop.optimizers.work import cost_model, modeled_work
from optloop.loop.runs.request import RunRequest
from optloop.loop.spending.optimizer_work import OptimizerWork
from optloop.loop.spending.shape import RunShape

FAKE = "fake"


class FakeOptimizer(Optimizer):
    """Proposes nothing; what the registry builds, by name."""

    name = FAKE

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        return None


def work(shape: RunShape) -> OptimizerWork:
    """The fake's cost model: one proposer call a trial."""
    return OptimizerWork(
        optimizer=FAKE,
        rounds=shape.budget,
        trials_per_round=1,
        calls=0,
        tokens=0,
        proposer_calls=shape.budget,
        proposer_prompt_tokens=0,
        basis="one proposer call a trial",
    )


SPEC = OptimizerSpec(FAKE, __name__, "FakeOptimizer", summary="a test's optimizer")


@pytest.fixture
def optimizers(monkeypatch) -> dict[str, OptimizerSpec]:
    """A copy of the registry for the test: what it registers is gone after it."""
    copy = dict(registry.OPTIMIZERS)
    monkeypatch.setattr(registry, "OPTIMIZERS", copy)
    return copy


@pytest.fixture
def requests(monkeypatch) -> list[RunRequest]:
    """The requests ``optloop.optimize`` hands the library (``optloop.loop.runs.session.run``
    stubbed)."""
    seen: list[RunRequest] = []
    monkeypatch.setattr(
        optloop.loop.runs.session, "run", lambda request, **kwargs: seen.append(request) or "done"
    )
    return seen


def shape() -> RunShape:
    return RunShape(
        budget=4,
        train_questions=2,
        train_episodes=1,
        sites=["answer"],
        question_calls=1.0,
        ingest_calls=1.0,
        question_tokens=10.0,
    )


def test_the_built_in_optimizers_are_the_registrys_entries():
    assert registry.names() == ["simba", "gepa", "optuna", "edit"]
    assert [registry.optimizer_class(n).name for n in registry.names()] == registry.names()
    assert registry.sharing() == ["optuna"] and registry.tunes_knobs("optuna")
    assert registry.module_path("edit") == "optloop/loop/optimizers/edit.py"
    parser = build_parser()
    [flag] = [a for a in parser._actions if a.dest == "optimizer"]
    assert flag.choices == registry.names()
    assert flag.help is not None and flag.help.startswith(
        "simba, gepa, optuna (TPE over proposed instructions and knobs), or edit (GrIPS-style "
    )


def test_an_optimizer_registered_in_one_place_is_usable_by_name(optimizers, requests, capsys):
    optimizers[FAKE] = SPEC
    # the config, the command's flag (choices and help) and the Python API take the name
    assert LoopConfig(run_name="r", optimizer=FAKE).optimizer == FAKE
    parser = build_parser()
    assert run_request(parser.parse_args(["--optimizer", FAKE])).config.optimizer == FAKE
    [flag] = [a for a in parser._actions if a.dest == "optimizer"]
    assert flag.choices == ["simba", "gepa", "optuna", "edit", FAKE]
    assert flag.help is not None and "or fake (a test's optimizer). Default: edit" in flag.help
    optloop.optimize(system="md_flat", optimizer=FAKE)
    assert requests[-1].config.optimizer == FAKE
    # the demo's flag lists it
    with pytest.raises(SystemExit):
        demo_repair.main(["--help"])
    assert "edit,fake}" in capsys.readouterr().out
    # the run's wiring builds it, without knobs (it tunes none); --estimate finds its model
    from optloop.loop.runs.runner import Loop

    loop = Loop(LoopConfig(run_name="r", optimizer=FAKE, seed=3), lm=None, proposer="proposer")
    evaluator = SimpleNamespace(work="/nonexistent", lm=None)
    built = loop._optimizer(evaluator, "train", ["answer"], ["top_k"], coordinator=None)
    assert isinstance(built, FakeOptimizer)
    assert (built.sites, built.knobs, built.seed, built.proposer) == (
        ["answer"],
        [],
        3,
        "proposer",
    )
    assert cost_model(FAKE) is work
    modeled = modeled_work(shape(), FAKE)
    assert modeled is not None and modeled.proposer_calls == 4


def test_optimize_takes_a_class_or_a_spec_and_the_run_records_its_name(optimizers, requests):
    """As a study takes a sampler object: the class is registered under its ``name``, a spec
    under its own; the config records the name, so the same call (or the name) resumes the run,
    and a class of the registry is recorded by its registry name."""
    from optloop.loop.optimizers.edit import EditOptimizer

    optloop.optimize(system="md_flat", optimizer=FakeOptimizer)
    optloop.optimize(system="md_flat", optimizer=FakeOptimizer)
    optloop.optimize(system="md_flat", optimizer=FAKE)
    by_class, again, by_name = (r.config for r in requests)
    assert by_class.optimizer == FAKE and optimizers[FAKE].load() is FakeOptimizer
    assert by_class.resume_key() == again.resume_key() == by_name.resume_key()
    assert (
        by_class.model_copy(update={"run_name": "r"}).digest()
        == by_name.model_copy(update={"run_name": "r"}).digest()
    )
    # registered from a class: no shared study, no knobs, no cost model (measured once trials ran)
    assert not registry.shared_study(FAKE) and not registry.tunes_knobs(FAKE)
    assert modeled_work(shape(), FAKE) is None

    spec = OptimizerSpec("fake-shared", __name__, "FakeOptimizer", shared_study=True)
    optloop.optimize(system="md_flat", optimizer=spec)
    assert requests[-1].config.optimizer == "fake-shared" and registry.shared_study("fake-shared")
    assert "fake-shared" in registry.sharing()

    optloop.optimize(system="md_flat", optimizer=EditOptimizer)
    assert requests[-1].config.optimizer == "edit"
    assert list(optimizers) == ["simba", "gepa", "optuna", "edit", FAKE, "fake-shared"]


@pytest.mark.parametrize(
    "optimizer, message",
    [
        ("nosuch", "optimizer: Input should be 'simba', 'gepa', 'optuna' or 'edit'"),
        (
            FakeOptimizer(None, None, None, sites=[]),
            "not a FakeOptimizer object: the run builds the optimizer",
        ),
        (OptimizerSpec("edit", __name__, "FakeOptimizer"), "'edit' is taken by"),
        (dict, "is not a subclass of Optimizer"),
    ],
)
def test_what_cannot_name_an_optimizer_is_a_config_error(
    optimizers, requests, optimizer: Any, message: str
):
    """An unknown name is refused as the config's literal was; an optimizer object (the run builds
    its own, on its evaluator, proposer and train split), a spec under a name another holds, or a
    class that is no optimizer, before anything runs."""
    with pytest.raises(ConfigError, match=message):
        optloop.optimize(system="md_flat", optimizer=optimizer)
    assert not requests
    assert list(optimizers) == registry.names() == ["simba", "gepa", "optuna", "edit"]
