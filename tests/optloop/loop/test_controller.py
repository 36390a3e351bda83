"""The loop controller driven by fakes: no LM, no MLflow, no optimizer library.

A scripted evaluator decides each candidate's accuracy and where its failures are
blamed; a scripted optimizer proposes deterministic rewrites of its target sites; an
in-memory sink stands for MLflow (its records survive a "kill", as MLflow's do); the
checkpoint is a real file. A kill is an exception raised by any fake, or just before a
checkpoint write, at step k of the run. A :class:`Meter` stands for one process's LM
accounting: 10 LLM calls per evaluation, 1 per proposal.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from optloop.attribution import Attribution, ErrorType
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.controller import Controller, RunContext, Split, Summary, Targeting
from optloop.loop.evaluate import Evaluation, QuestionOutcome
from optloop.loop.optimizers.base import QueuedOptimizer
from optloop.loop.racing import Against, race_order
from optloop.loop.spending.eta import TrialLine
from optloop.loop.state import Checkpoint, LoopConfig, LoopResult
from optloop.loop.workers.coordinator import LocalCoordinator, SharedCoordinator

ANSWER, EXTRACT = "answer", "mem.extract"
SITES = [ANSWER, EXTRACT]
BASE = Candidate(
    sites={
        ANSWER: SiteState(instructions="seed answer"),
        EXTRACT: SiteState(instructions="seed extract"),
    }
)
QUESTIONS = {"train": 4, "dev": 4, "test": 24}

# dev: (questions passed of 4, the site their failures are blamed on), by (answer, extract)
# instruction
DEV = {
    ("seed answer", "seed extract"): (1, ANSWER),
    ("answer:1", "seed extract"): (1, ANSWER),
    ("answer:2", "seed extract"): (2, EXTRACT),  # better, and the blame moves: retarget
    ("answer:2", "mem.extract:1"): (3, EXTRACT),  # better, the blame stays: no retarget
    ("answer:2", "mem.extract:2"): (2, EXTRACT),
}
TEST = {("seed answer", "seed extract"): 6, ("answer:2", "mem.extract:1"): 20}  # of 24


class Killed(Exception):
    """A simulated kill (SIGKILL, Ctrl-C, a crash) at one step of the run."""


class Clock:
    """Counts the run's steps; raises :class:`Killed` at step ``kill_at``, at the first step named
    ``kill_on`` (its ``nth`` one), or at the step right after the first one named
    ``kill_after``."""

    def __init__(
        self,
        kill_at: int | None = None,
        kill_on: str | None = None,
        *,
        nth: int = 1,
        kill_after: str | None = None,
    ):
        self.kill_at = kill_at
        self.kill_on = kill_on
        self.nth = nth
        self.kill_after = kill_after
        self.steps: list[str] = []

    def tick(self, what: str) -> None:
        self.steps.append(what)
        on = (
            self.kill_on is not None
            and sum(s.startswith(self.kill_on) for s in self.steps) == self.nth
            and what.startswith(self.kill_on)
        )
        after = (
            self.kill_after is not None
            and len(self.steps) > 1
            and self.steps[-2] == self.kill_after
            and self.steps.count(self.kill_after) == 1
        )
        if len(self.steps) == self.kill_at or on or after:
            raise Killed(f"step {len(self.steps)}: {what}")


EVALUATION_CALLS, PROPOSAL_CALLS = 10, 1


class Meter:
    """One process's LM accounting: what its evaluations and proposals spent."""

    def __init__(self) -> None:
        self.calls = 0

    def cost(self) -> dict[str, int | float]:
        return {"llm_calls": self.calls, "tokens": 100 * self.calls}


def key(candidate: Candidate) -> tuple[str, str]:
    return candidate.sites[ANSWER].instructions, candidate.sites[EXTRACT].instructions


def evaluation(split: str, candidate: Candidate, passes: int, n: int, target: str) -> Evaluation:
    outcomes = []
    for i in range(n):
        ok = i < passes
        outcomes.append(
            QuestionOutcome(
                episode_id=f"e{i // 4}",
                question_id=f"q{i}",
                task_type="t",
                question="?",
                gold="g",
                prediction="g" if ok else "x",
                score=float(ok),
                passed=ok,
                attribution=None
                if ok
                else Attribution(
                    question_id=f"q{i}", error_type=ErrorType.RESPONSE, target=target
                ),
            )
        )
    return Evaluation(split=split, candidate=candidate.digest(), outcomes=outcomes)


