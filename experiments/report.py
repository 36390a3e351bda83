"""docs/benchmarks.md from experiments/results/*.json: each benchmark's question, command and
latest tables.

    python -m experiments.report            # rewrite docs/benchmarks.md
    python -m experiments.report --check    # exit 1 when docs/benchmarks.md differs from what the
                                            # results say

Every table is read from a results file; the page's text names what each benchmark asks and how to
run it. Each results file carries its provenance (``command``, ``date``, ``commit``, ``model``,
``machine``) once, in its ``provenance`` header, and the page repeats it above the figures it
took from there, so a re-run of a benchmark (which rewrites its results file) updates the page.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments.markdown import table
from experiments.provenance import flag_of

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"

Json = dict[str, Any]


def load(name: str) -> Json | None:
    path = RESULTS / name
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def provenance(data: Json, name: str) -> str:
    """The provenance header of a results file, as one paragraph."""
    p = data.get("provenance")
    if not p:
        raise SystemExit(
            f"experiments/results/{name} has no provenance header (command, date, commit, model, "
            "machine); add one"
        )
    line = (
        f"`{name}`: `{p['command']}`  \n{p['date']}, commit {p['commit']}, {p['model']}; "
        f"{p['machine']}."
    )
    module = p["command"].split()[2] if p["command"].startswith("python -m ") else None
    if module and importlib.util.find_spec(module) is None:
        line += f" `{module}` is no longer in the tree: the command runs at commit {p['commit']}."
    return line


def ci(low: float, high: float, fmt: str = "+.2f") -> str:
    return f"[{format(low, fmt)}, {format(high, fmt)}]"


def interval(x: Json, fmt: str = ".3f") -> str:
    """``k/n 0.921 [0.874, 0.969]`` from a ``{k, n, estimate, low, high}`` rate."""
    if not x.get("n"):
        return "nothing to score"
    mark = "*" if x.get("small_sample") else ""
    return f"{x['k']}/{x['n']} {x['estimate']:{fmt}} {ci(x['low'], x['high'], fmt)}{mark}"


def pct(x: float) -> str:
    return f"{x:.0%}"


# --- one section per benchmark ------------------------------------------------------------------


def demo() -> list[str]:
    out = [
        "## The closed loop on the embedded model (`make demo`)",
        "Does the loop raise held-out accuracy on a task whose score depends on memory, with "
        "the 135M model and no proposer that writes? `make demo`'s run: rag_bm25 with "
        "`--query-rewrite` on `synthetic:recall`, the edit optimizer, budget 3; "
        "`python -m experiments.bench.run_report` on the finished run "
        "([`demo.md`](../experiments/results/demo.md)).",
    ]
    data = load("demo.json")
    if data is None:
        return out + [
            "No results file yet: run `make demo`, then `python -m experiments.bench.run_report "
            "--run-dir <its run> --json experiments/results/demo.json`."
        ]
    delta = data["delta"]
    control = data.get("control") or {}
    best_minus_control = control.get("delta_best_minus_control")
    out += [
        provenance(data, "demo.json"),
        table(
            [
                "dev baseline",
                "test before",
                "control test",
                "test after",
                "held-out delta [95% CI]",
                "best - control [95% CI]",
                "n test",
                "blamed",
                "changed",
                "LLM calls",
            ],
            [
                [
                    data["baseline_dev"],
                    data["test_before"],
                    control.get("test", "-"),
                    data["test_after"],
                    f"{delta['estimate']:+.3f} {ci(delta['low'], delta['high'], '+.3f')}",
                    f"{best_minus_control['estimate']:+.3f} "
                    f"{ci(best_minus_control['low'], best_minus_control['high'], '+.3f')}"
                    if best_minus_control
                    else "-",
                    delta["n"],
                    ", ".join(data["targets"]),
                    ", ".join(data["best_prompts"]) or "-",
                    f"{data['cost'].get('llm_calls', 0):.0f}",
                ]
            ],
        ),
    ]
    return out


def _repair_bites(data: Json) -> str:
    return table(
        ["case", "site", "mode", "n", "clean", "sabotaged", "margin [95% CI]", "kept"],
        [
            [
                b["name"],
                b["site"],
                b["mode"],
                b["n"],
                f"{b['clean']:.3f}",
                f"{b['sabotaged']:.3f}",
                f"{b['margin']:+.2f} {ci(*b['margin_ci'])}",
                "yes" if b["bites"] else "dropped",
            ]
            for b in data["bites"]
        ],
    )


def _repair_arms(data: Json) -> str:
    from experiments.bench.repair import label

    removed = any("sabotage_removed" in c for c in data["cases"])
    return table(
        [
            "case",
            "optimizer",
            "arm",
            "seed",
            "n test",
            "clean",
            "sabotaged",
            "after",
            "gain [95% CI]",
            "first blame",
            "changed",
            *(["sabotage removed"] if removed else []),
            "LLM calls",
        ],
        [
            [
                c["case"],
                label(c),
                c["arm"],
                c["seed"],
                c["n_test"],
                f"{c['clean']:.2f}",
                f"{c['sabotaged']:.2f}",
                f"{c['after']:.2f}",
                f"{c['gain']:+.2f} {ci(*c['gain_ci'])}" if c.get("gain_ci") else "n/a",
                c["first_blame"] + ("" if c["first_blame_correct"] else " (wrong)"),
                ", ".join(c["changed"]) or "-",
                *([_yes_no(c.get("sabotage_removed"))] if removed else []),
                c["llm_calls"],
            ]
            for c in data["cases"]
        ],
    )


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "no"


REPAIR_CHAMPION_COMMAND = (
    "python -m experiments.bench.repair --champion --seeds 0,1,2 --optimizers edit,simba "
    "--budget 3 --json experiments/results/repair_champion.json "
    "--markdown experiments/results/repair_champion.md"
)


def _repair_champion(data: Json) -> list[str]:
    """The champion the cases of ``repair_champion.json`` were planted on, and its instructions."""
    champion = data["champion"]
    rows = [
        [
            site,
            " ".join(text.split()).replace("|", "\\|")
            if site in champion["changed"]
            else "(the clean one)",
        ]
        for site, text in champion["instructions"].items()
    ]
    return [
        f"Champion: {champion['note']}.",
        table(["site", "champion instruction"], rows),
    ]


_OUTCOME_COLUMNS = [
    "first blame right",
    "recovered >= 50%",
    "recovered, mean [95% CI]",
    "sabotage removed",
]


def _outcome_cells(row: Json) -> list[str]:
    """A repair aggregate row's outcome cells, in :data:`_OUTCOME_COLUMNS`' order."""
    return [
        pct(row["first_blame_correct"]),
        pct(row["recovered_half"]),
        f"{row['recovered_mean']:+.2f} {ci(*row['recovered_mean_ci'])}",
        pct(row["sabotage_removed"]) if "sabotage_removed" in row else "n/a",
    ]


def _repair_aggregate(data: Json) -> str:
    return table(
        ["optimizer", "arm", "cases", *_OUTCOME_COLUMNS, "LLM calls (mean)"],
        [
            [
                a["optimizer"],
                a["arm"],
                a["cases"],
                *_outcome_cells(a),
                f"{a['llm_calls_mean']:.0f}",
            ]
            for a in data["aggregate"]
        ],
    )


def _repair_by_planting(data: Json) -> list[str]:
    """The aggregate split by how the sabotage was planted, where the report has it."""
    if not data.get("by_planting"):
        return []
    return [
        "By how the sabotage was planted: `added` in front of or after the site's instruction "
        "(one deletion takes it out), `replaced` (the instruction gone, so only new writing "
        "mends it).",
        table(
            ["optimizer", "arm", "planted", "runs", *_OUTCOME_COLUMNS],
            [
                [r["optimizer"], r["arm"], r["planted"], r["cases"], *_outcome_cells(r)]
                for r in data["by_planting"]
            ],
        ),
    ]


WELLFORMED = "repair_champion_simba_wellformed.json"


def _simba_wellformed(before: Json) -> list[str]:
    """SIMBA's targeted runs of ``repair_champion.json`` against the same runs (case, seed) when
    its advice and the proposer's rewrites must be well-formed: paired differences with their
    bootstrap CI."""
    after = load(WELLFORMED)
    if after is None:
        return []
    from optloop.stats import bootstrap_mean

    def runs(data: Json) -> dict[tuple[str, int], Json]:
        return {
            (c["case"], c["seed"]): c
            for c in data["cases"]
            if c["optimizer"] == "simba" and c["arm"] == "targeted"
        }

    old, new = runs(before), runs(after)
    keys = sorted(old.keys() & new.keys())
    if not keys:
        return []

    def share(rows: Json, test: Callable[[Json], bool]) -> str:
        return f"{sum(test(r) for r in rows) / len(rows):.0%}"

    rows = []
    for label, field in (("recovered", "recovered"), ("after - sabotaged", "gain")):
        diff = bootstrap_mean([new[k][field] - old[k][field] for k in keys], seed=0)
        rows.append(
            [
                label,
                f"{sum(old[k][field] for k in keys) / len(keys):+.2f}",
                f"{sum(new[k][field] for k in keys) / len(keys):+.2f}",
                f"{diff.estimate:+.2f} {ci(diff.low, diff.high)} n={diff.n}",
            ]
        )
    o, n = [old[k] for k in keys], [new[k] for k in keys]
    rows += [
        [
            "recovered >= 50%",
            share(o, lambda r: r["recovered"] >= 0.5),
            share(n, lambda r: r["recovered"] >= 0.5),
            "",
        ],
        [
            "sabotage removed",
            share(o, lambda r: r["sabotage_removed"]),
            share(n, lambda r: r["sabotage_removed"]),
            "",
        ],
        [
            "LLM calls (mean)",
            f"{sum(r['llm_calls'] for r in o) / len(o):.0f}",
            f"{sum(r['llm_calls'] for r in n) / len(n):.0f}",
            "",
        ],
    ]
    return [
        "### SIMBA when its advice must be well-formed",
        "The SIMBA targeted runs above against the same case and seed on the same LM cache, "
        "with SIMBA's advice and the proposer's rewrites that are not well-formed instructions "
        "left out ([loop.md](loop.md)); the paired difference's CI is a bootstrap over the runs. "
        "Every run: [`repair_champion_simba_wellformed.md`]"
        "(../experiments/results/repair_champion_simba_wellformed.md).",
        provenance(after, WELLFORMED),
        table(
            [
                "figure",
                "advice as written",
                "well-formed advice only",
                "paired difference [95% CI]",
            ],
            rows,
        ),
    ]


WRITER = "repair_champion_writer.json"


def _repair_writer(before: Json) -> list[str]:
    """The champion's cases mended with a writer (``--proposer-lm``), and the aggregate of those
    cases beside the rows of ``repair_champion.json`` (edit and SIMBA, no writer) on the same
    cases."""
    writer = load(WRITER)
    if writer is None:
        return []
    from experiments.bench.repair import summarize

    cases = {c["case"] for c in writer["cases"]}
    merged = summarize(
        {**writer, "cases": [c for c in before["cases"] if c["case"] in cases] + writer["cases"]}
    )
    return [
        "### The same cases with a model that writes",
        "The champion's biting cases, with SmolLM2 answering as above and Qwen2.5-Coder-1.5B "
        "writing the edit optimizer's new text (`--proposer-lm`: a short instruction for a "
        "blamed site, a sentence added or rewritten), on the same champion, seeds and budget; "
        "first run. The aggregate puts these rows beside the rows above without a writer, on "
        "the same cases. Every run: [`repair_champion_writer.md`]"
        "(../experiments/results/repair_champion_writer.md).",
        provenance(writer, WRITER),
        _repair_bites(writer),
        _repair_arms(writer),
        *[f"**Unfinished.** {u}." for u in writer.get("unfinished", [])],
        _repair_aggregate(merged),
        *_repair_by_planting(merged),
        "Each run's text at the sabotaged site after the loop (cut at 160 characters), and what "
        "the proposal gate says of it now (`gate now`; a later rule may refuse a text the gate "
        "of the run passed; judged without the failures the writer was shown, so a quote of "
        "them is not caught here):",
        _winners(writer["cases"]),
        *_repair_writer_budget(),
        *_repair_writer_by_text(),
        *_repair_writer_first_start(),
        *_repair_writer_qwen(),
    ]


WRITER_BUDGET = "repair_champion_writer_budget6.json"


def _repair_writer_budget() -> list[str]:
    """The two replaced-instruction cases again, targeted, at a budget that reaches the written
    edits: at budget 3 the edit optimizer spends its trials on the deletions the failures support
    first."""
    data = load(WRITER_BUDGET)
    if data is None:
        return []
    return [
        "At budget 3 the edit optimizer's three trials go to the deletions the failures support "
        "(and the deletion of all), which cannot mend a replaced instruction; the writer's texts "
        "come after them. The two replaced-instruction cases again, targeted, at budget "
        f"{data['budget']}:",
        provenance(data, WRITER_BUDGET),
        _repair_arms(data),
        _winners(data["cases"]),
    ]


WRITER_QWEN = "repair_writer_qwen_bite.json"
WRITER_QWEN_MD_FLAT = "repair_writer_qwen_bite_md_flat.json"


def _by_text(cases: list[Json], clean: str) -> str:
    """The runs of replaced-instruction cases by what each kind of text at the sabotaged site
    scored: on dev, the signature's default instruction (the deletion of all) and the writer's
    best text; on test, the sabotaged program, the loop's result, the loop's control (the trivial
    instruction at the blamed sites; ``-`` for a run from before the bench kept it) and the
    ``clean`` program."""
    rows = []
    for c in cases:
        # only the trials that edited the sabotaged site (a later round may edit another)
        trials = [t for t in c["trials"] if _at_site(t["origin"], c["site"])]
        default = [t["dev"] for t in trials if "default instruction" in t["origin"]]
        written = [t["dev"] for t in trials if _is_written(t["origin"])]
        rows.append(
            [
                c["case"],
                c.get("arm", "targeted"),
                c["seed"],
                f"{default[0]:.2f}" if default else "-",
                f"{max(written):.2f}" if written else "-",
                f"{c['sabotaged']:.2f}",
                f"{c['after']:.2f}",
                f"{c['control_test']:.2f}" if "control_test" in c else "-",
                f"{c['clean']:.2f}",
            ]
        )
    return table(
        [
            "case",
            "arm",
            "seed",
            "dev, the signature's default",
            "dev, the writer's best",
            "test, sabotaged",
            "test, after",
            "test, trivial instruction",
            f"test, {clean}",
        ],
        rows,
    )


def _repair_writer_by_text() -> list[str]:
    """The budget-6 runs of the replaced-instruction cases by what each kind of text scored, and
    the replaced-instruction cases' bite checks with the Qwen 0.5B answering."""
    data = load(WRITER_BUDGET)
    out: list[str] = []
    if data is not None:
        out += [
            "Each of those runs by what scored what: on dev, the signature's default "
            "instruction (the deletion of all) and the writer's best text; on test, the "
            "sabotaged program, the loop's result and the champion. With SmolLM2 answering, a "
            "written text mends a replaced instruction only where its dev gain carries to test.",
            _by_text(data["cases"], "champion"),
        ]
    qwen = load(WRITER_QWEN)
    if qwen is not None:
        bites = [b for b in qwen["bites"] if b["bites"]]
        out += [
            "The same two cases with the Qwen2.5-Coder 0.5B answering (no champion: "
            "rag_bm25's own prompts are the clean program), first run: "
            + (
                "neither bites, so there is nothing for the writer to mend on that model; "
                if not bites
                else f"{len(bites)} of {len(qwen['bites'])} bite; "
            )
            + "a negative margin is a sabotaged program that answers better than the clean one.",
            provenance(qwen, WRITER_QWEN),
            _repair_bites(qwen),
        ]
    md_flat = load(WRITER_QWEN_MD_FLAT)
    if md_flat is not None:
        cleans = sorted({b["clean"] for b in md_flat["bites"]})
        out += [
            "The other replaced-instruction cases (md_flat on `memfail:persona`), the same "
            "model, bite check only, first run: the clean program answers "
            + ", ".join(f"{c:.3f}" for c in cleans)
            + " there, so a sabotage has little to take away and its mending could not be "
            "measured on a test split of this size.",
            provenance(md_flat, WRITER_QWEN_MD_FLAT),
            _repair_bites(md_flat),
        ]
    return out


