"""``python -m optloop``: the ``optloop`` command (:mod:`optloop.console`)."""

import sys

from optloop.cli.console import main

sys.exit(main())
