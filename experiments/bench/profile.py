"""Where one evaluation's time goes on the embedded model, and what the context pool saves.

    python -m experiments.bench.profile [--system graphiti] [--dataset "synthetic:suite?seed=0"]
                                        [--configs 1:llama.cpp,8:grammar-first]
                                        [--json OUT] [--markdown OUT]

Each of ``--configs`` is ``K:SAMPLER``: K llama.cpp contexts per model file
(``OPTLOOP_LLAMA_CONTEXTS``; one per prompt site, :class:`optloop.lm.llama.ContextPool`) and the
sampler of constrained greedy answers, ``grammar-first`` (optloop's,
:class:`optloop.lm.sampling.GreedyGrammar`) or ``llama.cpp`` (llama-cpp-python's chain, the
grammar applied to the whole vocabulary at every token). ``1:llama.cpp`` is how the embedded
model ran before both. For each, runs one evaluation of ``--system``'s baseline over
``--dataset`` on the embedded model with an empty LM cache, so every call is computed, and times
its parts:

``prompt eval``   llama.cpp evaluating prompt tokens (``Llama.eval`` of more than one token)
``generation``    llama.cpp evaluating the tokens it wrote (``Llama.eval`` of one token)
``sampling``      choosing each token: the JSON-schema grammar applied to the vocabulary, greedy
``tokenize``      the chat template's text to tokens
``LM, rest``      the rest of the LM calls (chat template, grammar from the schema, Python)
``slot wait``     waiting for the machine-wide llama.cpp slot (another process's call)
``embeddings``    the bundled MiniLM (sentence-transformers)
``graph store``   Kuzu queries (graphiti)
``system, rest``  the memory system's and optloop's own code: the evaluation less all the above

The evaluations are compared call by call (a call is its messages and decoding parameters): the
calls both made with the same answer, those whose answers differ (each listed), and those only one
made (what follows a different answer). Per K: wall seconds, seconds per session, accuracy with
its 95% CI and the delta against the first K (paired bootstrap over questions).

``--prefixes CACHE`` measures instead how much of the prompts prefix reuse can skip at all: it
replays the evaluation from an LM cache that holds its answers (``python -m
experiments.bench.throughput record`` writes one; nothing is computed, so it takes a minute) and,
for the prompts in the order they were sent, counts the characters llama.cpp would evaluate with
one context, with the pool's routing (:class:`~optloop.lm.llama.ContextPool` itself) at several
sizes, and at the bound: each prompt after its longest shared prefix with any earlier prompt.

Run it alone on the machine: another process's work on the cores slows llama.cpp's threads, and
its model calls wait for the slot.
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

os.environ.update(
    offline_defaults()
)  # first: litellm, mem0 and Hugging Face read them when imported

import argparse
import hashlib
import json
import resource
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from experiments.bench.throughput import evaluate
from experiments.markdown import provenance_lines, table
from experiments.provenance import stamped
from optloop.cli.command import CommandParser, parse_command, run_cli
from optloop.datasets import load_dataset
from optloop.embed import LocalEmbedder, get_embedder
from optloop.errors import ConfigError
from optloop.lm import LMSettings, OptloopLM
from optloop.lm import llama as local
from optloop.lm.requests import Request
from optloop.lm.settings import bundled_model_path
from optloop.paths import write_atomic
from optloop.stats import bootstrap_mean, paired_bootstrap_delta
from systems import get_system

DEFAULT_SYSTEM = "graphiti"
DEFAULT_DATASET = "synthetic:suite?seed=0"
PARTS = [
    "prompt eval",
    "generation",
    "sampling",
    "tokenize",
    "LM, rest",
    "slot wait",
    "embeddings",
    "graph store",
    "system, rest",
]


class Clock:
    """Seconds and counts per part, from any thread."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def add(self, part: str, seconds: float, count: int = 1) -> None:
        with self._lock:
            self.seconds[part] += seconds
            self.counts[part] += count


@contextmanager
def timing(
    owner: Any, name: str, record: Callable[[tuple[Any, ...], float], None]
) -> Iterator[None]:
    """``owner.name`` wrapped so that each call's arguments and seconds go to ``record``."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            record(args, time.perf_counter() - started)

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


def call_key(request: Request) -> str:
    """A call's identity across evaluations: its messages and decoding parameters."""
    body = json.dumps(
        [request.messages, request.schema, request.temperature, request.max_tokens, request.seed],
        sort_keys=True,
        default=str,
    )
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


