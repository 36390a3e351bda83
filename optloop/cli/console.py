"""The ``optloop`` command: one entry point, a subcommand per job.

    optloop run --system mem0 --budget 3        # = python -m optloop run ...
    optloop attribute --system rag_bm25         # = python -m optloop attribute ...
    optloop export --run <id> --format mem0 --out mem0_prompts.py
    optloop doctor                              # check the stack with real calls
    optloop models install                      # assemble the Qwen2.5-Coder GGUF models
    optloop ui                                  # the MLflow UI on optloop's store
    optloop demo-repair                         # one sabotage planted, blamed, mended, exported
    optloop clidoc > docs/cli.md                # the command-line reference

The installed ``optloop`` script and ``python -m optloop`` (:mod:`optloop.__main__`) both run
:func:`main`: they are the way into every command. ``python -m optloop.run`` is the one module
path kept besides (:mod:`optloop.run`, over :mod:`optloop.cli.run`). Each subcommand is its
module's own parser and ``main``, so ``optloop run`` and ``python -m optloop.run`` take the same
flags, print the same and exit with the same codes. Subcommand modules are imported only when
run: ``optloop --help`` loads no ML library.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from optloop._version import __version__


@dataclass(frozen=True)
class Command:
    """One subcommand: the module whose ``build_parser`` and ``main`` it runs, and its one-line
    summary."""

    name: str
    module: str
    summary: str

    def build_parser(self) -> argparse.ArgumentParser:
        from optloop.cli.command import command_name

        with command_name(f"optloop {self.name}"):
            return importlib.import_module(self.module).build_parser()

    def main(self) -> Callable[[Sequence[str] | None], int]:
        return importlib.import_module(self.module).main


COMMANDS: tuple[Command, ...] = (
    Command(
        "run", "optloop.cli.run", "the closed loop: blame the failing prompt, rewrite it, measure"
    ),
    Command(
        "attribute",
        "optloop.cli.attribute",
        "blame each wrong answer on an operation and a prompt site",
    ),
    Command(
        "export",
        "optloop.cli.export",
        "write optimized prompts for a product on plain mem0 or graphiti",
    ),
    Command("doctor", "optloop.cli.doctor", "check the stack end to end with real calls"),
    Command("models", "optloop.cli.models", "list and install the GGUF models run in-process"),
    Command("ui", "optloop.cli.ui", "the MLflow UI on optloop's store (loopback only)"),
    Command(
        "demo-repair",
        "optloop.cli.demo_repair",
        "one repair case end to end: a sabotage planted, blamed, mended, exported",
    ),
    Command("clidoc", "optloop.cli.clidoc", "print docs/cli.md, the reference of every command"),
)
BY_NAME = {c.name: c for c in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: ``optloop --help`` and ``--version`` (each subcommand parses its own
    flags)."""
    parser = argparse.ArgumentParser(
        prog="optloop",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="optloop: trace every memory operation, blame the faulty prompt, optimize "
        "only that prompt.",
        epilog="Every subcommand has its own --help (optloop run --help). The same commands run "
        "as python -m optloop COMMAND. Guides: docs/ in the repository; every flag: "
        "docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"optloop {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    for command in COMMANDS:
        sub.add_parser(command.name, help=command.summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``optloop COMMAND [FLAGS]``: run COMMAND's module with FLAGS; exit with its code."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args or args[0] not in BY_NAME:
        if args and not args[0].startswith("-"):
            parser.exit(
                2,
                f"optloop: error: unknown command {args[0]!r}; choose one of: "
                f"{', '.join(BY_NAME)} (optloop --help)\n",
            )
        parser.parse_args(args)  # --help, --version, or a usage error
        parser.print_help()
        return 2
    import os

    from optloop.offline import command_defaults

    # Before optloop.cli.command, which imports DSPy and tqdm: tqdm reads TQDM_DISABLE when
    # imported.
    os.environ.update(command_defaults(args))
    from optloop.cli.command import command_name, run_cli

    command = BY_NAME[args[0]]
    with command_name(f"optloop {command.name}"):
        return run_cli(command.main(), args[1:])
