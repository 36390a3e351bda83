"""What an estimate says, in words: its table (``--estimate``, and the projection a run makes
before its first trial), the line with the run's ETA that follows the projection, and money and a
model's name as a run writes them. Built here, below the commands, so that a run's ``run.log``
(:mod:`optloop.loop.runs.session`) and ``optloop run``'s console say them the same way."""

from __future__ import annotations

from optloop.lm import LMSettings
from optloop.loop.config import LoopConfig
from optloop.loop.spending.estimate import Estimate
from optloop.loop.spending.eta import Eta, projected
from optloop.loop.state import Checkpoint
from optloop.output import Table


def money(dollars: float) -> str:
    """``$12.35``, ``$0.0123``, or a tiny amount with its digits (``$2.9e-06``) rather than
    ``$0.0000``."""
    if dollars == 0 or dollars >= 1:
        return f"${dollars:.2f}"
    return f"${dollars:.4f}" if dollars >= 0.0001 else f"${dollars:.2g}"


def model_name(settings: LMSettings) -> str:
    """The model as the user named it: ``openai:gpt-4o-mini``, a GGUF path, or the embedded
    model."""
    if settings.backend == "openai":
        return f"openai:{settings.model}"
    return settings.model or "the embedded model"


def _cell(value: float | None, fmt: str) -> str:
    return "unknown" if value is None else format(value, fmt)


def estimate_table(figures: Estimate, config: LoopConfig, settings: LMSettings) -> Table:
    """The ``--estimate`` of a run, one row per part (see :mod:`optloop.loop.spending.estimate` for
    the
    model)."""
    table = Table(
        title=f"estimate for {config.run_name}: {config.system} on {config.dataset}, "
        f"{config.optimizer}, budget {config.budget}, {model_name(settings)}, --concurrency "
        f"{figures.concurrency}"
    )
    for column in ("part", "evaluations", "calls", "tokens", "dollars", "time"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part in [*figures.parts, figures.total]:
        if part is figures.total:
            table.add_section()
        dollars = (
            ("unknown" if figures.priced else "no price")
            if part.cost_usd is None
            else money(part.cost_usd)
        )
        table.add_row(
            part.part,
            str(part.evaluations),
            str(part.calls),
            _cell(part.tokens, "d"),
            dollars,
            "unknown" if part.hours is None else projected(part.hours * 3600),
        )
    return table


def projection_line(figures: Estimate, ckpt: Checkpoint, config: LoopConfig) -> str:
    """The line after the projection's table: the whole run's calls, tokens and dollars, and the
    ETA of what is left of it (the trials ``ckpt`` has not evaluated yet, then the test)."""
    left = Eta.of(figures, config.budget).seconds_left(
        sum(t.evaluation is not None for t in ckpt.trials)
    )
    hours = "unknown" if left is None else projected(left)
    tokens = "unknown" if figures.total.tokens is None else str(figures.total.tokens)
    dollars = "" if figures.total.cost_usd is None else f", {money(figures.total.cost_usd)}"
    return (
        f"projected: {figures.total.calls} calls, {tokens} tokens{dollars}; ETA {hours} for the "
        "rest of the run (Ctrl-C stops it; the same command resumes it)"
    )