def raced(full: Evaluation, against: Against | None) -> Evaluation:
    """``full`` as a race against ``against`` leaves it, episode by episode in the run's order, as
    the real evaluator answers them: cut after the episode where the race stops it."""
    if against is None:
        return full
    race = against.race()
    episodes = race_order(sorted({o.episode_id for o in full.outcomes}), against.seed, full.split)
    answered: list[QuestionOutcome] = []
    for episode in episodes:
        outcomes = [o for o in full.outcomes if o.episode_id == episode]
        answered += outcomes
        if (stop := race.observe(outcomes)) is not None:
            kept = [o for o in full.outcomes if o in answered]
            return full.model_copy(
                update={
                    "outcomes": kept,
                    "stopped": stop.model_copy(update={"questions": len(kept)}),
                }
            )
    return full


class FakeEvaluator:
    """Scripted evaluations: ``DEV`` on train and dev (default 1 pass), ``TEST`` on test (default
    6)."""

    site_names = SITES

    def __init__(
        self,
        clock: Clock,
        test: Mapping[tuple[str, str], int] | None = None,
        meter: Meter | None = None,
    ):
        self.clock = clock
        self.test = dict(TEST if test is None else test)
        self.calls: list[tuple[str, str]] = []
        self.batches: list[int] = []  # the size of each evaluate_many
        self.meter = meter or Meter()

    def evaluate(
        self, candidate: Candidate, split: Split, *, against: Against | None = None
    ) -> Evaluation:
        # spent as it starts: a kill at this step loses the work, not its cost
        self.meter.calls += EVALUATION_CALLS
        self.clock.tick(f"evaluate {split} {key(candidate)}")
        self.calls.append((split, candidate.digest()))
        if split == "test":
            return evaluation(
                split, candidate, self.test.get(key(candidate), 6), QUESTIONS[split], ANSWER
            )
        passes, target = DEV.get(key(candidate), (1, EXTRACT))
        return raced(evaluation(split, candidate, passes, QUESTIONS[split], target), against)

    def evaluate_many(
        self, candidates: list[Candidate], split: Split, *, against: Against | None = None
    ) -> list[Evaluation]:
        self.batches.append(len(candidates))
        return [self.evaluate(c, split, against=against) for c in candidates]

    def prompt_texts(self, candidate: Candidate) -> dict[str, str]:
        return {name: state.instructions for name, state in candidate.sites.items()}

    def trivial_instruction(self, site: str) -> str:
        return f"trivial {site}"


class FakeOptimizer(QueuedOptimizer):
    """Proposes ``<site>:1``, ``<site>:2``, ... for its first site, two per round, on the best so
    far, each named after its round (so a resumed run that counted its rounds again from 0 would
    differ from the uninterrupted one); a candidate the budget leaves is dropped, not queued
    again."""

    name = "fake"

    def __init__(
        self,
        sites: list[str],
        knobs: list[str],
        clock: Clock,
        *,
        fail_at: int | None = None,
        prefix: str = "",
        meter: Meter | None = None,
    ):
        super().__init__(None, None, None, sites=sites, knobs=knobs)  # type: ignore[arg-type]
        self.clock = clock
        self.meter = meter or Meter()
        self.retargets: list[tuple[list[str], list[str]]] = []
        self.observed: list[int] = []
        self.proposals = 0
        self.fail_at = fail_at
        self.prefix = prefix

    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        self.clock.tick("propose")
        self.proposals += 1
        if self.proposals == self.fail_at:
            raise RuntimeError("the optimizer failed")
        self.meter.calls += PROPOSAL_CALLS
        site, k, fresh = self.sites[0], 0, not self.queue
        self.rounds += fresh
        while fresh and len(self.queue) < 2 and k < 50:
            k += 1
            text = f"{self.prefix}{site}:{k}"
            candidate = best.model_copy(
                update={
                    "sites": {**best.sites, site: SiteState(instructions=text)},
                    "origin": f"fake round {self.rounds}: {site} {k}",
                }
            )
            if candidate.digest() not in self.seen and candidate.digest() != best.digest():
                self.seen.add(candidate.digest())
                self.queue.append(candidate)
        return self.queue.pop(0) if self.queue else None

    def observe(self, candidate: Candidate, evaluation: Evaluation, trial: int) -> None:
        self.clock.tick("observe")
        self.observed.append(trial)

    def release(self, candidate: Candidate) -> None:
        pass

    def retarget(self, sites, knobs=()) -> None:
        self.retargets.append((list(sites), list(knobs)))
        super().retarget(sites, knobs)


class NothingOptimizer(FakeOptimizer):
    def propose(self, best: Candidate, best_eval: Evaluation) -> Candidate | None:
        self.clock.tick("propose")
        return None


