"""``python -m optloop.doctor``: check that the whole stack works here, end to end.

It makes real calls, not import checks: a schema-constrained extraction and a
free-text answer through :mod:`optloop.lm`, an embedding through
:mod:`optloop.embed`, and reports versions, timings and the call accounting.
Against an endpoint it first runs the start-up check every CLI runs
(:meth:`optloop.lm.OptloopLM.check_endpoint`) and prints the schema mode and the
concurrency the endpoint gets, and why (``docs/servers.md``).
Exit status 0 means every check passed; 75 the endpoint cannot be reached; 2 it
refuses the key, the model or the schema mode.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults, quiet_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported
if __name__ == "__main__":  # run as a command (not imported): tqdm's bars off unless --verbose
    os.environ.update(quiet_defaults())

import importlib.metadata
import sys
import time
from collections.abc import Sequence

from pydantic import BaseModel

from optloop.cli import LM_HELP, CommandParser, lm_from_args, parse_command, run_cli
from optloop.embed import get_embedder
from optloop.lm import prompt_site
from optloop.output import Table, make_console

PACKAGES = (
    "dspy",
    "mem0ai",
    "graphiti-core",
    "kuzu",
    "mlflow",
    "optuna",
    "torch",
    "sentence-transformers",
    "llama_cpp_python",
    "openai",
    "uvicorn",
    "fastapi",
)


class Fact(BaseModel):
    subject: str
    attribute: str
    value: str


class Facts(BaseModel):
    facts: list[Fact]


def build_parser() -> CommandParser:
    parser = CommandParser(
        "python -m optloop.doctor",
        "Check the optloop stack end to end with real calls: LM (schema-constrained and free "
        "text), embeddings, and the installed versions.",
        lm=True,
        epilog=LM_HELP,
    )
    parser.add_argument(
        "--embed", metavar="SPEC", help="embedder: local (default) | openai:<model>"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    console = make_console()

    versions = Table(title="installed stack", show_header=True)
    versions.add_column("package")
    versions.add_column("version")
    for name in PACKAGES:
        try:
            versions.add_row(name, importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            versions.add_row(name, "[red]missing[/red]")
    console.print(versions)

    lm = lm_from_args(args)
    console.print(
        f"LM: [bold]{lm.backend.identity}[/bold]  cache: {lm.settings.resolved_cache_path()}"
    )
    for (
        line
    ) in lm.check_endpoint():  # an endpoint: the schema mode and the concurrency it gets, and why
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    checks = Table(title="checks", show_header=True)
    for col in ("check", "result", "seconds"):
        checks.add_column(col)

    started = time.perf_counter()
    with prompt_site("doctor.extract"):
        facts = lm.json(
            [
                {
                    "role": "system",
                    "content": "Extract facts about the user as subject/attribute/value triples.",
                },
                {
                    "role": "user",
                    "content": "I moved to Lisbon in 2021 and my sister Ana is a nurse.",
                },
            ],
            Facts,
        )
    parsed = Facts.model_validate(facts)
    checks.add_row(
        "schema-constrained call",
        f"{len(parsed.facts)} facts: {parsed.facts[:2]}",
        f"{time.perf_counter() - started:.2f}",
    )

    started = time.perf_counter()
    with prompt_site("doctor.answer"):
        answer = lm.text(
            "In one short sentence: what is long-term memory for a chat assistant?", max_tokens=48
        )
    checks.add_row(
        "free-text call",
        answer.strip()[:100] or "[red]empty[/red]",
        f"{time.perf_counter() - started:.2f}",
    )

    started = time.perf_counter()
    embedder = get_embedder(args.embed)
    vectors = embedder.embed(
        ["I live in Lisbon.", "My home city is Lisbon.", "The cat sleeps all day."]
    )
    close, far = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    checks.add_row(
        f"embeddings ({embedder.name}, dim {embedder.dim})",
        f"paraphrase {close:.2f} > unrelated {far:.2f}",
        f"{time.perf_counter() - started:.2f}",
    )
    console.print(checks)

    usage = Table(title="LM accounting by prompt site")
    for col in (
        "site",
        "calls",
        "model calls",
        "cache hits",
        "prompt tok",
        "completion tok",
        "seconds",
    ):
        usage.add_column(col)
    for site, u in lm.accounting.by_site().items():
        usage.add_row(
            str(site),
            str(u.calls),
            str(u.model_calls),
            str(u.cache_hits),
            str(u.prompt_tokens),
            str(u.completion_tokens),
            f"{u.seconds:.2f}",
        )
    console.print(usage)

    ok = bool(answer.strip()) and close > far
    console.print("[green]all checks passed[/green]" if ok else "[red]a check failed[/red]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
