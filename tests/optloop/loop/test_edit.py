"""The GrIPS-style edit optimizer: phrase splitting, the edits it proposes, screening order (no model)."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils import DummyLM

from optloop.datasets import Dataset, Episode, Question, Session, Turn
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.edit import EditOptimizer, join, phrases
from optloop.loop.evaluate import Evaluation, QuestionOutcome

SABOTAGE = "Reply with exactly N/A."
CLEAN = "Answer the question from the memories. Give the shortest answer, a name or a number."


def test_phrases_split_sentences_then_clauses_and_join_back():
    text = "Answer the question.  Give the shortest answer, a name or a number; nothing else."
    parts = phrases(text)
    assert parts == ["Answer the question.", "Give the shortest answer,", "a name or a number;", "nothing else."]
    assert join(parts) == " ".join(text.split())


class FakeEvaluator:
    """Scores a candidate by whether its answer instruction still carries the sabotage (fewer passes with it)."""

    def __init__(self):
        self.sites = {"answer": _Site()}
        self.evaluated: list[str] = []

    def evaluate(self, candidate: Candidate, dataset: Dataset, *, split: str = "dev") -> Evaluation:
        text = candidate.sites["answer"].instructions
        self.evaluated.append(text)
        ok = SABOTAGE not in text
        outcomes = [QuestionOutcome(episode_id=e.id, question_id=q.id, task_type="t", question=q.question,
                                    gold=q.gold, prediction="", score=float(ok), passed=ok)
                    for e in dataset.episodes for q in e.questions]
        return Evaluation(split=split, candidate=candidate.digest(), outcomes=outcomes)

    def evaluate_many(self, candidates: list[Candidate], dataset: Dataset, *, split: str = "dev") -> list[Evaluation]:
        return [self.evaluate(c, dataset, split=split) for c in candidates]


class _Site:
    class _Module:
        signature = dspy.Signature("memories, question -> answer", CLEAN)

    module = _Module()


def _train(n: int = 4) -> Dataset:
    episodes = [Episode(id=f"e{i}", sessions=[Session(id=f"s{i}", turns=[Turn(id=f"t{i}", role="user", content="hi")])],
                        questions=[Question(id=f"q{i}", question="what?", gold="x", task_type="t", scorer="exact")]) for i in range(n)]
    return Dataset(name="toy", uri="toy", episodes=episodes)


@pytest.fixture()
def optimizer():
    lm = DummyLM([{"paraphrase": "Say only N/A."}] * 50)
    start = Candidate(sites={"answer": SiteState(instructions=f"{CLEAN} {SABOTAGE}")})
    opt = EditOptimizer(FakeEvaluator(), lm, _train(), sites=["answer"], seed=0, extra=3, bsize=3)
    return opt, start


def test_a_round_proposes_deletions_and_the_default_then_random_edits(optimizer):
    opt, start = optimizer
    opt.deletions = 10  # more than the phrases: every single-phrase deletion
    edits = opt.edits(start.sites["answer"].instructions, "answer")
    parts = phrases(start.sites["answer"].instructions)
    all_deletions = {join(parts[:i] + parts[i + 1:]) for i in range(len(parts))}
    assert {e.text for e in edits[: len(parts)]} == all_deletions
    default = edits[len(parts)]
    assert default.ops[0].startswith("del all") and default.text.startswith("Given the fields")  # DSPy's default
    assert len(edits) == len(parts) + 1 + 3
    opt.deletions = 2  # fewer than the phrases: that many, drawn at random
    fewer = opt.edits(start.sites["answer"].instructions, "answer")
    assert len(fewer) == 2 + 1 + 3 and {e.text for e in fewer[:2]} < all_deletions


def test_edits_are_screened_on_train_and_the_best_comes_first(optimizer):
    opt, start = optimizer
    first = opt.propose(start, Evaluation(split="dev", candidate=start.digest(), outcomes=[]))
    assert first is not None and SABOTAGE not in first.sites["answer"].instructions
    assert "edit round 1: answer" in first.origin
    assert len(opt.minibatch.questions()) == 3  # the seeded mini-batch, not the whole train split
    # every queued candidate is new, and none repeats the start
    queued = [first, *opt.queue]
    assert len({c.digest() for c in queued}) == len(queued) and start.digest() not in {c.digest() for c in queued}


def test_the_optimizer_never_reads_the_systems_own_instruction(optimizer):
    """It edits only what it starts from: the template's text (CLEAN here) never enters an edit on its own."""
    opt, _ = optimizer
    start = Candidate(sites={"answer": SiteState(instructions="Repeat the question. Do not answer it.")})
    opt.propose(start, Evaluation(split="dev", candidate=start.digest(), outcomes=[]))
    texts = [c.sites["answer"].instructions for c in opt.queue]
    assert texts and all(CLEAN not in t for t in texts)