class MemorySink:
    """MLflow in memory: child runs by id (discarded ones removed), dev points, summary, registry,
    tags."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.lock = threading.Lock()
        self.children: dict[str, dict[str, Any]] = {}
        self.discarded: list[str] = []
        self.dev: list[tuple[int, float, float]] = []
        self.targets: list[Targeting] = []
        self.summary: Summary | None = None
        self.registered: list[tuple[dict[str, str], bool]] = []
        self.tags: dict[str, Any] = {}
        self._ids = 0

    def log_dev(self, trial: int, accuracy: float, best: float) -> None:
        self.clock.tick(f"log_dev {trial}")
        with self.lock:
            self.dev.append((trial, accuracy, best))

    def dev_steps(self) -> set[int]:
        with self.lock:
            return {trial for trial, _, _ in self.dev}

    def log_targets(self, targeting: Targeting) -> None:
        self.clock.tick("log_targets")
        self.targets.append(targeting)

    @contextmanager
    def open_trial(self, trial: int, tags: Mapping[str, str] | None) -> Iterator[str]:
        self.clock.tick(f"open_trial {trial}")
        with self.lock:
            self._ids += 1
            run_id = f"child-{self._ids}"
            self.children[run_id] = {"trial": trial, "status": "RUNNING", "tags": dict(tags or {})}
        try:
            yield run_id
        except BaseException:
            self.children[run_id]["status"] = "FAILED"
            raise
        self.children[run_id]["status"] = "FINISHED"

    def log_trial(
        self,
        trial: int,
        candidate: Candidate,
        evaluation: Evaluation,
        *,
        base: Candidate,
        diff: str,
    ) -> None:
        self.clock.tick(f"log_trial {trial}")
        with self.lock:
            run = next(
                r
                for r in self.children.values()
                if r["trial"] == trial and r["status"] == "RUNNING"
            )
            run |= {"candidate": candidate.digest(), "accuracy": evaluation.accuracy, "diff": diff}

    def discard_trial(self, trial: int) -> None:
        self.clock.tick(f"discard_trial {trial}")
        for run_id in [i for i, r in self.children.items() if r["trial"] == trial]:
            del self.children[run_id]
        self.discarded.append(trial)

    def log_summary(self, summary: Summary) -> None:
        self.clock.tick("log_summary")
        self.summary = summary

    def register(self, texts: Mapping[str, str], *, promote: bool, message: str) -> dict[str, Any]:
        """As ``prompt_registry.register_prompts``: a version this run registered with the same
        text is reused."""
        self.clock.tick("register")
        if not self.registered or self.registered[-1][0] != dict(texts):
            self.registered.append((dict(texts), promote))
        return {
            site: {"name": f"optloop.{site}", "version": len(self.registered), "champion": promote}
            for site in texts
        }

    def tag_result(self, promoted: bool, reason: str, note: str) -> None:
        self.clock.tick("tag_result")
        self.tags = {"promoted": promoted, "reason": reason, "note": note}

    def trials(self) -> list[int]:
        return sorted(r["trial"] for r in self.children.values())


class Run:
    """One process's run of the controller on the checkpoint at ``path`` (loaded if it exists)."""

    def __init__(
        self,
        path: Path,
        sink: MemorySink,
        clock: Clock,
        *,
        budget: int = 5,
        promote_if: str = "ci",
        optimizer: type[FakeOptimizer] = FakeOptimizer,
        fail_at: int | None = None,
        coordinator: Any = None,
        test: Mapping[tuple[str, str], int] | None = None,
        prefix: str = "",
        batch: int = 1,
        control: bool = True,
        race: bool = True,
        stall: int = 2,
    ):
        self.config = LoopConfig(
            system="fake",
            run_name="r",
            budget=budget,
            optimizer="edit",
            promote_if=promote_if,
            batch=batch,
            control=control,
            race=race,
            stall=stall,
        )
        ckpt = (
            Checkpoint.load(path)
            if path.exists()
            else Checkpoint(config_digest=self.config.digest(), parent_run_id="parent")
        )
        if not path.exists():
            ckpt.save(
                path
            )  # as Loop does, before the controller starts (the worker id, the parent run)
        self.clock = clock
        self.meter = Meter()  # this process's own accounting
        self.evaluator = FakeEvaluator(clock, test, self.meter)
        self.optimizers: list[FakeOptimizer] = []
        self.messages: list[str] = []
        self.lines: list[TrialLine] = []
        context = RunContext(
            config=self.config,
            checkpoint=ckpt,
            path=path,
            base=BASE,
            progress=self.messages.append,
            cost=self.meter.cost,
            trial_done=self.lines.append,
        )
        original_save = context.save

        def save() -> None:
            clock.tick("save")
            original_save()

        context.save = save  # type: ignore[method-assign]
        self.context = context

        def make(sites: list[str], knobs: list[str]) -> FakeOptimizer:
            self.optimizers.append(
                optimizer(sites, knobs, clock, fail_at=fail_at, prefix=prefix, meter=self.meter)
            )
            return self.optimizers[-1]

        self.controller = Controller(
            context, self.evaluator, sink, coordinator or LocalCoordinator(budget), make
        )

    @property
    def optimizer(self) -> FakeOptimizer:
        return self.optimizers[-1]

    def run(self) -> LoopResult:
        return self.controller.run()