def _bite_count(data: Json) -> str:
    bites = [b["name"] for b in data["bites"] if b["bites"]]
    if not bites:
        return f"none of the {len(data['bites'])} bites"
    return f"{len(bites)} of {len(data['bites'])} bite ({', '.join(f'`{b}`' for b in bites)})"


def _repair_runs(name: str, intro: str, runs: Json | None = None) -> list[str]:
    """A repair report's runs with a writer: provenance, every run, the aggregate, each run's
    winning text with what the gate now says of it, and each run by what scored what. ``runs``
    is the report when the caller has read it already."""
    runs = runs if runs is not None else load(name)
    if runs is None:
        return []
    from experiments.bench.repair import summarize

    return [
        intro,
        provenance(runs, name),
        _repair_arms(runs),
        *[f"**Unfinished.** {u}." for u in runs.get("unfinished", [])],
        _repair_aggregate(summarize(runs)),
        "Each run's text at the sabotaged site after the loop (cut at 160 characters), and what "
        "the proposal gate says of it now:",
        _winners(runs["cases"]),
        "Each run by what scored what (on dev, the signature's default instruction and the "
        "writer's best text at the sabotaged site; on test, sabotaged, after, the loop's "
        "control with the trivial instruction at the blamed sites (`-`: a run from before the "
        "bench kept it) and the system's own prompts):",
        _by_text(runs["cases"], "own prompts"),
    ]


