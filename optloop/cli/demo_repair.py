"""One repair case end to end (``make demo-repair``): plant a sabotage, let the loop find and mend
it, export.

    optloop demo-repair    # recall-answer-unknown-prepend: rag_bm25 on synthetic:recall, edit
    optloop demo-repair --case answer-echo --dataset "memfail:persona?limit=12" \\
        --lm-max-items 8

1. the sabotage (a case of :mod:`optloop.faults.sabotages`) is planted as the run's start
   instruction: ``optloop run --start SITE=TEXT``; the loop is not told which site it is in;
2. ``optloop run`` attributes the failures, blames a site and rewrites only that one;
3. the run's prompts are exported (``optloop export --format json``) as a product would take them;
4. the before/after diff of the mended prompt is printed, with where the first blame went, the
   held-out delta with its CI, and whether the sabotage's text is still in the exported prompt.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

import json
import time
from collections.abc import Sequence

from optloop import artifacts
from optloop.cli import export
from optloop.cli import run as optloop_run
from optloop.cli.command import CommandParser, command_name, parse_command
from optloop.faults.sabotages import SABOTAGES
from optloop.loop.candidate import prompt_diff
from optloop.loop.optimizers import registry
from optloop.output import make_console
from optloop.paths import state_dir

console = make_console()


def _logged_prompts(run_id: str, artifact: str) -> dict[str, str]:
    """A prompts artifact of a finished run (``prompts_before.json``: the program the run started
    from)."""
    import mlflow

    return json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/{artifact}"))


def build_parser() -> CommandParser:
    parser = CommandParser("optloop demo-repair", __doc__, lm=True)
    parser.add_argument(
        "--case",
        default="recall-answer-unknown-prepend",
        choices=[s.name for s in SABOTAGES if s.system != "mem0"],
        help="the sabotage to plant (a case of optloop.faults.sabotages)",
    )
    parser.add_argument("--dataset", help="the dataset to run on (default: the case's own)")
    parser.add_argument(
        "--optimizer",
        default=registry.EDIT,
        choices=registry.names(),
        help="the run's optimizer (default %(default)s)",
    )
    parser.add_argument(
        "--budget", type=int, default=3, help="the run's candidate evaluations on dev"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="the run's split, optimizer and bootstrap seed"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    lm_flags = [
        f
        for flag, value in (
            ("--lm", args.lm),
            ("--lm-base-url", args.lm_base_url),
            ("--lm-max-items", args.lm_max_items),
            ("--lm-max-chars", args.lm_max_chars),
        )
        if value is not None
        for f in (flag, str(value))
    ]
    sabotage = next(s for s in SABOTAGES if s.name == args.case)
    out = state_dir() / "demo-repair"
    out.mkdir(parents=True, exist_ok=True)
    name = f"demo-repair-{args.case}-{time.strftime('%Y%m%d-%H%M%S')}"
    console.rule(f"[bold]1. plant[/] {sabotage.site} <- {sabotage.mode} {sabotage.text!r}")
    with command_name("optloop run"):
        code = optloop_run.main(
            [
                "--system",
                sabotage.system,
                "--dataset",
                args.dataset or sabotage.dataset,
                "--allow-small-splits",
                "--optimizer",
                args.optimizer,
                "--budget",
                str(args.budget),
                "--seed",
                str(args.seed),
                "--run-name",
                name,
                "--start",
                f"{sabotage.site}={sabotage.start}",
                *(["--query-rewrite"] if sabotage.query_rewrite else []),
                "--json",
                str(out / f"{name}.json"),
                *lm_flags,
            ]
        )
    if code:
        return code
    result = json.loads((out / f"{name}.json").read_text())
    prompts = out / f"{name}.prompts.json"
    console.rule("[bold]3. export[/] (optloop export --format json)")
    with command_name("optloop export"):
        code = export.main(
            ["--run", result["parent_run_id"], "--format", "json", "--out", str(prompts)]
        )
    if code:
        return code
    after = json.loads(prompts.read_text())[sabotage.site]
    before = _logged_prompts(result["parent_run_id"], artifacts.PROMPTS_BEFORE)[sabotage.site]
    console.rule(f"[bold]4. the mended prompt[/] {sabotage.site}")
    first = result["targets"][0] if result["targets"] else "nothing"
    console.print(
        f"first blame: {first} "
        f"({'the sabotaged site' if first == sabotage.site else 'NOT the sabotaged site'}); "
        f"changed: {', '.join(result['changed_sites']) or 'nothing'}"
    )
    ci = result["delta_test_ci"]
    console.print(
        f"held-out test ({result['n_test']} questions): {result['test_before']:.3f} sabotaged "
        f"-> {result['test_after']:.3f} after, {ci['estimate']:+.3f} [{ci['low']:+.3f}, "
        f"{ci['high']:+.3f}]{'' if ci['low'] > 0 else ': no measurable change'}"
    )
    gone = " ".join(sabotage.text.split()) not in " ".join(after.split())
    console.print(
        "the sabotage's text is gone from the exported prompt"
        if gone
        else "the sabotage's text is still in the exported prompt: whatever changed, the loop "
        "did not take it out"
    )
    # before: the sabotaged start
    diff = prompt_diff({sabotage.site: before}, {sabotage.site: after})
    console.print(
        diff
        if before != after
        else "(unchanged: the loop found no better prompt within the budget)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"exported prompts: {prompts}")
    return 0
