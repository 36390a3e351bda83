"""System x model x dataset: dev accuracy under the system's own prompts and under a trivial
instruction, the table that picks the defaults.

    flock /tmp/optloop-lm.lock python -m experiments.bench.headroom --systems mem0 \
        --lms local:qwen2.5-coder-0.5b --datasets "synthetic:recall?seed=0&episodes=40" \
        [--variants own,trivial,given] [--sites mem0.extract] [--home DIR] \
        [--given TEXT | --given-file experiments/cases/FILE.md] \
        [--split dev|test|all] [--shares 0.5,0.25,0.25] \
        [--json experiments/results/headroom.json] [--markdown experiments/results/headroom.md]

For every combination, the dev split ``optloop.run`` would use (``--shares``, default
0.5/0.25/0.25 by episode, seed 0; ``--split test``: its held-out split) is evaluated through the
library's evaluator (the same pipeline a run's baseline goes through):

- ``own``: the system's own prompts (what ``optloop.run`` starts from);
- ``trivial``: the control every loop report carries: each of ``--sites`` (default: the system's
  ingest prompt sites, where its memories are written) given DSPy's default instruction for its
  signature ("Given the fields ..., produce the fields ...");
- ``given``: each of ``--sites`` given ``--given``, or the instruction a case file holds.

A row gives the accuracy with its 95% CI (bootstrap over the dev questions, seeded), n, whether it
lies in the headroom band (0.2-0.8: a better prompt can show, a worse one too), the seconds the
evaluation took, the share of LM calls that failed, and the sites the failures were blamed on. A
row already in ``--json`` is not run again (the file is rewritten after every row), so a killed
run resumes. Each combination gets its own LM cache under ``--home``; ``--lm-cache FILE`` starts
a combination's cache, when it has none yet, as a copy of FILE (a run's
``.optloop/lm_cache.sqlite``), so the calls that run already made (the same prompts on the same
questions) are replayed, not computed again.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(offline_defaults())  # first: litellm, mem0 and Hugging Face read them

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from experiments.markdown import provenance_lines, table
from experiments.provenance import commit, stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.datasets import load_dataset
from optloop.datasets.split import split_episodes
from optloop.embed import get_embedder
from optloop.lm import LMSettings, OptloopLM
from optloop.lm.models import model_named
from optloop.loop.candidate import SiteState, trivial_instruction
from optloop.loop.evaluate import Evaluator
from optloop.paths import write_atomic
from optloop.stats import bootstrap_mean, paired_bootstrap_delta
from systems import get_system

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
HEADROOM = (0.2, 0.8)
DEFAULT_SHARES = (0.5, 0.25, 0.25)


def given_text(path: Path) -> str:
    """The instruction a case file holds: the text between its first two lines that are exactly
    ``---`` (``experiments/cases/``)."""
    lines = path.read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if line.strip() == "---"]
    if len(marks) < 2:
        raise ValueError(f"{path}: no instruction between two lines of '---'")
    return "\n".join(lines[marks[0] + 1 : marks[1]]).strip()


def shares_of(text: str) -> tuple[float, float, float]:
    """``--shares TRAIN,DEV,TEST`` as optloop.run's ``--split`` takes it."""
    try:
        train, dev, test = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--shares {text!r}: three numbers, e.g. 0.2,0.2,0.6") from None
    return train, dev, test


class Row(BaseModel):
    system: str
    model: str
    dataset: str
    variant: str
    sites: list[str]
    n: int
    accuracy: float
    low: float
    high: float
    headroom: bool
    seconds: float
    calls: int
    failed_calls: int
    blamed: dict[str, int]
    given: str = ""
    commit: str = ""  # the code the row was measured with (the process's commit at its start)
    split: str = "dev"
    scores: list[float] = []  # per question, in the split's order (paired across variants)

    def key(self) -> tuple[str, str, str, str]:
        return (self.system, self.model, f"{self.dataset} [{self.split}]", self.variant)


def model_name(spec: str) -> str:
    """The model's file name without ``.gguf``, whether ``spec`` names it by path or by its short
    name (``local:qwen2.5-coder-0.5b``)."""
    settings = LMSettings.from_spec(spec)
    if not settings.model:
        return "smollm2-135m (bundled)"
    found = model_named(settings.model)
    return Path(found.file if found else settings.model).stem


def seed_cache(source: Path, target: Path) -> None:
    """``target`` as a copy of the LM cache ``source`` (SQLite's online backup, so a cache another
    process holds open copies whole), unless ``target`` already exists."""
    if target.exists():
        return
    if not source.is_file():
        raise ValueError(f"--lm-cache {source}: no such LM cache file")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(partial)) as dst:
        src.backup(dst)
    partial.replace(target)