CURATE15_ALONE = "repair_writer_qwen15_curate_sentence_alone.json"


def _repair_writer_qwen() -> list[str]:
    """The replaced-instruction cases on the Qwen models (``--cases writer`` and the rag_bm25
    ones with the 1.5B answering): their bite checks, and the repair runs with the 1.5B writing
    on the cases that bite. Each part was written into the catalogue before it ran."""
    out: list[str] = []
    parts = [
        (
            "repair_writer_qwen05_bite_replaced.json",
            "rag_bm25's two sites, the 0.5B answering",
            "rag_bm25's sites each return one JSON field, and the 0.5B fills it from the "
            "question and the memories whatever rule is written above: its query under a rule "
            "about the weather, or the first word, is the question as asked, which finds more "
            "than its rewrite under rag_bm25's own instruction.",
        ),
        (
            "repair_writer_qwen05_bite_curate.json",
            "md_flat's curate step (it writes down each session's facts; nothing written down, "
            "nothing to answer from) and its answer site, the 0.5B answering",
            "",
        ),
    ]
    for name, where, after in parts:
        data = load(name)
        if data is not None:
            out += [
                f"At {where}, first run: {_bite_count(data)}. {after}".rstrip(),
                provenance(data, name),
                _repair_bites(data),
            ]
    out += _repair_runs(
        "repair_writer_qwen05_curate.json",
        "The repair runs on the case that bites by the widest margin (the two curate cases tie; "
        "the first in the catalogue), the edit optimizer with the 1.5B writing, first run, "
        "stopped after seed 0's three arms: nothing was recovered. In the stores of seed 0's "
        "targeted run, under each curate instruction it evaluated (the 1.5B's among them), the "
        "0.5B returns the second session's line as the whole list and drops the first "
        "session's facts, which the questions ask for.",
    )
    qwen15 = load("repair_writer_qwen15_bite.json")
    if qwen15 is not None:
        out += [
            "With the 1.5B answering, rag_bm25's replaced-instruction cases (the champion "
            "table's two and the two above), first run: "
            f"{_bite_count(qwen15)}. The fixed non-answer bites on the 1.5B where it did not on "
            "the 0.5B; the echo and the two query rules still do not.",
            provenance(qwen15, "repair_writer_qwen15_bite.json"),
            _repair_bites(qwen15),
        ]
    out += _repair_runs(
        "repair_writer_qwen15.json",
        "The repair runs on the case that bites (the 1.5B answering and writing), three seeds, "
        "three arms, first run: the targeted arm ran first, by the command below with `--arms "
        "targeted`, then the other two by the command below, into the same report "
        "(`--resume`). Wherever a run changed `answer`, the winner there is the signature's "
        "default instruction (`del all`): the 1.5B's written instructions come after it in the "
        "edit optimizer's order and tie it on dev. One random run changed only "
        "`retrieve.query` and left the sabotage in place:",
    )
    curate15 = load("repair_writer_qwen15_curate.json")
    if curate15 is not None:
        out += [
            "md_flat's curate step with the 1.5B answering, where the 0.5B kept no memory file "
            f"under any instruction tried, first run: {_bite_count(curate15)}. md_flat's own "
            "prompts, which lost the first session's facts on the 0.5B, keep them on the 1.5B "
            "(the clean column).",
            provenance(curate15, "repair_writer_qwen15_curate.json"),
            _repair_bites(curate15),
        ]
        if curate15["cases"]:
            arms = list(dict.fromkeys(c["arm"] for c in curate15["cases"]))
            out += _repair_runs(
                "repair_writer_qwen15_curate.json",
                f"Its repair runs ({', '.join(arms)}), first run, each arm by the command below "
                "with its `--arms` and seeds, into the same report (`--resume`):",
                curate15,
            )
        else:
            out.append("Its repair runs (the command above) have not finished one run yet.")
    out += _repair_runs(
        CURATE15_ALONE,
        "The same case after two changes: the sentence written to be added stands in for a "
        "short instruction the gate refused (`write (the added sentence alone)`, "
        "[loop.md](loop.md#proposals-a-person-would-ship); in the first run's seed 1 the gate "
        "refused both of the 1.5B's short instructions, which spoke of the prompt: \"The goal "
        "of this step is ...\", and no written edit dropped the sabotage's two sentences), and "
        "the gate refuses a text that says what the instruction is (the first run's seed-0 "
        'winner opens "The instruction is to ..."). Each arm and seed by the command below '
        "with its `--arms` and `--seeds`, into the same report (`--resume`); the LM cache "
        "answers every call the first run made again. The random arm edits one site drawn per "
        "run (`answer` in seed 0):",
    )
    if not out:
        return []
    return [
        "#### Replaced instructions on the Qwen models, mended by the 1.5B",
        "Cases written for a task model that uses what is written, before they ran "
        "(`--cases writer`; [the repair catalogue, part by "
        "part](#the-repair-catalogue-part-by-part) says why each is what it is): each replaces a "
        "site's instruction with a fixed rule, so that only new text mends it.",
        *out,
    ]


FIRST_START = "repair_champion_writer_first_start.json"


def _model_name(model: str) -> str:
    """``qwen2.5-coder-1.5b-instruct-q4_k_m`` from ``local:<file>.gguf:<bytes>``."""
    return model.removeprefix("local:").split(".gguf")[0]


def _winner_kind(case: Json) -> str:
    """How the text a run left at the sabotaged site was made: written (by the writer, or
    derived from its text), the signature's default, another edit, or the sabotage untouched."""
    if case["site"] not in case.get("changed", []):
        return "unchanged"
    if "trials" not in case:
        return "not recorded"
    # The edit optimizer edits the best so far: the site's text in the run's best candidate came
    # from the last trial that edited the site and beat every trial before it.
    origin, top = "", float("-inf")
    for t in sorted(case["trials"], key=lambda t: t["trial"]):
        if t["trial"] > case["best_trial"]:
            break
        if t["dev"] > top:
            top = t["dev"]
            origin = t["origin"] if _at_site(t["origin"], case["site"]) else origin
    if _is_written(origin):
        return "written"
    return "default" if "default instruction" in origin else "other edit"


def _results_link(name: str) -> str:
    """A link to a results file's tables (its ``.md``), or to the file itself when it has none."""
    md = name.removesuffix(".json") + ".md"
    return f"[`{name}`](../experiments/results/{md if (RESULTS / md).exists() else name})"


