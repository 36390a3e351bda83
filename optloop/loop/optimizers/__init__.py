"""The optimizers: one module each behind one small contract, and one registry of their names.

:mod:`~optloop.loop.optimizers.base` holds the contract (:class:`~.base.Optimizer`: propose,
observe, retarget, release, and the hooks a resumed or shared run needs);
:mod:`~optloop.loop.optimizers.registry` is the only list of names ``--optimizer`` takes, one
entry each (where it lives and what the run's wiring needs to know of it). Each optimizer's module
holds its class and its cost model (``work``, what ``--estimate`` adds for its own LM calls, found
by name in :mod:`~.work`): SIMBA
(:mod:`~.simba`, its step on a kept pool in :mod:`~.simba_step`), GEPA (:mod:`~.gepa`), Optuna
(:mod:`~.optuna`) and GrIPS-style edits (:mod:`~.edit`); SIMBA and GEPA share the rounds of a
DSPy optimizer (:mod:`~.rounds`), and the proposer's instruction rewrite (:mod:`~.propose`) serves
Optuna and the rounds' fallback.

They run ``num_threads`` programs at once (one on the embedded model): each thread records into its
own recorder, and a shared store serves one question at a time. Importing this package loads
nothing (the run's configuration reads the registry without DSPy).
"""