ONE_TRIAL = EVALUATION_CALLS + PROPOSAL_CALLS  # what one redone trial costs at most


def without_cost(result: LoopResult) -> LoopResult:
    """``result`` with its cost left out (a resumed run's cost differs by the work it redid)."""
    return result.model_copy(update={"cost": {}})


def uninterrupted(tmp_path: Path, **kwargs: Any) -> tuple[LoopResult, Run, MemorySink]:
    sink = MemorySink(Clock())
    run = Run(tmp_path / "clean.json", sink, sink.clock, **kwargs)
    return run.run(), run, sink


def trials_of(path: Path) -> list[tuple[int, str, float, bool]]:
    ckpt = Checkpoint.load(path)
    return [
        (t.trial, t.candidate.digest(), t.evaluation.accuracy, t.improved)
        for t in ckpt.trials
        if t.evaluation
    ]


# --- the budget ----------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 2, 5])
def test_the_budget_is_exact(tmp_path, budget):
    result, run, sink = uninterrupted(tmp_path, budget=budget)
    dev_calls = [c for c in run.evaluator.calls if c[0] == "dev"]
    assert len(dev_calls) == budget + 2  # the baseline, the control, then one per trial
    assert result.evaluations == budget and [t.trial for t in result.tried] == list(
        range(1, budget + 1)
    )
    assert sink.trials() == list(range(1, budget + 1))
    assert [p[0] for p in sink.dev] == list(range(budget + 1))
    assert len({d for _, d in dev_calls}) == budget + 2  # no candidate evaluated twice
    assert Checkpoint.load(tmp_path / "clean.json").finished


def test_the_run_follows_the_script(tmp_path):
    result, run, sink = uninterrupted(tmp_path)
    assert [round(t.dev, 2) for t in result.tried] == [0.25, 0.5, 0.75, 0.5, 0.25]
    assert result.best_trial == 3 and result.best_dev == 0.75 and result.baseline_dev == 0.25
    assert result.targets == [ANSWER] and result.tunable_sites == [ANSWER]
    assert result.changed_sites == [ANSWER, EXTRACT]
    assert result.test_before == 0.25 and result.test_after == pytest.approx(20 / 24)
    assert [p[2] for p in sink.dev] == [0.25, 0.25, 0.5, 0.75, 0.75, 0.75]  # best so far
    # 11 evaluations (train, dev, the control on dev, 5 trials, test before, after and the
    # control) and 5 proposals, in one process
    assert result.cost == {
        "llm_calls": 11 * EVALUATION_CALLS + 5 * PROPOSAL_CALLS,
        "tokens": 11500,
        "processes": 1,
    }
    assert Checkpoint.load(tmp_path / "clean.json").total_cost() == result.cost
    assert "answer:2" in result.prompt_diff and "mem.extract:1" in result.prompt_diff
    assert (
        sink.summary is not None
        and sink.summary.evaluations == 5
        and sink.summary.best_curve[-1] == 0.75
    )


# --- retargeting ---------------------------------------------------------------------------------


def test_the_optimizer_is_retargeted_when_the_blame_moves_and_only_then(tmp_path):
    result, run, _ = uninterrupted(tmp_path)
    assert run.optimizer.retargets == [
        ([EXTRACT], [])
    ]  # trial 2 moved the blame; trial 3 improved, blame stayed
    assert "re-attribution: blame moved to mem.extract" in run.messages
    assert run.optimizer.observed == [1, 2, 3, 4, 5]


def test_a_resumed_optimizer_is_retargeted_on_the_best_so_far(tmp_path):
    path, sink = tmp_path / "ckpt.json", MemorySink(Clock())
    with pytest.raises(
        Killed
    ):  # both trials done (trial 2 moved the blame), killed in the held-out test
        Run(path, sink, Clock(kill_on="evaluate test"), budget=2).run()
    again = Run(path, sink, Clock(), budget=2)
    again.run()
    assert again.optimizer.retargets == [
        ([EXTRACT], [])
    ]  # from the checkpoint's best, before any proposal
    assert again.optimizer.proposals == 0


