"""optloop in Python: :func:`optimize` runs the closed loop (``optloop.attribute(...)``, which
attributes a system's failures, lives with its command in :mod:`optloop.attribute`).

It runs exactly what ``optloop run`` runs and returns the result object instead of printing
it. Heavy modules (DSPy, MLflow, the memory libraries) are imported inside the functions, so
``import optloop`` stays cheap and changes nothing in the process's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from optloop.offline import offline_defaults

if TYPE_CHECKING:
    from optloop.loop.state import LoopResult


def optimize(
    system: str = "mem0",
    dataset: str | None = None,
    budget: int = 3,
    optimizer: str = "simba",
    lm: str | None = None,
    *,
    seed: int = 0,
    sites: Sequence[str] | None = None,
    untargeted: bool = False,
    query_rewrite: bool = False,
    start: Mapping[str, str] | None = None,
    knobs: Mapping[str, Any] | None = None,
    split: tuple[float, float, float] | None = None,
    promote_if: str = "ci",
    proposer_lm: str | None = None,
    lm_base_url: str | None = None,
    concurrency: int | str | None = None,
    batch: int = 1,
    control: bool = True,
    allow_small_splits: bool = False,
    max_cost: float | None = None,
    max_calls: int | None = None,
    run_name: str | None = None,
    new: bool = False,
    tracking_uri: str | None = None,
    storage: str | None = None,
    verbose: bool = False,
) -> LoopResult:
    """Find which prompt makes a memory system fail, rewrite only that prompt, and measure the
    change.

    The same run as ``optloop run`` with the matching flags: the dataset is split by episode, the
    baseline's failures are attributed and blamed, the optimizer rewrites the blamed sites within
    ``budget`` evaluations on dev, and the baseline and the best candidate are compared on the
    held-out test split. Every trial is an MLflow run; the same call resumes an unfinished run of
    the same settings (``new=True`` starts afresh).

    Example:

        .. code-block:: python

            import optloop

            result = optloop.optimize(system="rag_bm25", budget=3, optimizer="edit")
            print(result.delta_test_ci, result.changed_sites)

    Args:
        system:
            A memory system of ``systems.SYSTEMS``: ``mem0``, ``graphiti``, ``tiered``, ``gated``,
            ``long_context``, ``rag_bm25``, ``rag_embedding`` or ``md_flat``.
        dataset:
            A dataset URI, e.g. ``synthetic:recall?seed=0&episodes=40``,
            ``memfail:persona?limit=40``, ``locomo:<path>`` (see ``docs/systems.md``); :obj:`None`
            is the dataset optloop generates for the system (``optloop.datasets.defaults``: 20 dev
            and 20 test questions).
        budget:
            Candidate evaluations on the dev split.
        optimizer:
            ``simba``, ``gepa``, ``optuna`` or ``edit``.
        lm:
            The LM spec: ``local`` (the embedded model), ``local:<name>`` (a model of
            ``python -m optloop.models list``, e.g. ``local:qwen2.5-coder-1.5b``),
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
            Train, dev and test shares of the episodes; :obj:`None` is ``(0.5, 0.25, 0.25)``.
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
            Show library log lines.

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
        optloop.loop.spend.RunStopped:
            ``max_cost`` or ``max_calls`` was reached; the run is saved and the same call with a
            higher limit resumes it.
    """
    argv = [
        "--system",
        system,
        "--budget",
        str(budget),
        "--optimizer",
        optimizer,
        "--seed",
        str(seed),
        "--promote-if",
        promote_if,
    ]
    flags: dict[str, Any] = {
        "--dataset": dataset,
        "--batch": batch if batch != 1 else None,
        "--lm": lm,
        "--proposer-lm": proposer_lm,
        "--lm-base-url": lm_base_url,
        "--concurrency": concurrency,
        "--max-cost": max_cost,
        "--max-calls": max_calls,
        "--run-name": run_name,
        "--tracking-uri": tracking_uri,
        "--storage": storage,
        "--sites": ",".join(sites) if sites else None,
        "--split": ",".join(map(str, split)) if split else None,
    }
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, str(value)]
    for site, text in (start or {}).items():
        argv += ["--start", f"{site}={text}"]
    for name, value in (knobs or {}).items():
        argv += ["--knob", f"{name}={value}"]
    argv += [
        flag
        for flag, on in (
            ("--untargeted", untargeted),
            ("--allow-small-splits", allow_small_splits),
            ("--query-rewrite", query_rewrite),
            ("--new", new),
            ("--no-control", not control),
            ("--verbose", verbose),
        )
        if on
    ]
    os.environ.update(
        offline_defaults()
    )  # before DSPy, litellm and the memory libraries are imported
    from optloop.run import execute

    return execute(argv)
