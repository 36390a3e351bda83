"""What ``python -m optloop.run`` prints: the result's tables, the ``--estimate``'s lines, and the
lines for a run that stopped (durations and accuracies with their CIs, formatted once here). The
estimate's table, the projection's line and money are the library's words
(:mod:`optloop.loop.spending.report`), so a run's ``run.log`` says them as the console does."""

from __future__ import annotations

from optloop.attribution.taxonomy import Target
from optloop.failures import mark
from optloop.lm import Usage
from optloop.loop.optimizers import registry
from optloop.loop.policy import floor_warning
from optloop.loop.runs.runner import Checkpoint, LoopConfig, LoopResult
from optloop.loop.spending.estimate import Estimate
from optloop.loop.spending.eta import projected as projected
from optloop.loop.spending.limits import MAX_COST, STOPPED_BY, RunStopped, run_dollars
from optloop.loop.spending.report import estimate_table as estimate_table
from optloop.loop.spending.report import model_name as model_name
from optloop.loop.spending.report import money
from optloop.loop.trivial_control import comparison_of
from optloop.output import Table
from optloop.stats import Interval


def _accuracy(interval: Interval) -> str:
    """``0.458 [0.250, 0.667] n=24``"""
    return f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}] n={interval.n}"


# The failed-call counts (LoopResult.failed_calls) of each row's dev and test figure.
_FAILED = {
    "own": ("baseline_dev", "test_before"),
    "control": ("control_dev", "control_test"),
    "best": ("best_dev", "test_after"),
}


def summary_table(result: LoopResult) -> Table:
    """The run's result: three rows on dev and test (the system's own prompt, the
    trivial-instruction control, the loop's best; :mod:`optloop.loop.trivial_control`), each
    accuracy with its 95% CI and n; the paired differences loop - own prompt and loop - control on
    test, each with its verdict; then the targets, the promotion and the cost."""
    cfg = result.config
    cost = result.cost
    comparison = comparison_of(result)
    table = Table(
        title=f"optloop.run {cfg.run_name}: {cfg.system} on {cfg.dataset}, {cfg.optimizer}, "
        f"budget {cfg.budget}" + (" (untargeted)" if cfg.untargeted else "")
    )
    table.add_column("")
    table.add_column("dev", justify="right")
    table.add_column("test (held out)", justify="right")
    failed = result.failed_calls  # figures with failed LM calls carry the count (optloop.failures)
    for row in comparison.rows:
        dev_key, test_key = _FAILED[row.program]
        if row.dev is None or row.test is None:  # the run has no control: say why
            table.add_row(row.label, result.control_note or "not evaluated", "")
            continue
        table.add_row(
            row.label,
            mark(_accuracy(row.dev), failed.get(dev_key, 0)),
            mark(_accuracy(row.test), failed.get(test_key, 0)),
        )
    table.add_section()
    for diff in comparison.differences:
        chosen = f" (best of {result.evaluations + 1} on dev)" if diff.against == "own" else ""
        table.add_row(
            diff.label, f"{diff.dev:+.3f}{chosen}", f"{diff.test} paired: {diff.verdict}"
        )
    table.add_section()
    table.add_row("blamed", ", ".join(result.targets) or "(no failure attributed to a site)", "")
    table.add_row(
        "optimized",
        ", ".join(result.tunable_sites + [str(Target.knob(k)) for k in result.tunable_knobs]),
        "",
    )
    changed = result.changed_sites + [f"{k}={v}" for k, v in result.changed_knobs.items()]
    table.add_row(
        "changed (best)",
        ", ".join(changed) or "nothing (baseline stays best)",
        f"trial {result.best_trial}",
    )
    table.add_row("promoted", result.promotion_reason, "")
    if result.beats_control is not None:
        table.add_row(
            "beats the control",
            "yes: its gain is more than a trivial instruction gets"
            if result.beats_control
            else "no: its prompt does not measurably beat a trivial instruction",
            "",
        )
    if result.proposals:
        table.add_row("proposals (gate)", proposals_line(result.proposals), "")
    table.add_section()
    table.add_row("evaluations / budget", f"{result.evaluations} / {cfg.budget}", "")
    table.add_row("cost", cost_line(cost), "")
    return table


def proposals_line(proposals: dict[str, int]) -> str:
    """``9 passed, 4 refused (2 echo, 1 off_task, 1 cut_off)``: what the proposal gate
    said of the optimizer's proposals (:mod:`optloop.loop.proposals.gate`)."""
    refused = {k: v for k, v in proposals.items() if k != "passed"}
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(refused.items(), key=lambda x: -x[1]))
    return f"{proposals.get('passed', 0)} passed, {sum(refused.values())} refused" + (
        f" ({why})" if why else ""
    )