def measure(
    system: str,
    spec: str,
    uri: str,
    variant: str,
    sites: Sequence[str],
    home: Path,
    given: str = "",
    split: str = "dev",
    shares: tuple[float, float, float] = DEFAULT_SHARES,
    lm_cache: Path | None = None,
) -> Row:
    cls = get_system(system)
    work = home / f"{system}-{model_name(spec)}"
    if lm_cache is not None:
        seed_cache(lm_cache, work / "lm_cache.sqlite")
    lm = OptloopLM(
        LMSettings.from_spec(spec, cache_path=work / "lm_cache.sqlite", **dict(cls.local_decoding))
    )
    evaluator = Evaluator(
        system, lm, work / variant, embedder=get_embedder("local"), dataset_uri=uri
    )
    try:
        dataset = load_dataset(uri)
        parts = split_episodes(dataset, shares, seed=0)
        dev = {"dev": parts[1], "test": parts[2]}.get(split, dataset)
        evaluator.register(dev)
        candidate = evaluator.baseline()
        chosen = list(sites) or [n for n, s in evaluator.sites.items() if s.stage == "ingest"]
        if variant != "own":
            states = dict(candidate.sites)
            for site in chosen:
                signature = evaluator.sites[site].module.signature
                text = given if variant == "given" else trivial_instruction(signature)
                states[site] = SiteState(instructions=text, demos=states[site].demos)
            candidate = candidate.model_copy(update={"sites": states})
        mark = lm.accounting.mark()
        started = time.perf_counter()
        evaluation = evaluator.evaluate(candidate, dev, split="test" if split == "test" else "dev")
        seconds = time.perf_counter() - started
        calls = lm.accounting.since(mark)
    finally:
        evaluator.close()
    interval = bootstrap_mean([float(o.passed) for o in evaluation.outcomes], seed=0)
    blamed = Counter(str(a.target) for a in evaluation.attributions())
    return Row(
        system=system,
        model=model_name(spec),
        dataset=uri,
        variant=variant,
        sites=chosen,
        n=interval.n,
        accuracy=interval.estimate,
        low=interval.low,
        high=interval.high,
        headroom=HEADROOM[0] <= interval.estimate <= HEADROOM[1],
        seconds=round(seconds, 1),
        calls=len(calls),
        failed_calls=sum(1 for c in calls if c.error),
        blamed=dict(blamed.most_common()),
        given=given if variant == "given" else "",
        split=split,
        scores=[float(o.passed) for o in evaluation.outcomes],
    )


def to_markdown(rows: Sequence[Row], results: dict[str, Any]) -> str:
    """The table of ``rows`` under ``results``' provenance header."""
    body = table(
        (
            "system",
            "model",
            "dataset",
            "prompt",
            "accuracy [95% CI]",
            "n",
            "0.2-0.8",
            "s / evaluation",
            "LM calls (failed)",
            "failures blamed on",
            "commit",
        ),
        [
            (
                r.system,
                r.model,
                f"`{r.dataset}`" + ("" if r.split == "dev" else f" ({r.split})"),
                "own" if r.variant == "own" else f"{r.variant} ({', '.join(r.sites)})",
                f"{r.accuracy:.3f} [{r.low:.3f}, {r.high:.3f}]",
                r.n,
                "yes" if r.headroom else "no",
                f"{r.seconds:.0f}",
                f"{r.calls} ({r.failed_calls})",
                ", ".join(f"{k} {v}" for k, v in r.blamed.items()) or "-",
                r.commit or "-",
            )
            for r in rows
        ],
    )
    pairs = []
    for a in rows:
        for b in rows:
            same = a.key()[:3] == b.key()[:3] and len(a.scores) == len(b.scores) > 0
            order = ("own", "trivial", "given")
            if same and order.index(a.variant) > order.index(b.variant):
                d = paired_bootstrap_delta(b.scores, a.scores, seed=0)
                verdict = "no measurable change" if d.low <= 0 <= d.high else "measurable"
                pairs.append(
                    (
                        a.system,
                        a.model,
                        f"`{a.dataset}`" + ("" if a.split == "dev" else f" ({a.split})"),
                        f"{a.variant} - {b.variant}",
                        f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}] n={d.n} ({verdict})",
                    )
                )
    if pairs:
        body += "\n\nPaired differences on the same questions (bootstrap, seed 0):\n\n" + table(
            ("system", "model", "dataset", "difference", "[95% CI]"), pairs
        )
    return (
        "# Headroom: system x model x dataset, own prompts against a trivial instruction\n\n"
        + provenance_lines(results["provenance"])
        + "The split of `optloop.run` a row names after its dataset (dev, with shares "
        "0.5/0.25/0.25 by episode, seed 0, when it names none); accuracy with a 95% bootstrap CI "
        "over that split's questions (seeded). *trivial*: the named sites given DSPy's "
        "default instruction for their signature, the control every loop report carries; *given*: "
        "a hand-written instruction (the row's JSON has it). "
        "Headroom: 0.2 <= accuracy <= 0.8. Each row's commit is the code it was measured with; "
        "the header's command is the last one that added a row. Rows of commits before f7c97b4 "
        "decoded every JSON answer under llama-cpp-python's schema grammar, which allows no "
        "newline between JSON tokens (`optloop/lm/grammar.py`): there mem0's own extraction "
        "prompt stored nothing on the 0.5B.\n\n" + body + "\n"
    )


