"""``python -m optloop``: the ``optloop`` command (:mod:`optloop.console`)."""

import sys

from optloop.console import main

sys.exit(main())