def cost_line(cost: dict[str, int | float]) -> str:
    """The run's cost in one line: every process that worked on it, added up (and how many there
    were)."""
    processes = int(cost.get("processes", 1))
    dollars = (
        f", {money(run_dollars(cost))}"
        if "cost_usd" in cost or "proposer_cost_usd" in cost
        else ""
    )
    return (
        f"{cost.get('llm_calls', 0):.0f} LLM calls ({cost.get('model_calls', 0):.0f} computed), "
        f"{cost.get('tokens', 0):.0f} tokens, {cost.get('seconds', 0):.1f} s{dollars}; "
        f"the run took {processes} process{'es' if processes != 1 else ''}"
    )


def tried_table(result: LoopResult) -> Table:
    """What the optimizer tried: every evaluated candidate with its dev accuracy (a 0 -> 0 run says
    what failed)."""
    control = "" if result.control_dev is None else f", control {result.control_dev:.3f}"
    table = Table(
        title=f"candidates tried on dev (baseline {result.baseline_dev:.3f}{control}, "
        f"n={result.n_dev})"
    )
    for col, justify in (
        ("trial", "right"),
        ("dev", "right"),
        ("changed", "left"),
        ("how", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for t in result.tried:
        mark = " best" if t.trial == result.best_trial else " stopped" if t.stopped else ""
        table.add_row(str(t.trial), f"{t.dev:.3f}{mark}", ", ".join(t.changed) or "-", t.origin)
    return table


def fault_line(usage: Usage) -> str | None:
    """What LM faults did to this run, in one line (``None`` when there were none)."""
    if not usage.faults:
        return None
    surfaced = usage.faults - usage.cured
    return (
        f"LM faults: {usage.faults} failed attempt(s); {usage.cured} cured by a retry, "
        f"{surfaced} in {usage.errors} call(s) that failed after their retries (see lm_faults "
        "in MLflow, fault graphs in the run directory)"
    )


def stopped_line(stop: RunStopped, ckpt: Checkpoint, config: LoopConfig, again: str) -> str:
    """What a run stopped by a spending limit says: the limit, what the run spent, where it stands,
    how to go on."""
    flag = "--max-cost" if stop.reason == MAX_COST else "--max-calls"
    return (
        f"optloop: stopped: {stop} ({cost_line(ckpt.total_cost())}); run {config.run_name} is "
        f"saved ({ckpt.progress(config.budget)}), its MLflow parent run marked KILLED "
        f"({STOPPED_BY}={stop.reason}); re-run the same command with a higher {flag} to go on: "
        f"{again}"
    )


def optimizer_line(figures: Estimate, config: LoopConfig) -> str:
    """What the optimizer's part stands for: its calls a trial and where the figure comes from."""
    work = figures.optimizer
    if work is None:
        return f"optimizer: {config.optimizer}'s own calls are not estimated (no model of them)"
    source = (
        ""
        if work.measured
        else f"the {work.optimizer} model ({registry.module_path(work.optimizer)}): "
    )
    return (
        f"optimizer: {work.per_trial(config.budget):.1f} calls a trial ({work.calls:.0f} on "
        f"train with the system LM, {work.proposer_calls:.0f} to the proposer, over the run), "
        f"from {source}{work.basis}"
    )


def estimate_lines(
    figures: Estimate, ckpt: Checkpoint, config: LoopConfig, go_on: str
) -> list[str]:
    """The estimate's model and what to do next, in plain lines; first, a warning when the
    baseline answered no dev question (:func:`~optloop.loop.policy.floor_warning`)."""
    dev, train = ckpt.baseline_dev, ckpt.baseline_train
    floor = (
        None
        if dev is None or train is None
        else floor_warning(train.passed, train.n, dev.passed, dev.n)
    )
    latency = (
        "unknown (no call was computed: the LM cache served them all, and kept no time for them)"
        if figures.latency_s is None
        else f"{figures.latency_s:.3f} s, measured on the baseline's dev evaluation"
        + (
            ""
            if dev is None or dev.model_calls
            else " (as the LM cache recorded it: every call there was a cache hit)"
        )
    )
    return [
        *([f"warning: {floor}"] if floor else []),
        f"how: {figures.model}",
        optimizer_line(figures, config),
        f"mean latency of one computed call: {latency}",
        *figures.floor_lines(),
        f"spent so far: {cost_line(ckpt.total_cost())}",
        f"nothing else ran: the baseline is saved in run {config.run_name}; the same "
        "command without --estimate "
        f"goes on from it: {go_on}",
    ]
