"""``optloop.optimize``: its keyword arguments become the typed objects ``optloop run``'s flags
become (no command line is built or parsed), with the same defaults, read from the config models.

Where a run would start, the ``Loop`` is stubbed (its ``run`` returns what it was configured with)
or ``optloop.loop.runs.session.run`` is (it returns the request it was given): nothing is
evaluated.
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import pytest

import optloop
import optloop.cli.run
import optloop.loop.runs.session
from optloop.cli import run_args
from optloop.cli.run_args import build_parser, run_request
from optloop.loop.config import LoopConfig
from optloop.loop.runs.request import RunOptions, RunRequest


def cli_request(*flags: str) -> RunRequest:
    """What ``optloop run FLAGS`` would run, parsed and mapped (nothing is checked or run)."""
    return run_request(build_parser().parse_args(list(flags)))


@pytest.fixture
def requests(monkeypatch) -> list[RunRequest]:
    """The requests ``optloop.optimize`` hands the library (``optloop.loop.runs.session.run``
    stubbed)."""
    seen: list[RunRequest] = []
    monkeypatch.setattr(
        optloop.loop.runs.session, "run", lambda request, **kwargs: seen.append(request) or "done"
    )
    return seen


@pytest.fixture
def oracle(oracle_state, monkeypatch):
    """A loopback endpoint that needs no model, the state and MLflow store under ``tmp_path``, and
    ``Loop.run`` stubbed: it returns the config the run was built with."""
    from optloop.loop.runs.runner import Loop

    monkeypatch.setattr(Loop, "run", lambda self: self.config)
    return oracle_state


def refuse_any_command_line(monkeypatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("optloop.optimize parsed a command line")

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", refuse)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", refuse)
    monkeypatch.setattr(run_args, "build_parser", refuse)
    monkeypatch.setattr(optloop.cli.run, "build_parser", refuse)


@pytest.mark.parametrize("control, flags", [(True, []), (False, ["--no-control"])])
def test_control_false_runs_without_the_trivial_instruction_control(requests, control, flags):
    assert optloop.optimize(system="md_flat", optimizer="edit", control=control) == "done"
    assert requests[0].config.control is control
    assert cli_request("--system", "md_flat", *flags).config.control is control


def test_optimize_builds_no_command_line_and_the_loop_gets_the_config_it_was_given(
    oracle, monkeypatch
):
    """The whole path to the loop (dataset, endpoint probe, stores, run choice) with every parser
    refusing to run: the arguments reach the loop's config as given."""
    refuse_any_command_line(monkeypatch)
    config = optloop.optimize(
        system="rag_bm25",
        budget=4,
        optimizer="gepa",
        lm="openai:oracle",
        lm_base_url=oracle.base_url,
        seed=2,
        sites=["answer"],
        start={"answer": "+Be brief."},
        knobs={"top_k": 3},
        split=(0.4, 0.3, 0.3),
        promote_if="delta",
        batch=2,
        control=False,
        allow_small_splits=True,
        run_name="by-name",
    )
    assert isinstance(config, LoopConfig)
    assert (config.system, config.budget, config.optimizer, config.seed) == (
        "rag_bm25",
        4,
        "gepa",
        2,
    )
    assert config.sites == ["answer"] and config.start == {"answer": "+Be brief."}
    assert config.knobs == {"top_k": 3} and config.fractions == (0.4, 0.3, 0.3)
    assert (config.promote_if, config.batch, config.control) == ("delta", 2, False)
    assert config.run_name == "by-name" and config.lm == "openai:oracle"
    assert config.lm_settings["backend"] == "openai" and config.lm_settings["model"] == "oracle"


def test_both_entry_points_build_the_same_run_from_their_defaults(oracle):
    """Nothing but the system and the endpoint given: the command and the function build the same
    config (the dataset optloop generates, the optimizer the endpoint gets) and options."""
    endpoint = ["--lm", "openai:oracle", "--lm-base-url", oracle.base_url]
    cli = cli_request("--system", "md_flat", *endpoint)
    api = optloop.optimize(system="md_flat", lm="openai:oracle", lm_base_url=oracle.base_url)
    assert api.model_dump(exclude={"run_name"}) == cli.config.model_dump(exclude={"run_name"})
    assert api.optimizer == "simba" and api.dataset.startswith("synthetic:recall")
    assert cli.options == RunOptions()


def test_the_default_optimizer_is_the_commands_rule(requests):
    """On the embedded model the function runs ``edit``, as the command does (its default was
    ``simba`` whatever the LM); an endpoint writing the instructions gets ``simba``."""
    optloop.optimize(system="md_flat")
    optloop.optimize(system="md_flat", proposer_lm="openai:gpt-4o-mini")
    assert [r.config.optimizer for r in requests] == ["edit", "simba"]
    assert cli_request("--system", "md_flat").config.optimizer == "edit"
    assert (
        cli_request("--system", "md_flat", "--proposer-lm", "openai:gpt-4o-mini").config.optimizer
        == "simba"
    )


