"""What a run may spend and how long it should take: the spending limits (:mod:`~.limits`:
``--max-cost``, ``--max-calls``, :class:`~.limits.RunStopped`), the ``--estimate`` of the whole
run from its baseline (:mod:`~.estimate`; the optimizer's own work in :mod:`~.optimizer_work`,
the chains of sequential requests that floor an evaluation's time in :mod:`~.chains`), the shape
of a run each optimizer's cost model reads (:mod:`~.shape`) and the time a run has left
(:mod:`~.eta`).

Spending flows one way: the optimizers read this package (each one's cost model, beside its
class in :mod:`optloop.loop.optimizers`, takes a :class:`~.shape.RunShape` and returns an
:class:`~.optimizer_work.OptimizerWork`), and nothing here imports an optimizer
(``tests/optloop/loop/spending/test_imports.py``)."""
