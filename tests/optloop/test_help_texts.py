"""Help texts name what the code has: every memory system and every dataset kind the registries
hold."""

from __future__ import annotations

import argparse
import re

import pytest

from optloop.cli.console import BY_NAME
from optloop.datasets import LOADERS
from optloop.datasets.builtin import BUILTINS
from optloop.datasets.synthetic import GENERATORS
from systems import SYSTEMS


def _help(command: str, flag: str) -> str:
    parser = BY_NAME[command].build_parser()
    [action] = [a for a in parser._actions if flag in a.option_strings]
    return " ".join(argparse.HelpFormatter(parser.prog)._expand_help(action).split())


@pytest.mark.parametrize("command", ["run", "attribute"])
def test_system_help_names_every_registered_system(command):
    text = _help(command, "--system")
    words = set(re.findall(r"[a-z0-9_]+", text))
    named = [name for name in SYSTEMS if name in words]
    assert named == list(SYSTEMS), (
        f"--system's help names {len(named)} of {len(SYSTEMS)} systems: {text}"
    )


@pytest.mark.parametrize("command", ["run", "attribute"])
def test_dataset_help_names_every_dataset_kind(command):
    text = _help(command, "--dataset")
    kinds = (
        [f"{scheme}:" for scheme in LOADERS]
        + [f"builtin:{n}" for n in BUILTINS]
        + [f"synthetic:{k}" for k in GENERATORS]
        + ["agentic:generate"]
    )
    missing = [kind for kind in kinds if kind not in text]
    assert not missing, f"--dataset's help leaves out {missing}: {text}"


def test_the_systems_benchmark_says_how_many_systems_it_runs(capsys):
    from experiments.bench import systems as bench

    with pytest.raises(SystemExit):
        bench.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"all {len(SYSTEMS)}:" in text and all(name in text for name in SYSTEMS), text
