"""A finished ``optloop run``, as a results file: what it ran on, what it printed, what it found.

    python -m experiments.bench.run_report --run-dir .optloop/runs/<name> \\
        --command "python -m optloop.run --system graphiti --budget 50" \\
        --console run.out --json OUT --markdown OUT

Reads the run's ``checkpoint.json`` and ``run.log`` (and, with ``--console``, what the run printed
to its terminal) and writes: the dataset and split sizes, the ETA lines the run printed (the
projection before the first trial and the one on every trial line), its wall time by stage (from
``run.log``'s timestamps), every trial's dev accuracy, and the held-out test before and after with
the paired 95% bootstrap CI of the delta (seed 0, as the run computes it); the trivial-instruction
control on dev and test with the paired deltas best - control; the best candidate's changed prompts
whole; and what the proposal gate said of every proposal (``proposals.jsonl``: counts by reason,
and each refused text); per question category (LoCoMo's multi_hop, temporal, ...) the held-out
accuracy and mean score (token F1 under LoCoMo's scorers, its official metric) before, under the
control and after, the overall mean score's paired delta; and the baseline's failures on train and
dev by blamed site and error type; the power line and every headroom check (before the trials,
after each stall, and, with ``--console``, the summary's, after the trials) as the run said them.
The provenance header
names the run's own command (``--command``) and the commit the run ran at (``--commit``, default:
this checkout's).
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from experiments.markdown import provenance_lines, table
from experiments.provenance import flag_of, model_of, stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.loop.evaluate import Evaluation
from optloop.loop.proposals.gate import logs_under, verdicts
from optloop.loop.state import Checkpoint
from optloop.loop.trivial_control import dev_interval, verdict
from optloop.paths import write_atomic
from optloop.pipeline import QuestionOutcome
from optloop.stats import Interval, bootstrap_mean, paired_bootstrap_delta

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (.*)$")


def log_lines(run_log: Path) -> list[tuple[datetime, str]]:
    """``run.log``'s lines with their times."""
    out = []
    for line in run_log.read_text().splitlines():
        if m := _STAMP.match(line):
            out.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"), m.group(2)))
    return out


def process_spans(lines: list[tuple[datetime, str]]) -> list[tuple[datetime, datetime]]:
    """The first and last time of each process that worked on the run: a resumed run's log has
    a ``optloop.run resuming ...`` line where each later process starts, and the time the run
    stood stopped between two processes is in none of the spans."""
    spans: list[list[datetime]] = []
    for t, text in lines:
        if not spans or text.startswith("optloop.run resuming"):
            spans.append([t, t])
        else:
            spans[-1][1] = t
    return [(a, b) for a, b in spans]


def accuracy(evaluation: Evaluation | None, *, dev: bool = False) -> str:
    """The share of questions passed (as the loop counts them), with its 95% CI and n: a dev
    figure's CI as the run printed it (:func:`~optloop.loop.trivial_control.dev_interval`, from the
    count of passes), a test figure's over the questions in order."""
    if evaluation is None:
        return "-"
    ci = (
        dev_interval(evaluation.accuracy, len(evaluation.outcomes), seed=0)
        if dev
        else bootstrap_mean([float(o.passed) for o in evaluation.outcomes], seed=0)
    )
    return f"{ci.estimate:.3f} [{ci.low:.3f}, {ci.high:.3f}] n={ci.n}"


def start_instructions(system: str, lm: str | None = None) -> dict[str, str]:
    """The instructions each prompt site of ``system`` starts from (the library's own prompts),
    read from a system built on the run's ``--lm`` (``lm``), which nothing calls: a local model
    is loaded at its first call, and graphiti opens its client with the model's name."""
    import tempfile

    from optloop.lm import LMSettings, OptloopLM
    from systems import get_system

    with tempfile.TemporaryDirectory() as tmp:
        unused = OptloopLM(LMSettings.from_spec(lm, cache_path=Path(tmp) / "cache.sqlite"))
        built = get_system(system)(unused, Path(tmp))
        try:
            return {name: site.instructions for name, site in built.prompt_sites().items()}
        finally:
            built.close()


def system_of(command: str) -> str | None:
    """The ``--system`` a run's command names, if any."""
    return flag_of(command, "--system")