def replaced_runs() -> list[str]:
    """Every repair run on a replaced instruction in ``experiments/results``, grouped by case,
    task model, optimizer (with its writer), budget and arm: how many recovered at least half
    the loss, how many took the sabotage's text out, and how the winning text was made."""
    from experiments.bench.repair import label

    groups: dict[tuple[str, ...], list[Json]] = {}
    for path in sorted(RESULTS.glob("repair*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for c in data.get("cases", []):
            if c.get("mode") != "replace":
                continue
            group = (
                c["case"],
                c["site"],
                _model_name(data.get("model", "?")),
                label(c),
                str(data["budget"]),
                c["arm"],
                path.name,
            )
            groups.setdefault(group, []).append(c)
    if not groups:
        return []
    rows = []
    for key, cases in groups.items():
        n = len(cases)
        kinds = Counter(_winner_kind(c) for c in cases)
        rows.append(
            [
                *key[:6],
                n,
                f"{sum(c['recovered'] >= 0.5 for c in cases)}/{n}",
                f"{sum(bool(c.get('sabotage_removed')) for c in cases)}/{n}",
                ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())),
                f"{sum(c['sabotaged'] for c in cases) / n:.2f} -> "
                f"{sum(c['after'] for c in cases) / n:.2f}",
                _results_link(key[6]),
            ]
        )
    return [
        "### Every run on a replaced instruction, by task model and optimizer",
        "A replaced instruction is mended only by new text. Every repair run on one, gathered "
        "from the results files of the sections above, one row per case, task model, optimizer, "
        "budget, arm and file. `winner`: how the text a run left at the sabotaged site was made "
        "(`written`: by the writer, or an edit of its text; `default`: the signature's default "
        "instruction; `other edit`: a deletion, a swap or a SIMBA rule; `unchanged`: the site "
        "kept the sabotage; `not recorded`: a file from before trials were kept). Test accuracy "
        "is the mean over the row's runs. Which case bites depends on the task model: the "
        "champion's two bite on SmolLM2-135M, which cannot use what a writer writes, and on "
        "neither Qwen model; the Qwen rows are the cases written for those models.",
        table(
            [
                "case",
                "site",
                "task model",
                "optimizer",
                "budget",
                "arm",
                "runs",
                "recovered >= half",
                "sabotage gone",
                "winner",
                "test, sabotaged -> after",
                "file",
            ],
            rows,
        ),
    ]


def _repair_writer_first_start() -> list[str]:
    """The targeted runs of the first start of the writer's table, stopped when one of its
    winning texts turned out to restate the writer's own rules, each winner judged again by the
    gate as it is now."""
    first = load(FIRST_START)
    if first is None:
        return []
    return [
        "The first start of this table (its first five targeted runs, then stopped): the "
        "winner of `recall-answer-echo` seed 1 was the writer's instruction followed by the "
        "writer's own rules about the instruction, reworded (\"The instruction should be general "
        '... should not mention functions, sessions, fields, or code."), which the gate of the '
        "time passed. The gate now refuses such text, and the table above was run again from "
        "the start on that gate. Those five runs, with what the gate now says of each winner:",
        provenance(first, FIRST_START),
        _winners(first["cases"]),
    ]


def _winners(cases: list[Json]) -> str:
    """Each run's winning text at the sabotaged site and what the proposal gate, as it is now,
    says of it: a run whose winner the gate would now refuse gained with a text nobody would
    ship."""
    from experiments.bench.repair import label
    from optloop.loop.proposals.gate import ProposalGate

    gate = ProposalGate()

    def now(case: Json) -> str:
        if case["site"] not in case["changed"]:
            return "- (unchanged)"
        reason, detail = gate.judge(case["site"], case["after_instruction"])
        return "passed" if reason is None else f"{reason.value}: {detail}"

    return table(
        [
            "case",
            "optimizer",
            "arm",
            "seed",
            "sabotaged",
            "after",
            "removed",
            "winner",
            "gate now",
        ],
        [
            [
                c["case"],
                label(c),
                c["arm"],
                c["seed"],
                f"{c['sabotaged']:.2f}",
                f"{c['after']:.2f}",
                _yes_no(c.get("sabotage_removed")),
                " ".join(c["after_instruction"].split())[:160],
                now(c),
            ]
            for c in cases
        ],
    )


# Why each part of the repair catalogue (optloop/faults/sabotages.py) is what it is: what the runs
# before it showed, written down before any of its faults ran.
REPAIR_CATALOGUE_PARTS = (
    (
        "1. **answer-echo, answer-na, answer-french, curate-empty, curate-redact, curate-food, "
        "mem0-extract-empty** (`memfail:persona`). The 135M model follows behaviour and format "
        "instructions far better than topic filters (measured before this benchmark: a "
        'food-only curate instruction and an "answer only word for word" rule left md_flat\'s '
        "accuracy where it was), so most cases are of that kind; `curate-food` is kept as the "
        "topic-filter case."
    ),
    (
        "2. **answer-never-abstain, answer-echo-append**. The first run showed why the first "
        "part's appended cases could not bite here: on memfail:persona, md_flat's clean "
        "accuracy (0.36) comes almost wholly from the answer site declining questions about "
        'people never mentioned; "reply N/A" and "answer in French" still decline (the '
        "abstention scorer accepts them), and the persona questions the curate site serves are "
        "lost even clean. The one case that bit, answer-echo, replaces the instruction: mending "
        "it means writing the abstention rule the optimizer never sees. These append behaviour "
        "rules that attack that declining, so that what bites is also what an optimizer can "
        "find and take back out."
    ),
    (
        "3. **answer-echo-prepend**. The second part's two appended rules did not bite (margins "
        "+0.014 and +0.000, CIs across 0: SmolLM2 acts on the start of the answer instruction, "
        "not on a sentence after it): answer-echo's own text put in front of the clean "
        "instruction instead of replacing it."
    ),
    (
        "4. **cond-curate-empty, cond-curate-redact, cond-answer-echo** "
        "(`memfail:conditional_easy?limit=40`). The first part's curate cases, bite-checked on "
        "memfail:persona (curate-empty -0.056 [-0.139, 0.028], curate-redact -0.014 [-0.069, "
        "0.042]), do not bite, because persona's clean score is the answer site declining, "
        "which needs no stored fact: the same curate sabotages and answer-echo on a task whose "
        "answers need the stored facts (MemFail's conditional facts, easy: \"would she do X "
        'now?", where X depends on a condition stated in the session).'
    ),
    (
        "5. **recall-answer-echo-prepend, recall-answer-echo, recall-answer-unknown-prepend, "
        "recall-answer-echo-append, recall-query-nothing-prepend, recall-query-nothing, "
        "recall-query-weather-prepend, recall-query-nothing-append** "
        "(`synthetic:recall?seed=0&episodes=40`, rag_bm25). The four parts above showed that on "
        "SmolLM2-135M, md_flat's score on MemFail barely depends on memory (a curate sabotage "
        "that stores nothing moves nothing), and the answer sabotage that bites replaces the "
        "instruction, which only writing can mend. So: a task whose score depends on memory "
        "even at 135M (three made-up facts, two asked; the answer is a value copied from "
        "context), a system with two sites on the path of every question (rag_bm25 with its "
        "query rewrite: retrieve.query, then answer; no LLM at ingest, so a question's fault is "
        "at one of the two), and for each site sabotages of three kinds: put in front of the "
        "site's own instruction (one phrase, so one deletion takes it out), replacing it, and "
        "appended. Which of them bite is the bite check's to say."
    ),
    (
        "6. **recall-answer-abstain-prepend, recall-answer-abstain-append**, for the repair "
        "proof on a champion (`experiments.bench.repair --champion`). The clean answer "
        "instruction ends with its own rule, 'If the memories do not contain the answer, reply "
        "\"I don't know\"', which SmolLM2 follows on questions the memories do answer: on "
        "synthetic:recall that rule costs more accuracy than most sabotages above, and an edit "
        "that deletes it reads as a repair. The champion is the program the loop reaches from "
        "the clean one (the rule deleted, where the loop deletes it); these cases put that rule "
        "back on the champion, in front and at the end, so the fault to mend is the one the "
        "clean program carried. Where the champion still says it, the bench drops the case (the "
        "text is already there)."
    ),
    (
        "7. **recall-answer-unknown, recall-answer-nothing, recall-query-weather, "
        "recall-query-first-word**, for a task model that can use a written instruction "
        "(Qwen2.5-Coder 0.5B). The replaced-instruction cases above bite on SmolLM2-135M, which "
        "cannot use the instruction a writer puts back; on the 0.5B neither bites "
        "(recall-answer-echo margin -0.03 [-0.06, +0.00], recall-query-nothing -0.25 [-0.35, "
        "-0.16], n=80: the 0.5B answers the question whatever the answer instruction says, and "
        'its query under "nothing" finds more than the clean rewrite\'s). These replace each '
        "site's instruction with a fixed rule such a model is more likely to obey, a non-answer "
        "at the answer site and a query about something else at the query site, so that mending "
        "them means writing the site's instruction again. The bite check says which of them "
        "bite on the 0.5B; the repair runs (three seeds, three arms, a writer) take, at each "
        "site, the case that bites by the widest margin."
    ),
    (
        "8. **recall-curate-empty, recall-curate-food, recall-md-answer-unknown** (md_flat). "
        "None of the seventh part's four bit on the 0.5B: under each, the 0.5B answered as well "
        "as under rag_bm25's own prompts or better (answer margins -0.013 and -0.025, query "
        "margins -0.350, n=80). rag_bm25's sites return one JSON field each, and the 0.5B fills "
        "it from the question and the memories whatever the instruction above says: its rewrite "
        'under "weather" or "first word" is the question as asked, which finds more than '
        "its rewrite under the clean instruction. These move to a site whose output is built "
        "from what the instruction asks for: md_flat's curate step, which writes down the facts "
        "of each session (nothing written down, nothing to answer from), on the same task; and "
        "the fixed non-answer at md_flat's answer site. The repair runs take, at each site, the "
        "case that bites by the widest margin, as above."
    ),
)


