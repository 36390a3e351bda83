"""docs/cli.md, the command-line reference, written from the parsers themselves.

    optloop clidoc > docs/cli.md            # or: optloop clidoc --out docs/cli.md

Every subcommand of ``optloop`` (:data:`optloop.cli.console.COMMANDS`) is rendered from the parser
its module builds: usage, summary, and one table per group of flags with each flag's value,
default, choices and help. ``tests/optloop/cli/test_clidoc.py`` fails when docs/cli.md differs from
what this prints, so a flag added, removed or reworded in code cannot leave the reference behind.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from optloop.cli.command import CommandParser
from optloop.cli.console import COMMANDS
from optloop.cli.console import build_parser as build_top_parser
from optloop.paths import write_atomic

WIDTH = 100
"""Usage lines are wrapped at this width whatever the terminal (argparse reads $COLUMNS
otherwise)."""


OUTPUT = (
    "**Output.** On a terminal a command shows a live status line and draws its tables at the "
    "terminal's width. In a file, a pipe or a CI log it prints plain lines instead: `optloop run` "
    "one per stage and per trial, `optloop attribute` one per episode "
    "(`[41 s] episode 3/40 recall-2: 4/6 correct so far, 2 failures attributed, ETA 2 min`), each "
    "after the time so far, tables `$COLUMNS` wide (else 120), each title a line of its own, and "
    "each warning one line (`WARNING optloop.loop.runs.runner: ...`). "
    "Either way `optloop run` appends its lines and tables, each line after the time of day, to "
    "`run.log` in the run's directory, and `optloop attribute` to `run.log` beside its reports. "
    "Third-party progress bars (tqdm's: GEPA's, MLflow's, Hugging Face's) and library INFO logs "
    "show only with `--verbose`."
)
"""The paragraph on what the commands print, where, and at what width."""


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(parser.prog, width=WIDTH, max_help_position=40)


def _cell(text: str) -> str:
    """One table cell: one line, its pipes escaped, its <placeholders> shown rather than read as
    HTML."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _flag(action: argparse.Action) -> str:
    names = (
        ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
    )
    if action.nargs == 0 or not (action.option_strings or action.choices):
        return names  # a flag without a value, or a positional named by its metavar
    metavar = action.metavar or (
        ("{" + ",".join(map(str, action.choices)) + "}") if action.choices else action.dest.upper()
    )
    return f"{names} `{metavar}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS) or action.required:
        return "required" if action.required else ""
    value = (
        ",".join(map(str, action.default)) if isinstance(action.default, tuple) else action.default
    )
    return f"`{value}`"


def _help(action: argparse.Action, formatter: argparse.HelpFormatter) -> str:
    # the %(default)s / %% expansion argparse does
    text = formatter._expand_help(action) if action.help else ""
    if action.choices and not all(str(choice) in text for choice in action.choices):
        text = f"{text} (one of: {', '.join(map(str, action.choices))})".strip()
    return _cell(text)


def _summary(parser: argparse.ArgumentParser) -> str:
    """The description's first paragraph (a module docstring's title line)."""
    return " ".join((parser.description or "").strip().split("\n\n")[0].split())


def render_parser(parser: argparse.ArgumentParser, title: str) -> list[str]:
    parser.format_help()  # a CommandParser adds --verbose and the LM flags when first used
    formatter = _formatter(parser)
    usage = formatter._format_usage(
        parser.usage, parser._actions, parser._mutually_exclusive_groups, ""
    )
    out = [f"## {title}", "", _summary(parser), "", "```", usage.strip(), "```"]
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help is not argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        if not actions:
            continue
        heading = "flags" if group.title in ("options", "optional arguments") else group.title
        out += [
            "",
            f"**{heading}**" + (f": {_cell(group.description)}" if group.description else ""),
            "",
            "| flag | default | what it does |",
            "|---|---|---|",
        ]
        out += [f"| {_flag(a)} | {_default(a)} | {_help(a, formatter)} |" for a in actions]
    if parser.epilog:
        out += ["", "```", parser.epilog.strip(), "```"]
    out.append("")
    return out


def render() -> str:
    """docs/cli.md's text."""
    top = build_top_parser()
    out = [
        "# Command-line reference",
        "",
        "Generated from the parsers by `python -m optloop clidoc > docs/cli.md`; a test fails "
        "when it drifts from them. Each `optloop COMMAND` is also `python -m optloop COMMAND` "
        "with the same flags. How the commands fit together: [loop.md](loop.md), "
        "[attribution.md](attribution.md), [endpoints.md](endpoints.md).",
        "",
        OUTPUT,
        "",
        "## optloop",
        "",
        "```",
        _formatter(top)
        ._format_usage(top.usage, top._actions, top._mutually_exclusive_groups, "")
        .strip(),
        "```",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    out += [f"| [`optloop {c.name}`](#optloop-{c.name}) | {c.summary} |" for c in COMMANDS]
    out.append("")
    for command in COMMANDS:
        out += render_parser(command.build_parser(), f"optloop {command.name}")
    return "\n".join(out)


def build_parser() -> CommandParser:
    parser = CommandParser("optloop clidoc", __doc__)
    parser.add_argument(
        "--out",
        metavar="PATH",
        type=Path,
        help="write the reference to PATH (docs/cli.md) instead of stdout",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """docs/cli.md's text on stdout, or in ``--out`` (logging is left as it is: a record on
    stdout would land in the reference)."""
    args = build_parser().parse_args(argv)
    text = render()
    if args.out is None:
        sys.stdout.write(text)
    else:
        write_atomic(args.out, text)
    return 0
