"""optloop in Python: :func:`optimize` runs the closed loop (``optloop.attribute(...)``, which
attributes a system's failures, is :func:`optloop.analysis.attribute`).

It runs what ``optloop run`` runs and returns the result object; it prints nothing (what the run
says reaches an ``on_event`` callback, when one is given, and the run's ``run.log``). Its keyword
arguments become the same typed objects the command's flags become
(:mod:`optloop.loop.runs.request`: ``LoopConfig``, ``RunOptions``, the LMs' ``LMSettings``), and
:func:`optloop.loop.runs.session.run` runs them: no command line is built or parsed. The defaults
in its signature are those models' field defaults, read from them, so the function and the command
cannot disagree.

Heavy modules (DSPy, MLflow, the memory libraries) are imported inside the functions, so
``import optloop`` stays cheap and changes nothing in the process's environment
(:mod:`optloop.loop.config` and :mod:`optloop.loop.runs.request` need pydantic only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from optloop.loop.config import LoopConfig, OptimizerName
from optloop.loop.runs.request import RunOptions, RunRequest, checked, loop_config, run_lms
from optloop.loop.spending.limits import SpendingLimits
from optloop.offline import offline_defaults

if TYPE_CHECKING:
    from optloop.loop.optimizers.base import Optimizer
    from optloop.loop.optimizers.registry import OptimizerSpec
    from optloop.loop.runs.session import OnEvent
    from optloop.loop.state import LoopResult

_LOOP = LoopConfig.model_fields
_RUN = RunOptions.model_fields


def optimize(
    system: str = _LOOP["system"].default,
    dataset: str | None = None,
    budget: int = _LOOP["budget"].default,
    optimizer: OptimizerName | OptimizerSpec | type[Optimizer] | None = None,
    lm: str | None = None,
    *,
    seed: int = _LOOP["seed"].default,
    sites: Sequence[str] | None = None,
    untargeted: bool = _LOOP["untargeted"].default,
    query_rewrite: bool = _LOOP["query_rewrite"].default,
    start: Mapping[str, str] | None = None,
    knobs: Mapping[str, Any] | None = None,
    split: tuple[float, float, float] | None = _LOOP["fractions"].default,
    promote_if: Literal["ci", "delta"] = _LOOP["promote_if"].default,
    proposer_lm: str | None = None,
    lm_base_url: str | None = None,
    concurrency: int | str | None = None,
    batch: int = _LOOP["batch"].default,
    control: bool = _LOOP["control"].default,
    race: bool = _LOOP["race"].default,
    min_gain: float = _LOOP["min_gain"].default,
    stall: int = _LOOP["stall"].default,
    allow_small_splits: bool = _RUN["allow_small_splits"].default,
    max_cost: float | None = None,
    max_calls: int | None = None,
    run_name: str | None = None,
    new: bool = _RUN["new"].default,
    tracking_uri: str | None = None,
    storage: str | None = None,
    verbose: bool = False,
    on_event: OnEvent | None = None,
) -> LoopResult:
    """Find which prompt makes a memory system fail, rewrite only that prompt, and measure the
    change.

    The same run as ``optloop run`` with the matching flags, and the same defaults: the dataset is
    split by episode, the baseline's failures are attributed and blamed, the optimizer rewrites the
    blamed sites within ``budget`` evaluations on dev, and the baseline and the best candidate are
    compared on the held-out test split. Every trial is an MLflow run; the same call resumes an
    unfinished run of the same settings (``new=True`` starts afresh).

    Example:

        .. code-block:: python

            import optloop

            result = optloop.optimize(system="rag_bm25", budget=3, optimizer="edit")
            print(result.delta_test_ci, result.changed_sites)

    Args:
        system:
            A memory system: a name of ``systems.SYSTEMS`` (``optloop run --help`` lists them).
        dataset:
            A dataset URI, e.g. ``synthetic:recall?seed=0&episodes=40``,
            ``memfail:persona?limit=40``, ``locomo:<path>`` (see ``docs/systems.md``); :obj:`None`
            is the dataset optloop generates (``optloop.datasets.defaults``: 20 dev and 20 test
            questions).
        budget:
            Candidate evaluations on the dev split.
        optimizer:
            A name ``--optimizer`` takes (the keys of
            ``optloop.loop.optimizers.registry.OPTIMIZERS``), an
            ``optloop.loop.optimizers.registry.OptimizerSpec`` or a subclass of
            ``optloop.loop.optimizers.base.Optimizer``, as a study takes a sampler: a spec or a
            class is registered under its name (a class's ``name``), which the run records, so
            the same call resumes the run. The run builds the optimizer itself, on its evaluator,
            proposer LM and train split, so it takes the class, not an object of it.
            :obj:`None` is the command's rule
            (:func:`optloop.loop.runs.request.default_optimizer`): ``edit`` when the instructions
            would be written by the embedded model (``proposer_lm``, else ``lm``, is ``local``),
            ``simba`` when by an endpoint (pass ``optimizer="simba"`` to run SIMBA on the
            embedded model).
        lm:
            The LM spec: ``local`` (the embedded model), ``local:<name>`` (a model of
            ``python -m optloop models list``, e.g. ``local:qwen2.5-coder-1.5b``),
            ``local:/path/model.gguf`` or ``openai:<model>``; :obj:`None` reads ``OPTLOOP_LM``,
            else ``local``.
        seed:
            Seed of the split, the optimizer and the bootstrap.
        sites:
            Optimize these prompt sites instead of the blamed ones.
        untargeted:
            Let the optimizer rewrite every site (the ablation).
        query_rewrite:
            Give the system a ``retrieve.query`` site.
        start:
            ``{site: instruction}`` to start from instead of the system's own (``+TEXT`` appends,
            ``TEXT+`` prepends).
        knobs:
            ``{knob: value}`` to start from, e.g. ``{"top_k": 3}``.
        split:
            Train, dev and test shares of the episodes; :obj:`None` is the default.
        promote_if:
            ``ci`` moves the registry's ``champion`` alias only when the held-out gain's 95% CI
            lies above 0; ``delta`` on any positive gain.
        proposer_lm:
            The LM spec that writes new instructions; :obj:`None` is the system's LM.
        lm_base_url:
            Base URL of an OpenAI-compatible endpoint (else ``OPENAI_BASE_URL``).
        concurrency:
            LM requests in flight at once, or ``"auto"`` (probe the endpoint).
        batch:
            Candidates of one optimizer round evaluated at once (an endpoint's slots fill up).
        control:
            Evaluate the trivial-instruction control (the start program with each blamed site
            given DSPy's default instruction for its signature) on dev and test, so the result
            says whether the loop's prompt beats it (``beats_control``, ``delta_control_ci``);
            ``False`` skips it, and the result cannot say what the loop's writing earned.
        race:
            Race each candidate on dev against the best so far and stop its evaluation once it is
            significantly worse (:mod:`optloop.loop.racing`); ``False`` answers every dev
            question with every candidate.
        min_gain:
            The smallest held-out gain the run is meant to show: the result's ``power`` line says
            whether the dev and test splits can show it.
        stall:
            After this many trials in a row without a new best, check again whether the prompt at
            the control's sites can matter (the start program, the control and the best trial
            that rewrote them, on the same dev questions) and move the rest of the budget to the
            other targets when all three agree within ``min_gain``; 0 never checks again.
        allow_small_splits:
            Run even when the dev or test split has fewer than 20 questions (its CIs are too wide
            to show a change).
        max_cost:
            Stop once the run has spent this many dollars (a model with a price only).
        max_calls:
            Stop once the models have computed this many calls.
        run_name:
            Start or resume the run of this name.
        new:
            Start a new run even if an unfinished run of these settings exists.
        tracking_uri:
            The MLflow tracking URI (default ``sqlite:///mlruns/mlflow.db``).
        storage:
            The Optuna storage URL (``optimizer="optuna"``).
        verbose:
            Accepted for the command's ``--verbose``; a library call leaves logging to its
            program.
        on_event:
            Called with each thing the run says as it runs
            (:data:`optloop.loop.runs.session.RunEvent`: which run, each stage, each trial, the
            projection, the result); :obj:`None` says nothing. Either way the run's ``run.log``
            gets what ``optloop run`` shows while the run runs.

    Returns:
        The run's :class:`~optloop.loop.state.LoopResult`: dev and held-out accuracies with their
        95% CIs (``test_before_ci``, ``test_after_ci``, ``delta_test_ci``; the control's
        ``control_dev``, ``test_control_ci``, ``delta_control_ci``), the blamed and changed
        sites, whether the ``champion`` alias moved and why, every candidate tried, the prompt
        diff, the cost and the MLflow parent run id.

    Raises:
        optloop.errors.OptloopError:
            Bad input (exit code 2 on the command line), an unavailable endpoint (75), or a state
            that cannot be written (74); nothing is written for bad input.
        optloop.loop.spending.limits.RunStopped:
            ``max_cost`` or ``max_calls`` was reached; the run is saved and the same call with a
            higher limit resumes it.
    """
    os.environ.update(
        offline_defaults()
    )  # before DSPy, litellm and the memory libraries are imported
    from optloop.loop.runs import session

    options = checked(
        RunOptions,
        run_name=run_name,
        new=new,
        allow_small_splits=allow_small_splits,
        limits=checked(SpendingLimits, max_cost=max_cost, max_calls=max_calls),
    )
    settings, proposer = run_lms(
        system, lm, proposer_lm, base_url=lm_base_url, concurrency=concurrency
    )
    config = loop_config(
        settings,
        proposer,
        system=system,
        dataset=dataset,
        budget=budget,
        optimizer=optimizer,
        seed=seed,
        untargeted=untargeted,
        sites=[name.strip() for name in sites or () if name.strip()] or None,
        run_name=run_name,
        tracking_uri=tracking_uri,
        storage=storage,
        lm=lm,
        proposer_lm=proposer_lm,
        knobs=dict(knobs or {}),
        start=dict(start or {}),
        fractions=split,
        promote_if=promote_if,
        query_rewrite=query_rewrite,
        batch=batch,
        control=control,
        race=race,
        min_gain=min_gain,
        stall=stall,
    )
    return session.run(RunRequest(config, settings, proposer, options), on_event=on_event)