def report(
    run_dir: Path, console: Path | None, start: dict[str, str] | None = None
) -> dict[str, Any]:
    """The figures of the finished run in ``run_dir`` (see the module docstring). ``start``: the
    sites' starting instructions (:func:`start_instructions`); a site whose best instructions
    equal them is left out of the changed prompts (a library's prompt is never copied out)."""
    ckpt = Checkpoint.load(run_dir / "checkpoint.json")
    if not ckpt.finished or ckpt.test_before is None or ckpt.test_after is None:
        raise SystemExit(f"{run_dir}: the run has not finished (no held-out test yet)")
    lines = log_lines(run_dir / "run.log")
    started, ended = lines[0][0], lines[-1][0]
    spans = process_spans(lines)
    worked = sum((b - a).total_seconds() for a, b in spans)
    stages = [
        {"at_s": int((t - started).total_seconds()), "line": text}
        for t, text in lines
        if text.startswith("evaluating baseline") or "on test" in text
    ]
    printed = console.read_text().splitlines() if console is not None else []
    # A resumed run says its projection, power line and first headroom check again in each
    # process: each is kept once, in the order first said.
    etas = _once(line.strip() for line in printed if "ETA" in line and "projected" in line)
    checks = _said([text for _, text in lines], printed, "headroom", "headroom:")
    powers = _said([text for _, text in lines], printed, "power:", "power:")
    before = [float(o.passed) for o in ckpt.test_before.outcomes]
    after = [float(o.passed) for o in ckpt.test_after.outcomes]
    delta = paired_bootstrap_delta(before, after, seed=0)
    control: dict[str, Any] = {}
    if ckpt.control_test is not None:
        beside = [float(o.passed) for o in ckpt.control_test.outcomes]
        vs = paired_bootstrap_delta(beside, after, seed=0)
        control = {
            "dev": accuracy(ckpt.control_dev, dev=True),
            "test": accuracy(ckpt.control_test),
            "delta_best_minus_control": _interval(vs),
        }
    best = max(
        (t for t in ckpt.trials if t.evaluation is not None),
        key=lambda t: (t.evaluation.accuracy if t.evaluation else 0.0, -t.trial),
        default=None,
    )
    prompts = {}  # the changed sites' instructions of the candidate tested after (the best trial)
    diffs = {}
    if best is not None and ckpt.test_after.candidate == best.candidate.digest():
        for site, state in best.candidate.sites.items():
            start_text = (start or {}).get(site)
            if site not in ckpt.targets or state.instructions == start_text:
                continue
            prompts[site] = state.instructions
            if start_text is not None:
                diffs[site] = "".join(
                    difflib.unified_diff(
                        _lines(start_text),
                        _lines(state.instructions),
                        f"{site} (start)",
                        f"{site} (best)",
                    )
                )
    verdicts_ = verdicts(logs_under(run_dir / "work" / "optimizers"))
    arms = {"before": ckpt.test_before, "control": ckpt.control_test, "after": ckpt.test_after}
    return {
        "run": run_dir.name,
        "split": {name: len(ids) for name, ids in ckpt.split.items()},
        "questions": {
            "dev": len(ckpt.baseline_dev.outcomes) if ckpt.baseline_dev else 0,
            "test": len(ckpt.test_before.outcomes),
        },
        "targets": ckpt.targets,
        "baseline_dev": accuracy(ckpt.baseline_dev, dev=True),
        "trials": [
            {
                "trial": t.trial,
                "origin": t.candidate.origin,
                "dev": None if t.evaluation is None else t.evaluation.accuracy,
            }
            for t in ckpt.trials
        ],
        "test_before": accuracy(ckpt.test_before),
        "test_after": accuracy(ckpt.test_after),
        "delta": _interval(delta),
        "projection_printed": etas,
        "power": powers[0] if powers else None,
        "power_after": powers[-1] if len(powers) > 1 else None,
        "headroom": checks,
        "trial_lines": [line.strip() for line in printed if re.search(r"trial \d+/\d+ dev", line)],
        "stages": stages,
        "wall_s": int(worked),
        "processes": len(spans),
        "stopped_s": int((ended - started).total_seconds() - worked),
        "cost": ckpt.total_cost(),
        "control": control,
        "best_trial": best.trial if best is not None else None,
        "best_prompts": prompts,
        "best_diffs": diffs,
        "proposals": dict(
            sorted(Counter(v.reason.value if v.reason else "passed" for v in verdicts_).items())
        ),
        "refused": [v.model_dump(mode="json") for v in verdicts_ if v.reason is not None],
        "by_category": by_category({k: v for k, v in arms.items() if v is not None}),
        "blame": blame_table([e for e in (ckpt.baseline_train, ckpt.baseline_dev) if e]),
        "evaluations": evaluation_costs(ckpt),
    }


