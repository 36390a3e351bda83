"""``python -m optloop COMMAND``: the ``optloop`` command (:mod:`optloop.cli.console`)."""

import sys

from optloop.cli.console import main

sys.exit(main())
