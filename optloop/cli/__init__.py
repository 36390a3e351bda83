"""optloop's commands: each one a module here, its flags, what it prints and its exit codes, over
the library below (``optloop.loop``, ``optloop.analysis``, ``optloop.product``, ...), which never
parses a flag or writes to a console.

:mod:`~optloop.cli.command` is the start every command shares (its parser, the LM flags,
:func:`run_cli`); :mod:`~optloop.cli.console` is the ``optloop`` command, one subcommand per
module: ``run`` (with ``run_args``, ``run_resume``, ``run_tables``), ``attribute``, ``export``,
``doctor``, ``models``, ``ui``, ``demo_repair`` (``optloop demo-repair``) and ``clidoc``
(docs/cli.md). ``optloop COMMAND`` and ``python -m optloop COMMAND`` are the way into each;
``python -m optloop.run`` runs ``run`` too.

The shared start is re-exported here and imported on first use, so that ``optloop --help``
loads no ML library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optloop.cli.command import CommandParser, parse_command, run_cli

__all__ = ["CommandParser", "parse_command", "run_cli"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("optloop.cli.command"), name)
    raise AttributeError(f"module 'optloop.cli' has no attribute {name!r}")