def test_a_setting_added_to_the_config_model_reaches_both_entry_points(oracle, monkeypatch):
    """A field added to LoopConfig with its default, in that one place: the loop ``optimize``
    starts and the config ``optloop run``'s flags map to both carry it."""
    import optloop.loop.runs.request

    class WithPatience(LoopConfig):
        patience: int = 4

    monkeypatch.setattr(optloop.loop.runs.request, "LoopConfig", WithPatience)
    endpoint = ["--lm", "openai:oracle", "--lm-base-url", oracle.base_url]
    api = optloop.optimize(system="md_flat", lm="openai:oracle", lm_base_url=oracle.base_url)
    cli = cli_request("--system", "md_flat", *endpoint).config
    assert isinstance(api, WithPatience) and isinstance(cli, WithPatience)
    assert api.patience == cli.patience == 4


# Parameters of optimize() named otherwise than the field they set.
RENAMED = {"split": "fractions"}


def test_the_signature_and_the_parser_take_their_defaults_from_the_config_models():
    parser = build_parser()
    parser.parse_args([])  # the flags every command adds are added on first use
    flags = {action.dest: action.default for action in parser._actions}
    flags["fractions"] = flags["split"]
    models = {**LoopConfig.model_fields, **RunOptions.model_fields}
    checked = []
    for name, parameter in inspect.signature(optloop.optimize).parameters.items():
        field = models.get(RENAMED.get(name, name))
        if field is None or parameter.default is None:
            continue  # an LM setting, a limit, or a rule's None (dataset, optimizer)
        assert parameter.default == field.default, name
        assert flags[RENAMED.get(name, name)] == field.default, name
        checked.append(name)
    assert {"system", "budget", "seed", "split", "promote_if", "batch", "control"} <= set(checked)


def test_bad_input_is_one_config_error_not_a_parser_exit(requests):
    from optloop.errors import ConfigError

    with pytest.raises(ConfigError, match="budget"):
        optloop.optimize(system="md_flat", budget=0)
    with pytest.raises(ConfigError, match="must sum to 1"):
        optloop.optimize(system="md_flat", split=(0.5, 0.5, 0.5))
    with pytest.raises(ConfigError, match="--new and --run-name exclude each other"):
        optloop.optimize(system="md_flat", new=True, run_name="x")
    assert not requests


def test_optimize_prints_nothing_while_the_command_shows_every_line_and_both_keep_run_log(
    oracle_state, tmp_path, monkeypatch, capsys
):
    """The same run (the loop stubbed: it says a stage, a line and a trial, then finishes) from
    the function and from the command: the function writes nothing to stdout or stderr and hands
    its events to ``on_event``; the command prints which run, the dataset, the stage, the line,
    the trial and the summary; each run's ``run.log`` holds the same lines."""
    from optloop.cli.run import main
    from optloop.loop.runs.runner import Loop
    from optloop.loop.runs.session import Finished, Said, Stage, TrialDone
    from optloop.loop.spending.eta import TrialLine
    from tests.optloop.cli.test_run_tables import result

    def fake_run(self: Loop) -> Any:
        self.progress("evaluating baseline on train (4 questions)")
        self.announce("the store was mended")
        self.on_trial(TrialLine(trial=1, budget=1, accuracy=0.5, best=0.5, seconds=3))
        return result(4, 6, 5).model_copy(update={"config": self.config})

    monkeypatch.setattr(Loop, "run", fake_run)
    said = [
        "evaluating baseline on train (4 questions)",
        "the store was mended",
        "trial 1/1 dev 0.500 (best 0.500) 3 s",
    ]
    endpoint = oracle_state
    lm = {"lm": "openai:oracle", "lm_base_url": endpoint.base_url}
    run = {"system": "rag_bm25", "budget": 1, "allow_small_splits": True, **lm}
    capsys.readouterr()
    optloop.optimize(run_name="quiet", **run)
    assert capsys.readouterr() == ("", "")
    events: list[Any] = []
    optloop.optimize(run_name="heard", on_event=events.append, **run)
    assert capsys.readouterr() == ("", "")
    kinds = [type(e) for e in events]
    assert kinds[0] is Said and kinds[-1] is Finished
    assert {Stage, TrialDone} <= set(kinds)
    assert [e.text for e in events if isinstance(e, Stage)] == [said[0]]
    code = main(
        [
            "--system",
            "rag_bm25",
            "--budget",
            "1",
            "--allow-small-splits",
            "--run-name",
            "loud",
            "--lm",
            "openai:oracle",
            "--lm-base-url",
            endpoint.base_url,
        ]
    )
    assert code == 0
    out, err = capsys.readouterr()
    assert out == ""
    for line in ["optloop.run loud: rag_bm25 on ", "dataset ", *said, "MLflow parent run p "]:
        assert line in err, line
    assert err.index(said[0]) < err.index(said[2]) < err.index("MLflow parent run")

    def logged(run_name: str) -> list[str]:
        log = tmp_path / "state" / "runs" / run_name / "run.log"
        return [line.split(" ", 2)[2] for line in log.read_text().splitlines()]

    quiet, loud = logged("quiet"), logged("loud")
    assert quiet[0].startswith("optloop.run quiet: ") and loud[0].startswith("optloop.run loud: ")
    assert quiet[1:] == loud[1 : len(quiet)] and set(said) <= set(quiet)
    assert loud[-1].startswith("MLflow parent run p ")  # the command's summary is logged too