# --- promotion -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule, test_after, promoted, why",
    [
        ("ci", 20, True, "its 95% CI is above 0, champion moved (--promote-if ci)"),
        ("ci", 8, False, "its 95% CI includes 0, champion not moved (--promote-if ci)"),
        (
            "delta",
            8,
            True,
            "the point delta is above 0 (its 95% CI includes 0), champion moved "
            "(--promote-if delta)",
        ),
        ("delta", 6, False, "the point delta is not above 0"),
    ],
)
def test_promotion_follows_the_rule(tmp_path, rule, test_after, promoted, why):
    result, _, sink = uninterrupted(
        tmp_path,
        promote_if=rule,
        test={("seed answer", "seed extract"): 6, ("answer:2", "mem.extract:1"): test_after},
    )
    assert result.promoted is promoted and why in result.promotion_reason
    assert sink.registered == [
        ({ANSWER: "answer:2", EXTRACT: "mem.extract:1"}, promoted)
    ]  # registered either way
    assert sink.tags["promoted"] is promoted and sink.tags["reason"] == result.promotion_reason
    assert all(r["champion"] is promoted for r in result.registered.values())


def test_nothing_is_registered_or_promoted_when_the_baseline_stays_best(tmp_path):
    result, _, sink = uninterrupted(tmp_path, budget=1)  # trial 1 ties the baseline: not better
    assert result.best_trial == 0 and not result.changed_sites and not result.promoted
    assert "baseline stayed best" in result.promotion_reason
    assert sink.registered == [] and result.registered == {}
    assert result.test_after == result.test_before


# --- proposals that fail -------------------------------------------------------------------------


def test_an_optimizer_with_nothing_to_propose_ends_the_run_cleanly(tmp_path):
    result, run, sink = uninterrupted(tmp_path, optimizer=NothingOptimizer)
    assert result.evaluations == 0 and result.tried == [] and sink.trials() == []
    assert (
        "fake proposed nothing new after 0 evaluation(s)" in result.note
        and "by this worker" not in result.note
    )
    assert (
        "fake proposed nothing new after 0 evaluation(s): the rest of the budget is left unspent"
        in run.messages
    )  # said when it happens, in the progress (and so in run.log)
    assert result.test_before == result.test_after and not result.promoted
    # the baseline, the control on dev, the start program and the control on test
    assert [c[0] for c in run.evaluator.calls] == ["train", "dev", "dev", "test", "test"]
    assert Checkpoint.load(tmp_path / "clean.json").finished


def test_a_proposal_that_raises_stops_the_run_with_nothing_half_done_and_a_rerun_finishes_it(
    tmp_path,
):
    path, sink = tmp_path / "ckpt.json", MemorySink(Clock())
    with pytest.raises(RuntimeError, match="the optimizer failed"):
        Run(path, sink, Clock(), fail_at=2).run()
    ckpt = Checkpoint.load(path)
    assert [t.trial for t in ckpt.trials] == [1] and ckpt.trials[0].evaluation is not None
    assert (
        not ckpt.finished
        and ckpt.test_before is None
        and sink.trials() == [1]
        and sink.summary is None
    )
    spent = Checkpoint.load(path).spending
    assert spent == {
        "llm_calls": 4 * EVALUATION_CALLS + PROPOSAL_CALLS,
        "tokens": 4100,
    }  # kept when it stopped: the baseline, the control on dev, trial 1
    result = Run(path, sink, Clock()).run()
    clean, _, _ = uninterrupted(tmp_path)
    assert without_cost(result) == without_cost(clean)
    assert result.cost == clean.cost | {
        "processes": 2
    }  # nothing was redone: the same cost, over two processes
    assert sink.trials() == [1, 2, 3, 4, 5] and sink.discarded == []


# --- resume after a kill at every step -----------------------------------------------------------


def steps_of_a_clean_run(tmp_path: Path, batch: int = 1) -> list[str]:
    clock = Clock()
    Run(tmp_path / f"count-{batch}.json", MemorySink(clock), clock, batch=batch).run()
    return clock.steps


@pytest.mark.parametrize("batch", [1, 2])
def test_resume_after_a_kill_at_any_step_equals_an_uninterrupted_run(tmp_path, batch):
    clean, _, clean_sink = uninterrupted(tmp_path, batch=batch)
    clean_trials = trials_of(tmp_path / "clean.json")
    steps = steps_of_a_clean_run(tmp_path, batch)
    assert len(steps) > 40
    for k in range(1, len(steps) + 1):
        path = tmp_path / f"kill-{k}.json"
        clock = Clock(kill_at=k)
        sink = MemorySink(clock)
        with pytest.raises(Killed):
            Run(path, sink, clock, batch=batch).run()
        sink.clock = Clock()
        resumed = Run(path, sink, sink.clock, batch=batch)
        result = resumed.run()
        where = f"killed at step {k} ({steps[k - 1]})"
        assert without_cost(result) == without_cost(clean), where
        extra = result.cost["llm_calls"] - clean.cost["llm_calls"]
        # a kill mid-batch redoes the batch's evaluations (and the proposals of the step it
        # stopped)
        bound = batch * EVALUATION_CALLS + batch * PROPOSAL_CALLS
        assert 0 <= extra <= bound and result.cost["processes"] == 2, (
            where,
            result.cost,
            clean.cost,
        )
        assert sorted(sink.dev_steps()) == [0, 1, 2, 3, 4, 5], (
            where
        )  # every acc_dev point, none lost to the kill
        assert trials_of(path) == clean_trials, where
        assert sink.trials() == [1, 2, 3, 4, 5], (
            where
        )  # one record per trial: a half-done one was discarded
        assert all(
            r["status"] == "FINISHED" and "accuracy" in r for r in sink.children.values()
        ), where
        assert len({p[0] for p in sink.dev}) == len(sink.dev), (
            where
        )  # no trial's point logged twice
        assert len(sink.registered) == 1, where  # registered once, even when killed just after
        dev_calls = [c for c in resumed.evaluator.calls if c[0] == "dev"]
        assert len(set(dev_calls)) == len(dev_calls), where
        assert Checkpoint.load(path).finished, where