def site_of(request: Request) -> str:
    """A short label for a call's prompt: the start of its system message."""
    first = request.messages[0] if request.messages else {}
    return " ".join(str(first.get("content") or "").split())[:70]


def instruments(clock: Clock, answers: dict[str, dict[str, str]]) -> ExitStack:
    """Timers on llama.cpp, the embedder and Kuzu; every computed answer into ``answers``."""
    from llama_cpp import Llama

    stack = ExitStack()

    def on_eval(args: tuple[Any, ...], seconds: float) -> None:
        tokens = len(args[1])
        clock.add("prompt eval" if tokens > 1 else "generation", seconds, tokens)

    stack.enter_context(timing(Llama, "eval", on_eval))
    stack.enter_context(timing(Llama, "sample", lambda _a, s: clock.add("sampling", s)))
    stack.enter_context(timing(Llama, "tokenize", lambda _a, s: clock.add("tokenize", s)))
    stack.enter_context(timing(LocalEmbedder, "embed", lambda _a, s: clock.add("embeddings", s)))
    try:
        import kuzu

        for owner in (kuzu.Connection, getattr(kuzu, "AsyncConnection", None)):
            if owner is not None:
                stack.enter_context(
                    timing(owner, "execute", lambda _a, s: clock.add("graph store", s))
                )
    except ImportError:
        pass
    backend = local.LocalLlamaBackend
    original = backend.complete

    def complete(self: Any, request: Request) -> dict[str, Any]:
        started = time.perf_counter()
        response = original(self, request)
        clock.add("LM", time.perf_counter() - started)
        clock.add("slot wait", self.queued_s())
        answers[call_key(request)] = {
            "site": site_of(request),
            "answer": str(response["choices"][0]["message"].get("content") or ""),
        }
        return response

    backend.complete = complete  # type: ignore[method-assign]
    stack.callback(setattr, backend, "complete", original)
    return stack


@contextmanager
def sampler(name: str) -> Iterator[None]:
    """``grammar-first`` as optloop runs; ``llama.cpp``: llama-cpp-python's own sampler chain."""
    from llama_cpp import Llama

    from optloop.lm.sampling import GrammarFirstLlama

    if name == "grammar-first":
        yield
        return
    if name != "llama.cpp":
        raise ConfigError(f"unknown sampler {name!r}; use grammar-first or llama.cpp")
    own = GrammarFirstLlama._init_sampler
    GrammarFirstLlama._init_sampler = Llama._init_sampler  # type: ignore[method-assign]
    try:
        yield
    finally:
        GrammarFirstLlama._init_sampler = own  # type: ignore[method-assign]


def profile_once(
    system: str, dataset_uri: str, config: str, embedder: Any, lm_spec: str = "local"
) -> tuple[dict[str, Any], dict[str, dict[str, str]], dict[str, float]]:
    """One evaluation under ``config`` (``K:SAMPLER``): (figures, answers by call, score by
    question)."""
    contexts, _, name = config.partition(":")
    os.environ[local.CONTEXTS_ENV] = contexts
    local._LOADED.clear()  # a new pool of the asked size; the old contexts are freed
    dataset = load_dataset(dataset_uri)
    clock = Clock()
    answers: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="optloop-profile-") as tmp:
        lm = OptloopLM(
            LMSettings.from_spec(
                lm_spec, cache_path=Path(tmp) / "cache.sqlite", **get_system(system).local_decoding
            )
        )
        with instruments(clock, answers), sampler(name or "grammar-first"):
            evaluation, episodes, seconds = evaluate(system, lm, dataset, Path(tmp), embedder)
    parts = dict(clock.seconds)
    lm_s = parts.pop("LM", 0.0)
    wait = parts.get("slot wait", 0.0)
    inside = sum(parts.get(p, 0.0) for p in ("prompt eval", "generation", "sampling", "tokenize"))
    parts["LM, rest"] = max(0.0, lm_s - wait - inside)
    parts["system, rest"] = max(
        0.0, seconds - lm_s - parts.get("embeddings", 0.0) - parts.get("graph store", 0.0)
    )
    sessions = sum(len(e.sessions) for e in dataset.episodes)
    scores = {f"{o.episode_id}/{o.question_id}": o.score for o in evaluation.outcomes}
    figures = {
        "config": config,
        "seconds": round(seconds, 1),
        "sessions": sessions,
        "seconds_per_session": round(seconds / max(1, sessions), 1),
        "questions": len(scores),
        "accuracy": bootstrap_mean(list(scores.values())).model_dump(),
        "calls": evaluation.model_calls,
        "parts_s": {p: round(parts.get(p, 0.0), 1) for p in PARTS},
        "prompt_tokens_evaluated": clock.counts.get("prompt eval", 0),
        "tokens_generated": clock.counts.get("generation", 0),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "sites": {name: cost.model_dump() for name, cost in evaluation.sites.items()},
    }
    return figures, answers, scores


