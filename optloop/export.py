"""``python -m optloop.export``: the command lives in :mod:`optloop.cli.export`; this module
keeps the documented path working."""

import os
import sys

from optloop.offline import quiet_defaults

if __name__ == "__main__":  # run as a command: tqdm's bars off unless --verbose, before any import
    os.environ.update(quiet_defaults())

from optloop.cli.export import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    from optloop.cli.command import run_cli

    sys.exit(run_cli(main))
