"""The ``--estimate`` of a run's cost and time, projected from its baseline.

:func:`estimate` (from a checkpoint's baseline) and :func:`project` (from any :class:`Figures`:
measured evaluations, or :class:`ModeledFigures`, as ``experiments/bench/estimate.py`` makes from
a recording) make an :class:`Estimate`: one :class:`Part` per part of the run (the baseline, the
control, the trials, the optimizer's own work, the held-out test) with its calls, tokens, dollars
and hours, each evaluation's time floored by its split's longest chain of sequential requests
(:mod:`optloop.loop.spending.chains`). :data:`MODEL` states the model in the output;
``docs/loop.md`` ("Spending limits", ``--estimate``) explains it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, Field

from optloop.loop.spending.chains import (
    Chains,
    chain_requests,
    evaluation_seconds,
    measured_chains,
)
from optloop.loop.spending.optimizer_work import OptimizerWork, measured_work

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.evaluate import Evaluation
    from optloop.loop.state import Checkpoint


# --- the estimate --------------------------------------------------------------------------------

MODEL = (
    "baseline: measured (train + dev, wall time); each trial: the baseline's dev evaluation "
    "with every request computed (stores reused and cache hits make it cheaper); optimizer: its "
    "own runs on train and its proposer calls, measured on finished trials or modeled from its "
    "structure (see the optimizer line); control: the trivial instruction at the blamed sites, "
    "one evaluation of dev before the trials and one of test, and one of train when dev alone "
    "cannot tell whether the prompt there matters and train and dev together can "
    "(trivial_control.widens; priced as the baseline's train evaluation, an upper bound); "
    "held-out test: 2 evaluations of "
    "the test split (3 with the control), the dev evaluation scaled by sessions + questions; "
    "when no target is an ingest site, the trials, the control and the optimizer's runs reuse "
    "every store and the held-out best and control reuse the start program's: their calls off "
    "the ingest stage alone; "
    "hours: requests x mean latency / concurrency, LM time only, as if that many requests were "
    "always in flight, but an evaluation takes at least its split's longest episode's chain of "
    "sequential requests x latency (its sessions ingested in order, then one question), when "
    "the chains are known; the optimizer's part is not floored"
)


CONTROL_PART = "control on dev"  # the estimate's part for the control's dev evaluation
CONTROL_TRAIN_PART = "control on train"  # when dev alone cannot tell the headroom
HELD_OUT_PART = "held-out test"


class Floor(BaseModel):
    """The chain under a part's evaluations (:class:`Chains`), and whether it, not
    ``--concurrency``, set their time."""

    split: str
    requests: float = Field(
        description="sequential requests of the split's longest episode (ingestion, a question)"
    )
    binds: bool = Field(
        description="the chain is longer than an evaluation's requests / concurrency: it set "
        "the time"
    )


class Part(BaseModel):
    """One row of the estimate: a part of the run and what it is expected to cost (None:
    unknown)."""

    part: str
    evaluations: int
    calls: int
    tokens: int | None
    cost_usd: float | None
    hours: float | None
    floor: Floor | None = Field(
        None,
        description="the chain its evaluations cannot take less than (None: not "
        "modeled for this part, or no chains given)",
    )


class Estimate(BaseModel):
    """The expected cost of the whole configured run (the model: :data:`MODEL`)."""

    parts: list[Part]
    total: Part
    concurrency: int
    latency_s: float | None = Field(
        description="mean seconds of one computed call, measured on the baseline's dev"
    )
    priced: bool = Field(description="whether the model has a price (else dollars are unknown)")
    model: str = MODEL
    optimizer: OptimizerWork | None = Field(
        None, description="the optimizer's own work, its part's source (None: not estimated)"
    )
    batch: int = Field(1, description="trials evaluated at once (--batch)")

    def floor_lines(self) -> list[str]:
        """One line for each part whose time its chain set (:func:`floor_line`)."""
        return [
            line
            for part in self.parts
            if (line := floor_line(part, self.concurrency, self.latency_s, self.batch))
        ]


class Figures(Protocol):
    """What the estimate reads of one evaluation: a
    measured :class:`~optloop.loop.evaluate.Evaluation`, or a model of one
    (``experiments/bench/estimate.py``, from a recording's calls and tokens per session)."""

    @property
    def llm_calls(self) -> float: ...  # requests made, cache hits included

    @property
    def model_calls(self) -> float: ...  # requests the model computed

    @property
    def tokens(self) -> float: ...  # of the computed requests

    @property
    def cost_usd(self) -> float | None: ...  # dollars (None: no price)

    @property
    def lm_seconds(self) -> float | None: ...  # the model's seconds on its calls

    @property
    def seconds(self) -> float: ...  # wall time


def per_call(fig: Figures) -> tuple[float | None, float | None, float | None]:
    """Tokens, dollars and model seconds of one computed request of ``fig``: the means over its
    computed requests; when it computed none (every request a cache hit), the means over the hits
    whose responses kept what computing them took (tokens and seconds; dollars unknown). ``None``
    where neither says."""
    if fig.model_calls:
        return (
            _ratio(fig.tokens, fig.model_calls),
            _ratio(fig.cost_usd, fig.model_calls),
            _ratio(fig.lm_seconds, fig.model_calls),
        )
    replayed = getattr(fig, "replayed_calls", 0)
    return (
        _ratio(getattr(fig, "replayed_tokens", 0), replayed),
        None,
        _ratio(getattr(fig, "replayed_seconds", 0.0), replayed),
    )


class ModeledFigures(BaseModel):
    """One evaluation as a model says it (:class:`Figures`): a trial that reuses every store
    (:func:`answer_path`), or an evaluation modeled from a recording
    (``experiments/bench/estimate.py``)."""

    llm_calls: float
    model_calls: float
    tokens: float
    cost_usd: float | None
    lm_seconds: float | None
    seconds: float


def answer_path(dev: Evaluation, ingest: set[str]) -> ModeledFigures | None:
    """:class:`ModeledFigures` of ``dev`` (the baseline's dev evaluation) without its ``ingest``
    sites' calls; ``None`` when none of its other calls was computed or replayed with its time
    (nothing to take the tokens of a call from) or it kept no per-site figures."""
    rest = [cost for site, cost in dev.sites.items() if site not in ingest]
    computed = sum(c.model_calls for c in rest)
    if not computed:  # a replayed baseline: the tokens the cache's responses took
        computed, rest_tokens = (
            sum(c.replayed_calls for c in rest),
            sum(c.replayed_tokens for c in rest),
        )
    else:
        rest_tokens = sum(c.tokens for c in rest)
    tokens_per_call, _, latency = per_call(dev)
    if not computed or not tokens_per_call:
        return None
    calls = max(dev.llm_calls - dev.ingest_calls, 0)
    tokens = calls * rest_tokens / computed
    seconds = None if latency is None else tokens * latency / tokens_per_call
    dollars = (
        None if dev.cost_usd is None or not dev.tokens else tokens * dev.cost_usd / dev.tokens
    )
    return ModeledFigures(
        llm_calls=calls,
        model_calls=calls,
        tokens=tokens,
        cost_usd=dollars,
        lm_seconds=seconds,
        seconds=seconds or 0.0,
    )


def work_units(dataset: Dataset) -> int:
    """What an evaluation of ``dataset`` has to do: sessions to ingest plus questions to answer."""
    return sum(len(e.sessions) + len(e.questions) for e in dataset.episodes)


def floor_line(
    part: Part, concurrency: int, latency_s: float | None, batch: int = 1
) -> str | None:
    """What set ``part``'s time when its chain did (``None`` otherwise): "time of the 50 trials set
    by the longest dev episode's 94 sequential requests (94 s an evaluation), not by --concurrency
    16: ..."."""
    floor = part.floor
    if floor is None or not floor.binds:
        return None
    unit = f"a batch of {batch}" if batch > 1 and "at once" in part.part else "an evaluation"
    each = "" if latency_s is None else f" ({floor.requests * latency_s:,.0f} s {unit})"
    return (
        f"time of the {part.part} set by the longest {floor.split} episode's "
        f"{floor.requests:,.0f} sequential "
        f"requests{each}, not by --concurrency {concurrency}: its sessions are ingested in "
        "order, then a question"
    )


def _scaled(
    dev: Figures,
    evaluations: float,
    name: str,
    count: int,
    concurrency: int,
    chain: tuple[str, float] | None = None,
    batch: int = 1,
) -> Part:
    """``evaluations`` times ``dev`` with every request computed, in ``count`` evaluations each no
    shorter than ``chain`` (the split and the requests of its longest chain:
    :mod:`optloop.loop.spending.chains`), ``batch`` of them at once: a batch's requests share the
    ``concurrency`` slots, and its time is floored by the chain once."""
    calls = round(dev.llm_calls * evaluations)
    tokens, dollars, latency = per_call(dev)
    each = calls / max(count, 1)  # requests of one evaluation
    batch = max(1, min(batch, count)) if count else 1
    floor = (
        None
        if chain is None
        else Floor(
            split=chain[0],
            requests=chain[1],
            binds=count > 0 and chain[1] > batch * each / max(concurrency, 1),
        )
    )
    full, rest = divmod(count, batch)
    seconds = (
        None
        if latency is None
        else sum(
            n
            * evaluation_seconds(
                size * each, latency, concurrency, None if floor is None else floor.requests
            )
            for n, size in ((full, batch), (1 if rest else 0, rest))
        )
    )
    return Part(
        part=name,
        evaluations=count,
        calls=calls,
        tokens=None if tokens is None else round(calls * tokens),
        cost_usd=None if dollars is None else calls * dollars,
        hours=None if seconds is None else seconds / 3600,
        floor=floor,
    )


def _measured(evaluation: Figures, name: str) -> Part:
    """An evaluation the run has made, as it ran."""
    return Part(
        part=name,
        evaluations=1,
        calls=round(evaluation.llm_calls),
        tokens=round(evaluation.tokens),
        cost_usd=evaluation.cost_usd,
        hours=evaluation.seconds / 3600,
    )


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _ratio(value: float | None, per: float) -> float | None:
    return None if value is None or not per else value / per


def _optimizer_part(
    work: OptimizerWork,
    dev: Figures,
    concurrency: int,
    proposer_price: tuple[float, float] | None,
    own_proposer: bool,
    trial: Figures | None = None,
) -> Part:
    """``work`` priced from the baseline's dev evaluation (its system-LM requests at ``trial``'s
    seconds a call when the targets reuse every store: they answer, they do not ingest). Measured
    work keeps its dollars; modeled system-LM requests are priced as the trials' are (tokens as
    modeled, dollars per token and latency per call measured on the baseline's dev), the
    proposer's tokens at ``proposer_price``
    (without one: at the system LM's dollars per token, or unknown for an ``own_proposer``). Its
    time is not floored by a chain: its runs on train take requests x latency / its threads (no
    more than ``concurrency``), the proposer's calls the baseline's latency per token, one call at
    a time."""
    dollars_per_token = _ratio(dev.cost_usd, dev.tokens)
    if work.measured:
        dollars = work.cost_usd
    else:
        system = (
            None
            if work.tokens is None or dollars_per_token is None
            else work.tokens * dollars_per_token
        )
        if not work.proposer_calls:
            proposer: float | None = 0.0
        elif proposer_price is not None:
            proposer = (
                work.proposer_prompt_tokens * proposer_price[0]
                + work.proposer_completion_tokens * proposer_price[1]
            )
        # the system LM's measured dollars per token, unless the proposer is another LM (no price)
        else:
            proposer = (
                None
                if own_proposer or dollars_per_token is None
                else work.proposer_tokens * dollars_per_token
            )
        dollars = _sum([system, proposer])
    tokens, _, latency = per_call(dev)
    token_seconds = None if latency is None or not tokens else latency / tokens
    parallel = max(min(work.threads or concurrency, concurrency), 1)
    each = latency if trial is None else _ratio(trial.lm_seconds, trial.llm_calls)
    system_hours = None if each is None else work.calls * each / parallel
    # the proposer's calls: one at a time
    proposer_hours = (
        0.0
        if not work.proposer_calls
        else (None if token_seconds is None else work.proposer_tokens * token_seconds)
    )
    hours = _sum([system_hours, proposer_hours])
    return Part(
        part=f"optimizer ({work.optimizer}, {'measured' if work.measured else 'modeled'})",
        evaluations=0,
        calls=round(work.calls + work.proposer_calls),
        tokens=None if work.tokens is None else round(work.tokens + work.proposer_tokens),
        cost_usd=dollars,
        hours=None if hours is None else hours / 3600,
    )


def estimate(
    ckpt: Checkpoint,
    *,
    budget: int,
    concurrency: int,
    dev_units: int,
    test_units: int,
    optimizer: OptimizerWork | None = None,
    proposer_price: tuple[float, float] | None = None,
    own_proposer: bool = False,
    chains: Chains | None = None,
    batch: int = 1,
    trial: Figures | None = None,
    control: bool = False,
    control_train: bool = False,
) -> Estimate:
    """The whole run of ``budget`` trials, from ``ckpt``'s baseline (train and dev must be
    evaluated); ``trial``: one trial's evaluation when it is not the baseline's dev evaluation
    (:func:`answer_path`: no target is an ingest site, so every store is reused; its time is not
    floored by a chain); ``dev_units``, ``test_units``: :func:`work_units` of the dev and test
    splits;
    ``chains``: their longest chains of sequential requests (:func:`measured_chains`), the floor of
    each trial's and held-out evaluation's time (none when ``None``).

    ``optimizer``: the optimizer's own work (:func:`measured_work`, or the model of
    :mod:`optloop.loop.spending.shape`), a part of its own after the trials (none when ``None``);
    ``proposer_price``: the proposer LM's dollars per prompt and per completion token, when it has
    a price; ``own_proposer``: the proposer is another LM than the system's (``--proposer-lm``), so
    without a price its dollars are unknown (the system LM's are measured); ``batch``: the trials
    evaluated at once (``--batch``); ``control``: the run evaluates the trivial-instruction control
    (on dev as ``ckpt`` measured it, once it has); ``control_train``: and on train, for the
    headroom (as ``ckpt`` measured it, once it has)."""
    train, dev = ckpt.baseline_train, ckpt.baseline_dev
    assert train is not None and dev is not None, "the estimate needs the baseline"
    return project(
        train,
        dev,
        budget=budget,
        concurrency=concurrency,
        dev_units=dev_units,
        test_units=test_units,
        optimizer=optimizer,
        proposer_price=proposer_price,
        own_proposer=own_proposer,
        chains=chains,
        batch=batch,
        trial=trial,
        control=control,
        control_dev=ckpt.control_dev,
        control_train=ckpt.control_train if control_train else None,
        train_control=control and control_train,
    )


def project(
    train: Figures,
    dev: Figures,
    *,
    budget: int,
    concurrency: int,
    dev_units: float,
    test_units: float,
    optimizer: OptimizerWork | None = None,
    proposer_price: tuple[float, float] | None = None,
    own_proposer: bool = False,
    chains: Chains | None = None,
    baseline: str = "baseline (measured)",
    batch: int = 1,
    trial: Figures | None = None,
    control: bool = False,
    control_dev: Figures | None = None,
    control_train: Figures | None = None,
    train_control: bool = False,
) -> Estimate:
    """The run model of :func:`estimate` on the baseline's train and dev evaluations as figures
    (measured ones, or a model's of them); ``baseline``: the name of their part; ``control_dev``,
    ``control_train``: the control's dev and train evaluations once the run has made them (their
    parts are then measured); ``train_control``: the run evaluates the control on train (priced
    as the baseline's train evaluation until measured). The other arguments are
    :func:`estimate`'s."""
    batch = trials_at_once(batch, optimizer)
    first = Part(
        part=baseline,
        evaluations=2,
        calls=round(train.llm_calls + dev.llm_calls),
        tokens=round(train.tokens + dev.tokens),
        cost_usd=_sum([train.cost_usd, dev.cost_usd]),
        hours=(train.seconds + dev.seconds) / 3600,
    )
    parts = [first]
    if control:
        parts.append(
            _measured(control_dev, CONTROL_PART + " (measured)")
            if control_dev is not None
            else _scaled(
                dev if trial is None else trial,
                1,
                CONTROL_PART + ("" if trial is None else ", stores reused"),
                1,
                concurrency,
                None if chains is None or trial is not None else ("dev", chains.dev),
            )
        )
    if train_control:
        parts.append(
            _measured(control_train, CONTROL_TRAIN_PART + " (measured)")
            if control_train is not None
            else _measured(train, CONTROL_TRAIN_PART + " (as the baseline's)")
        )
    parts += [
        _scaled(
            dev if trial is None else trial,
            budget,
            f"{budget} trials"
            + (f" ({batch} at once)" if batch > 1 else "")
            + ("" if trial is None else ", stores reused"),
            budget,
            concurrency,
            None if chains is None or trial is not None else ("dev", chains.dev),
            batch=batch,
        ),
    ]
    if optimizer is not None:
        parts.append(
            _optimizer_part(optimizer, dev, concurrency, proposer_price, own_proposer, trial)
        )
    held_out = 3 if control else 2  # the start program, the best, the control
    parts.append(
        _held_out(dev, trial, held_out, test_units / max(dev_units, 1), concurrency, chains)
    )
    total = _combined("total", parts)
    return Estimate(
        parts=parts,
        total=total,
        concurrency=concurrency,
        latency_s=per_call(dev)[2],
        priced=dev.cost_usd is not None,
        optimizer=optimizer,
        batch=batch,
    )


def _held_out(
    dev: Figures,
    trial: Figures | None,
    evaluations: int,
    scale: float,
    concurrency: int,
    chains: Chains | None,
) -> Part:
    """The held-out test: ``evaluations`` of the test split, each ``scale`` times dev's work. When
    the targets reuse every store (``trial``: :func:`answer_path`), only the start program ingests
    test; the best and the control answer on its stores."""
    chain = None if chains is None else ("test", chains.test)
    if trial is None:
        return _scaled(dev, evaluations * scale, HELD_OUT_PART, evaluations, concurrency, chain)
    start = _scaled(dev, scale, HELD_OUT_PART, 1, concurrency, chain)
    rest = _scaled(trial, (evaluations - 1) * scale, HELD_OUT_PART, evaluations - 1, concurrency)
    return _combined(HELD_OUT_PART, [start, rest], floor=start.floor)


def _combined(name: str, parts: list[Part], floor: Floor | None = None) -> Part:
    """``parts`` as one row: their evaluations, calls, tokens, dollars and hours added up (a
    figure unknown in one of them is unknown in the sum)."""
    tokens = _sum([p.tokens for p in parts])
    return Part(
        part=name,
        evaluations=sum(p.evaluations for p in parts),
        calls=sum(p.calls for p in parts),
        tokens=None if tokens is None else round(tokens),
        cost_usd=_sum([p.cost_usd for p in parts]),
        hours=_sum([p.hours for p in parts]),
        floor=floor,
    )


def trials_at_once(batch: int, optimizer: OptimizerWork | None) -> int:
    """The trials a ``--batch`` evaluates at once: no more than one of the optimizer's rounds
    yields (SIMBA: the new programs of a step; GEPA: its accepted mutations). An optimizer whose
    work is done up front (Optuna's proposals, ``trials_per_round`` 0) fills every batch."""
    if optimizer is None or optimizer.trials_per_round == 0:
        return batch
    return max(1, min(batch, int(optimizer.trials_per_round)))


__all__ = [
    "MODEL",
    "CONTROL_PART",
    "HELD_OUT_PART",
    "Chains",
    "Estimate",
    "Figures",
    "Floor",
    "OptimizerWork",
    "Part",
    "chain_requests",
    "estimate",
    "evaluation_seconds",
    "floor_line",
    "measured_chains",
    "measured_work",
    "project",
    "work_units",
]