def repair_catalogue() -> list[str]:
    """The repair catalogue, part by part (hand-written: no results file holds it)."""
    return [
        "### The repair catalogue, part by part",
        "The catalogue (`optloop/faults/sabotages.py`) grew in parts, each written down before "
        "any of its faults was run; what the runs before each part showed, and why its cases "
        "are what they are:",
        "\n".join(REPAIR_CATALOGUE_PARTS),
        "The writer's cases (`WRITER_CASES`: parts 7 and 8, `--cases writer`, run with `--lm` "
        "and a writer) were then run further, each step written down before it ran. After the "
        "eighth part's first repair runs on the 0.5B (seed 0, three arms: nothing recovered; "
        "under every instruction tried there, the writer's included, the 0.5B's curate step "
        "drops the first session's facts when it writes the list after the second): the "
        "replaced-instruction cases at rag_bm25's sites, the champion table's two and the "
        "seventh part's, are bite-checked with Qwen2.5-Coder 1.5B answering, a model that "
        "follows more of what is written (recall-answer-echo, recall-query-nothing, "
        "recall-answer-unknown, recall-query-weather). After the 1.5B's repair runs on "
        "recall-answer-unknown (nine of nine recovered, each by the signature's default "
        "instruction, which the writer's texts tied on dev): recall-curate-empty with the 1.5B "
        "answering, where the default instruction may not carry the memory file forward and "
        "only a written one would.",
    ]


def repair() -> list[str]:
    out = [
        "## The repair benchmark: does the loop mend a prompt that was made worse?",
        "A sabotage (a written instruction) is planted at one prompt site; the loop starts from "
        "the sabotaged program without being told where it is, and never sees the clean "
        "instruction. The bite check keeps a sabotage only when the 95% CI of its accuracy loss "
        "lies above 0. Each kept case runs three arms at equal budget (`targeted`: the blamed "
        "sites; `untargeted`: every site; `random`: one site) and reports the held-out gain "
        "(after - sabotaged, paired bootstrap CI), whether the first blame named the sabotaged "
        "site, and the cost. `recovered` = gain / (clean - sabotaged). "
        "`experiments/bench/repair.py` documents every step and every catalogue.",
        *repair_catalogue(),
    ]
    for name, title in (
        (
            "repair_recall.json",
            "rag_bm25 on `synthetic:recall` (a task whose score depends on "
            "memory), edit optimizer",
        ),
        ("repair_recall_simba.json", "the same cases with SIMBA"),
        (
            "repair.json",
            "MD-flat on MemFail persona and conditional (scores barely depend on memory at 135M)",
        ),
    ):
        data = load(name)
        if data is None:
            continue
        out += [
            f"### {title}",
            provenance(data, name),
            _repair_bites(data),
            _repair_arms(data),
            _repair_aggregate(data),
        ]
        if data.get("targets"):
            out.append("\n".join(f"- {t}" for t in data["targets"]))
    out += [
        "### rag_bm25 on `synthetic:recall`, planted on a champion (edit and SIMBA)",
        "The clean program's own answer rule (reply \"I don't know\") costs more than most "
        "sabotages, so an edit that deletes it wins whatever was planted. Here the loop first "
        "runs on the clean program until no edit beats it on dev; the best trial's instructions "
        "are the champion, each sabotage is planted on the champion's instruction of its site, "
        "and `recovered` is measured against the champion. `sabotage removed`: the sabotage's "
        "text is gone from the site's prompt in the run's best candidate.",
    ]
    data = load("repair_champion.json")
    if data is None:
        out.append(f"No results file yet: run `{REPAIR_CHAMPION_COMMAND}`.")
    else:
        out += [
            provenance(data, "repair_champion.json"),
            *(_repair_champion(data) if data.get("champion") else []),
            _repair_bites(data),
            _repair_arms(data),
            *[f"**Unfinished.** {u}." for u in data.get("unfinished", [])],
            _repair_aggregate(data),
        ]
        if data.get("targets"):
            out.append("\n".join(f"- {t}" for t in data["targets"]))
        out += _repair_by_planting(data)
        out += _simba_wellformed(data)
        out += _repair_writer(data)
    out += replaced_runs()
    rate = [d for d in (load(f"repair_rate_s{k}.json") for k in range(3)) if d is not None]
    if rate:
        out += [
            "### Blame ranked by failure rate: `cond-answer-echo` after the change",
            "Blame is ranked by each target's failure rate given a correct input "
            "([attribution.md](attribution.md#blame)). Before the change: the "
            "`cond-answer-echo` rows of "
            "`repair.json` above (blame by count). After the change, one results file per seed:",
        ]
        for k, data in enumerate(rate):
            out += [provenance(data, f"repair_rate_s{k}.json"), _repair_arms(data)]
    out.append(
        "Before the change to the edit optimizer's rounds (two starts stopped by hand, no "
        "figure): [`repair_first_run.md`](../experiments/results/repair_first_run.md)."
    )
    return out


def targeted() -> list[str]:
    out = [
        "## Targeted vs untargeted optimization",
        "Does optimizing only the blamed sites cost less than optimizing every site, for the "
        "same gain? Same split, seed 0, equal budget, each arm on its own fresh LM cache. LLM "
        "calls count every call (cached ones too); model calls are the ones the model computed. "
        "Each test split holds 3 to 6 questions, so the accuracies are no measurable change "
        "either way; the costs are the figure.",
    ]
    rows = []
    for name in (
        "targeted_md_flat_persona.json",
        "targeted_md_flat.json",
        "targeted_mem0.json",
        "targeted_rag_bm25.json",
    ):
        data = load(name)
        if data is None:
            continue
        out.append(provenance(data, name))
        for r in data["rows"]:
            rows.append(
                [
                    f"{r['system']}, {data['dataset']}",
                    r["mode"],
                    ", ".join(r.get("blamed", [])) or "-",
                    ", ".join(r["optimized"]),
                    f"{r['test_before']:.2f} -> {r['test_after']:.2f}",
                    f"{r['llm_calls']:.0f}",
                    f"{r.get('model_calls', 0):.0f}",
                    f"{r.get('tokens', 0):.0f}",
                    f"{r.get('seconds', 0):.0f}",
                ]
            )
    out.append(
        table(
            [
                "system, dataset",
                "mode",
                "blamed",
                "optimized",
                "test before -> after",
                "LLM calls",
                "model calls",
                "tokens",
                "s",
            ],
            rows,
        )
    )
    return out


def reuse() -> list[str]:
    data = load("reuse_md_flat.json")
    if data is None:
        return []
    rows = [
        [arm, r["llm_calls"], r["ingest_calls"], r["stores_reused"], f"{r['seconds']:.1f}"]
        for arm, r in data["results"].items()
    ]
    return [
        "## Ingestion reuse",
        "What does a candidate that changes only the answer site cost, against a full "
        "re-ingest? Stores are kept by the ingest sites' prompts, so such a candidate reuses "
        "them.",
        provenance(data, "reuse_md_flat.json"),
        table(["candidate", "LLM calls", "ingest calls", "stores reused", "s"], rows),
        f"Answer-only / full re-ingest LLM calls: **{data['ratio']:.1%}** "
        f"({data['sessions']} sessions, "
        f"{data['questions']} questions).",
    ]


RACING_RUNS = (
    ("racing_demo.json", "`make demo`'s run"),
    ("racing_demo_budget10.json", "`make demo`'s run at `--budget 10`"),
    ("racing_mem0.json", "mem0, the Qwen2.5-Coder 0.5B answering and the 1.5B writing"),
)


