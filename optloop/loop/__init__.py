"""The closed loop: evaluate candidates, attribute, blame, optimize only the blamed sites.

``config`` (``LoopConfig``: what a run is, its defaults), ``request`` (what a run is asked
for and the rules that fill what is unset), ``candidate`` (what may change, as data),
``evaluate`` (a candidate over a split, through the one episode pipeline
:mod:`optloop.pipeline`, with ingestion reuse), ``program`` (a system as a DSPy program with
unblamed sites frozen, and the attribution-carrying metric), ``optimizers`` (SIMBA, GEPA,
Optuna and the GrIPS-style ``edit`` behind one interface), ``budget`` (spending limits and the
``--estimate`` cost model), ``state`` (checkpoint, result), ``policy`` (the pure rules),
``control`` (the trivial-instruction control every report compares the best with),
``controller`` (the loop itself, behind the small ``interfaces``, on its ``run_context``;
``outcome``: the figures a finished run reports), ``coordinator`` and ``study`` (one worker or
several), ``mlflow_sink``, ``mlflow_run`` and ``prompt_registry`` (MLflow names, artifacts,
registry), ``runner`` (``Loop``: the wiring, with ``split_evaluator`` and ``run_dirs``),
``session`` (a run from its request to its result). The command is ``python -m optloop.run``;
the map of every module is ``docs/architecture.md``.

The names below are imported on first use, as :mod:`optloop`'s are: importing a light module
of the package (``optloop.loop.config`` and ``optloop.loop.request``, where the Python API
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
    from optloop.loop.run_context import RunContext
    from optloop.loop.runner import Loop
    from optloop.loop.state import LoopResult

_HOMES = {
    "Candidate": "optloop.loop.candidate",
    "SiteState": "optloop.loop.candidate",
    "Controller": "optloop.loop.controller",
    "RunContext": "optloop.loop.run_context",
    "Evaluation": "optloop.loop.evaluate",
    "Evaluator": "optloop.loop.evaluate",
    "Loop": "optloop.loop.runner",
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
