"""docs/cli.md is what the parsers say: a flag added, removed or reworded in code fails here until
the reference is written again (``python -m optloop clidoc > docs/cli.md``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from optloop.cli import clidoc
from optloop.cli.console import COMMANDS

DOC = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


def test_docs_cli_md_is_generated_from_the_parsers():
    assert DOC.read_text(encoding="utf-8") == clidoc.render(), (
        "docs/cli.md drifted from the command-line parsers; write it again: python -m "
        "optloop clidoc > docs/cli.md"
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_flag_of_every_command_is_in_the_reference(command):
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"## optloop {command.name}\n", 1)[1].split("\n## ", 1)[0]
    parser = command.build_parser()
    flags = [
        s
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction)
        for s in a.option_strings
    ]
    assert flags and all(f"`{flag}`" in section for flag in flags), [
        f for f in flags if f"`{f}`" not in section
    ]


def test_a_flag_added_to_a_parser_makes_the_reference_drift(monkeypatch):
    """The drift check catches a planted change: one more flag on ``optloop export``'s parser."""
    import optloop.cli.export as export

    original = export.build_parser

    def with_one_more_flag() -> argparse.ArgumentParser:
        parser = original()
        parser.add_argument("--planted-flag", help="not in docs/cli.md")
        return parser

    monkeypatch.setattr(export, "build_parser", with_one_more_flag)
    assert clidoc.render() != DOC.read_text(encoding="utf-8")
    assert "`--planted-flag`" in clidoc.render()


def test_optloop_clidoc_writes_the_reference_to_out(tmp_path, capsys):
    out = tmp_path / "docs" / "cli.md"
    assert clidoc.main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == clidoc.render() and capsys.readouterr().out == ""