def racing() -> list[str]:
    from experiments.bench.racing import figures

    found = [(name, what, data) for name, what, data in ((n, w, load(n)) for n, w in RACING_RUNS)]
    runs = [(name, what, data) for name, what, data in found if data is not None]
    if not runs:
        return []
    out = [
        "## Racing on dev",
        "Does racing each candidate against the best (Optuna's WilcoxonPruner, the default) "
        "cut what a losing candidate costs to at most a third of a full dev evaluation, without "
        "choosing a best that is measurably worse on the held-out questions? The same seeded "
        "run twice, with and without `--no-race`, each in a fresh state directory: "
        "`python -m experiments.bench.racing`. Wall times come from a machine that ran other "
        "jobs beside them; the questions and calls do not depend on it. An arm whose wall time "
        "names another arm's LM cache started from a copy of it (`--cache-from`): the calls "
        "both arms make alike were replayed, so its seconds do not compare, while its questions "
        "and calls (cache hits counted) do.",
    ]
    for name, what, data in runs:
        out += [f"### {what}", provenance(data, name), *figures(data)]
    return out


def planted() -> list[str]:
    out = [
        "## Attribution on planted faults",
        "How often does attribution name the planted site and error type? Each fault of the "
        "catalogue (`optloop attribute --list-faults`) is planted in turn; a question that "
        "passes clean and fails under the fault is a failure the fault caused. Rates over fewer "
        "than 10 cases are marked `*` (too small to support a figure). Method: "
        "[attribution.md](attribution.md#planted-faults-is-attribution-right).",
    ]
    for name in (
        "planted.json",
        "tiered_planted.json",
        "tiered_planted_before.json",
        "gated_planted.json",
    ):
        data = load(name)
        if data is None:
            continue
        rows = [
            [
                "induced failures only",
                interval(data["induced"]["site"]),
                interval(data["induced"]["type"]),
            ],
            [
                "every failure a fault caused",
                interval(data["all_failures"]["site"]),
                interval(data["all_failures"]["type"]),
            ],
        ]
        for group, g in sorted(data.get("by_added", {}).items()):
            rows += [
                [
                    f"faults of group `{group}`, induced only",
                    interval(g["induced"]["site"]),
                    interval(g["induced"]["type"]),
                ],
                [
                    f"faults of group `{group}`, every failure caused",
                    interval(g["all"]["site"]),
                    interval(g["all"]["type"]),
                ],
            ]
        dens = table(
            [
                "system",
                "dataset",
                "questions",
                "passed clean",
                "sound clean passes",
                "failures caused",
            ],
            [
                [
                    d["system"],
                    d["dataset"],
                    d["questions"],
                    d["passed_clean"],
                    d["sound_clean"],
                    d["failures_caused"],
                ]
                for d in data["denominators"]
            ],
        )
        before = (
            " (before the change to its extraction; docs/tiered.md)"
            if name.endswith("_before.json")
            else ""
        )
        out += [
            f"### {', '.join(sorted({d['system'] for d in data['denominators']}))}{before}",
            provenance(data, name),
            table(["failures scored", "site accuracy [95% CI]", "type accuracy [95% CI]"], rows),
            dens,
            "Every table (per fault, per type, the failures set aside): "
            f"[`{name.replace('.json', '.md')}`]"
            f"(../experiments/results/{name.replace('.json', '.md')}).",
        ]
    return out


def baselines() -> list[str]:
    out = [
        "## Baselines per task type",
        "How does each system score on each task type on the embedded model (in the spirit of "
        "MEME's Table 2)? Cells: accuracy (questions). Seconds per episode were taken while "
        "other jobs shared the cores: upper bounds.",
    ]
    for name in ("baselines.json", "baselines_tiered_gated.json", "tiered_suite.json"):
        data = load(name)
        if data is None:
            continue
        systems = data["systems"]
        rows = [
            [
                task,
                *(
                    f"{cells[s]['accuracy']:.2f} ({cells[s]['n']})" if s in cells else "-"
                    for s in systems
                ),
            ]
            for task, cells in data["accuracy"].items()
        ]
        cost = [
            [
                s,
                data["cost"][s]["questions"],
                f"{data['cost'][s]['accuracy']:.3f}",
                f"{data['cost'][s]['seconds_per_episode']:.1f}",
                f"{data['cost'][s]['calls_per_episode']:.1f}",
            ]
            for s in systems
        ]
        out += [
            provenance(data, name),
            table(["task", *systems], rows),
            table(["system", "questions", "accuracy", "s / episode", "LLM calls / episode"], cost),
        ]
    if (RESULTS / "tiered_suite_probes.md").exists():
        out.append(
            "`tiered` on its own suite, per probe and per memory tier: "
            "[`tiered_suite_probes.md`](../experiments/results/tiered_suite_probes.md) "
            "([tiered.md](tiered.md))."
        )
    return out


def gated() -> list[str]:
    data = load("gated.json")
    if data is None:
        return []
    metrics = ("recall", "contamination", "leakage", "clean_context")
    rows = [
        [arm, *(f"{v[m]['estimate']:.3f} {ci(v[m]['low'], v[m]['high'], '.3f')}" for m in metrics)]
        for arm, v in ((a, d["all"]) for a, d in data["summary"]["arms"].items())
    ]
    return [
        "## `gated` vs `rag_embedding`: what reaches the answer prompt",
        "Does the admission gate keep stale, dead-branch and other-workspace memories out of "
        "the context, and what recall does it cost? Same embedder and `top_k`, the gate's "
        "deterministic floors only (no LLM). The generator's state is exact, so this checks the "
        "mechanism, not a product.",
        provenance(data, "gated.json"),
        table(["arm", *metrics], rows),
        "Per category: [`gated.md`](../experiments/results/gated.md).",
    ]


def throughput() -> list[str]:
    out = [
        "## Throughput against an endpoint",
        "What does `--concurrency N` buy, and what do HTTP 429s cost? Answers recorded once on "
        "the embedded model are replayed by a loopback endpoint with a fixed latency (and 10% "
        "HTTP 429 with Retry-After 1 s), at N = 1 to 16. Targets: speed-up at N=8 at least 0.8 "
        "of the ideal; 429s cost at most 1.3x. Accuracy and every outcome must be identical at "
        "every N.",
    ]

    def summary(data: Json) -> str:
        return table(
            [
                "system",
                "speed-up at N=8 (ideal)",
                "share of ideal",
                "429 time ratio at N=1 / 2 / 4 / 8 / 16",
                "questions lost",
            ],
            [
                [
                    s["system"],
                    f"{s['speedup']:.2f}x ({s['ideal_speedup']:.2f}x)",
                    f"{s['share_of_ideal']:.2f}",
                    " / ".join(f"{v:.2f}" for v in s["cost_429"].values()),
                    s["lost"],
                ]
                for s in data["summary"]
            ],
        )

    for name, title in (
        ("throughput.json", "300 ms a call"),
        ("throughput_repeat3.json", "300 ms, median of 3 runs"),
        ("throughput_1s.json", "1 s a call"),
    ):
        data = load(name)
        if data is not None:
            out += [f"### {title}", provenance(data, name), summary(data)]
    first = load("throughput_first_run.json")
    if first is not None:
        rows = [
            [
                r["system"],
                r["n"],
                r["rate_429"],
                r["seconds"],
                f"{r['efficiency']:.2f}",
                r["calls"],
            ]
            for r in first["rows"]
            if r["n"] in (1, 8)
        ]
        out += [
            "### Before the change (the 9-episode suite, before mem0's stores stopped building "
            "OpenAI clients and before the embedding cache)",
            provenance(first, "throughput_first_run.json"),
            table(["system", "N", "429 rate", "s", "share of ideal", "calls"], rows),
        ]
    out.append(
        "Every row: [`throughput.md`](../experiments/results/throughput.md). The 429 ratio at "
        "300 ms has a floor by arithmetic (`experiments.bench.throughput.floor_429`): 1 + 0.111 "
        "x 1.05 / 0.3 = 1.39x for calls that must go one after another."
    )
    return out


