"""The repair benchmark: a prompt made worse at one site must be found and mended by the loop.

    python -m experiments.bench.repair                # md_flat cases, every arm, seeds 0,1,2
    python -m experiments.bench.repair --cases answer-echo --seeds 0 --arms targeted \\
        --optimizers edit
    python -m experiments.bench.repair --bite-only    # only measure which sabotages bite
    python -m experiments.bench.repair --champion     # planted on a champion
    python -m experiments.bench.repair --champion --edit-order screen --json OUT --resume
    python -m experiments.bench.repair --report-only --json OUT --markdown MD   # runs nothing

The closed loop's promise under control. A **sabotage** is a written instruction
(the optimizer rewrites instructions, so the fault must live in one): the site's
instruction replaced, or a sentence appended to it. The cases are in
:data:`optloop.faults.sabotages.SABOTAGES`, written down before any was run.

1. **Bite check**: the clean program and the sabotaged one run over the whole
   dataset; the margin (clean - sabotaged accuracy) gets a paired-bootstrap 95% CI
   over questions. A sabotage whose CI does not lie above 0 does not bite on this
   model: it is dropped, and listed with its figure.
2. **Arms**, each from the sabotaged program at equal ``--budget``: ``targeted``
   (``optloop.run``: the blamed sites), ``untargeted`` (every site) and
   ``random`` (one site picked at random, seeded), per optimizer and seed.
3. **Report on the held-out test split**: clean, sabotaged, after; the recovered
   share of the loss, (after - sabotaged) / (clean - sabotaged), with a paired
   bootstrap CI over the test questions; whether the first blame named the
   sabotaged site; LLM calls (cached ones included, so arms compare), tokens and
   seconds. The aggregate is given per optimizer and arm, and again split by how the
   sabotage was planted: ``added`` in front of or after the instruction (one deletion
   takes it out) or ``replaced`` (only new writing mends it).
4. **The clean instruction never reaches the optimizer**: the run starts from the
   sabotaged instruction (``LoopConfig.start``), and a witness on the LM checks
   every proposer request and every candidate's demos. Where the sabotage
   replaces the instruction, the clean text must appear in none of them
   (``leaks`` counts the ones that did; the benchmark fails on any). Where it
   appends or prepends, the start instruction itself carries the clean text, so
   that check cannot apply (``leaks`` is null).

**On a champion** (``--champion``): the clean program is not the best one the loop can
reach (rag_bm25's clean answer instruction tells the model to reply "I don't know", which it
does too often), so an edit that deletes the clean instruction's own rule wins whatever was
planted, and repair cannot be told from improvement. With ``--champion`` the bench first runs
the loop on the clean program (edit optimizer, seed 0, ``--champion-budget`` dev evaluations a
round, at most ``--champion-rounds`` rounds, each round starting from the last one's best) until
no edit beats the program on dev; the best trial's instructions per site are the champion (the
clean program itself when no edit beat it, and the report says so). It is kept in ``--work``
(keyed by system, dataset, model and those settings), so a rerun reuses it. Every step above
then runs with the champion as the clean program: each sabotage is planted on the champion's
instruction of its site, and the bite check and ``recovered`` measure against the champion. A
case whose text the champion's instruction already holds is dropped. Every run, with or
without ``--champion``, reports ``sabotage_removed``: whether the sabotage's text is gone from
the site's instruction in the run's best candidate (the prompt the run registers). The
champion was chosen on seed 0's dev split, so for seeds 1 and 2 it may have seen some of their
test questions: the champion and its sabotaged copy are measured on the same questions, so the
recovered share compares like with like.

**The edit optimizer's order** (``--edit-order``): ``evidence``, the order ``optloop.run`` uses
(the deletions the failures support first, :mod:`optloop.loop.optimizers.edit`), or ``screen``, the
train screen's order alone, the order before the evidence was read. Each run reports
``tried_before_best``, the candidates evaluated on dev before the one promoted; the aggregate
names the screen order's rows ``edit (screen order)``, so two reports, one per order, compare
case by case.

Every loop runs the way ``optloop.optimize`` runs it (:func:`optloop.loop.runs.session.opened`, its
runs in a temporary folder), and the bite check evaluates through the run's own evaluator
(:func:`optloop.loop.runs.session.evaluator`). All arms share one LM cache (``--cache``; a
temporary one by default), so an evaluation repeated across arms costs nothing the second time;
``llm_calls`` counts every call, cached or not, and ``model_calls`` the computed ones. MLflow
runs go to a temporary store unless ``--tracking-uri`` is given. ``--resume`` keeps the runs the
``--json`` report already holds and runs only the others, so a long table is built over several
commands (with the same ``--cache``, the bite checks are replays). A report names the optimizers
that have not yet run every case x arm x seed (``unfinished``); ``--report-only`` writes the
tables again from the ``--json`` report without running anything.
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
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from experiments.provenance import model_of, stamped
from optloop.cli.command import CommandParser, lm_overrides, parse_command, run_cli
from optloop.datasets import load_dataset
from optloop.faults.model import InstructionFault
from optloop.faults.sabotages import (
    CHAMPION_CASES,
    DEFAULT_CASES,
    RECALL,
    RECALL_CASES,
    SABOTAGES,
    WRITER_CASES,
)
from optloop.lm import LMSettings, OptloopLM
from optloop.loop.candidate import Candidate
from optloop.loop.config import LoopConfig
from optloop.loop.evaluate import Evaluation
from optloop.loop.optimizers.base import PROPOSER_SITE
from optloop.loop.optimizers.edit import EditOptimizer
from optloop.loop.policy import start_candidate
from optloop.loop.runs import session
from optloop.loop.runs.request import RunOptions, RunRequest, loop_config, run_lms
from optloop.loop.state import Checkpoint, LoopResult
from optloop.paths import state_dir, write_atomic
from optloop.stats import Interval, bootstrap_mean, paired_bootstrap_delta, recovered_share

logger = logging.getLogger(__name__)
console = Console(width=None if sys.stdout.isatty() else 200)

ARMS = ("targeted", "untargeted", "random")
# What a loop run stopped by a fault from outside says goes on with it.
AGAIN = "python -m experiments.bench.repair with the same flags and --resume"


class Witness:
    """Watches an LM's requests for a text that must never reach the proposer."""

    def __init__(self, text: str | None):
        self.text = " ".join(text.split()) if text else None
        self.proposer_requests = 0
        self.leaks = 0

    def __call__(self, site: str | None, messages: list[dict[str, Any]]) -> None:
        if site != PROPOSER_SITE:
            return
        self.proposer_requests += 1
        if self.text and any(
            self.text in " ".join(str(m.get("content", "")).split()) for m in messages
        ):
            self.leaks += 1

    @contextmanager
    def watching(self, lm: OptloopLM) -> Iterator[Witness]:
        """This witness on ``lm``'s requests while the block runs."""
        lm.watchers.append(self)
        try:
            yield self
        finally:
            lm.watchers.remove(self)

    def check_demos(self, candidates: Sequence[Candidate]) -> None:
        for candidate in candidates:
            for state in candidate.sites.values():
                if self.text and any(
                    self.text in " ".join(json.dumps(d).split()) for d in state.demos
                ):
                    self.leaks += 1