def compare(first: dict[str, dict[str, str]], other: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Call by call: the same answer, a different answer (listed), made by one only."""
    shared = first.keys() & other.keys()
    differ = sorted(k for k in shared if first[k]["answer"] != other[k]["answer"])
    return {
        "same": len(shared) - len(differ),
        "different": [
            {"site": first[k]["site"], "before": first[k]["answer"], "after": other[k]["answer"]}
            for k in differ
        ],
        "only_first": len(first.keys() - other.keys()),
        "only_other": len(other.keys() - first.keys()),
    }


def to_markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    lines = [
        f"# One {report['system']} evaluation on the embedded model: contexts and sampler",
        "",
        provenance_lines(report["provenance"]).rstrip(),
        f"- dataset: `{report['dataset']}` ({runs[0]['sessions']} sessions, "
        f"{runs[0]['questions']} questions); every call computed (empty LM cache)",
        "",
    ]
    header = [
        "contexts:sampler",
        "wall s",
        "s per session",
        "speed-up",
        "calls",
        "prompt tokens evaluated",
    ]
    base = runs[0]["seconds"]
    rows = [
        [
            r["config"],
            r["seconds"],
            r["seconds_per_session"],
            f"{base / r['seconds']:.2f}x" if r["seconds"] else "-",
            r["calls"],
            f"{r['prompt_tokens_evaluated']:,}",
        ]
        for r in runs
    ]
    lines += [table(header, rows), "", "Seconds by part:", ""]
    lines += [
        table(
            ["part", *(r["config"] for r in runs)],
            [[p, *(r["parts_s"][p] for r in runs)] for p in PARTS],
        ),
        "",
        "Answers:",
        "",
    ]
    acc_rows = []
    for r, cmp in zip(runs, [None, *report["comparisons"]], strict=True):
        a = r["accuracy"]
        acc = f"{a['estimate']:.3f} [{a['low']:.3f}, {a['high']:.3f}] n={a['n']}"
        if cmp is None:
            acc_rows.append([r["config"], acc, "-", "-", "-"])
            continue
        d = cmp["delta"]
        acc_rows.append(
            [
                r["config"],
                acc,
                f"{d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]",
                f"{cmp['same']} same, {len(cmp['different'])} different",
                f"{cmp['only_first']} / {cmp['only_other']}",
            ]
        )
    lines.append(
        table(
            [
                "contexts:sampler",
                "accuracy [95% CI]",
                f"delta vs {runs[0]['config']}",
                "calls both made",
                "calls made by one only (first / this)",
            ],
            acc_rows,
        )
    )
    for r, cmp in zip(runs[1:], report["comparisons"], strict=True):
        for d in cmp["different"]:
            lines.append(
                f"\n- {r['config']}, `{d['site']}`: `{d['before'][:160]}` -> `{d['after'][:160]}`"
            )
    return "\n".join(lines) + "\n"


def prefix_shares(
    system: str, dataset_uri: str, cache: Path, embedder: Any, sizes: Sequence[int]
) -> dict[str, Any]:
    """The share of prompt characters left to evaluate with each routing (``--prefixes``)."""
    prompts: list[tuple[str, str]] = []  # (routing key, the prompt as text), in the order sent

    def witness(_site: str | None, messages: list[dict[str, Any]]) -> None:
        text = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages)
        prompts.append((local.prefix_of(messages), text))

    with tempfile.TemporaryDirectory(prefix="optloop-profile-") as tmp:
        lm = OptloopLM(
            LMSettings.from_spec("local", cache_path=cache, **get_system(system).local_decoding)
        )
        lm.watchers.append(witness)
        evaluation, _, _ = evaluate(system, lm, load_dataset(dataset_uri), Path(tmp), embedder)
    total = sum(len(text) for _, text in prompts)

    def left(size: int) -> int:
        pool = local.ContextPool(dict, size)
        spent = 0
        for key, text in prompts:
            held = pool.take(key).llama
            spent += len(text) - len(os.path.commonprefix([held.get("last", ""), text]))
            held["last"] = text
        return spent

    bound = sum(
        len(text) - max((len(os.path.commonprefix([t, text])) for _, t in prompts[:i]), default=0)
        for i, (_, text) in enumerate(prompts)
    )
    return {
        "calls": len(prompts),
        "computed": evaluation.model_calls,
        "characters": total,
        "left": {f"{k} context(s)": round(left(k) / total, 3) for k in sizes},
        "bound": round(bound / total, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser("python -m experiments.bench.profile", __doc__)
    parser.add_argument("--system", default=DEFAULT_SYSTEM)
    parser.add_argument("--dataset", default=DEFAULT_DATASET)
    parser.add_argument(
        "--lm",
        default="local",
        help="the embedded model: local (the bundled SmolLM2) or local:NAME (e.g. "
        "local:qwen2.5-coder-0.5b)",
    )
    parser.add_argument(
        "--configs",
        default="1:llama.cpp,8:grammar-first",
        help="K:SAMPLER, comma-separated: K llama.cpp contexts per model file, SAMPLER "
        "grammar-first or llama.cpp (default: before and after)",
    )
    parser.add_argument(
        "--prefixes",
        type=Path,
        metavar="CACHE",
        help="replay from this LM cache and report the prompt share prefix reuse leaves",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--markdown", type=Path, help="and its tables here")
    args: argparse.Namespace = parse_command(parser, argv)
    console = Console()
    embedder = get_embedder()
    embedder.embed(["load the model before the clock starts"])
    if args.prefixes:
        shares = prefix_shares(args.system, args.dataset, args.prefixes, embedder, (1, 2, 4, 8))
        console.print(shares)
        report = stamped(
            {"system": args.system, "dataset": args.dataset, **shares},
            model=f"{bundled_model_path().name} (embedded, llama.cpp), recorded answers",
        )
        if args.json:
            write_atomic(args.json, json.dumps(report, indent=1))
        if args.markdown:
            rows = [[name, f"{share:.3f}"] for name, share in shares["left"].items()]
            rows.append(
                [
                    "bound: after the longest prefix shared with any earlier prompt",
                    f"{shares['bound']:.3f}",
                ]
            )
            write_atomic(
                args.markdown,
                f"# How much of {args.system}'s prompts prefix reuse can skip\n\n"
                + provenance_lines(report["provenance"])
                + f"- dataset: `{args.dataset}`; {shares['calls']} calls in the order sent, "
                f"{shares['characters']:,} prompt characters\n\n"
                + table(["routing", "share of prompt characters evaluated"], rows)
                + "\n",
            )
        return 0
    runs: list[dict[str, Any]] = []
    answers: list[dict[str, dict[str, str]]] = []
    scores: list[dict[str, float]] = []
    for config in args.configs.split(","):
        figures, calls, score = profile_once(args.system, args.dataset, config, embedder, args.lm)
        console.print(
            f"{config}: {figures['seconds']} s ({figures['seconds_per_session']} s a "
            f"session), {figures['calls']} calls, {figures['parts_s']}"
        )
        runs.append(figures)
        answers.append(calls)
        scores.append(score)
    comparisons = []
    for calls, score in zip(answers[1:], scores[1:], strict=True):
        cmp = compare(answers[0], calls)
        keys = sorted(scores[0].keys() & score.keys())
        cmp["delta"] = paired_bootstrap_delta(
            [scores[0][k] for k in keys], [score[k] for k in keys]
        ).model_dump()
        comparisons.append(cmp)
        console.print(
            f"answers: {cmp['same']} same, {len(cmp['different'])} different, "
            f"{cmp['only_first']}/{cmp['only_other']} made by one only"
        )
    report = stamped(
        {
            "system": args.system,
            "dataset": args.dataset,
            "runs": runs,
            "comparisons": comparisons,
        },
        model=(
            f"{bundled_model_path().name} (embedded, llama.cpp)"
            if args.lm == "local"
            else f"{args.lm} (embedded, llama.cpp)"
        ),
    )
    if args.json:
        write_atomic(args.json, json.dumps(report, indent=1))
    if args.markdown:
        write_atomic(args.markdown, to_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
