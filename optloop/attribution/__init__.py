"""Failure attribution: which operation failed, of which type, and which prompt to fix.

``taxonomy`` (error types, the :class:`Attribution` record), ``evidence``
(gold evidence: dataset ids or hybrid search), ``judges`` (does a variable
still carry it), ``decisive`` (the forward walk), ``blame`` (per-site shares),
``faults`` (the planted-fault harness that measures all of this).
"""

from optloop.attribution.blame import BlameEntry, blame
from optloop.attribution.decisive import attribute
from optloop.attribution.judges import JudgeChain, default_judges
from optloop.attribution.taxonomy import Attribution, ErrorType, Target

__all__ = [
    "Attribution",
    "BlameEntry",
    "ErrorType",
    "JudgeChain",
    "Target",
    "attribute",
    "blame",
    "default_judges",
]