def test_a_checkpoint_saved_without_the_round_count_resumes_at_the_round_its_trials_name(
    tmp_path,
):
    """A checkpoint from before optloop kept ``rounds`` reads the count from its trials' origins,
    so the resumed optimizer goes on to the next round instead of making the first one again."""
    clean, _, _ = uninterrupted(tmp_path)
    path, clock = tmp_path / "old.json", Clock(kill_on="log_dev 2")
    with pytest.raises(Killed):
        Run(path, MemorySink(clock), clock).run()
    saved = json.loads(path.read_text())
    assert saved.pop("rounds") == 1  # trials 1 and 2 were round 1's
    path.write_text(json.dumps(saved))
    old = Checkpoint.load(path)
    assert old.rounds is None and old.optimizer_rounds() == 1
    sink = MemorySink(Clock())
    assert without_cost(Run(path, sink, sink.clock).run()) == without_cost(clean)


# --- batches -------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch, sizes", [(2, [2, 2, 1]), (3, [2, 2, 1]), (5, [2, 2, 1])])
def test_a_batch_is_one_round_evaluated_at_once_and_the_budget_stays_exact(tmp_path, batch, sizes):
    """The fake optimizer's rounds make two candidates: a batch never asks for a second round
    before the first's results are observed, and never takes more trials than the budget leaves."""
    result, run, sink = uninterrupted(tmp_path, batch=batch)
    assert [t.trial for t in result.tried] == [1, 2, 3, 4, 5] and sink.trials() == [1, 2, 3, 4, 5]
    assert run.evaluator.batches == [s for s in sizes if s > 1]
    assert run.optimizer.observed == [1, 2, 3, 4, 5]
    assert [p[0] for p in sink.dev] == [0, 1, 2, 3, 4, 5]
    dev_calls = [c for c in run.evaluator.calls if c[0] == "dev"]  # the control's included
    assert len(dev_calls) == 7 and len(set(dev_calls)) == 7


def test_a_batched_run_is_deterministic_for_its_seed_and_batch_size(tmp_path):
    first, _, _ = uninterrupted(tmp_path / "a", batch=2)
    again, _, _ = uninterrupted(tmp_path / "b", batch=2)
    assert first == again
    assert [t.dev for t in first.tried] == [
        0.25,
        0.5,
        0.75,
        0.5,
        0.25,
    ]  # this script's order survives batches


def test_every_trial_reports_a_line_with_an_eta(tmp_path):
    from optloop.loop.spending.eta import Eta

    clock, sink = Clock(), MemorySink(Clock())
    run = Run(tmp_path / "eta.json", sink, clock, batch=2)
    run.context.baseline_done = lambda ckpt: Eta(5, trial_s=60.0, test_s=30.0)
    run.run()
    assert [line.trial for line in run.lines] == [1, 2, 3, 4, 5]
    assert all(line.eta_s is not None and line.eta_s >= 30.0 for line in run.lines)
    assert run.lines[-1].eta_s == pytest.approx(30.0)  # only the held-out test is left
    assert run.lines[2].text().startswith("trial 3/5 dev 0.750 (best 0.750) ")
    assert any("ETA" in m for m in run.messages if m.startswith("trial "))


def test_a_finished_checkpoint_is_not_run_again(tmp_path):
    _, _, sink = uninterrupted(tmp_path)
    rerun = Run(tmp_path / "clean.json", sink, Clock())
    assert (
        rerun.context.checkpoint.finished
    )  # Loop refuses such a run before the controller starts


# --- several workers: the shared coordinator on a SQLite study -----------------------------------


