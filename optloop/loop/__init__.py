"""The closed loop: evaluate candidates, attribute, blame, optimize only the blamed sites.

The core, flat: ``config`` (``LoopConfig``: what a run is, its defaults), ``candidate`` (what may
change, as data), ``evaluate`` (a candidate over a split, through the one episode pipeline
:mod:`optloop.pipeline`, with ingestion reuse), ``program`` (a system as a DSPy program with
unblamed sites frozen, and the attribution-carrying metric), ``state`` (checkpoint, result),
``policy`` (the pure rules), ``cost`` (an evaluation's LM cost per site), ``racing`` (a candidate
raced against the best on dev), ``trivial_control`` (the trivial-instruction control every report
compares the best with), ``controller`` (the loop itself, behind the small ``interfaces``;
``outcome``: the figures a finished run reports). Its wings: ``runs/`` (a run's lifecycle:
``request``, ``session``, ``runner``'s ``Loop`` on its ``context``, ``dirs``, ``split_evaluator``,
``resume``, ``checkpoint_guard``), ``tracking/`` (its MLflow side: ``sink``, ``run``, ``metrics``,
``names``, ``prompt_registry``), ``proposals/`` (what optimizers use to make text: ``gate``,
``writer``, ``units``, ``jobs``), ``workers/`` (``coordinator``: one worker or several, sharing a
``study``), ``optimizers/`` (SIMBA, GEPA, Optuna, GrIPS-style edits behind one interface),
``spending/`` (what a run may spend and how long it should take). The command is
``python -m optloop.run``; the map is ``docs/architecture.md``.

The names below are imported on first use, as :mod:`optloop`'s are: importing a light module
of the package (``optloop.loop.config`` and ``optloop.loop.runs.request``, where the Python API
builds its run) loads no DSPy, MLflow or memory library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optloop.loop.candidate import Candidate, SiteState
    from optloop.loop.config import LoopConfig
    from optloop.loop.controller import Controller
    from optloop.loop.evaluate import Evaluation, Evaluator
    from optloop.loop.runs.context import RunContext
    from optloop.loop.runs.runner import Loop
    from optloop.loop.state import LoopResult

_HOMES = {
    "Candidate": "optloop.loop.candidate",
    "SiteState": "optloop.loop.candidate",
    "Controller": "optloop.loop.controller",
    "RunContext": "optloop.loop.runs.context",
    "Evaluation": "optloop.loop.evaluate",
    "Evaluator": "optloop.loop.evaluate",
    "Loop": "optloop.loop.runs.runner",
    "LoopConfig": "optloop.loop.config",
    "LoopResult": "optloop.loop.state",
}

__all__ = [
    "Candidate",
    "Controller",
    "Evaluation",
    "Evaluator",
    "Loop",
    "LoopConfig",
    "LoopResult",
    "RunContext",
    "SiteState",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'optloop.loop' has no attribute {name!r}")
