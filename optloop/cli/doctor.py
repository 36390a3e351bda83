"""``optloop doctor``: check that the whole stack works here, end to end.

It makes real calls, not import checks: a schema-constrained extraction and a
free-text answer through :mod:`optloop.lm`, an embedding through
:mod:`optloop.embed`, and reports versions, timings and the call accounting.
Against an endpoint it first runs the start-up check every CLI runs
(:meth:`optloop.lm.OptloopLM.check_endpoint`) and prints the schema mode and the
concurrency the endpoint gets, and why (``docs/servers.md``).
It lists every model of the registry (:mod:`optloop.lm.models`: installed or not, and where)
and measures each installed one here: prompt evaluation of a 256-token prompt and generation of
32 tokens, in tokens/s, with llama.cpp on the threads of one machine-wide slot
(:mod:`optloop.lm.machine`), holding that slot so no other optloop job runs llama.cpp meanwhile
(``--no-models``: the list without the measurement).
Exit status 0 means every check passed; 75 the endpoint cannot be reached; 2 it
refuses the key, the model or the schema mode.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

import importlib.metadata
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from optloop.cli.command import LM_HELP, CommandParser, lm_from_args, parse_command
from optloop.embed import get_embedder
from optloop.errors import ConfigError
from optloop.lm import MODELS, MachineSlots, prompt_site, threads_per_slot
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


PROMPT_TOKENS = 256
GENERATED_TOKENS = 32
SPEED_TEXT = (
    "The user moved to Lisbon in 2021, works as a nurse at the central hospital, and keeps a "
    "small garden with tomatoes and basil on the balcony. Her sister Ana visits every summer. "
)


class Speed(BaseModel):
    """A model's speed here: seconds to load, prompt and generation tokens per second."""

    load_s: float
    prompt_tps: float
    generate_tps: float
    threads: int


def model_speed(path: Path, slots: MachineSlots | None = None) -> Speed:
    """``path``'s speed on this machine: a :data:`PROMPT_TOKENS` prompt evaluated, then
    :data:`GENERATED_TOKENS` tokens generated greedily, on one slot's threads while holding the
    slot (a machine-wide lock: another optloop job's model calls wait, and this waits for them)."""
    from llama_cpp import Llama

    slots = slots or MachineSlots()
    threads = threads_per_slot(slots.slots)
    started = time.perf_counter()
    llama = Llama(
        model_path=str(path),
        n_ctx=PROMPT_TOKENS + GENERATED_TOKENS + 32,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
        seed=0,
    )
    load_s = time.perf_counter() - started
    try:
        tokens = llama.tokenize((SPEED_TEXT * 16).encode())[:PROMPT_TOKENS]
        with slots.hold():
            started = time.perf_counter()
            llama.eval(tokens)
            prompt_s = time.perf_counter() - started
            started = time.perf_counter()
            for _ in range(GENERATED_TOKENS):  # an end-of-text token is evaluated like any other
                llama.eval([llama.sample(temp=0.0)])
            generate_s = time.perf_counter() - started
    finally:
        llama.close()
    return Speed(
        load_s=load_s,
        prompt_tps=len(tokens) / prompt_s,
        generate_tps=GENERATED_TOKENS / generate_s,
        threads=threads,
    )


def models_table(measure: bool) -> Table:
    """Every model of the registry: installed or not, its path, and (``measure``) its speed."""
    table = Table(title="models (--lm local:<name>)", show_header=True)
    table.add_column("name", no_wrap=True)
    table.add_column("installed", no_wrap=True)
    speeds = ("load s", "prompt tok/s", "gen tok/s") if measure else ()
    for col in speeds:
        table.add_column(col, no_wrap=True, justify="right")
    table.add_column("path", overflow="fold")
    missing: list[str] = []
    for model in MODELS.values():
        try:
            path = str(model.path())
        except ConfigError as exc:  # the bundled package is missing
            path = str(exc)
        if not model.installed():
            missing.append(model.install_command())
            table.add_row(model.name, "no", *("" for _ in speeds), path)
        elif not measure:
            table.add_row(model.name, "yes", path)
        else:
            speed = model_speed(Path(path))
            table.add_row(
                model.name,
                "yes",
                f"{speed.load_s:.1f}",
                f"{speed.prompt_tps:.0f}",
                f"{speed.generate_tps:.1f}",
                path,
            )
    lines = [
        f"{PROMPT_TOKENS}-token prompt, {GENERATED_TOKENS} tokens generated, "
        f"{threads_per_slot()} threads"
        if measure
        else "--no-models: not measured"
    ]
    lines += [f"install: {command}" for command in dict.fromkeys(missing)]
    table.caption = "\n".join(lines)
    return table


class Fact(BaseModel):
    subject: str
    attribute: str
    value: str


class Facts(BaseModel):
    facts: list[Fact]


def build_parser() -> CommandParser:
    parser = CommandParser(
        "python -m optloop doctor",
        "Check the optloop stack end to end with real calls: LM (schema-constrained and free "
        "text), embeddings, the installed versions, and each installed model's tokens/s.",
        lm=True,
        epilog=LM_HELP,
    )
    parser.add_argument(
        "--embed", metavar="SPEC", help="embedder: local (default) | openai:<model>"
    )
    parser.add_argument(
        "--no-models",
        action="store_true",
        help="list the models without measuring their speed (a few seconds each)",
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
    console.print(models_table(measure=not args.no_models))

    lm = lm_from_args(args)
    console.print(
        f"LM: [bold]{lm.backend.identity}[/bold]  cache: {lm.settings.resolved_cache_path()}"
    )
    # an endpoint: the schema mode and the concurrency it gets, and why
    for line in lm.check_endpoint():
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