def test_two_workers_split_the_budget_through_a_shared_study(tmp_path):
    config = LoopConfig(system="fake", run_name="shared", budget=4, optimizer="optuna")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    coordinators = [SharedCoordinator.join(config, storage, worker=f"w{i}") for i in range(2)]
    for c in coordinators:
        c.study.poll = 0.05
    sink = MemorySink(Clock())
    runs = [
        Run(
            tmp_path / f"w{i}.json",
            sink,
            Clock(),
            budget=4,
            coordinator=coordinators[i],
            prefix=f"w{i}-",
        )
        for i in range(2)
    ]
    results: dict[int, LoopResult] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = runs[i].run()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for c in coordinators:
            c.close()
    assert not errors, errors
    assert results[0] == results[1] and results[0].evaluations == 4
    assert sink.trials() == [1, 2, 3, 4]  # every slot once, none beyond the budget
    assert len({r["candidate"] for r in sink.children.values()}) == 4
    assert [c[0] for c in runs[1].evaluator.calls].count(
        "train"
    ) == 0  # the leader evaluated the baseline once
    assert len(sink.targets) == 1  # the run-level blame is recorded once, by the leader
    assert {r["tags"]["optloop.worker"].split(":")[0] for r in sink.children.values()} <= {
        "0",
        "1",
    }
    assert all(Checkpoint.load(tmp_path / f"w{i}.json").finished for i in range(2))
    assert len(sink.registered) <= 1
    # the control: on dev by the leader (w0) once, handed over; on test once, by the finisher
    assert ("dev", control_digest()) in runs[0].evaluator.calls
    assert ("dev", control_digest()) not in runs[1].evaluator.calls
    on_test = [c for run in runs for c in run.evaluator.calls if c == ("test", control_digest())]
    assert len(on_test) == 1 and results[0].control_dev == 0.25
    assert results[0].beats_control is False  # the workers' candidates score as the control does


