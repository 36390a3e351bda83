"""The closed loop: evaluate candidates, attribute, blame, optimize only the blamed sites.

``candidate`` (what may change, as data), ``evaluate`` (a candidate over a split,
with ingestion reuse), ``program`` (a system as a DSPy program with unblamed sites
frozen, and the attribution-carrying metric), ``optimizers`` (SIMBA, GEPA, Optuna
behind one interface), ``record`` (MLflow names, artifacts, registry), ``runner``
(the loop itself). The command is ``python -m optloop.run``.
"""

from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.evaluate import Evaluation, Evaluator
from optloop.loop.runner import Loop, LoopConfig, LoopResult

__all__ = ["Candidate", "Evaluation", "Evaluator", "Loop", "LoopConfig", "LoopResult", "SiteState"]
