"""The closed loop: evaluate candidates, attribute, blame, optimize only the blamed sites.

``candidate`` (what may change, as data), ``evaluate`` (a candidate over a split, through
the one episode pipeline :mod:`optloop.pipeline`, with ingestion reuse), ``program`` (a
system as a DSPy program with unblamed sites frozen, and the attribution-carrying metric),
``optimizers`` and ``edit`` (SIMBA, GEPA, Optuna, GrIPS-style edits behind one interface),
``state`` (config, checkpoint, result), ``policy`` (the pure rules), ``control`` (the
trivial-instruction control every report compares the best with), ``controller`` (the
loop itself, behind small interfaces), ``coordinator`` (one worker or several),
``mlflow_sink`` and ``record`` (MLflow names, artifacts, registry), ``runner`` (``Loop``:
the wiring). The command is ``python -m optloop.run``; the map is ``docs/architecture.md``.
"""

from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.controller import Controller, RunContext
from optloop.loop.evaluate import Evaluation, Evaluator
from optloop.loop.runner import Loop, LoopConfig, LoopResult

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
