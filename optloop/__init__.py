"""optloop: trace every memory operation, blame the faulty prompt, optimize only that prompt.

In Python::

    import optloop

    result = optloop.optimize(
        system="rag_bm25", dataset="builtin:tiny", budget=3, optimizer="edit"
    )
    report = optloop.attribute(system="rag_bm25", dataset="builtin:tiny")

:func:`optimize` returns the run's :class:`~optloop.loop.state.LoopResult`, :func:`attribute` an
:class:`AttributionReport`. Importing optloop loads nothing else (its version aside): each name
below is imported on first use, and the heavy libraries (DSPy, MLflow, the memory systems) only
when a function runs. Importing optloop changes nothing in the environment; its commands and
functions apply the offline defaults (:mod:`optloop.offline`) when they start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from optloop._version import __version__

__all__ = ["AttributionReport", "LoopResult", "__version__", "attribute", "optimize"]

if TYPE_CHECKING:
    from optloop._api import optimize
    from optloop.analysis import AttributionReport, attribute
    from optloop.loop.state import LoopResult


def __getattr__(name: str) -> Any:
    if name == "optimize":
        return importlib.import_module("optloop._api").optimize
    if name == "AttributionReport":
        return importlib.import_module("optloop.analysis").AttributionReport
    if name == "attribute":
        return importlib.import_module("optloop.analysis").attribute
    if name == "LoopResult":
        return importlib.import_module("optloop.loop.state").LoopResult
    raise AttributeError(f"module 'optloop' has no attribute {name!r}")
