"""Each optimizer's model of its own LM calls over a run, found by its name: what ``--estimate``
adds to the trials before any trial has finished.

A model is a function of a :class:`~optloop.loop.spending.shape.RunShape` (the run's shape and the
baseline's measurements) returning an :class:`~optloop.loop.spending.optimizer_work.OptimizerWork`,
kept beside the optimizer's class in its module (``work``); its registry entry
(:class:`~optloop.loop.optimizers.registry.OptimizerSpec`) names the module and the function.
The spending package prices what a model returns and imports nothing of the optimizers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from optloop.loop.optimizers import registry
from optloop.loop.spending.optimizer_work import OptimizerWork
from optloop.loop.spending.shape import RunShape

CostModel = Callable[[RunShape], OptimizerWork]


def cost_model(optimizer: str) -> CostModel:
    """``optimizer``'s model of its own LM calls over a run: the function its spec names
    (``work``) beside its class, in the module the registry names (a :class:`LookupError` for an
    optimizer without one)."""
    spec = registry.entry(optimizer)
    if spec.cost_model is None:
        raise LookupError(f"the optimizer {optimizer!r} has no cost model")
    model: CostModel = getattr(importlib.import_module(spec.module), spec.cost_model)
    return model


def modeled_work(shape: RunShape, optimizer: str) -> OptimizerWork | None:
    """The model of ``optimizer`` on ``shape`` (``None``: no model for it)."""
    spec = registry.OPTIMIZERS.get(optimizer)
    if spec is None or spec.cost_model is None:
        return None
    return cost_model(optimizer)(shape)


__all__ = ["CostModel", "cost_model", "modeled_work"]
