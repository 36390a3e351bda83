"""The planted figures (:func:`summarize`): site and type accuracy over the induced failures and
over every failure a fault caused, per fault, per planted type and per catalogue group, with the
denominators. Rates come with a seeded 95% bootstrap interval
(:func:`optloop.stats.bootstrap_mean`), an empty sample says so instead of scoring 0, and a sample
under :data:`MIN_SAMPLE` is flagged as too small to support a figure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from optloop.faults.planted import SET_ASIDE_REASONS, Case, PlantedRun
from optloop.stats import bootstrap_mean

MIN_SAMPLE = 10
"""A rate over fewer cases (or a system with fewer clean passes) is flagged as too small to support
a figure."""


def rate(
    values: Sequence[bool], *, what: str, seed: int = 0, min_n: int = MIN_SAMPLE
) -> dict[str, Any]:
    """The share of ``values`` that are true, with its seeded 95% bootstrap interval.

    An empty sample gives ``estimate`` ``None`` and the note "nothing to score (0 <what>)"; a
    sample under ``min_n`` is flagged ``small_sample`` with a note saying it is too small to
    support a figure."""
    n = len(values)
    if n == 0:
        return {
            "n": 0,
            "k": 0,
            "estimate": None,
            "low": None,
            "high": None,
            "confidence": 0.95,
            "small_sample": True,
            "note": f"nothing to score (0 {what})",
        }
    interval = bootstrap_mean([float(v) for v in values], seed=seed)
    small = n < min_n
    return {
        "n": n,
        "k": int(sum(bool(v) for v in values)),
        "estimate": interval.estimate,
        "low": interval.low,
        "high": interval.high,
        "confidence": interval.confidence,
        "small_sample": small,
        "note": f"too small to support a figure (n={n} < {min_n})" if small else "",
    }


def format_rate(r: dict[str, Any], *, compact: bool = False) -> str:
    """``0.750 [0.250, 1.000] (n=4)``, with the small-sample warning; the empty sample's note
    instead of a number.

    ``compact`` (a table cell): ``3/4 0.75 [0.25, 1.00]*``, ``*`` marking a sample too small to
    support a figure."""
    if not r["n"]:
        return "nothing to score" if compact else r["note"]
    if compact:
        return f"{r['k']}/{r['n']} {r['estimate']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" + (
            "*" if r["small_sample"] else ""
        )
    text = f"{r['estimate']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (n={r['n']})"
    return f"{text}; {r['note']}" if r["note"] else text


def _block(group: Sequence[Case], what: str, seed: int) -> dict[str, Any]:
    """``n``, point ``site_accuracy`` / ``type_accuracy`` (``None`` when empty) and both rates with
    intervals."""
    site = rate([c.site_ok for c in group], what=what, seed=seed)
    kind = rate([c.type_ok for c in group], what=what, seed=seed)
    return {
        "n": len(group),
        "site_accuracy": site["estimate"],
        "type_accuracy": kind["estimate"],
        "site": site,
        "type": kind,
    }


def _ms(cases: Sequence[Case]) -> tuple[float | None, float | None]:
    ms = sorted(c.seconds * 1000 for c in cases)
    if not ms:
        return None, None
    return ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.95))]


def summarize(run: PlantedRun, *, seed: int = 0, min_n: int = MIN_SAMPLE) -> dict[str, Any]:
    """The planted figures: the induced-only accuracy (top-level ``n``, ``site_accuracy``,
    ``type_accuracy`` and ``induced``) next to the accuracy over every failure a fault caused
    (``all_failures``), what was set aside and why (``set_aside``), per fault and per planted type,
    and the denominators (clean passes per system and dataset, failures caused per fault). Every
    rate has a seeded 95% interval."""
    cases, induced, aside = run.cases, run.induced, run.set_aside

    fault_keys = list(dict.fromkeys(f"{t.system}/{t.fault}" for t in run.tallies))
    fault_keys += [
        k for k in dict.fromkeys(f"{c.system}/{c.fault}" for c in cases) if k not in fault_keys
    ]
    by_fault: dict[str, Any] = {}
    for key in sorted(fault_keys):
        group = [c for c in cases if f"{c.system}/{c.fault}" == key]
        tallies = [t for t in run.tallies if f"{t.system}/{t.fault}" == key]
        first = tallies[0] if tallies else None
        ind = [c for c in group if c.induced]
        by_fault[key] = {
            # n, site/type accuracy at the top level: the induced failures only (as "induced")
            **_block(ind, "induced failures", seed),
            "caused": len(group),
            "induced": _block(ind, "induced failures", seed),
            "all": _block(group, "failures caused", seed),
            "set_aside": {r: sum(c.set_aside == r for c in group) for r in SET_ASIDE_REASONS},
            "questions": sum(t.questions for t in tallies),
            "passed_clean": sum(t.passed_clean for t in tallies),
            "failed_both": sum(t.failed_both for t in tallies),
            "true_target": first.true_target if first else (group[0].true_target if group else ""),
            "true_type": first.true_type if first else (group[0].true_type.value if group else ""),
            "added": first.added if first else "",
        }
    by_type: dict[str, Any] = {}
    for t in sorted({c.true_type.value for c in cases}):
        group = [c for c in cases if c.true_type.value == t]
        ind = [c for c in group if c.induced]
        by_type[t] = {
            **_block(ind, "induced failures", seed),
            "caused": len(group),
            "induced": _block(ind, "induced failures", seed),
            "all": _block(group, "failures caused", seed),
        }

    # The faults by the catalogue group they joined with: the preregistered ones' figures apart.
    added_of = {(t.system, t.fault): t.added for t in run.tallies}
    by_added: dict[str, Any] = {}
    for added in sorted(
        set(added_of.values()) | {added_of.get((c.system, c.fault), "original") for c in cases}
    ):
        group = [c for c in cases if added_of.get((c.system, c.fault), "original") == added]
        ind = [c for c in group if c.induced]
        by_added[added] = {
            **_block(ind, "induced failures", seed),
            "caused": len(group),
            "induced": _block(ind, "induced failures", seed),
            "all": _block(group, "failures caused", seed),
            "passed_clean": sum(t.passed_clean for t in run.tallies if t.added == added),
        }

    denominators = []
    for system, dataset in dict.fromkeys((b.system, b.dataset) for b in run.baselines):
        rows = [b for b in run.baselines if (b.system, b.dataset) == (system, dataset)]
        passed_clean = sum(b.passed for b in rows)
        small = passed_clean < min_n
        denominators.append(
            {
                "system": system,
                "dataset": dataset,
                "episodes": len(rows),
                "questions": sum(b.questions for b in rows),
                "passed_clean": passed_clean,
                "sound_clean": sum(b.sound for b in rows),
                "failures_caused": sum(c.system == system and c.dataset == dataset for c in cases),
                "small_sample": small,
                "note": f"{passed_clean} clean pass(es) < {min_n}: too small to support a figure"
                if small
                else "",
            }
        )

    median, p95 = _ms(cases)
    return {
        # n, site_accuracy, type_accuracy at the top level: induced failures only (as "induced")
        **_block(induced, "induced failures", seed),
        "induced": _block(induced, "induced failures", seed),
        "all_failures": _block(cases, "failures caused", seed),
        "set_aside": {
            "n": len(aside),
            "by_reason": {
                r: {
                    "description": d,
                    **_block(
                        [c for c in aside if c.set_aside == r],
                        "failures set aside for this reason",
                        seed,
                    ),
                }
                for r, d in SET_ASIDE_REASONS.items()
            },
        },
        "by_fault": by_fault,
        "by_type": by_type,
        "by_added": by_added,
        "denominators": denominators,
        "tallies": [asdict(t) for t in run.tallies],
        "systems_covered": sorted({c.system for c in cases}),
        "attribution_llm_calls": sum(c.llm_calls for c in cases),
        "collateral": len(aside),
        "median_attribution_ms": median,
        "p95_attribution_ms": p95,
        "min_sample": min_n,
        "seed": seed,
        "confidence": 0.95,
    }
