"""The optimizers ``--optimizer`` names: the one list of their names, where each lives and what the
run's wiring needs to know of it before building one.

Adding an optimizer is a module in this package (its
:class:`~optloop.loop.optimizers.base.Optimizer` and its cost model, a function ``work`` of a
:class:`~optloop.loop.spending.shape.RunShape`) and one entry here. This module imports nothing of
optloop, so the run's configuration (:mod:`optloop.loop.config`) reads the names from it without
loading DSPy; the classes and cost models are imported when asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from optloop.loop.optimizers.base import Optimizer

OptimizerName = Literal["simba", "gepa", "optuna", "edit"]
"""What ``--optimizer`` takes (stored in checkpoints and run names: renaming one is a data
migration)."""
NAMES: tuple[OptimizerName, ...] = get_args(OptimizerName)
SIMBA, GEPA, OPTUNA, EDIT = NAMES

DEFAULT: OptimizerName = SIMBA
"""The optimizer of a run that names none, when an endpoint writes the instructions."""
WITHOUT_WRITER: OptimizerName = EDIT
"""The optimizer of a run that names none when the embedded model writes the instructions (it
needs no strong proposer)."""


@dataclass(frozen=True)
class Entry:
    """One optimizer: the module holding its class (and its cost model ``work``) and its class's
    name there; ``shared_study``: its trials come from an Optuna study that several workers of one
    run may share (the run is coordinated by a shared study, and a run another process holds is
    joined rather than refused); ``tunes_knobs``: it searches the blamed knobs' values too."""

    module: str
    cls: str
    shared_study: bool = False
    tunes_knobs: bool = False


ENTRIES: dict[OptimizerName, Entry] = {
    SIMBA: Entry("optloop.loop.optimizers.simba", "SimbaOptimizer"),
    GEPA: Entry("optloop.loop.optimizers.gepa", "GepaOptimizer"),
    OPTUNA: Entry(
        "optloop.loop.optimizers.optuna", "OptunaOptimizer", shared_study=True, tunes_knobs=True
    ),
    EDIT: Entry("optloop.loop.optimizers.edit", "EditOptimizer"),
}


def entry(name: str) -> Entry:
    """The entry of ``name`` (a :class:`KeyError` naming the choices for another name)."""
    if name not in ENTRIES:
        raise KeyError(f"no optimizer {name!r}; choose one of {', '.join(NAMES)}")
    return ENTRIES[name]


def optimizer_class(name: str) -> type[Optimizer]:
    """The :class:`~optloop.loop.optimizers.base.Optimizer` ``--optimizer name`` builds."""
    found = entry(name)
    cls: type[Optimizer] = getattr(importlib.import_module(found.module), found.cls)
    return cls


def module_path(name: str) -> str:
    """The file ``name`` lives in, as a run's output names it
    (``optloop/loop/optimizers/edit.py``)."""
    return entry(name).module.replace(".", "/") + ".py"


def shared_study(name: str) -> bool:
    return entry(name).shared_study


def tunes_knobs(name: str) -> bool:
    return entry(name).tunes_knobs


def sharing() -> list[str]:
    """The optimizers whose runs several workers may share."""
    return [name for name in NAMES if ENTRIES[name].shared_study]