def build_parser() -> CommandParser:
    parser = CommandParser(
        "python -m experiments.bench.headroom",
        "Dev accuracy per system, model and dataset, under the system's own prompts and a "
        "trivial instruction.",
    )
    parser.add_argument("--systems", required=True, help="comma-separated system names")
    parser.add_argument("--lms", required=True, help="comma-separated LM specs")
    parser.add_argument("--datasets", required=True, help="dataset URIs, separated by ' ; '")
    parser.add_argument("--variants", default="own,trivial")
    parser.add_argument("--sites", default="", help="sites the trivial variant changes")
    parser.add_argument(
        "--given", default="", help="the instruction of the 'given' variant (a hand-written one)"
    )
    parser.add_argument("--home", type=Path, default=Path("/tmp/optloop-headroom"))
    parser.add_argument("--json", type=Path, default=RESULTS / "headroom.json")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "headroom.md")
    parser.add_argument(
        "--report-only", action="store_true", help="write the markdown again from --json"
    )
    parser.add_argument(
        "--given-file",
        type=Path,
        help="read the 'given' instruction from a case file (between two lines of '---', "
        "experiments/cases/)",
    )
    parser.add_argument(
        "--split",
        choices=("dev", "test", "all"),
        default="dev",
        help="dev or test: that split of optloop.run with --shares (seed 0); all: every question "
        "of the dataset (a held-out set for prompts a loop wrote on another seed)",
    )
    parser.add_argument(
        "--lm-cache",
        type=Path,
        help="start each combination's LM cache (when it has none) as a copy of this one, e.g. a "
        "run's .optloop/lm_cache.sqlite: calls that run made are replayed",
    )
    parser.add_argument(
        "--shares",
        default="0.5,0.25,0.25",
        help="optloop.run's --split TRAIN,DEV,TEST the dev and test splits follow (default "
        "0.5,0.25,0.25)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    code = commit()
    old = json.loads(args.json.read_text()) if args.json.exists() else {}
    rows = [Row.model_validate(r) for r in old.get("rows", [])]
    if args.report_only:
        write_atomic(args.markdown, to_markdown(rows, old))
        return 0
    done = {r.key() for r in rows}
    shares = shares_of(args.shares)
    split = (
        args.split
        if shares == DEFAULT_SHARES or args.split == "all"
        else (f"{args.split} {args.shares}")
    )
    given = given_text(args.given_file) if args.given_file else args.given
    sites = [s for s in args.sites.split(",") if s]
    specs = [s for s in args.lms.split(",") if s]
    models = ", ".join(sorted({model_name(s) for s in specs} | {r.model for r in rows}))
    for system in args.systems.split(","):
        for spec in specs:
            for uri in [u.strip() for u in args.datasets.split(" ; ") if u.strip()]:
                for variant in args.variants.split(","):
                    if (system, model_name(spec), f"{uri} [{split}]", variant) in done:
                        continue
                    print(f"{system} {model_name(spec)} {uri} {variant} ...", flush=True)
                    row = measure(
                        system,
                        spec,
                        uri,
                        variant,
                        sites,
                        args.home,
                        given,
                        args.split,
                        shares,
                        args.lm_cache,
                    )
                    row.commit, row.split = code, split
                    print(
                        f"  {row.accuracy:.3f} [{row.low:.3f}, {row.high:.3f}] n={row.n} "
                        f"{row.seconds:.0f}s blamed {row.blamed}",
                        flush=True,
                    )
                    rows = [r for r in rows if r.key() != row.key()] + [row]
                    results = stamped({"rows": [r.model_dump() for r in rows]}, models)
                    write_atomic(args.json, json.dumps(results, indent=1) + "\n")
                    write_atomic(args.markdown, to_markdown(rows, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