def evaluation_costs(ckpt: Checkpoint) -> list[dict[str, Any]]:
    """What each evaluation of the run cost: questions, seconds, LLM calls (and of those the ones
    the model computed, and the ingest calls)."""
    named: list[tuple[str, Evaluation | None]] = [
        ("baseline train", ckpt.baseline_train),
        ("baseline dev", ckpt.baseline_dev),
        ("control dev", ckpt.control_dev),
        *((f"trial {t.trial} dev", t.evaluation) for t in ckpt.trials),
        ("test before", ckpt.test_before),
        ("control test", ckpt.control_test),
        ("test after", ckpt.test_after),
    ]
    return [
        {
            "evaluation": name,
            "questions": len(e.outcomes),
            "seconds": round(e.seconds, 1),
            "llm_calls": e.llm_calls,
            "model_calls": e.model_calls,
            "ingest_calls": e.ingest_calls,
            "stores_reused": e.stores_reused,
        }
        for name, e in named
        if e is not None
    ]


def _interval(ci: Interval) -> dict[str, Any]:
    """An interval as the results files hold it: estimate, low, high, n."""
    return ci.model_dump(include={"estimate", "low", "high", "n"})


def _verdict(d: dict[str, Any]) -> str:
    """What a paired difference held as :func:`_interval` says (the loop's own verdict)."""
    return verdict(Interval(**d))


def _lines(text: str) -> list[str]:
    return [line + "\n" for line in text.splitlines()]


def by_category(arms: dict[str, Evaluation]) -> dict[str, Any]:
    """Per question category, each arm's accuracy and mean score with n; overall, each arm's mean
    score with its 95% CI and the paired mean-score deltas after - before and after - control."""
    groups: dict[str, dict[str, list[QuestionOutcome]]] = {}
    for arm, evaluation in arms.items():
        for o in evaluation.outcomes:
            groups.setdefault(o.task_type, {}).setdefault(arm, []).append(o)
    rows = {
        task: {
            arm: {
                "n": len(outcomes),
                "accuracy": sum(o.passed for o in outcomes) / len(outcomes),
                "mean_score": sum(o.score for o in outcomes) / len(outcomes),
            }
            for arm, outcomes in cells.items()
        }
        for task, cells in sorted(groups.items())
    }
    scores = {arm: [o.score for o in e.outcomes] for arm, e in arms.items()}
    overall = {arm: _interval(bootstrap_mean(xs, seed=0)) for arm, xs in scores.items()}
    deltas = {
        name: _interval(paired_bootstrap_delta(scores[a], scores[b], seed=0))
        for name, (a, b) in {
            "after - before": ("before", "after"),
            "after - control": ("control", "after"),
        }.items()
        if a in scores and b in scores
    }
    return {"categories": rows, "mean_score": overall, "deltas": deltas}


def blame_table(evaluations: list[Evaluation]) -> list[dict[str, Any]]:
    """The failures of ``evaluations`` counted by blamed site (or knob) and error type."""
    counts: Counter[tuple[str, str]] = Counter()
    for evaluation in evaluations:
        for o in evaluation.outcomes:
            if o.passed:
                continue
            if o.attribution is None:
                counts[("(not attributed)", o.error or "-")] += 1
            else:
                counts[(o.attribution.target or "(no site)", o.attribution.error_type.value)] += 1
    return [
        {"target": target, "error_type": error_type, "failures": n}
        for (target, error_type), n in counts.most_common()
    ]


def _wall(data: dict[str, Any]) -> str:
    """The run's wall time, and over how many processes when it was stopped and resumed (the time
    it stood stopped left out)."""
    wall = f"{data['wall_s'] / 60:.0f} min"
    if data.get("processes", 1) > 1:
        wall += (
            f" over {data['processes']} processes (not counting the "
            f"{data['stopped_s'] / 60:.0f} min it stood stopped between them)"
        )
    return wall


