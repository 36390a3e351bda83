"""The ``optloop`` command: a subcommand per job over each module's own parser, and a cheap
import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from optloop.cli.console import COMMANDS, main

REPO = Path(__file__).resolve().parents[3]


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(f"    {c.name}" in out for c in COMMANDS), out


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_a_subcommand_shows_its_module_parser_under_its_own_name(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: optloop {command} ")


def test_an_unknown_command_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["optimise"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown command 'optimise'" in err and "run, attribute" in err


def test_a_usage_error_in_a_subcommand_is_its_own_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--budget", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith("optloop: error: argument --budget")


def test_importing_optloop_loads_no_library_and_sets_no_environment():
    code = (
        "import os, sys; before = dict(os.environ); import optloop; heavy = [m for m in "
        "('dspy', 'mlflow', 'mem0', 'torch', 'llama_cpp', 'pydantic') if m in sys.modules]; "
        "print(heavy, sorted(set(os.environ) - set(before)))"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "MLFLOW_DISABLE_TELEMETRY")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[] []", out
