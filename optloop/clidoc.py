"""``python -m optloop.clidoc``: :mod:`optloop.cli.clidoc` writes docs/cli.md; this module keeps
the documented path working."""

import sys

from optloop.cli.clidoc import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
