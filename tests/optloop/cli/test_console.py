"""The ``optloop`` command: a subcommand per job over each module's own parser, and a cheap
import."""

from __future__ import annotations

import ast
import inspect
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


# Every command the optloop command runs; the list is written out so that one dropped from
# COMMANDS fails here.
EVERY_COMMAND = ("run", "attribute", "export", "doctor", "models", "ui", "demo-repair", "clidoc")


def test_python_dash_m_optloop_help_lists_every_command():
    done = subprocess.run(
        [sys.executable, "-m", "optloop", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: optloop ")
    assert [c.name for c in COMMANDS] == list(EVERY_COMMAND)
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("    ")]
    assert [name for name in listed if name in EVERY_COMMAND] == list(EVERY_COMMAND), done.stdout


@pytest.mark.parametrize(
    "name", ["export", "doctor", "models", "ui", "demo_repair", "clidoc", "console", "attribute"]
)
def test_no_module_beside_the_optloop_command_runs_a_command_but_optloop_run(name):
    """``python -m optloop COMMAND`` (and the ``optloop`` script) is the way in: optloop holds no
    module or package NAME, and of its top-level modules only ``__main__`` and ``run`` import
    ``optloop.cli``."""
    import optloop

    package = Path(optloop.__file__).parent
    assert not (package / f"{name}.py").exists() and not (package / name).exists()
    importers = sorted(
        path.name
        for path in package.glob("*.py")
        if any(module.startswith("optloop.cli") for module in _imports(path))
    )
    assert importers == ["__main__.py", "run.py"]


def _imports(path: Path) -> list[str]:
    """The modules ``path`` imports, at any depth of its syntax tree."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
    return modules


def test_optloop_attribute_is_the_function():
    import optloop
    import optloop.analysis

    assert optloop.attribute is optloop.analysis.attribute
    assert inspect.isfunction(optloop.attribute)
