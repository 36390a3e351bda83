"""Names a loop run's MLflow records share: the parent run's tag :data:`BEATS_CONTROL` and
:func:`metric_key`, which makes a target or site name metric-safe. A leaf: the modules that build
the metrics (:mod:`optloop.loop.tracking.metrics`, :mod:`optloop.loop.tracking.sink`,
:mod:`optloop.loop.cost`) import it, it imports none of them.

Every metric a run logs, on its parent run (one ``optloop.run``) and its child runs (one
candidate each): ``docs/loop.md``, "MLflow metrics".
"""

from __future__ import annotations

import re

BEATS_CONTROL = "optloop.beats_control"  # the parent run's tag: True, False or "no control"


def metric_key(name: str) -> str:
    """A metric-safe name: ``knob:top_k`` -> ``knob_top_k``."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)
