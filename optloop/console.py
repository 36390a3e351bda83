"""The ``optloop`` command's entry point: :mod:`optloop.cli.console`; this module keeps the
installed ``optloop`` script working."""

import sys

from optloop.cli.console import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