def test_a_baseline_that_answers_no_dev_question_is_said_before_the_budget_is_spent(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(DEV, ("seed answer", "seed extract"), (0, ANSWER))
    result, run, _ = uninterrupted(tmp_path)
    floor = (
        "the baseline answered none of the 4 dev questions (0 of 4 train): a candidate wins only "
        "by making some pass, so the budget may buy nothing; check the model (optloop doctor, "
        "--lm) and that --dataset suits --system"
    )
    assert run.messages.index(floor) < next(
        i for i, m in enumerate(run.messages) if "trial" in m
    )  # in the progress (and so run.log) before the first trial
    assert floor in result.note  # and in the final note, with the MLflow run


def test_a_baseline_that_answers_some_dev_question_says_nothing_of_it(tmp_path):
    result, run, _ = uninterrupted(tmp_path)
    assert not any("answered none" in m for m in run.messages + [result.note])


# --- the trivial-instruction control -------------------------------------------------------------

CONTROL_KEY = ("trivial answer", "seed extract")  # the start program, answer's trivial instruction


def control_calls(run: Run) -> list[str]:
    """The splits the control was evaluated on, in order."""
    control = next(
        (d for s, d in run.evaluator.calls if s == "dev" and d == control_digest()), None
    )
    return [s for s, d in run.evaluator.calls if d == control] if control else []


def control_digest() -> str:
    sites = {**BASE.sites, ANSWER: SiteState(instructions="trivial answer")}
    return BASE.model_copy(update={"sites": sites}).digest()


def test_the_control_is_evaluated_once_on_dev_before_the_trials_and_once_on_test(tmp_path):
    result, run, sink = uninterrupted(tmp_path)
    assert control_calls(run) == ["dev", "test"]
    first_trial = run.clock.steps.index("propose")
    assert run.clock.steps.index(f"evaluate dev {CONTROL_KEY}") < first_trial
    assert run.clock.steps.index(f"evaluate test {CONTROL_KEY}") > first_trial
    assert result.control_sites == [ANSWER] and result.control_note == ""
    assert result.control_dev == 0.25 and result.test_control == 0.25  # the script's defaults
    assert result.delta_control_ci is not None and result.delta_control_ci.estimate == (
        pytest.approx(20 / 24 - 6 / 24)
    )
    assert result.beats_control is True and "trivial instruction" not in result.note
    ckpt = Checkpoint.load(tmp_path / "clean.json")
    assert ckpt.control_dev is not None and ckpt.control_dev.candidate == control_digest()
    assert ckpt.control_test is not None and ckpt.control_test.split == "test"
    assert sink.summary is not None
    rows = {r.program: r for r in sink.summary.comparison.rows}
    assert [r.program for r in sink.summary.comparison.rows] == ["own", "control", "best"]
    assert rows["control"].test is not None and rows["control"].test.n == 24
    assert [d.against for d in sink.summary.comparison.differences] == ["own", "control"]
    assert sink.summary.texts_control[ANSWER] == "trivial answer"
    assert (
        "control (the trivial instruction at answer): dev 0.250, the start program 0.250"
        in run.messages
    )  # said before the trials (the console and run.log)
    assert result.promoted  # the promotion rule is against the start program, as before


def test_the_note_says_plainly_when_the_loop_does_not_beat_the_control(tmp_path):
    test = {**TEST, CONTROL_KEY: 20}  # the trivial instruction does as well as the loop's best
    result, _, sink = uninterrupted(tmp_path, test=test)
    assert result.beats_control is False and result.test_control == pytest.approx(20 / 24)
    assert result.delta_control_ci is not None and result.delta_control_ci.estimate == 0
    assert (
        "the loop's prompt does not measurably beat the trivial instruction: loop \u2212 control "
        "on test +0.000 [+0.000, +0.000] (n=24) (no measurable change)" in result.note
    )
    assert sink.tags["note"] == result.note
    # the champion still moves on the gain over the start program
    assert result.promoted and "its 95% CI is above 0" in result.promotion_reason


def test_no_control_skips_it_and_the_report_says_what_it_cannot_tell(tmp_path):
    from optloop.loop.policy import NO_CONTROL

    result, run, sink = uninterrupted(tmp_path, control=False)
    assert control_calls(run) == [] and not any("trivial" in d for _, d in run.evaluator.calls)
    assert [c[0] for c in run.evaluator.calls].count("dev") == 6  # the baseline and 5 trials
    assert result.cost["llm_calls"] == 9 * EVALUATION_CALLS + 5 * PROPOSAL_CALLS
    assert result.control_sites == [] and result.control_note == NO_CONTROL
    assert result.control_dev is None and result.test_control_ci is None
    assert result.beats_control is None and "trivial instruction" not in result.note
    assert sink.summary is not None and sink.summary.comparison.beats_control is None
    ckpt = Checkpoint.load(tmp_path / "clean.json")
    assert ckpt.control_dev is None and ckpt.control_test is None


def test_there_is_no_control_when_only_knobs_are_blamed(tmp_path, monkeypatch):
    monkeypatch.setitem(DEV, ("seed answer", "seed extract"), (1, "knob:top_k"))
    result, run, _ = uninterrupted(tmp_path)
    assert result.tunable_sites == [ANSWER] and result.targets == ["knob:top_k"]
    assert control_calls(run) == [] and result.control_sites == []
    assert result.control_note == (
        "none: the blame names no prompt site (only knob:top_k), so there is no prompt to "
        "replace with the trivial instruction"
    )
    assert f"control: {result.control_note}" in result.note  # said in the final note
    assert f"control: {result.control_note}" in run.messages  # and before the trials
    assert result.beats_control is None


def test_a_control_that_is_the_start_program_takes_its_evaluations(tmp_path, monkeypatch):
    """Start instructions that already are the trivial ones: nothing is evaluated twice."""
    monkeypatch.setattr(FakeEvaluator, "trivial_instruction", lambda self, site: "seed answer")
    result, run, _ = uninterrupted(tmp_path)
    assert [c[0] for c in run.evaluator.calls].count("dev") == 6  # the baseline and 5 trials
    assert [c[0] for c in run.evaluator.calls].count("test") == 2  # before and after
    assert result.control_dev == result.baseline_dev and result.test_control == result.test_before
    assert result.delta_control_ci == result.delta_test_ci


@pytest.mark.parametrize(
    "kill",
    [
        {"kill_on": f"evaluate dev {CONTROL_KEY}"},  # during the control on dev
        {"kill_after": f"evaluate dev {CONTROL_KEY}"},  # evaluated, not yet checkpointed
        {"kill_on": "open_trial 1"},  # the control on dev checkpointed
        {"kill_on": f"evaluate test {CONTROL_KEY}"},  # during the control on test
        {"kill_after": f"evaluate test {CONTROL_KEY}"},  # evaluated, not yet checkpointed
        {"kill_on": "log_summary"},  # the control on test checkpointed
    ],
    ids=lambda kill: next(iter(kill.values())) + f" ({next(iter(kill))})",
)
def test_a_kill_around_the_control_resumes_without_evaluating_it_again(tmp_path, kill):
    clean, _, _ = uninterrupted(tmp_path)
    path, sink = tmp_path / "killed.json", MemorySink(Clock(**kill))
    with pytest.raises(Killed):
        Run(path, sink, sink.clock).run()
    done = Checkpoint.load(path)
    sink.clock = Clock()
    resumed = Run(path, sink, sink.clock)
    result = resumed.run()
    assert without_cost(result) == without_cost(clean)
    again = [s for s, d in resumed.evaluator.calls if d == control_digest()]
    # what the checkpoint held is read back; only an evaluation the kill cut short is redone
    assert again == [
        split
        for split, saved in (("dev", done.control_dev), ("test", done.control_test))
        if saved is None
    ]
    assert result.cost["llm_calls"] - clean.cost["llm_calls"] <= EVALUATION_CALLS
