"""The planted-fault harness over systems as one report (``optloop attribute --faults planted``):
:func:`~optloop.faults.planted.run_planted`, summarized, with its cost."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optloop.datasets import load_dataset
from optloop.faults.planted import run_planted
from optloop.faults.planted_report import summarize


def planted_report(
    systems: list[str],
    dataset_uri: str,
    lm: Any,
    work: Path,
    fault_names: list[str] | None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The planted-fault harness (:func:`~optloop.faults.planted.run_planted`) over
    ``systems`` and its report; ``progress(message)`` hears each step of the harness."""
    dataset = load_dataset(dataset_uri)
    mark = lm.accounting.mark()
    started = time.perf_counter()
    planted = run_planted(
        systems,
        dataset,
        lm,
        work,
        fault_names=fault_names,
        progress=(lambda msg: progress(f"planted faults: {msg}")) if progress else None,
    )
    usage = lm.accounting.totals(since=mark)
    return {
        **summarize(planted),
        "systems": systems,
        "dataset": dataset.uri,
        "cases": [c.to_json() for c in planted.induced],
        "set_aside_cases": [c.to_json() for c in planted.set_aside],
        "cost": {
            "llm_calls": usage.calls,
            "tokens": usage.tokens,
            "seconds": round(time.perf_counter() - started, 1),
        },
    }
