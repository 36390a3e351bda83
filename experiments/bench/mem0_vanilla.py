"""Vanilla mem0 against mem0 through optloop, same model, same server: what optloop's calls change.

    python -m experiments.bench.mem0_vanilla --lm-base-url http://127.0.0.1:8011/v1 \\
        --model smollm2 --dataset "synthetic:recall?seed=0&episodes=10" \\
        --json experiments/results/mem0_vanilla.json

Three arms ingest every episode's sessions and search every question (top 5), all with
``mem0.Memory`` 2.2.1, qdrant on disk and the local MiniLM embedder, against one OpenAI-compatible
server:

* ``vanilla``: ``Memory.from_config`` with provider ``openai`` at the server, as a product builds
  it; mem0's own request (``response_format={"type": "json_object"}`` without a schema, mem0's
  sampling: temperature 0.1, top_p 0.1, max_tokens 2000);
* ``optloop``: optloop's ``Mem0System`` (the baseline prompts, optloop's LM at the server: the
  site's schema in the endpoint's schema mode, temperature 0, max_tokens 512, seed 0);
* ``exported``: the vanilla app with ``optloop export``'s mem0 module of the baseline prompts
  applied (``mem0_prompts.apply``): the requests the ``optloop`` arm sent, from a product.

With ``--extract-prompt FILE`` (an instruction for ``mem0.extract``, such as the one a loop
promoted) the arms are ``vanilla`` and ``exported``, the latter with that instruction exported
into the vanilla app: whether the exported prompt stores the facts mem0's own prompt loses, on the
same sessions.

Per question: whether a retrieved memory holds every word of the gold answer (recall@5), with its
95 % bootstrap CI, and the paired difference between arms. Per arm: memories stored, extraction
requests and how many returned no memory. An episode in which an arm raises (mem0 itself can fail
on a small model's answer) is listed with the error and scores no arm, so the arms stay paired.
Run it under the machine's LM lock.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments.provenance import command_of, stamped
from optloop.cli.command import run_cli
from optloop.datasets import Episode, load_dataset
from optloop.stats import bootstrap_mean, paired_bootstrap_delta
from optloop.text import words

ARMS = ("vanilla", "optloop", "exported")
TOP_K = 5


def holds_gold(texts: Sequence[str], gold: str) -> float:
    """1.0 when one retrieved text holds every word of ``gold``."""
    need = set(words(gold))
    return float(bool(need) and any(need <= set(words(t)) for t in texts))


def app_config(root: Path, base_url: str, model: str) -> dict[str, Any]:
    """A product's mem0 config: provider openai at the server, the local MiniLM, qdrant on disk."""
    from optloop.embed import LocalEmbedder

    return {
        "llm": {
            "provider": "openai",
            "config": {"model": model, "openai_base_url": base_url, "api_key": "not-needed"},
        },
        "embedder": {
            "provider": "huggingface",
            "config": {"model": LocalEmbedder.model_path(), "embedding_dims": 384},
        },
        "vector_store": {
            "provider": "qdrant",
            "config": {
                "collection_name": "app",
                "path": str(root / "qdrant"),
                "on_disk": True,
                "embedding_model_dims": 384,
            },
        },
        "history_db_path": str(root / "history.db"),
    }


def exported_module(root: Path, extract: str | None = None) -> Any:
    """``optloop export``'s mem0 module of the baseline prompts (mem0's own text, the site's
    schema), or of ``extract`` as the extraction instruction."""
    from optloop.product.export import Bundle, render
    from signatures.mem0 import Mem0Extract

    bundle = Bundle(
        system="mem0",
        prompts={"mem0.extract": extract if extract is not None else Mem0Extract.instructions},
        source={"baseline": extract is None},
        label="the baseline prompts" if extract is None else "the given extraction prompt",
    )
    path = root / "mem0_prompts.py"
    path.write_text(render(bundle, "mem0", command="experiments.bench.mem0_vanilla"))
    spec = importlib.util.spec_from_file_location("mem0_prompts_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_app(
    episode: Episode, root: Path, base_url: str, model: str, prepare: Callable[[Any], None]
) -> dict:
    from systems.mem0_system import (
        USER_ID,
        session_messages,
    )  # first: it points MEM0_DIR into optloop's state

    from mem0 import Memory  # isort: skip

    memory = Memory.from_config(app_config(root, base_url, model))
    prepare(memory)
    try:
        for session in episode.sessions:
            memory.add(session_messages(session), user_id=USER_ID)
        stored = memory.get_all(filters={"user_id": USER_ID})["results"]
        hits = [
            [
                h["memory"]
                for h in memory.search(q.question, top_k=TOP_K, filters={"user_id": USER_ID})[
                    "results"
                ]
            ]
            for q in episode.questions
        ]
    finally:
        memory.close()
    return {"memories": [m["memory"] for m in stored], "hits": hits}