def scores(evaluation: Evaluation, keys: Sequence[tuple[str, str]] | None = None) -> list[float]:
    """Per-question 0/1 (passed), in the order of ``keys`` ((episode, question) ids) when given."""
    by_key = {(o.episode_id, o.question_id): float(o.passed) for o in evaluation.outcomes}
    return [by_key[k] for k in keys] if keys is not None else list(by_key.values())


def ci(interval: Interval) -> list[float]:
    return [round(interval.low, 3), round(interval.high, 3)]


def _folded(text: str) -> str:
    return " ".join(text.split())


def holds(prompt: str, text: str) -> bool:
    """Whether ``prompt`` holds ``text``, white space folded."""
    return _folded(text) in _folded(prompt)


def planted(
    sabotage: InstructionFault, program: Mapping[str, str], champion: Mapping[str, str]
) -> dict[str, str]:
    """A run's start instructions: the champion's (``{}``: the clean program) with the sabotage
    planted on its site's instruction in ``program`` (site -> instruction, the champion's on)."""
    return {**champion, sabotage.site: sabotage.instruction(program[sabotage.site])}


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args = args
        self.tmp = tmp
        self.lms: dict[str, OptloopLM] = {}
        self.champions: dict[str, dict[str, Any]] = {}

    def lm_settings(self, system: str) -> tuple[LMSettings, LMSettings | None]:
        """The settings of the LM a system's evaluations and runs answer with and of
        ``--proposer-lm`` (None: the task model writes), as ``optloop run`` builds them
        (:func:`run_lms`: the flags over the system's local decoding bounds), both on the bench's
        one cache."""
        settings, proposer = run_lms(
            system, self.args.lm, self.args.proposer_lm, **lm_overrides(self.args)
        )
        cached = {"cache_path": self.args.cache}
        return settings.model_copy(update=cached), (
            proposer.model_copy(update=cached) if proposer else None
        )

    def settings(self, system: str) -> LMSettings:
        return self.lm_settings(system)[0]

    def proposer(self, system: str) -> LMSettings | None:
        return self.lm_settings(system)[1]

    def writer(self) -> str | None:
        """The proposer's model as the tables name it, None without ``--proposer-lm``."""
        spec = self.args.proposer_lm
        if not spec:
            return None
        name = Path(spec.split(":", 1)[-1]).name  # a short spec's name holds dots: 1.5b
        return name.removesuffix(".gguf")

    def lm(self, system: str) -> OptloopLM:
        """One LM per system for the bite check (a loop run builds its own, on the same cache)."""
        if system not in self.lms:
            self.lms[system] = OptloopLM(self.settings(system))
        return self.lms[system]

    def config(self, system: str, writer: bool = True, **fields: Any) -> LoopConfig:
        """A run's config as ``optloop.optimize`` builds it (:func:`loop_config`), on the system's
        LM settings, the bench's MLflow store, ``--lm`` and (``writer``) ``--proposer-lm``."""
        proposer = self.proposer(system) if writer else None
        return loop_config(
            self.settings(system),
            proposer,
            system=system,
            tracking_uri=self.args.tracking_uri,
            lm=self.args.lm,
            proposer_lm=self.args.proposer_lm if proposer else None,
            **fields,
        )

    def run_loop(
        self, config: LoopConfig, witness: Witness | None = None
    ) -> tuple[LoopResult, Checkpoint, Candidate]:
        """One loop run, the way ``optloop.optimize`` runs it (:mod:`optloop.loop.runs.session`),
        in the bench's runs folder: its result, checkpoint and start program. ``witness`` watches
        the run's LM."""
        name = config.run_name
        options = RunOptions(run_name=name, allow_small_splits=True, runs_dir=self.tmp / "runs")
        proposer = self.proposer(config.system) if config.proposer_lm != "same" else None
        request = RunRequest(config, self.settings(config.system), proposer, options)
        with console.status(name) as status:

            def said(event: session.RunEvent) -> None:
                if isinstance(event, session.Stage):
                    status.update(f"{name}: {event.text}")

            with session.opened(request, AGAIN, said) as run:
                with (
                    witness.watching(run.lm) if witness else nullcontext(),
                    witness.watching(run.proposer)
                    if witness and run.proposer is not run.lm
                    else nullcontext(),
                ):
                    run.start()
                    result = run.run()
        assert run.loop.start is not None
        return result, run.checkpoint(), run.loop.start

    # --- 0. the champion ------------------------------------------------------------------

    def champion(self, sabotage: InstructionFault) -> dict[str, Any]:
        """The program the loop reaches from the clean one on the sabotage's system and dataset
        (see the module docstring), read from ``--work`` when an earlier run of the bench made
        it."""
        key = {
            "system": sabotage.system,
            "dataset": sabotage.dataset,
            "query_rewrite": sabotage.query_rewrite,
            "optimizer": "edit",
            "seed": 0,
            "budget": self.args.champion_budget,
            "rounds": self.args.champion_rounds,
            "model": self.lm(sabotage.system).model,
            **{
                k: getattr(self.args, k, None)
                for k in ("lm", "lm_n_ctx", "lm_max_items", "lm_max_chars")
            },
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        if digest in self.champions:
            return self.champions[digest]
        path = Path(self.args.work) / f"champion-{sabotage.system}-{digest}.json"
        if path.exists() and (kept := json.loads(path.read_text())).get("key") == key:
            console.print(f"champion: reused {path}")
            self.champions[digest] = {**kept, "reused": True, "path": str(path)}
            return self.champions[digest]
        start: dict[str, str] = {}
        clean: dict[str, str] = {}
        rounds: list[dict[str, Any]] = []
        for n in range(1, self.args.champion_rounds + 1):
            config = self.config(
                sabotage.system,
                dataset=sabotage.dataset,
                budget=self.args.champion_budget,
                writer=False,  # every arm, with a writer or without, mends the same champion
                optimizer="edit",
                seed=0,
                run_name=f"champion-{sabotage.system}-{digest}-r{n}",
                start=start,
                query_rewrite=sabotage.query_rewrite,
            )
            result, ckpt, base = self.run_loop(config)
            clean = clean or {s: st.instructions for s, st in base.sites.items()}
            best = next((t.candidate for t in ckpt.trials if t.trial == result.best_trial), None)
            rounds.append(
                {
                    "round": n,
                    "run_name": config.run_name,
                    "best_trial": result.best_trial,
                    "baseline_dev": round(result.baseline_dev, 3),
                    "best_dev": round(result.best_dev, 3),
                    "test_before": round(result.test_before, 3),
                    "test_after": round(result.test_after, 3),
                    "delta_test_ci": ci(result.delta_test_ci),
                    "n_dev": result.n_dev,
                    "n_test": result.n_test,
                    "changed": result.changed_sites,
                    "promoted": result.promoted,
                    "llm_calls": int(result.cost.get("llm_calls", 0)),
                }
            )
            if result.best_trial == 0 or best is None:  # no edit beat the program on dev
                break
            start = {
                s: st.instructions for s, st in best.sites.items() if st.instructions != clean[s]
            }
            for site, text in start.items():
                if text.startswith("+") or text.endswith("+"):  # a start would read it as +TEXT
                    raise SystemExit(
                        f"repair: the champion's {site} instruction begins or ends with +"
                    )
        last = rounds[-1]
        stopped = (
            f"no edit beat it on dev in round {last['round']}"
            if last["best_trial"] == 0
            else f"its {len(rounds)} rounds of budget {self.args.champion_budget} ended"
        )
        champion = {
            "key": key,
            "instructions": {**clean, **start},
            "changed": sorted(start),
            "clean": clean,
            "from_clean": not start,
            "note": (
                "no edit beat the clean program on dev: the champion is the clean program"
                if not start
                else f"the champion changes {', '.join(sorted(start))}; {stopped}"
            ),
            "rounds": rounds,
        }
        write_atomic(path, json.dumps(champion, indent=1))
        console.print(f"champion: {champion['note']} (kept in {path})")
        self.champions[digest] = {**champion, "reused": False, "path": str(path)}
        return self.champions[digest]

    # --- 1. does it bite ------------------------------------------------------------------

    def evaluate(
        self, sabotage: InstructionFault, champion: Mapping[str, str]
    ) -> tuple[dict[str, str], list[str], Evaluation, Evaluation]:
        """The program (the clean one with ``champion``'s instructions) and the sabotage planted on
        it, each over the whole dataset: the program's instruction per site, the sites, and both
        evaluations."""
        dataset = load_dataset(sabotage.dataset)
        config = self.config(
            sabotage.system,
            dataset=sabotage.dataset,
            run_name="bite",
            query_rewrite=sabotage.query_rewrite,
            start=dict(champion),
        )
        work = self.tmp / "bite" / sabotage.name
        with session.evaluator(config, self.lm(sabotage.system), work, dataset) as evaluator:
            clean = start_candidate(evaluator, config)
            instructions = {s: st.instructions for s, st in clean.sites.items()}
            start = planted(sabotage, instructions, champion)
            sabotaged = start_candidate(evaluator, config.model_copy(update={"start": start}))
            with console.status(f"{sabotage.name}: clean over {dataset.uri}"):
                clean_eval = evaluator.evaluate(clean, dataset, split="all")
            with console.status(f"{sabotage.name}: sabotaged over {dataset.uri}"):
                sab_eval = evaluator.evaluate(sabotaged, dataset, split="all")
            sites = list(evaluator.sites)
        return instructions, sites, clean_eval, sab_eval

    def bite(
        self, sabotage: InstructionFault, champion: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The clean program vs the sabotaged one over the whole dataset. With ``champion`` (the
        champion's changed sites' instructions; ``{}``: it is the clean program) the champion is
        the clean program, and a case whose text its instruction already holds is dropped."""
        on_champion = champion is not None  # the champion may be the clean program ({})
        champion = dict(champion or {})
        instructions, sites, clean_eval, sab_eval = self.evaluate(sabotage, champion)
        keys = [(o.episode_id, o.question_id) for o in clean_eval.outcomes]
        margin = paired_bootstrap_delta(scores(sab_eval, keys), scores(clean_eval, keys), seed=0)
        blamed = sab_eval.blame()
        clean_text = instructions[sabotage.site]
        already = on_champion and holds(clean_text, sabotage.text)
        return {
            "name": sabotage.name,
            "system": sabotage.system,
            "site": sabotage.site,
            "mode": sabotage.mode,
            "dataset": sabotage.dataset,
            "n": margin.n,
            "clean": round(clean_eval.accuracy, 3),
            "sabotaged": round(sab_eval.accuracy, 3),
            "margin": round(margin.estimate, 3),
            "margin_ci": ci(margin),
            "bites": margin.low > 0 and not already,
            "first_blame_all": blamed[0].target if blamed else None,
            "clean_instruction": clean_text,
            **({"on_champion": True, "already_there": already} if on_champion else {}),
            "_sites": sites,
            "_clean_eval": clean_eval,
            "_instructions": instructions,
            "_champion": champion,
        }

    # --- 2. the arms ----------------------------------------------------------------------

    def arm(
        self, sabotage: InstructionFault, bite: dict[str, Any], arm: str, optimizer: str, seed: int
    ) -> dict[str, Any]:
        clean_text = bite["clean_instruction"]
        start = planted(sabotage, bite["_instructions"], bite["_champion"])
        sites = None
        if arm == "random":
            sites = [random.Random(f"{sabotage.name}/{seed}").choice(bite["_sites"])]
        writer = self.writer()
        name = f"repair-{sabotage.name}-{arm}-{optimizer}{'-' + writer if writer else ''}-s{seed}"
        config = self.config(
            sabotage.system,
            dataset=sabotage.dataset,
            budget=self.args.budget,
            optimizer=optimizer,
            seed=seed,
            untargeted=arm == "untargeted",
            sites=sites,
            run_name=name,
            start=start,
            query_rewrite=sabotage.query_rewrite,
        )
        started = time.perf_counter()
        EditOptimizer.evidence = self.args.edit_order == "evidence"
        witness = Witness(clean_text if sabotage.mode == "replace" else None)
        try:
            result, ckpt, _ = self.run_loop(config, witness)
        finally:
            EditOptimizer.evidence = True  # the champion's run and optloop.run's order
        witness.check_demos([t.candidate for t in ckpt.trials])
        assert ckpt.test_before is not None and ckpt.test_after is not None
        keys = [(o.episode_id, o.question_id) for o in ckpt.test_before.outcomes]
        clean_v = scores(bite["_clean_eval"], keys)
        sab_v, after_v = scores(ckpt.test_before, keys), scores(ckpt.test_after, keys)
        recovered = recovered_share(clean_v, sab_v, after_v, seed=seed)
        gain = paired_bootstrap_delta(
            sab_v, after_v, seed=seed
        )  # stable where clean - sabotaged is small on test
        after_instruction = _best_instruction(ckpt, result.best_trial, sabotage.site, start)
        return {
            "case": sabotage.name,
            "site": sabotage.site,
            "mode": sabotage.mode,
            "optimizer": optimizer,
            **({"writer": writer} if writer else {}),
            "arm": arm,
            "seed": seed,
            "optimized": result.tunable_sites,
            "clean": round(statistics.fmean(clean_v), 3) if clean_v else 0.0,
            "sabotaged": round(result.test_before, 3),
            "after": round(result.test_after, 3),
            # the trivial instruction (the signature's default) at the blamed sites, the loop's
            # control: what the site scores with no written text at all
            **{
                f"control_{split}": round(ev.accuracy, 3)
                for split, ev in (("dev", ckpt.control_dev), ("test", ckpt.control_test))
                if ev is not None
            },
            "n_test": len(keys),
            "recovered": None
            if recovered.estimate != recovered.estimate
            else round(recovered.estimate, 3),
            "recovered_ci": ci(recovered),
            "gain": round(gain.estimate, 3),
            "gain_ci": ci(gain),
            "first_blame": result.targets[0] if result.targets else None,
            "first_blame_correct": bool(result.targets) and result.targets[0] == sabotage.site,
            "blame": _blame_counts(ckpt),
            "site_blamed": sabotage.site in result.targets,
            "changed": result.changed_sites,
            "best_trial": result.best_trial,
            "llm_calls": int(result.cost["llm_calls"]),
            "model_calls": int(result.cost["model_calls"]),
            "tokens": int(result.cost["tokens"]),
            "seconds": round(time.perf_counter() - started, 1),
            "proposer_requests": witness.proposer_requests,
            "leaks": witness.leaks if sabotage.mode == "replace" else None,
            "sabotage_removed": not holds(after_instruction, sabotage.text),
            "after_instruction": after_instruction,
            "edit_order": self.args.edit_order if optimizer == "edit" else None,
            "tried_before_best": _tried_before_best(ckpt, result.best_trial),
            "trials": [
                {
                    "trial": t.trial,
                    "origin": t.candidate.origin,
                    "dev": None if t.evaluation is None else round(t.evaluation.accuracy, 3),
                }
                for t in ckpt.trials
            ],
        }


def _tried_before_best(ckpt: Checkpoint, best_trial: int) -> int | None:
    """Candidates evaluated on dev before the best one (``None``: none beat the start)."""
    if not best_trial:
        return None
    return sum(1 for t in ckpt.trials if t.trial < best_trial and t.evaluation is not None)


def label(case: Mapping[str, Any]) -> str:
    """The optimizer as the tables name it: ``edit (screen order)`` for the edit optimizer with
    the evidence order off; ``edit, <model> writes`` when ``--proposer-lm`` wrote the new text."""
    order = case.get("edit_order")
    name = f"{case['optimizer']} (screen order)" if order == "screen" else case["optimizer"]
    return f"{name}, {case['writer']} writes" if case.get("writer") else name


def run_key(case: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes a row of ``cases`` one run: ``--resume`` skips the runs a report holds."""
    return (case["case"], label(case), case["arm"], case["seed"])


def _blame_counts(ckpt: Checkpoint) -> dict[str, int]:
    """Failures of the sabotaged baseline (train + dev) per blamed target: what the first blame was
    chosen from."""
    counts: dict[str, int] = {}
    for ev in (ckpt.baseline_train, ckpt.baseline_dev):
        for a in ev.attributions() if ev is not None else []:
            counts[a.target or "-"] = counts.get(a.target or "-", 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _best_instruction(ckpt: Checkpoint, best_trial: int, site: str, start: dict[str, str]) -> str:
    for t in ckpt.trials:
        if t.trial == best_trial:
            return t.candidate.sites[site].instructions
    return start[site]


def aggregate(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (optimizer, arm): first-blame rate, share recovering >= 50%, mean recovered with a CI
    over cases, cost."""
    rows = []
    for optimizer in sorted({label(c) for c in cases}):
        for arm in ARMS:
            group = [c for c in cases if label(c) == optimizer and c["arm"] == arm]
            if group:
                rows.append({"optimizer": optimizer, "arm": arm, **_summary(group)})
    return rows


def planted_as(case: Mapping[str, Any]) -> str:
    """How a case's sabotage sits in the site's instruction: ``added`` (in front of or after the
    instruction, so one deletion takes it out) or ``replaced`` (the instruction is gone, so only
    new writing mends it)."""
    return "replaced" if case["mode"] == "replace" else "added"


def by_planting(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`aggregate` split by :func:`planted_as`: which kind of fault each optimizer mends."""
    rows = [
        {"optimizer": r["optimizer"], "arm": r["arm"], "planted": planted, **r}
        for planted in ("added", "replaced")
        for r in aggregate([c for c in cases if planted_as(c) == planted])
    ]
    return sorted(rows, key=lambda r: (r["optimizer"], ARMS.index(r["arm"]), r["planted"]))


def _summary(group: list[dict[str, Any]]) -> dict[str, Any]:
    rec = [c["recovered"] for c in group if c["recovered"] is not None]
    mean = bootstrap_mean(rec, seed=0)
    return {
        "cases": len(group),
        "first_blame_correct": round(sum(c["first_blame_correct"] for c in group) / len(group), 3),
        "recovered_half": round(sum(r >= 0.5 for r in rec) / len(group), 3),
        "recovered_mean": round(mean.estimate, 3),
        "recovered_mean_ci": ci(mean),
        "llm_calls_mean": round(statistics.fmean(c["llm_calls"] for c in group), 1),
        "tokens_mean": round(statistics.fmean(c["tokens"] for c in group)),
        "leaks": sum(c["leaks"] or 0 for c in group),
        **_removed_share(group),
        **_tried_mean(group),
    }


def unfinished(report: Mapping[str, Any]) -> list[str]:
    """A line per optimizer whose runs do not yet cover every case that bites x arm x seed (a
    table built over several commands, or one whose run was stopped)."""
    kept = [b["name"] for b in report["bites"] if b["bites"]]
    planned = len(kept) * len(report["arms"]) * len(report["seeds"])
    out = []
    for optimizer in sorted({label(c) for c in report["cases"]}):
        done = sum(
            1
            for c in report["cases"]
            if label(c) == optimizer and c["case"] in kept and c["arm"] in report["arms"]
        )
        if done < planned:
            out.append(
                f"{optimizer}: {done} of {planned} runs ({len(kept)} cases x "
                f"{len(report['arms'])} arms x {len(report['seeds'])} seeds); its rows cover "
                "those runs only"
            )
    return out


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with its aggregate, per-planting rows, targets and unfinished lines computed
    from its cases."""
    report["aggregate"] = aggregate(report["cases"])
    report["by_planting"] = by_planting(report["cases"])
    report["targets"] = targets(report["aggregate"])
    report["unfinished"] = unfinished(report)
    return report


def _removed_share(group: list[dict[str, Any]]) -> dict[str, float]:
    """The share of runs whose promoted prompt no longer holds the sabotage's text."""
    known = [c["sabotage_removed"] for c in group if c.get("sabotage_removed") is not None]
    return {"sabotage_removed": round(sum(known) / len(known), 3)} if known else {}


def _tried_mean(group: list[dict[str, Any]]) -> dict[str, Any]:
    """Candidates tried before the best one, mean over the runs where one beat the start."""
    if "tried_before_best" not in group[0]:
        return {}
    tried = [c["tried_before_best"] for c in group if c.get("tried_before_best") is not None]
    return {
        "tried_before_best_mean": round(statistics.fmean(tried), 2) if tried else None,
        "improved_runs": len(tried),
    }


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The benchmark's targets, each as a met/missed line."""
    out = []
    for optimizer in sorted({r["optimizer"] for r in rows}):
        by_arm = {r["arm"]: r for r in rows if r["optimizer"] == optimizer}
        t = by_arm.get("targeted")
        if t is None:
            continue
        out.append(
            f"{optimizer}: first blame names the sabotaged site in "
            f"{t['first_blame_correct']:.0%} of cases "
            f"(target >= 90%): {'met' if t['first_blame_correct'] >= 0.9 else 'MISSED'}"
        )
        out.append(
            f"{optimizer}: targeted recovers >= 50% of the loss in "
            f"{t['recovered_half']:.0%} of cases "
            f"(target >= 70%): {'met' if t['recovered_half'] >= 0.7 else 'MISSED'}"
        )
        if "sabotage_removed" in t:
            out.append(
                f"{optimizer}: targeted takes the sabotage's text out of the promoted prompt in "
                f"{t['sabotage_removed']:.0%} of runs (target >= 70%): "
                f"{'met' if t['sabotage_removed'] >= 0.7 else 'MISSED'}"
            )
        for other, strict in (("untargeted", False), ("random", True)):
            o = by_arm.get(other)
            if o is None:
                continue
            better = (
                t["recovered_mean"] > o["recovered_mean"]
                if strict
                else t["recovered_mean"] >= o["recovered_mean"]
            )
            cheaper = t["llm_calls_mean"] < o["llm_calls_mean"]
            out.append(
                f"{optimizer}: targeted recovers {t['recovered_mean']:+.2f} vs {other} "
                f"{o['recovered_mean']:+.2f}"
                f" ({'more' if strict else 'at least as much'}: {'met' if better else 'MISSED'}), "
                f"{t['llm_calls_mean']:.0f} vs {o['llm_calls_mean']:.0f} LLM calls "
                f"(fewer: {'met' if cheaper else 'MISSED'})"
            )
    return out


def render(report: dict[str, Any]) -> None:
    bites = Table(
        title=f"bite check ({report['model']}): clean vs sabotaged over the whole dataset, paired "
        "bootstrap"
    )
    for col in ("case", "site", "mode", "n", "clean", "sabotaged", "margin [95% CI]", "kept"):
        bites.add_column(col)
    for b in report["bites"]:
        bites.add_row(
            b["name"],
            b["site"],
            b["mode"],
            str(b["n"]),
            f"{b['clean']:.3f}",
            f"{b['sabotaged']:.3f}",
            f"{b['margin']:+.3f} [{b['margin_ci'][0]:+.3f}, {b['margin_ci'][1]:+.3f}]",
            "yes" if b["bites"] else "dropped",
        )
    console.print(bites)
    if champion := report.get("champion"):
        console.print(f"champion: {champion['note']}")
        for site, text in champion["instructions"].items():
            mark = "changed" if site in champion["changed"] else "clean"
            console.print(f"  {site} ({mark}): {_folded(text)}", markup=False, highlight=False)
    if not report["cases"]:
        return
    table = Table(title=f"repair on held-out test, budget {report['budget']} ({report['model']})")
    for col in (
        "case",
        "optimizer",
        "arm",
        "seed",
        "n",
        "clean",
        "sab.",
        "after",
        "gain [95% CI]",
        "recovered [95% CI]",
        "1st blame ok",
        "removed",
        "LLM calls",
        "tokens",
        "s",
        "leaks",
    ):
        table.add_column(col)
    for c in report["cases"]:
        rec = (
            "n/a"
            if c["recovered"] is None
            else f"{c['recovered']:+.2f} [{c['recovered_ci'][0]:+.2f}, "
            f"{c['recovered_ci'][1]:+.2f}]"
        )
        gain = (
            f"{c['gain']:+.2f} [{c['gain_ci'][0]:+.2f}, {c['gain_ci'][1]:+.2f}]"
            if "gain" in c
            else "n/a"
        )
        table.add_row(
            c["case"],
            c["optimizer"],
            c["arm"],
            str(c["seed"]),
            str(c["n_test"]),
            f"{c['clean']:.2f}",
            f"{c['sabotaged']:.2f}",
            f"{c['after']:.2f}",
            gain,
            rec,
            "yes" if c["first_blame_correct"] else "no",
            _yes_no(c.get("sabotage_removed")),
            str(c["llm_calls"]),
            str(c["tokens"]),
            f"{c['seconds']:.0f}",
            "-" if c["leaks"] is None else str(c["leaks"]),
        )
    console.print(table)
    agg = Table(
        title="aggregate per optimizer and arm (recovered: mean over cases, bootstrap CI over "
        "cases)"
    )
    for col in (
        "optimizer",
        "arm",
        "cases",
        "1st blame ok",
        ">= 50% recovered",
        "recovered mean [95% CI]",
        "LLM calls (mean)",
        "tokens (mean)",
    ):
        agg.add_column(col)
    for r in report["aggregate"]:
        agg.add_row(
            r["optimizer"],
            r["arm"],
            str(r["cases"]),
            f"{r['first_blame_correct']:.0%}",
            f"{r['recovered_half']:.0%}",
            f"{r['recovered_mean']:+.2f} [{r['recovered_mean_ci'][0]:+.2f}, "
            f"{r['recovered_mean_ci'][1]:+.2f}]",
            f"{r['llm_calls_mean']:.0f}",
            f"{r['tokens_mean']}",
        )
    console.print(agg)
    for line in [*report.get("unfinished", []), *report["targets"]]:
        console.print(line)


def to_markdown(report: dict[str, Any]) -> str:
    """The report's tables as Markdown (the README's and ``experiments/results/repair.md``)."""

    def ci_text(v: Any, lo_hi: list[float]) -> str:
        return "n/a" if v is None else f"{v:+.2f} [{lo_hi[0]:+.2f}, {lo_hi[1]:+.2f}]"

    lines = []
    if p := report.get("provenance"):
        lines += [
            f"Command: `{p['command']}`  ",
            f"Date: {p['date']}; commit: {p['commit']}; model: {p['model']}; "
            f"machine: {p['machine']}.",
            "",
        ]
    lines += [
        f"Model: {report.get('model', '?')}; budget {report['budget']}; seeds {report['seeds']}.",
        "",
    ]
    if champion := report.get("champion"):
        lines += _champion_markdown(champion)
    lines += [
        "| case | site | mode | n | clean | sabotaged | margin [95% CI] | kept |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {b['name']} | {b['site']} | {b['mode']} | {b['n']} | {b['clean']:.3f} | "
        f"{b['sabotaged']:.3f} | {ci_text(b['margin'], b['margin_ci'])} | "
        f"{'yes' if b['bites'] else 'dropped'} |"
        for b in report["bites"]
    ]
    if report["cases"]:
        lines += [
            "",
            "| case | optimizer | arm | seed | n test | clean | sabotaged | after | after - "
            "sabotaged [95% CI] | recovered [95% CI] | first blame | changed | "
            "sabotage removed | LLM calls | tokens | s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {c['case']} | {label(c)} | {c['arm']} | {c['seed']} | {c['n_test']} | "
            f"{c['clean']:.2f} | {c['sabotaged']:.2f} | {c['after']:.2f} | "
            f"{ci_text(c['gain'], c['gain_ci']) if 'gain' in c else 'n/a'} | "
            f"{ci_text(c['recovered'], c['recovered_ci'])} | "
            f"{c['first_blame']}{'' if c['first_blame_correct'] else ' (wrong)'} | "
            f"{', '.join(c['changed']) or '-'} | {_yes_no(c.get('sabotage_removed'))} | "
            f"{c['llm_calls']} | {c['tokens']} | {c['seconds']:.0f} |"
            for c in report["cases"]
        ]
    if report.get("aggregate"):
        if report.get("unfinished"):
            lines += ["", *[f"**Unfinished.** {u}." for u in report["unfinished"]]]
        lines += [
            "",
            "| optimizer | arm | cases | first blame right | recovered >= 50% | recovered, mean "
            "[95% CI] | sabotage removed | tried before the best (mean, runs) | "
            "LLM calls (mean) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['optimizer']} | {r['arm']} | {r['cases']} | {r['first_blame_correct']:.0%} | "
            f"{r['recovered_half']:.0%} | "
            f"{ci_text(r['recovered_mean'], r['recovered_mean_ci'])} | "
            f"{format(r['sabotage_removed'], '.0%') if 'sabotage_removed' in r else 'n/a'} | "
            f"{_tried_text(r)} | {r['llm_calls_mean']:.0f} |"
            for r in report["aggregate"]
        ]
        lines += ["", *[f"- {t}" for t in report.get("targets", [])]]
    if report.get("by_planting"):
        lines += [
            "",
            "By how the sabotage was planted: added (in front of or after the site's instruction, "
            "so one deletion takes it out) or replaced (the instruction gone, so only new writing "
            "mends it).",
            "",
            "| optimizer | arm | planted | runs | first blame right | recovered >= 50% | "
            "recovered, mean [95% CI] | sabotage removed |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['optimizer']} | {r['arm']} | {r['planted']} | {r['cases']} | "
            f"{r['first_blame_correct']:.0%} | {r['recovered_half']:.0%} | "
            f"{ci_text(r['recovered_mean'], r['recovered_mean_ci'])} | "
            f"{format(r['sabotage_removed'], '.0%') if 'sabotage_removed' in r else 'n/a'} |"
            for r in report["by_planting"]
        ]
    return "\n".join(lines) + "\n"


def _tried_text(row: Mapping[str, Any]) -> str:
    if row.get("tried_before_best_mean") is None:
        return "n/a"
    return f"{row['tried_before_best_mean']:.2f} ({row['improved_runs']})"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "no"


def _cell(text: str) -> str:
    return _folded(text).replace("|", "\\|")


def _champion_markdown(champion: dict[str, Any]) -> list[str]:
    """The champion the cases were planted on: how it was reached, and its instruction per site."""
    reused = " (reused from an earlier run of the bench)" if champion.get("reused") else ""
    lines = [
        f"Champion: {champion['note']}{reused}.",
        "",
        "| round | best trial | dev before | dev best | test before | test after | "
        "held-out delta [95% CI] | n test | changed | LLM calls |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['round']} | {r['best_trial']} | {r['baseline_dev']:.3f} | {r['best_dev']:.3f} | "
        f"{r['test_before']:.3f} | {r['test_after']:.3f} | "
        f"{r['test_after'] - r['test_before']:+.2f} [{r['delta_test_ci'][0]:+.2f}, "
        f"{r['delta_test_ci'][1]:+.2f}] | {r['n_test']} | {', '.join(r['changed']) or '-'} | "
        f"{r['llm_calls']} |"
        for r in champion["rounds"]
    ]
    lines += ["", "| site | clean instruction | champion instruction |", "|---|---|---|"]
    lines += [
        f"| {site} | {_cell(champion['clean'][site])} | "
        f"{_cell(text) if site in champion['changed'] else '(the clean one)'} |"
        for site, text in champion["instructions"].items()
    ]
    return [*lines, ""]


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("python -m experiments.bench.repair", __doc__, lm=True)
    parser.add_argument(
        "--cases",
        help=f"sabotages to run (default the md_flat ones, with --champion the champion ones; "
        f"'recall': the rag_bm25 ones on {RECALL}; 'champion': those and the ones written for a "
        f"champion; 'writer': the ones written for a task model that uses a written instruction, "
        f"e.g. --lm local:qwen2.5-coder-0.5b); all: {', '.join(s.name for s in SABOTAGES)}",
    )
    parser.add_argument(
        "--seeds", default="0,1,2", help="split and optimizer seeds (default 0,1,2)"
    )
    parser.add_argument(
        "--arms", default=",".join(ARMS), help="targeted, untargeted, random (default all)"
    )
    parser.add_argument(
        "--optimizers",
        default="edit,simba",
        help="optimizers to run the arms with (default edit,simba)",
    )
    parser.add_argument(
        "--budget", type=int, default=4, help="dev evaluations per arm (default 4)"
    )
    parser.add_argument(
        "--champion",
        action="store_true",
        help="plant the sabotages on a champion: the best program the loop reaches from the clean "
        "one (edit, seed 0), kept in --work and reused",
    )
    parser.add_argument(
        "--champion-budget",
        type=int,
        default=3,
        help="dev evaluations per round of the champion's run (default 3)",
    )
    parser.add_argument(
        "--champion-rounds",
        type=int,
        default=3,
        help="rounds of the champion's run at most, each from the last one's best; it stops "
        "at the first round where no edit beats the program on dev (default 3)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="where the champion is kept between runs (default <state dir>/bench-repair)",
    )
    parser.add_argument(
        "--bite-only",
        action="store_true",
        help="only the bite check: which sabotages lower accuracy",
    )
    parser.add_argument(
        "--edit-order",
        choices=("evidence", "screen"),
        default="evidence",
        help="the edit optimizer's order: evidence (the deletions the failures support first, as "
        "optloop.run does) or screen (the train screen's order alone, the order before the "
        "evidence was read); default evidence",
    )
    parser.add_argument(
        "--proposer-lm",
        metavar="SPEC",
        help="the LM that writes the arms' new instructions (as optloop.run's --proposer-lm, e.g. "
        "local:qwen2.5-coder-1.5b); its rows are labelled '<optimizer>, <model> writes' and the "
        "champion stays the one found without it; default: the task model writes",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the runs the --json report holds and run only the others (the same LM "
        "--cache makes the bite checks a replay)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write the tables (console, --json, --markdown) again from the --json "
        "report, e.g. one whose run was stopped; its unfinished optimizers are named",
    )
    parser.add_argument(
        "--cache", type=Path, help="the LM cache all arms share (default: a fresh temporary one)"
    )
    parser.add_argument("--tracking-uri", help="MLflow store (default: a temporary one)")
    parser.add_argument(
        "--json",
        type=Path,
        metavar="OUT",
        help="write the report here (experiments/results/repair.json)",
    )
    parser.add_argument(
        "--markdown", type=Path, metavar="OUT", help="write the tables as Markdown here"
    )
    return parser


def report_again(args: argparse.Namespace) -> int:
    """``--report-only``: the tables written again from the ``--json`` report, nothing run; the
    report keeps the provenance of the command that ran its cases."""
    if not args.json or not args.json.exists():
        raise SystemExit(
            "repair: --report-only writes the tables again from an earlier report; give that "
            "report as --json OUT"
        )
    report = summarize(json.loads(args.json.read_text()))
    render(report)
    write_atomic(args.json, json.dumps(report, indent=1, default=str))
    if args.markdown:
        write_atomic(args.markdown, to_markdown(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_command(build_parser(), argv)
    if not args.verbose:
        logging.getLogger("dspy").setLevel(logging.ERROR)
    if args.report_only:
        return report_again(args)
    known = {s.name: s for s in SABOTAGES}
    if args.cases is None:
        args.cases = "champion" if args.champion else ",".join(DEFAULT_CASES)
    args.cases = {
        "recall": ",".join(RECALL_CASES),
        "champion": ",".join(CHAMPION_CASES),
        "writer": ",".join(WRITER_CASES),
    }.get(args.cases, args.cases)
    unknown = [c for c in _csv(args.cases) if c not in known]
    if unknown:
        raise SystemExit(
            f"repair: unknown case(s) {', '.join(unknown)}; the cases are {', '.join(known)}"
        )
    chosen = [known[c] for c in _csv(args.cases)]
    seeds = [int(s) for s in _csv(args.seeds)]
    arms = _csv(args.arms)
    if set(arms) - set(ARMS):
        raise SystemExit(f"repair: --arms takes {', '.join(ARMS)}")
    if args.champion and len({(s.system, s.dataset, s.query_rewrite) for s in chosen}) > 1:
        raise SystemExit(
            "repair: --champion takes cases of one system and dataset (one champion); "
            "run the others in a command of their own"
        )
    if args.resume and not args.json:
        raise SystemExit("repair: --resume reads the report named by --json; give --json OUT")
    kept: list[dict[str, Any]] = []
    if args.resume and args.json.exists():
        kept = json.loads(args.json.read_text()).get("cases", [])
    done = {run_key(c) for c in kept}
    args.work = args.work or state_dir() / "bench-repair"
    with tempfile.TemporaryDirectory(prefix="optloop-bench-repair-") as tmp_name:
        tmp = Path(tmp_name)
        args.tracking_uri = args.tracking_uri or f"sqlite:///{tmp / 'mlflow.db'}"
        args.cache = args.cache or tmp / "cache.sqlite"
        bench = Bench(args, tmp)
        report: dict[str, Any] = {
            "bench": "repair",
            "budget": args.budget,
            "seeds": seeds,
            "arms": arms,
            "optimizers": _csv(args.optimizers),
            "bites": [],
            "cases": kept,
            "dropped": [],
        }
        if args.champion:
            report["bench"] = "repair-champion"
            report["champion_budget"] = args.champion_budget
            report["champion_rounds"] = args.champion_rounds
        for sabotage in chosen:
            champion = bench.champion(sabotage) if args.champion else None
            if champion is not None:
                report["champion"] = champion
            bite = bench.bite(
                sabotage,
                None
                if champion is None
                else {s: champion["instructions"][s] for s in champion["changed"]},
            )
            report["model"] = bench.lm(sabotage.system).model
            report["bites"].append({k: v for k, v in bite.items() if not k.startswith("_")})
            console.print(
                f"{sabotage.name}: clean {bite['clean']:.3f}, sabotaged "
                f"{bite['sabotaged']:.3f}, margin "
                f"{bite['margin']:+.3f} {bite['margin_ci']} (n={bite['n']}): "
                f"{'bites' if bite['bites'] else 'does not bite, dropped'}"
                f"{' (the champion already says it)' if bite.get('already_there') else ''}"
            )
            if not bite["bites"]:
                report["dropped"].append(
                    {
                        k: bite[k]
                        for k in (
                            "name",
                            "site",
                            "mode",
                            "n",
                            "clean",
                            "sabotaged",
                            "margin",
                            "margin_ci",
                        )
                    }
                    | ({"already_there": True} if bite.get("already_there") else {})
                )
            if args.json:  # partial results survive a long run's interruption
                write_atomic(
                    args.json, json.dumps(stamped(report, model_of(args)), indent=1, default=str)
                )
            if not bite["bites"] or args.bite_only:
                continue
            for seed in seeds:
                for optimizer in _csv(args.optimizers):
                    for arm in arms:
                        planned = {
                            "case": sabotage.name,
                            "optimizer": optimizer,
                            "edit_order": args.edit_order if optimizer == "edit" else None,
                            "writer": bench.writer(),
                            "arm": arm,
                            "seed": seed,
                        }
                        if run_key(planned) in done:
                            continue
                        case = bench.arm(sabotage, bite, arm, optimizer, seed)
                        report["cases"].append(case)
                        console.print(
                            f"{case['case']} {optimizer} {arm} s{seed}: test "
                            f"{case['sabotaged']:.2f} -> {case['after']:.2f} (clean "
                            f"{case['clean']:.2f}, n={case['n_test']}), recovered "
                            f"{case['recovered']} {case['recovered_ci']}, {case['llm_calls']} "
                            "LLM calls"
                        )
                        if args.json:  # partial results survive a long run's interruption
                            write_atomic(
                                args.json,
                                json.dumps(stamped(report, model_of(args)), indent=1, default=str),
                            )
        summarize(report)
    render(report)
    if args.json:
        write_atomic(args.json, json.dumps(stamped(report, model_of(args)), indent=1, default=str))
    if args.markdown:
        write_atomic(args.markdown, to_markdown(stamped(report, model_of(args))))
    leaks = sum(c["leaks"] or 0 for c in report["cases"])
    if leaks:
        console.print(
            f"[red]the clean instruction reached the proposer or a demo {leaks} time(s)[/]"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
