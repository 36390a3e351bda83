"""Each optimizer's model of its own LM calls over a run, found by its name: what ``--estimate``
adds to the trials before any trial has finished.

A model is a function of a :class:`~optloop.loop.spending.shape.RunShape` (the run's shape and the
baseline's measurements) returning an :class:`~optloop.loop.spending.optimizer_work.OptimizerWork`,
kept beside the optimizer's class in its module (``work``); the registry
(:mod:`~optloop.loop.optimizers.registry`) says which module. The spending package prices what a
model returns and imports nothing of the optimizers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from optloop.loop.optimizers import registry
from optloop.loop.spending.optimizer_work import OptimizerWork
from optloop.loop.spending.shape import RunShape

CostModel = Callable[[RunShape], OptimizerWork]


def cost_model(optimizer: str) -> CostModel:
    """``optimizer``'s model of its own LM calls over a run: the function ``work`` beside its
    class (the module the registry names)."""
    model: CostModel = importlib.import_module(registry.entry(optimizer).module).work
    return model


def modeled_work(shape: RunShape, optimizer: str) -> OptimizerWork | None:
    """The model of ``optimizer`` on ``shape`` (``None``: no model for it)."""
    model = cost_model(optimizer) if optimizer in registry.NAMES else None
    return None if model is None else model(shape)


__all__ = ["CostModel", "cost_model", "modeled_work"]