def run_optloop(episode: Episode, root: Path, lm: Any) -> dict:
    from systems.mem0_system import Mem0System

    system = Mem0System(lm, root)
    try:
        system.ingest(episode.sessions)
        stored = system.all_memories()
        hits = [[m.text for m in system.search(q.question, TOP_K)] for q in episode.questions]
    finally:
        system.close()
    return {"memories": [m.text for m in stored], "hits": hits}


def _stored_or_raised(arm: str, results: dict[str, dict], raised: dict[str, str]) -> str:
    return f"raised {raised[arm]}" if arm in raised else str(len(results[arm]["memories"]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench.mem0_vanilla",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lm-base-url", required=True, help="the OpenAI-compatible server")
    parser.add_argument("--model", default="smollm2", help="the model name the server answers to")
    parser.add_argument("--dataset", default="synthetic:recall?seed=0&episodes=10")
    parser.add_argument("--json", metavar="OUT", help="write the figures here")
    parser.add_argument(
        "--extract-prompt",
        metavar="FILE",
        type=Path,
        help="export this mem0.extract instruction instead of the baseline's (arms: vanilla, "
        "exported)",
    )
    args = parser.parse_args(argv)
    extract = args.extract_prompt.read_text() if args.extract_prompt else None
    arms = ("vanilla", "exported") if extract is not None else ARMS
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    from optloop.lm import LMSettings, OptloopLM, collect_calls

    dataset = load_dataset(args.dataset)
    lm = OptloopLM(
        LMSettings.from_spec(
            f"openai:{args.model}", base_url=args.lm_base_url, cache=False, timeout_s=300
        )
    )  # mem0's long prompt on a CPU server
    lines = lm.check_endpoint()
    scores: dict[str, list[float]] = {arm: [] for arm in arms}
    stored: dict[str, list[int]] = {arm: [] for arm in arms}
    seconds = dict.fromkeys(arms, 0.0)
    same_memories = 0
    errors: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mem0-vanilla-") as tmp:
        module = exported_module(Path(tmp), extract)
        for i, episode in enumerate(dataset.episodes):
            results: dict[str, dict] = {}
            raised: dict[str, str] = {}
            for arm in arms:
                started = time.perf_counter()
                root = Path(tmp) / arm / episode.id
                try:
                    if arm == "optloop":
                        with collect_calls():
                            results[arm] = run_optloop(episode, root, lm)
                    else:
                        prepare = module.apply if arm == "exported" else (lambda memory: None)
                        results[arm] = run_app(
                            episode, root, args.lm_base_url, args.model, prepare
                        )
                except Exception as exc:  # noqa: BLE001 - the library's own failure, reported
                    raised[arm] = f"{type(exc).__name__}: {str(exc)[:200]}"
                seconds[arm] += time.perf_counter() - started
            if raised:  # an arm raised: the episode scores no arm, so the arms stay paired
                errors.append({"episode": episode.id, "raised": raised})
            else:
                for arm in arms:
                    stored[arm].append(len(results[arm]["memories"]))
                    scores[arm] += [
                        holds_gold(h, q.gold)
                        for h, q in zip(results[arm]["hits"], episode.questions)
                    ]
                if "optloop" in results:
                    same_memories += sorted(results["optloop"]["memories"]) == sorted(
                        results["exported"]["memories"]
                    )
            print(
                f"episode {i + 1}/{len(dataset.episodes)}: memories "
                + ", ".join(f"{arm} {_stored_or_raised(arm, results, raised)}" for arm in arms),
                file=sys.stderr,
            )
    seed = 0
    figures = {
        "dataset": dataset.uri,
        "model": args.model,
        "server": args.lm_base_url,
        "endpoint": lines,
        "episodes": len(dataset.episodes),
        "episodes_scored": len(dataset.episodes) - len(errors),
        "episodes_where_an_arm_raised": errors,
        "questions": len(scores["vanilla"]),
        "extract_prompt": extract,
        "recall_at_5": {arm: bootstrap_mean(scores[arm], seed=seed).model_dump() for arm in arms},
        **(
            {
                "delta_optloop_minus_vanilla": paired_bootstrap_delta(
                    scores["vanilla"], scores["optloop"], seed=seed
                ).model_dump(),
                "delta_exported_minus_optloop": paired_bootstrap_delta(
                    scores["optloop"], scores["exported"], seed=seed
                ).model_dump(),
            }
            if "optloop" in arms
            else {
                "delta_exported_minus_vanilla": paired_bootstrap_delta(
                    scores["vanilla"], scores["exported"], seed=seed
                ).model_dump()
            }
        ),
        "memories_stored": {arm: sum(stored[arm]) for arm in arms},
        "episodes_with_no_memory": {arm: sum(n == 0 for n in stored[arm]) for arm in arms},
        "episodes_where_exported_stored_what_optloop_stored": same_memories,
        "seconds": {arm: round(s, 1) for arm, s in seconds.items()},
    }
    figures = stamped(
        figures,
        f"openai:{args.model} at {args.lm_base_url}",
        command_of("experiments.bench.mem0_vanilla", argv),
    )
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