def to_markdown(data: dict[str, Any]) -> str:
    d = data["delta"]
    changed = _verdict(d)
    lines = [
        f"# `{data['provenance']['command']}`",
        "",
        provenance_lines(data["provenance"]).rstrip("\n"),
        "",
        table(
            ["figure", "value"],
            [
                ["run", data["run"]],
                ["split (episodes)", ", ".join(f"{k} {v}" for k, v in data["split"].items())],
                [
                    "dev / test questions",
                    f"{data['questions']['dev']} / {data['questions']['test']}",
                ],
                ["blamed", ", ".join(data["targets"])],
                ["baseline dev", data["baseline_dev"]],
                ["trials evaluated", str(sum(t["dev"] is not None for t in data["trials"]))],
                ["held-out test, before", data["test_before"]],
                ["held-out test, after", data["test_after"]],
                [
                    "held-out delta [95% CI]",
                    f"{_ci(d, signed=True)} ({changed})",
                ],
                ["wall time", _wall(data)],
                [
                    "LLM calls",
                    f"{data['cost'].get('llm_calls', 0):.0f} "
                    f"({data['cost'].get('model_calls', 0):.0f} computed)",
                ],
            ],
        ),
        "",
        *_check_lines(data),
        "Printed before the first trial: "
        + ("; ".join(f"`{e}`" for e in data["projection_printed"]) or "(no console given)"),
        "",
        table(
            ["trial", "dev", "how"],
            [
                [t["trial"], "-" if t["dev"] is None else f"{t['dev']:.3f}", t["origin"]]
                for t in data["trials"]
            ],
        ),
        "",
        *_control_lines(data),
        *_prompt_lines(data),
        *_gate_lines(data),
        *_category_lines(data),
        *_blame_lines(data),
        *_cost_lines(data),
        "Stages (seconds from the start, from run.log):",
        "",
        table(["at s", "line"], [[s["at_s"], s["line"]] for s in data["stages"]]),
        "",
    ]
    return "\n".join(lines)


def _check_lines(data: dict[str, Any]) -> list[str]:
    """The power line and the headroom checks, each as the run said it."""
    said = [p for p in (data.get("power"), data.get("power_after")) if p] + list(
        data.get("headroom") or []
    )
    if not said:
        return []
    return (
        ["What the splits can show and whether the blamed prompt can matter:", ""]
        + [f"- {line}" for line in said]
        + [""]
    )


def _control_lines(data: dict[str, Any]) -> list[str]:
    control = data.get("control") or {}
    if not control:
        return ["No trivial-instruction control in this run.", ""]
    d = control["delta_best_minus_control"]
    return [
        table(
            ["the trivial-instruction control", "value"],
            [
                ["dev", control["dev"]],
                ["held-out test", control["test"]],
                [
                    "held-out best - control [95% CI]",
                    f"{_ci(d, signed=True)} ({_verdict(d)})",
                ],
            ],
        ),
        "",
    ]


def _prompt_lines(data: dict[str, Any]) -> list[str]:
    prompts = data.get("best_prompts") or {}
    if not prompts:
        return ["The baseline stayed best: no prompt changed.", ""]
    out = [
        f"The best candidate (trial {data['best_trial']}), the instructions it changed, whole, "
        "and their diff from the start:"
    ]
    for site, text in prompts.items():
        out += ["", f"`{site}`:", "", "```", text, "```"]
        if diff := (data.get("best_diffs") or {}).get(site):
            out += ["", "```diff", diff.rstrip("\n"), "```"]
    return [*out, ""]


def _gate_lines(data: dict[str, Any]) -> list[str]:
    counts = data.get("proposals") or {}
    if not counts:
        return []
    out = [
        "The proposal gate: "
        + ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
        + ". Each refused proposal:",
        "",
    ]
    out.append(
        table(
            ["site", "by", "reason", "what it found", "text"],
            [
                [
                    v["site"],
                    v["who"],
                    v["reason"],
                    v["detail"][:90],
                    " ".join(v["text"].split())[:200].replace("|", "/"),
                ]
                for v in data.get("refused", [])
            ],
        )
    )
    return [*out, ""]


