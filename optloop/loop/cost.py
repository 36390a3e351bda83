"""What LM work cost, per prompt site, as data the loop stores and MLflow metrics it logs.

An :class:`~optloop.loop.evaluate.Evaluation` carries its LM cost (:func:`evaluation_cost`):
dollars, the seconds the model spent, and an :class:`LMCost` per prompt site, so a trial's
child run logs them (:func:`site_metrics`) from the checkpointed evaluation, and
``--estimate`` (:mod:`optloop.loop.spending.estimate`) extrapolates from the baseline's. The run's
own cost (``Loop._cost``: what each process spent, summed over processes by the checkpoint) uses
the same per-site metric names, so the parent run shows the run's totals per site.

Metric names follow :mod:`optloop.loop.tracking.names` (``<metric>/<breakdown>``, like
``acc_dev/<task>``): ``llm_calls/<site>``, ``tokens/<site>``, ``cost_usd/<site>``; calls made
outside any prompt site are charged to ``no_site``. A site without a price has no
``cost_usd/<site>`` (MLflow takes no None; 0 would claim it was free).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from optloop.lm.accounting import Usage
from optloop.loop.tracking.names import metric_key

NO_SITE = "no_site"  # where calls made outside any prompt site are charged


class LMCost(BaseModel):
    """What one stretch of LM work cost: requests, those the model computed, tokens, dollars."""

    calls: int = Field(0, description="LLM requests, cache hits included")
    model_calls: int = Field(0, description="requests the model computed (not from the cache)")
    tokens: int = Field(0, description="prompt + completion tokens of the computed requests")
    prompt_tokens: int = Field(
        0, description="of ``tokens``, the prompts' (priced apart from completions)"
    )
    cost_usd: float | None = Field(None, description="dollars (None: the model has no price)")
    replayed_calls: int = Field(
        0, description="cache hits whose response kept the seconds it took to compute"
    )
    replayed_tokens: int = Field(0, description="those responses' tokens")
    reused_prompt_tokens: int = Field(
        0, description="of ``prompt_tokens``, those the model's cache held (not computed)"
    )
    truncated: int = Field(0, description="computed requests whose answer a limit cut")
    seconds: float = Field(0.0, description="seconds the model spent (:func:`lm_seconds`)")

    @classmethod
    def of(cls, usage: Usage) -> LMCost:
        return cls(
            calls=usage.calls,
            model_calls=usage.model_calls,
            tokens=usage.tokens,
            prompt_tokens=usage.prompt_tokens,
            cost_usd=usage.cost_usd,
            replayed_calls=usage.replayed_calls,
            replayed_tokens=usage.replayed_tokens,
            reused_prompt_tokens=usage.reused_prompt_tokens,
            truncated=usage.truncated,
            seconds=lm_seconds(usage),
        )


def site_costs(by_site: Mapping[str | None, Usage]) -> dict[str, LMCost]:
    """``Accounting.by_site(...)`` as :class:`LMCost` per site name, sorted (``None`` ->
    ``no_site``)."""
    named = {
        NO_SITE if site is None else site: LMCost.of(usage) for site, usage in by_site.items()
    }
    return dict(sorted(named.items()))


def lm_seconds(usage: Usage) -> float:
    """The seconds the model (or endpoint) itself spent on ``usage``'s calls: their durations
    summed, less the waits this process imposed (another process's llama.cpp slot,
    ``--rpm``/``--tpm``/``--concurrency``), so it divided by the computed calls is the mean latency
    of one call whatever the concurrency was."""
    return round(max(usage.seconds - usage.queued_s - usage.throttled_s, 0.0), 3)


def evaluation_cost(usage: Usage, by_site: Mapping[str | None, Usage]) -> dict[str, Any]:
    """The cost fields of an :class:`~optloop.loop.evaluate.Evaluation` over the calls it made
    (``usage``, and the same calls per site)."""
    return {
        "cost_usd": usage.cost_usd,
        "lm_seconds": lm_seconds(usage),
        "sites": site_costs(by_site),
    }


def site_metrics(sites: Mapping[str, LMCost]) -> dict[str, float]:
    """``llm_calls/<site>``, ``tokens/<site>`` and, where priced, ``cost_usd/<site>`` (see the
    module docstring)."""
    out: dict[str, float] = {}
    for site, cost in sites.items():
        key = metric_key(site)
        out[f"llm_calls/{key}"] = cost.calls
        out[f"tokens/{key}"] = cost.tokens
        if cost.cost_usd is not None:
            out[f"cost_usd/{key}"] = cost.cost_usd
    return out


__all__ = ["NO_SITE", "LMCost", "evaluation_cost", "lm_seconds", "site_costs", "site_metrics"]