def two_runs() -> list[str]:
    data = load("two_runs.json")
    if data is None:
        return []
    rows = []
    for label, key in (
        ("before the change (each run its own lock, `--separate-locks`)", "before"),
        ("after the change (machine-wide llama.cpp slots)", "after"),
    ):
        r = data[key]
        alone = next(x for x in r["runs"] if x["name"] == "alone")
        worst = max(x["wall_s"] for x in r["runs"] if x["name"] != "alone")
        rows.append(
            [
                label,
                f"{alone['wall_s']:.1f} s",
                f"{worst:.1f} s",
                f"{r['ratio_worst']:.2f}",
                f"{r['target']}: {'met' if r['met'] else 'missed'}",
            ]
        )
    return [
        "## Two runs on one machine",
        "Do two runs on one machine take turns at the embedded model instead of contending for "
        "its cores? `optloop run --system md_flat --budget 2` alone, then two at once, 2 s "
        "apart.",
        provenance(data, "two_runs.json"),
        table(["", "alone", "two at once, worst", "x alone", "target"], rows),
    ]


def structure() -> list[str]:
    if not (RESULTS / "structure.md").exists():
        return []
    return [
        "## The code's structure",
        "How long are the longest modules and classes, which imports form cycles, how many "
        "lines pass 99 columns? `python -m experiments.structure` reads a checkout's syntax "
        "trees; the figures before and after the split of the largest modules, with their "
        "command and commits: [`structure.md`](../experiments/results/structure.md).",
    ]


_WRITTEN = ("write", "written", "proposer rewrite", " par ")


def _at_site(origin: str, site: str) -> bool:
    """Whether a trial's origin (``edit round 2: md_flat.curate write 0``) edited ``site``."""
    return f": {site} " in origin


def _is_written(origin: str) -> bool:
    """Whether a trial's origin names text a writer produced (a written instruction or sentence,
    a paraphrase, a proposer's rewrite) rather than a deletion, a swap or a default."""
    return any(w in origin for w in _WRITTEN)


def _delta_cell(delta: Json) -> str:
    from optloop.loop.trivial_control import verdict
    from optloop.stats import Interval

    said = verdict(Interval.model_validate(delta))
    return f"{delta['estimate']:+.3f} {ci(delta['low'], delta['high'], '+.3f')}, {said}"


def written_against_control() -> list[str]:
    """Every loop run whose results file carries the trivial-instruction control (written by
    ``experiments.bench.run_report``): the system's own prompts, the control and the loop's best
    on the held-out questions, and whether the best is a text the writer wrote."""
    runs: list[tuple[str, Json]] = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and {"control", "trials", "delta"} <= data.keys():
            if data["control"].get("delta_best_minus_control"):
                runs.append((path.name, data))
    if not runs:
        return []
    runs.sort(key=lambda run: (run[1]["provenance"]["date"], run[0]))
    rows = []
    wins = []
    for name, data in runs:
        command = data["provenance"]["command"]
        best = next((t for t in data["trials"] if t["trial"] == data.get("best_trial")), None)
        origin = best["origin"] if best else "the system's own prompts (nothing beat them)"
        written = best is not None and _is_written(origin)
        over_control = data["control"]["delta_best_minus_control"]
        if written and over_control["low"] > 0 and data["delta"]["low"] > 0:
            wins.append(name)
        system = flag_of(command, "--system") or "?"
        if "--query-rewrite" in shlex.split(command):
            system += " (query rewrite)"
        if sites := flag_of(command, "--sites"):
            system += f" (--sites {sites})"
        rows.append(
            [
                f"[`{name}`](../experiments/results/{name.removesuffix('.json')}.md)",
                system,
                f"`{flag_of(command, '--dataset') or 'the default'}`",
                f"{data['provenance']['model']}; "
                f"{flag_of(command, '--proposer-lm') or 'the task model'} writes",
                f"{flag_of(command, '--optimizer') or 'edit'}, "
                f"budget {flag_of(command, '--budget')}",
                f"{data['provenance']['date']}, {data['provenance']['commit']}",
                data["test_before"],
                data["control"]["test"],
                data["test_after"],
                _delta_cell(data["delta"]),
                _delta_cell(over_control),
                origin,
                "yes" if written else "no",
            ]
        )
    verdict = (
        f"{len(wins)} of {len(runs)} runs end with a written text that beats both the system's "
        f"own prompts and the control on held-out questions, each CI above 0: "
        + ", ".join(
            f"`{w}` ({data['provenance']['date']}, {data['provenance']['commit']})"
            for w, data in runs
            if w in wins
        )
        + "."
        if wins
        else f"None of the {len(runs)} runs ends with a written text that beats both the system's "
        "own prompts and the control on held-out questions."
    )
    return [
        "## Written prompts against the trivial instruction: every loop run with a control",
        "Does the prompt the loop writes earn more than a trivial instruction would? For every "
        "loop run whose report carries the trivial-instruction control (the same evaluation with "
        "DSPy's default instruction at each blamed site), the held-out accuracy under the "
        "system's own prompts, under the control and under the loop's best, the two differences "
        "(paired bootstrap, 95% CI, seed 0) and how the best was made. `python -m "
        "experiments.bench.run_report` on each finished run; each file names its command, date, "
        "commit and machine. mem0's runs dated 2026-11-27 ran before commit f7c97b4, when "
        "optloop's JSON grammar kept the model's output on one line: under it mem0's own "
        "extraction prompt stored nothing on the 0.5B, and the grammar since lets it store the "
        "facts ([`headroom.md`](../experiments/results/headroom.md)). " + verdict,
        table(
            [
                "run",
                "system",
                "dataset",
                "models",
                "optimizer",
                "date, commit",
                "own prompts",
                "control",
                "loop's best",
                "best - own",
                "best - control",
                "the best",
                "written",
            ],
            rows,
        ),
    ]