def _ci(c: dict[str, Any], signed: bool = False) -> str:
    f = "+.3f" if signed else ".3f"
    return f"{c['estimate']:{f}} [{c['low']:{f}}, {c['high']:{f}}] n={c['n']}"


def _category_lines(data: dict[str, Any]) -> list[str]:
    cats = data.get("by_category") or {}
    if not cats or len(cats.get("categories", {})) < 2:
        return []
    arms = list(cats["mean_score"])
    rows = []
    for name, cells in cats["categories"].items():
        row = [name, max(c["n"] for c in cells.values())]
        for arm in arms:
            c = cells.get(arm)
            row.append("-" if c is None else f"{c['accuracy']:.3f} / {c['mean_score']:.3f}")
        rows.append(row)
    rows.append(["all (mean score, 95% CI)", "", *(_ci(cats["mean_score"][a]) for a in arms)])
    out = [
        "Held-out test by question category: accuracy / mean score (token F1 for LoCoMo's "
        "scorers) per arm (before: the system's own prompts; control: the trivial instruction; "
        "after: the loop's best):",
        "",
        table(["category", "n", *arms], rows),
        "",
    ]
    for name, d in cats.get("deltas", {}).items():
        out.append(f"- mean score, {name}: {_ci(d, signed=True)} ({_verdict(d)})")
    return [*out, ""]


def _blame_lines(data: dict[str, Any]) -> list[str]:
    blame = data.get("blame") or []
    if not blame:
        return []
    return [
        "The baseline's failures (train and dev) by blamed site and error type:",
        "",
        table(
            ["blamed", "error type", "failures"],
            [[b["target"], b["error_type"], b["failures"]] for b in blame],
        ),
        "",
    ]


def _cost_lines(data: dict[str, Any]) -> list[str]:
    rows = data.get("evaluations") or []
    if not rows:
        return []
    return [
        "What each evaluation cost (seconds of wall time; LLM calls, cache hits included):",
        "",
        table(
            [
                "evaluation",
                "questions",
                "s",
                "LLM calls",
                "computed",
                "ingest calls",
                "stores reused",
            ],
            [
                [
                    r["evaluation"],
                    r["questions"],
                    f"{r['seconds']:.0f}",
                    r["llm_calls"],
                    r["model_calls"],
                    r["ingest_calls"],
                    r["stores_reused"],
                ]
                for r in rows
            ],
        ),
        "",
    ]


def _once(lines: Iterable[str]) -> list[str]:
    """``lines`` without repeats, in the order first said."""
    return list(dict.fromkeys(lines))


def _said(logged: Sequence[str], printed: Sequence[str], prefix: str, summary: str) -> list[str]:
    """The lines starting with ``prefix`` that run.log holds, once each, then the summary's line
    (the last printed line starting with ``summary``) when it is new: the summary's headroom
    (with the check after the trials) and power line are printed, not logged."""
    said = _once(text for text in logged if text.startswith(prefix))
    last = [line.strip() for line in printed if line.strip().startswith(summary)]
    if last and last[-1] not in said:
        said.append(last[-1])
    return said


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.run_report", __doc__)
    parser.add_argument("--run-dir", type=Path, required=True, help="the run's directory")
    parser.add_argument("--command", required=True, help="the command the run was started with")
    parser.add_argument("--commit", help="the commit the run ran at (default: this checkout's)")
    parser.add_argument("--console", type=Path, help="what the run printed to its terminal")
    parser.add_argument(
        "--lm",
        default=None,
        help="the run's --lm (default: the one --command names, else the embedded model)",
    )
    parser.add_argument("--json", type=Path, required=True, metavar="OUT")
    parser.add_argument("--markdown", type=Path, metavar="OUT")
    args = parse_command(parser, argv)
    if args.lm is None:
        args.lm = flag_of(args.command, "--lm")
    system = system_of(args.command)
    start = start_instructions(system, args.lm) if system else None
    data = stamped(report(args.run_dir, args.console, start), model_of(args), args.command)
    if args.commit:
        data["provenance"]["commit"] = args.commit
    write_atomic(args.json, json.dumps(data, indent=1) + "\n")
    if args.markdown:
        write_atomic(args.markdown, to_markdown(data))
    print(to_markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
