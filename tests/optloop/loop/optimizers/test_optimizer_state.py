"""SIMBA and GEPA keep their state across the loop's rounds, and across a resume (no model:
scripted LMs).

The toy system has one prompt site, ``answer``. Its scripted LM answers right one time in three,
two times in three once the instruction carries SIMBA's advice (``SAY-PARIS``), and always under an
instruction GEPA's reflection wrote. Every piece of advice and every instruction the proposer
writes is numbered, so a program can be traced to the round that made it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dspy
import pytest
from dspy.utils import DummyLM

from optloop.datasets import Dataset, Episode, Question, Session, Turn
from optloop.loop.candidate import Candidate, SiteState, apply_state
from optloop.loop.evaluate import Evaluation
from optloop.loop.optimizers.gepa import GepaOptimizer
from optloop.loop.optimizers.simba import SimbaOptimizer
from optloop.loop.program import MemoryProgram, running
from optloop.pipeline import QuestionOutcome

START = "Answer the question with one word."
ADVICE = "SAY-PARIS"
REFLECTED = "Reflected instruction"


class ScriptLM(DummyLM):
    """A DummyLM whose reply is ``reply(messages)``: a dict of output fields (rendered as JSON)."""

    def __init__(self, reply: Callable[[list[dict[str, Any]]], dict[str, Any]]):
        super().__init__([], follow_examples=True, adapter=dspy.JSONAdapter())
        self.reply = reply

    def _use_example(self, messages: list[dict[str, Any]]) -> str:
        return self._format_answer_fields(self.reply(messages))


def system_lm() -> ScriptLM:
    calls = itertools.count()

    def reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
        n, system = next(calls), messages[0]["content"]
        right = True if REFLECTED in system else n % 3 != 0 if ADVICE in system else n % 3 == 0
        return {"answer": "Paris" if right else "Rome"}

    return ScriptLM(reply)


def proposer_lm() -> ScriptLM:
    calls = itertools.count(1)

    def reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
        n, system = next(calls), messages[0]["content"]
        if "examples_with_feedback" in system:  # GEPA's reflection
            return {
                "new_instruction": f"{START} {REFLECTED} #{n}: the capital asked about is Paris."
            }
        if "new_instruction" in system:  # optloop's own rewrite, when a round made nothing
            return {"new_instruction": f"{START} Rewrite #{n}."}
        return {
            "discussion": "the answer module guessed",
            "answer": f"{ADVICE} (advice #{n}): answer Paris.",
        }

    return ScriptLM(reply)


class ToyEvaluator:
    """What a :class:`MemoryProgram` and the optimizers ask of an evaluator, for a one-site
    system."""

    def __init__(self, work: Path, dataset: Dataset):
        self.lm = system_lm()
        self.work = work
        self.questions = {(e.id, q.id): (e, q) for e in dataset.episodes for q in e.questions}
        self.ran: list[str] = []  # the answer instruction of every question asked

    def lookup(self, episode_id: str, question_id: str) -> tuple[Episode, Question]:
        return self.questions[(episode_id, question_id)]

    def modules(self, candidate: Candidate) -> dict[str, dspy.Predict]:
        module = dspy.Predict("question -> answer")
        apply_state(module, candidate.sites["answer"])
        return {"answer": module}

    def store(self, candidate: Candidate, episode: Episode, modules: Any) -> tuple[None, bool]:
        return None, True

    def ask(
        self,
        store: None,
        candidate: Candidate,
        modules: dict[str, dspy.Predict],
        episode: Episode,
        question: Question,
    ) -> QuestionOutcome:
        module = modules["answer"]
        self.ran.append(module.signature.instructions)
        with dspy.context(lm=self.lm, adapter=dspy.JSONAdapter()):
            answer = module(question=question.question).answer
        ok = answer == question.gold
        return QuestionOutcome(
            episode_id=episode.id,
            question_id=question.id,
            task_type="t",
            question=question.question,
            gold=question.gold,
            prediction=answer,
            score=float(ok),
            passed=ok,
        )


def _dataset(n: int = 4) -> Dataset:
    episodes = [
        Episode(
            id=f"e{i}",
            sessions=[Session(id=f"s{i}", turns=[Turn(id=f"t{i}", role="user", content="hi")])],
            questions=[
                Question(
                    id=f"q{i}",
                    question=f"Capital of France? ({i})",
                    gold="Paris",
                    task_type="t",
                    scorer="exact",
                )
            ],
        )
        for i in range(n)
    ]
    return Dataset(name="toy", uri="toy", episodes=episodes)


START_CANDIDATE = Candidate(sites={"answer": SiteState(instructions=START)})
NO_EVAL = Evaluation(split="dev", candidate=START_CANDIDATE.digest(), outcomes=[])


@pytest.fixture()
def toy(tmp_path: Path) -> tuple[ToyEvaluator, Dataset]:
    dataset = _dataset()
    return ToyEvaluator(tmp_path / "work", dataset), dataset


def test_a_program_is_data_and_runs_on_the_evaluator_it_is_lent(toy):
    evaluator, dataset = toy
    program = MemoryProgram(START_CANDIDATE, ["answer"], evaluator.modules(START_CANDIDATE))
    copy = program.deepcopy()  # no live object inside: an ordinary deep copy
    assert copy.candidate("x") == program.candidate("x") and copy.answer is not program.answer
    example = dspy.Example(episode_id="e0", question_id="q0", question="?").with_inputs(
        "episode_id", "question_id", "question"
    )
    with pytest.raises(RuntimeError, match="running"):
        program(**example.inputs())
    with running(evaluator):
        prediction = program(**example.inputs())
    assert prediction.answer in ("Paris", "Rome") and evaluator.ran == [START]


def test_simba_second_round_samples_the_pool_the_first_round_left(toy):
    evaluator, dataset = toy
    proposer = proposer_lm()  # one numbering: round 2's advice never repeats round 1's
    kwargs = {"sites": ["answer"], "seed": 0, "bsize": 4, "num_candidates": 2, "max_demos": 0}
    first = SimbaOptimizer(evaluator, proposer, dataset, **kwargs)
    proposed = first.propose(START_CANDIDATE, NO_EVAL)
    assert proposed is not None and ADVICE in proposed.sites["answer"].instructions
    winner = proposed.sites["answer"].instructions
    pool_file = first.work / "pool.json"
    state = json.loads(pool_file.read_text())
    assert state["steps"] == 1 and state["position"] == 4
    assert winner in [e["candidate"]["sites"]["answer"]["instructions"] for e in state["entries"]]

    # A resumed run: a new optimizer on the same work directory goes on from the saved pool.
    evaluator.ran.clear()
    second = SimbaOptimizer(evaluator, proposer, dataset, **kwargs)
    second.mark_seen(START_CANDIDATE)
    second.mark_seen(proposed)
    again = second.propose(START_CANDIDATE, NO_EVAL)
    assert (
        second.pool.state.steps == 2 and again is not None and again.digest() != proposed.digest()
    )
    kept = len(first.pool.entries)
    assert [e.candidate for e in second.pool.entries[:kept]] == [
        e.candidate for e in first.pool.entries
    ]
    assert (
        winner in evaluator.ran
    )  # round 2 ran round 1's winner: drawn from the pool, not from the start alone
    made = [e.candidate.sites["answer"].instructions for e in second.pool.entries[kept:]]
    assert any(t.startswith(winner) and t.count(ADVICE) == 2 for t in made), (
        made
    )  # built on round 1's winner


def test_simba_rounds_of_one_optimizer_share_one_pool(toy):
    evaluator, dataset = toy
    optimizer = SimbaOptimizer(
        evaluator,
        proposer_lm(),
        dataset,
        sites=["answer"],
        seed=0,
        bsize=2,
        num_candidates=2,
        max_demos=0,
    )
    optimizer.propose(START_CANDIDATE, NO_EVAL)
    optimizer.queue.clear()
    after_one = [e.candidate.digest() for e in optimizer.pool.entries]
    optimizer.propose(START_CANDIDATE, NO_EVAL)
    assert (
        optimizer.pool.state.steps == 2 and optimizer.pool.state.position == 4
    )  # the shuffle walked on
    assert [e.candidate.digest() for e in optimizer.pool.entries][: len(after_one)] == after_one


def test_gepa_second_round_resumes_the_first_rounds_run(toy):
    evaluator, dataset = toy
    proposer = (
        proposer_lm()
    )  # one numbering: a GEPA run started again would write instruction #2, not reuse #1
    kwargs = {"sites": ["answer"], "seed": 0, "metric_calls": 12}
    first = GepaOptimizer(evaluator, proposer, dataset, **kwargs)
    proposed = first.propose(START_CANDIDATE, NO_EVAL)
    assert proposed is not None and REFLECTED in proposed.sites["answer"].instructions
    log_dir = first.log_dir()
    assert log_dir.parent == first.work and (log_dir / "gepa_state.bin").exists()
    assert json.loads((log_dir / "optloop.json").read_text()) == {"metric_calls": 12, "rounds": 1}
    candidates_one = json.loads((log_dir / "candidates.json").read_text())
    iterations_one = [entry["i"] for entry in json.loads((log_dir / "run_log.json").read_text())]

    # A resumed run: a new optimizer picks up the same GEPA run, with the budget of two rounds.
    second = GepaOptimizer(evaluator, proposer, dataset, **kwargs)
    with running(evaluator):
        carried = second.round(START_CANDIDATE)
    assert proposed.digest() in {
        c.digest() for c in carried
    }  # round 1's candidate is on round 2's front
    assert json.loads((log_dir / "optloop.json").read_text()) == {"metric_calls": 24, "rounds": 2}
    candidates_two = json.loads((log_dir / "candidates.json").read_text())
    assert candidates_two[: len(candidates_one)] == candidates_one
    iterations_two = [entry["i"] for entry in json.loads((log_dir / "run_log.json").read_text())]
    assert iterations_two[: len(iterations_one)] == iterations_one and max(iterations_two) > max(
        iterations_one
    )

    # When the resumed run has nothing this optimizer has not proposed, the proposer rewrites the
    # instruction.
    for c in [START_CANDIDATE, *carried]:
        second.mark_seen(c)
    rewrite = second.propose(START_CANDIDATE, NO_EVAL)
    assert rewrite is not None and "Rewrite #" in rewrite.sites["answer"].instructions
    assert rewrite.origin.endswith("(proposer rewrite)")


def test_gepa_starts_another_run_when_the_targets_move(toy):
    evaluator, dataset = toy
    optimizer = GepaOptimizer(evaluator, proposer_lm(), dataset, sites=["answer"], seed=0)
    before = optimizer.log_dir()
    optimizer.retarget(["answer", "retrieve.query"])
    assert optimizer.log_dir() != before and optimizer.log_dir().parent == before.parent
    optimizer.retarget(
        ["retrieve.query", "answer"]
    )  # the same targets in another order: the same run
    assert (
        optimizer.log_dir()
        == GepaOptimizer(
            evaluator, proposer_lm(), dataset, sites=["answer", "retrieve.query"]
        ).log_dir()
    )


def test_a_simba_round_runs_programs_in_threads_on_the_real_evaluator(tmp_path):
    """rag_bm25 behind a scripted endpoint: the round runs its programs on the endpoint's
    --concurrency threads (8 by default), each recording into its own recorder over the shared
    stores, and its winner carries the advice."""
    import threading
    import time

    from optloop.datasets import load_dataset
    from optloop.embed import get_embedder
    from optloop.lm import LMSettings, OptloopLM
    from optloop.loop.evaluate import Evaluator
    from optloop.testing.scripted import ScriptedOpenAIServer

    dataset = load_dataset("builtin:tiny?limit=2")
    golds = {q.question: q.gold for e in dataset.episodes for q in e.questions}
    calls, in_flight, most = itertools.count(), [0], [0]
    lock = threading.Lock()

    def respond(body: dict[str, Any]) -> tuple[str, Any]:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            n = next(calls)
        time.sleep(0.02)  # long enough for the other threads' requests to overlap
        system = body["messages"][0]["content"]
        user = body["messages"][-1]["content"]
        if "discussion" in system:
            reply = {
                "discussion": "it guessed",
                "answer": f"{ADVICE} (advice #{n}): answer from the memories.",
            }
        else:
            gold = next((g for q, g in golds.items() if q in user), "?")
            right = n % 3 != 0 if ADVICE in system else n % 3 == 0
            reply = {"answer": gold if right else "I don't know"}
        with lock:
            in_flight[0] -= 1
        return "ok", json.dumps(reply)

    with ScriptedOpenAIServer([("respond", respond)]) as server:
        lm = OptloopLM(
            LMSettings.from_spec("openai:scripted", base_url=server.base_url, cache=False)
        )
        evaluator = Evaluator("rag_bm25", lm, tmp_path / "work", embedder=get_embedder("local"))
        evaluator.register(dataset)
        try:
            optimizer = SimbaOptimizer(
                evaluator, lm, dataset, sites=["answer"], seed=0, bsize=4, max_demos=0
            )
            assert (
                optimizer.num_threads == 8
            )  # an endpoint's --concurrency (8 by default), at least 4
            proposed = optimizer.propose(evaluator.baseline(), NO_EVAL)
        finally:
            evaluator.close()
    assert most[0] > 1  # programs ran at once
    assert proposed is not None and ADVICE in proposed.sites["answer"].instructions
    stores = sorted(
        p.relative_to(tmp_path / "work" / "stores")
        for p in (tmp_path / "work" / "stores").glob("*/*")
    )
    assert [s.name for s in stores] == sorted(
        e.id for e in dataset.episodes
    )  # one ingest key: one store an episode