def linked() -> list[str]:
    """Benchmarks whose tables are read in their own files (each with its provenance header)."""
    files = [
        (
            "Trials in batches against an endpoint",
            "Does evaluating a round's candidates at once (`--batch K`) cut the wall time at "
            "`--concurrency 16` and 1 s a call, with the same results? `python -m "
            "experiments.bench.batch` (replay server)",
            ["batch.md", "batch.json", "batch_answer_site.md", "batch_answer_site.json"],
        ),
        (
            "The embedded model's time, by part",
            "Where does one graphiti evaluation's time go on the embedded model (prompt "
            "evaluation, generation, sampling under the grammar, embeddings, Kuzu), and what do "
            "a llama.cpp context per prompt site and grammar-first sampling save, with the same "
            "answers? `python -m experiments.bench.profile`",
            [
                "profile_graphiti.md",
                "profile_graphiti.json",
                "profile_graphiti_prefixes.md",
                "profile_graphiti_prefixes.json",
            ],
        ),
        (
            "mem0's extraction on LoCoMo, call by call",
            "On two LoCoMo sessions with the Qwen2.5-Coder 0.5B, what does each of mem0's "
            "extraction calls cost (prompt tokens computed and reused from the cached prefix, "
            "tokens generated, cut at a limit or not), before and after the site asks with "
            "mem0's own max_tokens? `python -m experiments.bench.profile --system mem0 --lm "
            "local:qwen2.5-coder-0.5b`",
            [
                "profile_mem0_locomo.md",
                "profile_mem0_locomo.json",
                "profile_mem0_locomo_before.json",
            ],
        ),
        (
            "The edit optimizer's order: evidence first against the train screen alone",
            "On the champion's repair cases (targeted arm, seeds 0-2), does trying the edits "
            "the failures point at first remove the sabotage more often, or find the best "
            "edit sooner, than the train screen's order? `python -m experiments.bench.repair "
            "--champion --optimizers edit --arms targeted --edit-order screen`, against the "
            "targeted rows of `repair_champion.md`",
            ["repair_champion_screen_order.md", "repair_champion_screen_order.json"],
        ),
        (
            "The mission command on the embedded model",
            "What does `python -m optloop.run --system graphiti --budget 50` do as typed on a "
            "checkout with an empty state directory: the dataset, the split, the ETA it prints, "
            "how long it takes and the held-out delta? `python -m experiments.bench.run_report` "
            "on the finished run",
            ["mission_graphiti.md", "mission_graphiti.json"],
        ),
        (
            "The mission command's cost on an endpoint",
            "What does `--system graphiti --budget 50` on LoCoMo with gpt-4o-mini take at "
            "`--concurrency 16`, one trial at a time and in batches? `python -m "
            "experiments.bench.estimate`",
            [
                "estimate_locomo_batch1.md",
                "estimate_locomo_batch1.json",
                "estimate_locomo_batch8.md",
                "estimate_locomo_batch8.json",
            ],
        ),
        (
            "The loop on tiered and gated",
            "Does the loop improve tiered (the edit optimizer and SIMBA) and gated (the edit "
            "optimizer, on its agentic dataset) on the embedded model (held-out delta and its "
            "CI)? `python -m experiments.bench.loops`, one `optloop.run` per optimizer; the "
            "commands are in each file",
            ["tiered_loop.md", "tiered_loop.json", "gated_loop.md", "gated_loop.json"],
        ),
        (
            "The default datasets",
            "Where does each system's embedded baseline land on the dataset `optloop run` uses "
            "without `--dataset`? `python -m experiments.bench.defaults`",
            ["defaults.md", "defaults.json"],
        ),
        (
            "Headroom with the Qwen models: own prompts against a trivial instruction",
            "Per system, model and dataset: the dev accuracy under the system's own prompts, "
            "under the trivial-instruction control (DSPy's default instruction for the blamed "
            "site) and under a hand-written one, with the seconds an evaluation takes. "
            "`python -m experiments.bench.headroom`",
            ["headroom.md", "headroom.json"],
        ),
        (
            "The loop writing mem0's extraction prompt (Qwen2.5-Coder 0.5B answers, 1.5B writes)",
            "On the default dataset and on `synthetic:meme` (where mem0's own prompts and the "
            "control both leave headroom), does the loop's written prompt beat mem0's own prompt "
            "and the trivial-instruction control on held-out questions, and what did the proposal "
            "gate refuse? `python -m experiments.bench.run_report` on the finished runs (edit "
            "optimizer with written edits; GEPA)",
            [
                "mem0_meme.md",
                "mem0_meme.json",
                "mem0_qwen_edit.md",
                "mem0_qwen_edit.json",
                "mem0_qwen_gepa.md",
                "mem0_qwen_gepa.json",
                "mem0_qwen_gepa_fallback.md",
                "mem0_qwen_gepa_fallback.json",
                "mem0_qwen_gepa_gate.md",
                "mem0_qwen_gepa_gate.json",
                "gate_judgement.md",
            ],
        ),
        (
            "rag_bm25's query rewrite on the Qwen 0.5B, before and after the rewrite's blame",
            "rag_bm25 with its query-rewrite site, the Qwen2.5-Coder 0.5B answering and the 1.5B "
            "writing, edit optimizer, budget 6, the same command at two commits. At 23f396f the "
            "attribution blamed the rewrite only when it kept under a third of the question's "
            'words, so a rewrite such as "boat\'s name" that lost the evidence was blamed on '
            "top_k; the loop edited `answer` and gained nothing. At 548f111 a miss is the "
            "rewrite's when the same search for the question as asked returns the evidence: "
            "`retrieve.query` is blamed and the loop's best (the signature's default "
            "instruction there) gains on held-out questions, as much as the trivial-instruction "
            "control. The second run reused the first's LM cache (its wall time is not a cost). "
            "`python -m experiments.bench.run_report` on each run",
            [
                "rag_bm25_query_qwen_before.md",
                "rag_bm25_query_qwen_before.json",
                "rag_bm25_query_qwen.md",
                "rag_bm25_query_qwen.json",
            ],
        ),
        (
            "A vanilla mem0 app with the exported prompt",
            "Does the extraction prompt the loop promoted, exported into a plain mem0 app on "
            "the same model behind llama.cpp's server, store the facts mem0's own prompt lost "
            "(memories stored, recall@5, same sessions)? "
            "`python -m experiments.bench.mem0_vanilla "
            "--extract-prompt`",
            ["mem0_qwen_exported.md", "mem0_qwen_exported.json", "mem0_qwen_vanilla.json"],
        ),
        (
            "LoCoMo at this machine's size: what one evaluation costs",
            "Seconds to ingest one LoCoMo conversation into mem0 and into graphiti with the "
            "Qwen2.5-Coder 0.5B model, seconds and calls per question, calls per evaluation. "
            "`python -m experiments.bench.systems --systems mem0,graphiti --dataset "
            "'locomo:<path>?sessions=N&questions=N'`",
            [
                "locomo_cost.md",
                "locomo_cost.json",
                "locomo_cost_graphiti.md",
                "locomo_cost_graphiti.json",
            ],
        ),
        (
            "The loop on LoCoMo, beside MemTrace's +7.62%",
            "The loop on LoCoMo conversations with local models (mem0; graphiti at --budget 50): "
            "held-out before and after, the trivial-instruction control, per category, the "
            "prompts changed, the baseline's failures by site and error type; and MemTrace's "
            "setup and figure beside ours, with what differs. `python -m "
            "experiments.bench.run_report` on the runs",
            [
                "locomo.md",
                "locomo_heldout.md",
                "locomo_heldout.json",
                "headroom_locomo_test.md",
                "headroom_locomo_test.json",
                "locomo_heldout_gepa_answer.md",
                "locomo_heldout_gepa_answer.json",
                "locomo_heldout_edit_answer.md",
                "locomo_heldout_edit_answer.json",
                "locomo_heldout_edit_answer_gated.md",
                "locomo_heldout_edit_answer_gated.json",
                "locomo_heldout_wider.md",
                "locomo_heldout_wider.json",
                "headroom_locomo_answer_test.md",
                "headroom_locomo_answer_test.json",
                "locomo_mem0.md",
                "locomo_mem0.json",
                "locomo_mem0_grammar.md",
                "locomo_mem0_grammar.json",
                "locomo_graphiti.md",
                "locomo_graphiti.json",
            ],
        ),
        (
            "llama.cpp's own server",
            "Does optloop run against llama.cpp's OpenAI-compatible server by flags alone "
            "(schema mode, concurrency, request errors, failed calls, the Mem0 app)? The "
            "integration tests `tests/optloop/test_llama_server.py` and "
            "`tests/systems/test_library_apps.py`",
            ["servers.md", "demo_llama_server.json", "mem0_vanilla.json"],
        ),
    ]
    out: list[str] = []
    for title, question, names in files:
        present = [n for n in names if (RESULTS / n).exists()]
        if present:
            links = ", ".join(f"[`{n}`](../experiments/results/{n})" for n in present)
            out += [f"## {title}", f"{question}: {links}."]
    return out


def checked_by_tests() -> list[str]:
    return [
        "## Benchmarks whose figures are checked by tests",
        "\n".join(
            [
                "- **Crash consistency** (`python -m experiments.bench.crash`; slow test "
                "`tests/optloop/loop/test_crash_e2e.py`): the real command killed with "
                "SIGKILL at each checkpoint "
                "boundary, resumed by the same command, must end exactly as an "
                "uninterrupted run (candidates, "
                "accuracies, CIs, the registered prompt and its alias), with no RUNNING run "
                "and no trial run twice.",
                "- **Endpoint chaos** (`python -m experiments.bench.chaos`): the loop "
                "against an endpoint that "
                "misbehaves on a fixed schedule; faults injected, cured by a retry, surfaced.",
                "- **Estimate** (`python -m experiments.bench.estimate`; "
                "`tests/experiments/test_bench_estimate.py`): "
                "what `--system graphiti --budget 50` on LoCoMo costs with gpt-4o-mini, "
                "projected by `--estimate`'s "
                "model from a recording.",
                "- **MEME's published traces** "
                "(`python -m experiments.bench.meme_traces --path <meme-eval checkout>`): "
                "agreement of optloop's verdict with the authors' hand-judged failure "
                "stage; design and figures in "
                "[meme-traces.md](meme-traces.md).",
                "- **The LM** (`make bench`): calls/s, tokens/s, the cache speed-up and "
                "embedding throughput on this "
                "machine.",
            ]
        ),
    ]


SECTIONS: tuple[Callable[[], list[str]], ...] = (
    demo,
    repair,
    targeted,
    reuse,
    racing,
    planted,
    baselines,
    gated,
    throughput,
    two_runs,
    structure,
    written_against_control,
    linked,
    checked_by_tests,
)


def render() -> str:
    parts = [
        "# Benchmarks",
        "Each benchmark: the question it answers, its command, and its latest figures, read "
        "from `experiments/results/*.json` (each file's header names its command, date, commit, "
        "model and machine). This page is generated: `python -m experiments.report` rewrites it "
        "after a benchmark is re-run. Every accuracy comes with its n and a 95% bootstrap CI; a "
        "delta whose CI crosses 0 is no measurable change. Figures of SmolLM2-135M say what a "
        "135M model does, not what a strong model would.",
    ]
    for section in SECTIONS:
        parts += section()
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when docs/benchmarks.md is not up to date"
    )
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(
                "docs/benchmarks.md is out of date: run python -m experiments.report",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
