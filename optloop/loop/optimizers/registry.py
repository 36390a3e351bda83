"""The optimizers ``--optimizer`` names: :data:`OPTIMIZERS`, one :class:`OptimizerSpec` each, the
only list of their names, where each lives and what the run's wiring needs to know of it before
building one.

Adding an optimizer is a module in this package (its
:class:`~optloop.loop.optimizers.base.Optimizer` and its cost model, a function ``work`` of a
:class:`~optloop.loop.spending.shape.RunShape`) and one line in :data:`OPTIMIZERS`; everything
else reads the registry: the names :class:`~optloop.loop.config.LoopConfig` takes,
``--optimizer``'s choices and help (``optloop run``, ``python -m optloop demo-repair``), the
run's wiring (:mod:`optloop.loop.runs.runner`) and ``--estimate``'s model
(:mod:`optloop.loop.optimizers.work`). ``optloop.optimize(optimizer=...)`` also takes a spec or
an :class:`~optloop.loop.optimizers.base.Optimizer` subclass, registered for the process under
its name (:func:`resolve`): the run records that name, as it records a registered one.

This module imports nothing of optloop, so the run's configuration (:mod:`optloop.loop.config`)
reads the names from it without loading DSPy; the classes and cost models are imported when asked
for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from optloop.loop.optimizers.base import Optimizer

OptimizerName: TypeAlias = str
"""What ``--optimizer`` takes: a key of :data:`OPTIMIZERS` (stored in checkpoints and run names:
renaming one is a data migration)."""

SIMBA, GEPA, OPTUNA, EDIT = "simba", "gepa", "optuna", "edit"
"""The names of the optimizers of this package (each module's ``name``)."""


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer: its name (what ``--optimizer`` takes and the run records), the module
    holding its class (and its cost model), and its class (a name in that module, or the class
    itself); ``summary``: what ``--optimizer``'s help says of it beside its name;
    ``shared_study``: its trials come from an Optuna study that several workers of one run may
    share (the run is coordinated by a shared study, and a run another process holds is joined
    rather than refused); ``tunes_knobs``: it searches the blamed knobs' values too;
    ``cost_model``: the function of the module that models its own LM calls over a run
    (``--estimate``; ``None``: none, the estimate then counts its calls once trials have run)."""

    name: str
    module: str
    cls: str | type[Optimizer]
    summary: str = ""
    shared_study: bool = False
    tunes_knobs: bool = False
    cost_model: str | None = "work"

    @classmethod
    def of(cls, optimizer: type[Optimizer]) -> OptimizerSpec:
        """The spec of an :class:`~optloop.loop.optimizers.base.Optimizer` subclass: named by its
        ``name`` (else its class name), in no shared study, tuning no knobs, without a cost
        model."""
        from optloop.loop.optimizers.base import Optimizer

        if not (isinstance(optimizer, type) and issubclass(optimizer, Optimizer)):
            raise ValueError(f"{optimizer!r} is not a subclass of Optimizer")
        name = getattr(optimizer, "name", None)
        return cls(
            name if isinstance(name, str) and name else optimizer.__name__,
            optimizer.__module__,
            optimizer,
            cost_model=None,
        )

    def load(self) -> type[Optimizer]:
        """The class (imported from :attr:`module` when named)."""
        if not isinstance(self.cls, str):
            return self.cls
        found: type[Optimizer] = getattr(importlib.import_module(self.module), self.cls)
        return found


OPTIMIZERS: dict[OptimizerName, OptimizerSpec] = {
    spec.name: spec
    for spec in (
        OptimizerSpec(SIMBA, "optloop.loop.optimizers.simba", "SimbaOptimizer"),
        OptimizerSpec(GEPA, "optloop.loop.optimizers.gepa", "GepaOptimizer"),
        OptimizerSpec(
            OPTUNA,
            "optloop.loop.optimizers.optuna",
            "OptunaOptimizer",
            summary="TPE over proposed instructions and knobs",
            shared_study=True,
            tunes_knobs=True,
        ),
        OptimizerSpec(
            EDIT,
            "optloop.loop.optimizers.edit",
            "EditOptimizer",
            summary="GrIPS-style phrase edits of the blamed instruction: delete, swap, "
            "paraphrase, add back; needs no strong proposer",
        ),
    )
}
"""Every optimizer by name, in the order ``--optimizer`` lists them."""

DEFAULT: OptimizerName = SIMBA
"""The optimizer of a run that names none, when an endpoint writes the instructions."""
WITHOUT_WRITER: OptimizerName = EDIT
"""The optimizer of a run that names none when the embedded model writes the instructions (it
needs no strong proposer)."""


def names() -> list[OptimizerName]:
    """The names ``--optimizer`` takes, in order."""
    return list(OPTIMIZERS)


def entry(name: str) -> OptimizerSpec:
    """The spec of ``name`` (a :class:`KeyError` naming the choices for another name)."""
    if name not in OPTIMIZERS:
        raise KeyError(f"no optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def check(name: str) -> OptimizerName:
    """``name`` if it is registered, else a :class:`ValueError` listing the names (as a literal's
    refusal reads)."""
    if name not in OPTIMIZERS:
        quoted = [repr(n) for n in OPTIMIZERS]
        choices = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
        raise ValueError(f"Input should be {choices}")
    return name


def register(spec: OptimizerSpec) -> OptimizerName:
    """Add ``spec`` to :data:`OPTIMIZERS` (nothing to do when it is there already) and return its
    name; a :class:`ValueError` when another optimizer holds the name."""
    held = OPTIMIZERS.get(spec.name)
    if held is not None and held != spec:
        raise ValueError(
            f"the optimizer name {spec.name!r} is taken by {held.module}.{_class_name(held)}; "
            "give the optimizer another name"
        )
    OPTIMIZERS[spec.name] = spec
    return spec.name


def resolve(optimizer: OptimizerName | OptimizerSpec | type[Optimizer]) -> OptimizerName:
    """The name a run records for ``optimizer``: a name as given (:class:`LoopConfig` checks it),
    a spec or an :class:`~optloop.loop.optimizers.base.Optimizer` subclass registered under its
    name (a registered class under the name it is registered by). An optimizer object is refused
    (:class:`ValueError`): the run builds its optimizer on the run's evaluator, proposer LM and
    train split, so it takes the class, or a spec naming it."""
    if isinstance(optimizer, str):
        return optimizer
    if isinstance(optimizer, OptimizerSpec):
        return register(optimizer)
    if isinstance(optimizer, type):
        # A class's module is loaded already: a spec of that module is loaded without an import.
        for spec in OPTIMIZERS.values():
            if spec.module == optimizer.__module__ and spec.load() is optimizer:
                return spec.name
        return register(OptimizerSpec.of(optimizer))
    raise ValueError(
        f"an optimizer is a name ({', '.join(OPTIMIZERS)}), an OptimizerSpec or an Optimizer "
        f"subclass, not a {type(optimizer).__name__} object: the run builds the optimizer on its "
        "own evaluator, proposer LM and train split"
    )


def optimizer_class(name: str) -> type[Optimizer]:
    """The :class:`~optloop.loop.optimizers.base.Optimizer` ``--optimizer name`` builds."""
    return entry(name).load()


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
    return [name for name, spec in OPTIMIZERS.items() if spec.shared_study]


def _class_name(spec: OptimizerSpec) -> str:
    return spec.cls if isinstance(spec.cls, str) else spec.cls.__qualname__


__all__ = [
    "DEFAULT",
    "EDIT",
    "GEPA",
    "OPTIMIZERS",
    "OPTUNA",
    "SIMBA",
    "WITHOUT_WRITER",
    "OptimizerName",
    "OptimizerSpec",
    "check",
    "entry",
    "module_path",
    "names",
    "optimizer_class",
    "register",
    "resolve",
    "shared_study",
    "sharing",
    "tunes_knobs",
]
