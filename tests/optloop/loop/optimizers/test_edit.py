"""The GrIPS-style edit optimizer: phrase splitting, the edits it proposes, screening order (no
model)."""

from __future__ import annotations

import dspy
import pytest
from dspy.utils import DummyLM

from optloop.attribution import Attribution, ErrorType
from optloop.datasets import Dataset, Episode, Question, Session, Turn
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.evaluate import Evaluation, QuestionOutcome
from optloop.loop.optimizers.edit import (
    LONG_WORDS,
    EditOptimizer,
    conditional,
    phrases,
    same_length,
    support,
)
from optloop.loop.proposals.units import Instruction, problems

SABOTAGE = "Reply with exactly N/A."
CLEAN = "Answer the question from the memories. Give the shortest answer, a name or a number."


def test_phrases_are_sentences_and_semicolon_clauses_as_written():
    text = "Answer the question.  Give the shortest answer, a name or a number; nothing else."
    assert phrases(text) == [
        "Answer the question.",
        "Give the shortest answer, a name or a number;",
        "nothing else.",
    ]
    assert Instruction.parse(text).text == text


class FakeEvaluator:
    """Scores a candidate by whether its answer instruction still carries the sabotage (fewer
    passes with it)."""

    def __init__(self):
        self.sites = {"answer": _Site()}
        self.evaluated: list[str] = []

    def evaluate(
        self, candidate: Candidate, dataset: Dataset, *, split: str = "dev"
    ) -> Evaluation:
        text = candidate.sites["answer"].instructions
        self.evaluated.append(text)
        ok = SABOTAGE not in text
        outcomes = [
            QuestionOutcome(
                episode_id=e.id,
                question_id=q.id,
                task_type="t",
                question=q.question,
                gold=q.gold,
                prediction="",
                score=float(ok),
                passed=ok,
            )
            for e in dataset.episodes
            for q in e.questions
        ]
        return Evaluation(split=split, candidate=candidate.digest(), outcomes=outcomes)

    def evaluate_many(
        self, candidates: list[Candidate], dataset: Dataset, *, split: str = "dev"
    ) -> list[Evaluation]:
        return [self.evaluate(c, dataset, split=split) for c in candidates]


class _Site:
    class _Module:
        signature = dspy.Signature("memories, question -> answer", CLEAN)

    module = _Module()


def _train(n: int = 4) -> Dataset:
    episodes = [
        Episode(
            id=f"e{i}",
            sessions=[Session(id=f"s{i}", turns=[Turn(id=f"t{i}", role="user", content="hi")])],
            questions=[
                Question(id=f"q{i}", question="what?", gold="x", task_type="t", scorer="exact")
            ],
        )
        for i in range(n)
    ]
    return Dataset(name="toy", uri="toy", episodes=episodes)


@pytest.fixture()
def optimizer():
    lm = DummyLM([{"paraphrase": "Say only N/A."}] * 50)
    start = Candidate(sites={"answer": SiteState(instructions=f"{CLEAN} {SABOTAGE}")})
    opt = EditOptimizer(
        FakeEvaluator(), lm, _train(), sites=["answer"], seed=0, extra=3, bsize=3, write=False
    )
    return opt, start


def test_a_round_proposes_deletions_and_the_default_then_random_edits(optimizer):
    opt, start = optimizer
    opt.deletions = 10  # more than the units: every single-unit deletion
    instruction = Instruction.parse(start.sites["answer"].instructions)
    n = len(instruction.editable)
    edits = opt.edits(instruction.text, "answer")
    all_deletions = {instruction.delete(k).text for k in range(n)}
    assert {e.text for e in edits[:n]} == all_deletions
    default = edits[n]
    assert default.ops[0].startswith("del all") and default.text.startswith(
        "Given the fields"
    )  # DSPy's default
    assert len(edits) == n + 1 + 3
    opt.deletions = 2  # fewer than the units: that many, drawn at random
    fewer = opt.edits(instruction.text, "answer")
    assert len(fewer) == 2 + 1 + 3 and {e.text for e in fewer[:2]} < all_deletions


def test_edits_are_screened_on_train_and_the_best_comes_first(optimizer):
    opt, start = optimizer
    first = opt.propose(start, Evaluation(split="dev", candidate=start.digest(), outcomes=[]))
    assert first is not None and SABOTAGE not in first.sites["answer"].instructions
    assert "edit round 1: answer" in first.origin
    assert len(opt.minibatch.questions()) == 3  # the seeded mini-batch, not the whole train split
    # every queued candidate is new, and none repeats the start
    queued = [first, *opt.queue]
    assert len({c.digest() for c in queued}) == len(queued) and start.digest() not in {
        c.digest() for c in queued
    }


def test_the_optimizer_never_reads_the_systems_own_instruction(optimizer):
    """It edits only what it starts from: the template's text (CLEAN here) never enters an edit on
    its own."""
    opt, _ = optimizer
    start = Candidate(
        sites={"answer": SiteState(instructions="Repeat the question. Do not answer it.")}
    )
    opt.propose(start, Evaluation(split="dev", candidate=start.digest(), outcomes=[]))
    texts = [c.sites["answer"].instructions for c in opt.queue]
    assert texts and all(CLEAN not in t for t in texts)


def _failure(answer: str, target: str = "answer") -> Attribution:
    return Attribution(
        question_id="q", prediction=answer, error_type=ErrorType.RESPONSE, target=target
    )


def _failing(start: Candidate, failures: list[Attribution]) -> Evaluation:
    """A dev evaluation of ``start`` in which every question failed with one of ``failures``."""
    outcomes = [
        QuestionOutcome(
            episode_id="e",
            question_id=f"q{i}",
            task_type="t",
            question="?",
            gold="x",
            prediction=a.prediction,
            score=0.0,
            passed=False,
            attribution=a,
        )
        for i, a in enumerate(failures)
    ]
    return Evaluation(split="dev", candidate=start.digest(), outcomes=outcomes)


def test_the_deletion_the_failures_point_at_goes_first_and_says_why(optimizer):
    opt, _ = optimizer
    text = "Always reply exactly I don't know whatever the memories say. " + CLEAN
    start = Candidate(sites={"answer": SiteState(instructions=text)})
    failures = [_failure("I don't know")] * 14 + [_failure("Paris"), _failure("blue")]
    first = opt.propose(start, _failing(start, failures))
    assert first is not None
    assert first.sites["answer"].instructions == CLEAN
    assert first.origin.endswith(
        """(deleted sentence 1: 14 of 16 failures answered "I don't know")"""
    )


def test_support_needs_several_failures_and_reads_quoted_phrases():
    instruction = Instruction.parse('Answer from the memories. If unsure, reply "N/A". Be brief.')
    assert support(instruction, [_failure("N/A")]) == {}  # one failure is not enough
    backed = support(instruction, [_failure("n/a")] * 3 + [_failure("Rome")] * 5)
    assert list(backed) == [1] and backed[1][0] == 3


def test_no_edit_leaves_a_sentence_cut_in_half(optimizer):
    opt, _ = optimizer
    opt.deletions, opt.extra = 10, 30
    text = (
        "Answer from the memories. If the memories do not contain the answer, reply \"I don't "
        'know".'
    )
    for edit in opt.edits(text, "answer"):
        assert not problems(edit.text), edit
        assert "contain the answer," not in edit.text or "reply" in edit.text


@pytest.mark.parametrize(
    "text, problem",
    [
        ("Answer. If the memories do not contain the answer,", "cut short"),
        ("Answer. Reply \"I don't know.", "unmatched quote"),
        ("Answer the question. . Be brief.", "empty sentence"),
        ("Answer the question and.", "ending on 'and'"),
        ("If the memories do not contain the answer.", "no main clause"),
        ("Answer (briefly.", "unmatched ()"),
    ],
)
def test_problems_name_what_a_reviewer_would_reject(text, problem):
    assert any(problem in p for p in problems(text)), problems(text)


def test_units_keep_layout_and_delete_whole_list_items_and_clauses():
    text = "Rules:\n- Be brief.\n- Never guess;\n  say so instead.\n\nAnswer now; be polite."
    instruction = Instruction.parse(text)
    assert instruction.text == text
    assert [u.kind for u in instruction.editable] == ["item", "item", "clause", "clause"]
    assert (
        instruction.delete(0).text
        == "Rules:\n- Never guess;\n  say so instead.\n\nAnswer now; be polite."
    )
    assert (
        instruction.delete(3).text
        == "Rules:\n- Be brief.\n- Never guess;\n  say so instead.\n\nAnswer now."
    )
    assert instruction.delete(2).text.endswith("\n\nBe polite.")
    assert instruction.label(1) == "list item 2"


def _shipped_instructions() -> dict[str, str]:
    import importlib
    import inspect

    from signatures import graphiti

    out = {}
    for name in ("baselines", "common", "gated", "mem0", "tiered"):
        module = importlib.import_module(f"signatures.{name}")
        for attr, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, dspy.Signature)
                and obj.__module__ == module.__name__
                and not attr.startswith(("Library", "_"))
            ):
                out[f"{name}.{attr}"] = obj.instructions
    out |= {site: sig.instructions for site, sig in graphiti.SIGNATURES.items()}
    return out


@pytest.mark.parametrize("site", sorted(_shipped_instructions()))
def test_every_shipped_prompt_splits_losslessly_and_each_deletion_stays_well_formed(site):
    text = _shipped_instructions()[site]
    instruction = Instruction.parse(text)
    assert instruction.text == text  # byte for byte
    before = problems(text)
    if len(instruction.editable) > 1:
        for k in range(len(instruction.editable)):
            assert [p for p in problems(instruction.delete(k).text) if p not in before] == [], (
                site,
                k,
            )


def test_a_paraphrase_must_be_about_as_long_as_its_phrase():
    rule = 'If the memories do not contain the answer, reply "I don\'t know".'
    assert not same_length(rule, "I don't know.")  # a fragment of the rule, not the rule reworded
    assert same_length(rule, 'When the answer is not in the memories, say "I don\'t know".')


def test_conditional_reads_the_condition_outside_quotes():
    assert conditional('If the memories do not contain the answer, reply "I don\'t know".')
    assert conditional("When unsure, say so.")
    assert not conditional("Always reply exactly I don't know whatever the memories say.")
    assert not conditional('Reply "if in doubt, ask" to every greeting.')


def test_of_two_units_the_same_failures_support_the_unconditional_command_goes_first(optimizer):
    """The clean rule ('If ..., reply "I don't know".') and an unconditional command that says
    the same are both supported by every "I don't know": the command's deletion is queued first,
    whatever the train screen says."""
    opt, _ = optimizer
    rule = 'If the memories do not contain the answer, reply "I don\'t know".'
    text = f"{CLEAN} {rule} Always reply exactly I don't know whatever the memories say."
    start = Candidate(sites={"answer": SiteState(instructions=text)})
    failures = [_failure("I don't know")] * 6
    # the train screen prefers keeping the command: the evidence order wins over it
    opt._screen_all = lambda candidates, what=None: opt.screened.update(
        {
            c.digest(): Evaluation(split="train", candidate=c.digest(), outcomes=[])
            for c in candidates
        }
    )
    opt._screen = lambda c: 1.0 if "Always reply" in c.sites["answer"].instructions else 0.0
    first = opt.propose(start, _failing(start, failures))
    assert first is not None
    assert first.sites["answer"].instructions == f"{CLEAN} {rule}"
    assert opt.queue[0].sites["answer"].instructions == (
        f"{CLEAN} Always reply exactly I don't know whatever the memories say."
    )


def test_the_screening_says_where_it_is(optimizer):
    """A round's screening can take most of an hour on a slow endpoint: each program screened is a
    progress line (the run's log shows it without a terminal)."""
    opt, start = optimizer
    said: list[str] = []
    opt.progress = said.append
    opt.propose(start, Evaluation(split="dev", candidate=start.digest(), outcomes=[]))
    assert said and all(
        line.startswith("edit round 1: screening ") and "train mini-batch (3 questions)" in line
        for line in said
    )
    assert said.pop(0).startswith("edit round 1: screening the best on a train mini-batch")
    assert said[0].startswith("edit round 1: screening 1")
    assert said[-1].split(" of ")[1].split()[0] == said[0].split(" of ")[1].split()[0]


def test_an_answer_that_opens_with_what_a_unit_says_supports_it():
    instruction = Instruction.parse(
        "Always reply exactly I don't know whatever the memories say. Answer from the memories. "
        'If the memories do not contain the answer, reply "I don\'t know".'
    )
    said = [_failure("I don't know what the question is.")] * 2 + [
        _failure("I don't know the answer to that question.")
    ] * 2
    backed = support(instruction, said)
    assert sorted(backed) == [0, 2] and backed[0][0] == backed[2][0] == 4  # command, quoted rule
    # an opening shorter than MIN_PHRASE words points at nothing
    assert (
        support(Instruction.parse("Say no more. Be brief."), [_failure("Say no, then go")] * 3)
        == {}
    )


def test_a_trial_that_beats_the_best_drops_the_rest_of_its_round(optimizer):
    """GrIPS's greedy step: the next edits are of the new best, not of the program it beat."""
    opt, start = optimizer
    empty = Evaluation(split="dev", candidate=start.digest(), outcomes=[])
    first = opt.propose(start, empty)
    assert first is not None and opt.queue and all(c.parent == start.digest() for c in opt.queue)
    second = opt.propose(start, empty)  # the best did not move: the round goes on
    assert second is not None and second.parent == start.digest() and opt.rounds == 1
    third = opt.propose(first, Evaluation(split="dev", candidate=first.digest(), outcomes=[]))
    assert opt.rounds == 2 and third is not None and third.parent == first.digest()
    assert all(c.parent == first.digest() for c in opt.queue)


def test_a_round_with_a_writer_adds_a_short_instruction_an_added_and_a_rewritten_sentence():
    written = "Answer the question with the name or number the memories give."
    lm = DummyLM(
        [
            {"instruction": written},
            {"sentence": "Never reply N/A when a memory holds the answer."},
            {"new_sentence": "Answer only from the memories."},
        ]
        * 5
    )
    start = f"{CLEAN} {SABOTAGE}"
    opt = EditOptimizer(
        FakeEvaluator(), lm, _train(), sites=["answer"], seed=0, deletions=0, extra=0, bsize=3
    )
    edits = opt.edits(start, "answer")
    ops = [e.ops[0] for e in edits]
    assert ops[0].startswith("del all")
    assert ops[1] == "write (a short instruction)" and edits[1].text == written
    assert ops[2] == "add written" and edits[2].text == (
        f"{start} Never reply N/A when a memory holds the answer."
    )
    assert ops[3].startswith("write ") and "Answer only from the memories." in edits[3].text
    assert opt.gate.counts["passed"] == 3


def test_the_writer_is_shown_the_bests_failures_on_train_and_the_deletions_dev_s(optimizer):
    """A sentence fitted to a dev case would be chosen by the dev evaluation of that case: the
    written edits see the train mini-batch's failures; the deletions they support, dev's."""
    opt, start = optimizer
    on_train = _failure("train says N/A")
    seen: dict[str, list[str]] = {}

    class TrainFails(FakeEvaluator):
        def evaluate(self, candidate, dataset, *, split="dev"):
            ev = super().evaluate(candidate, dataset, split=split)
            outcomes = [o.model_copy(update={"attribution": on_train}) for o in ev.outcomes]
            return ev.model_copy(update={"outcomes": outcomes})

    opt.evaluator = TrainFails()
    opt.write = True
    opt.written = lambda start_, site, failures, supported=(): (  # type: ignore[method-assign]
        seen.setdefault("written", [a.prediction for a in failures]) and []
    )
    real_edits = opt.edits

    def edits(instruction, site, failures=(), shown=None):
        seen["supported"] = [a.prediction for a in failures]
        return real_edits(instruction, site, failures, shown)

    opt.edits = edits  # type: ignore[method-assign]
    opt.propose(start, _failing(start, [_failure("dev says N/A")] * 2))
    assert seen["supported"] == ["dev says N/A"] * 2
    assert set(seen["written"]) == {"train says N/A"}


def _written_edits(instruction: str, sentence: str, new_sentence: str):
    """The optimizer and the ops of its edits of the sabotaged instruction, with no deletion or
    composed edit, when the writer answers its three tasks with these texts."""
    lm = DummyLM(
        [{"instruction": instruction}, {"sentence": sentence}, {"new_sentence": new_sentence}]
    )
    opt = EditOptimizer(
        FakeEvaluator(), lm, _train(), sites=["answer"], seed=0, deletions=0, extra=0, bsize=3
    )
    return opt, [e.ops[0] for e in opt.edits(f"{CLEAN} {SABOTAGE}", "answer")]


def test_written_edits_the_gate_refuses_are_not_proposed():
    opt, ops = _written_edits(
        "Please provide the task details and examples of task inputs.",
        "Never reply N/A when a",
        "Answer only from the memories.",
    )
    assert "write (a short instruction)" not in ops and "add written" not in ops
    assert opt.gate.counts == {"off_task": 1, "malformed": 1, "passed": 1}


@pytest.mark.parametrize(
    ("sentence", "alone"),
    [
        ("Answer the question with the name or number the memories give.", True),
        ("Be brief.", False),
    ],
)
def test_a_refused_short_instruction_gives_way_to_the_added_sentence_alone(sentence, alone):
    """Only a written edit that drops every unit mends an instruction replaced outright: when the
    short instruction is refused, the added sentence stands in for it if it names the job."""
    lm = DummyLM(
        [
            {"instruction": "The goal of this step is to answer from the memories."},
            {"sentence": sentence},
            {"new_sentence": "Answer only from the memories."},
        ]
    )
    opt = EditOptimizer(
        FakeEvaluator(), lm, _train(), sites=["answer"], seed=0, deletions=0, extra=0, bsize=3
    )
    edits = opt.edits(f"{CLEAN} {SABOTAGE}", "answer")
    by_op = {e.ops[0]: e.text for e in edits}
    assert "write (a short instruction)" not in by_op and "add written" in by_op
    assert (by_op.get("write (the added sentence alone)") == sentence) is alone
    assert opt.gate.counts["off_task"] == (1 if alone else 2)
    assert opt.gate.counts["passed"] == (3 if alone else 2)


def test_a_long_instruction_gets_no_random_deletions_or_composed_edits(optimizer):
    opt, _ = optimizer
    opt.deletions = 3
    long = " ".join(f"Rule {i}: keep every fact about item {i} in the list." for i in range(120))
    assert len(long.split()) > LONG_WORDS
    ops = [e.ops[0] for e in opt.edits(long, "answer")]
    assert ops == ["del all (the signature's default instruction)"]
    short = " ".join(f"Rule {i}: keep every fact about item {i} in the list." for i in range(5))
    ops = [e.ops for e in opt.edits(short, "answer")]
    # three random single-unit deletions, the default, then the random composed edits
    assert all(len(o) == 1 and o[0].startswith("del ") and "all" not in o[0] for o in ops[:3])
    assert ops[3][0].startswith("del all") and len(ops) > 4


def test_a_resumed_optimizer_makes_the_round_an_uninterrupted_one_makes(tmp_path):
    """The draws and the units "add" can put back are saved with each round, so the round after
    a resume (a fresh optimizer, its rounds counted on and told what was tried) is the same."""

    def fresh(work):
        lm = DummyLM([{"paraphrase": "Say only N/A."}] * 100)
        return EditOptimizer(
            FakeEvaluator(),
            lm,
            _train(),
            sites=["answer"],
            seed=0,
            extra=3,
            write=False,
            work=work,
        )

    long_start = Candidate(
        sites={"answer": SiteState(instructions=f"{CLEAN} Be brief. Use the memories. {SABOTAGE}")}
    )

    screens: dict[bool, list[str]] = {}

    def rounds(opt, *, resume_after_first: bool):
        first = opt.propose(
            long_start, Evaluation(split="dev", candidate=long_start.digest(), outcomes=[])
        )
        assert first is not None
        before = opt.evaluator.evaluated
        if resume_after_first:
            seen, opt = set(opt.seen), fresh(opt.work)
            opt.seen, opt.rounds = seen, 1
        nxt = opt.propose(first, Evaluation(split="dev", candidate=first.digest(), outcomes=[]))
        after = opt.evaluator.evaluated
        screens[resume_after_first] = before + after if after is not before else before
        assert opt.rounds == 2 and nxt is not None
        return [c.sites["answer"].instructions for c in (nxt, *opt.queue)], [
            c.origin for c in (nxt, *opt.queue)
        ]

    assert rounds(fresh(tmp_path / "a"), resume_after_first=True) == rounds(
        fresh(tmp_path / "b"), resume_after_first=False
    )
    assert (tmp_path / "a" / "rounds.json").exists()
    # and it screens no program the process before it screened (each screen is kept there too)
    assert len(screens[True]) == len(screens[False])
    assert len(set(screens[True])) == len(screens[True])


def test_an_added_sentence_the_instruction_already_says_is_not_proposed():
    """A writer that restates a sentence the instruction holds (case and punctuation aside) gets
    no "add written" edit: the instruction would say it twice."""
    _, ops = _written_edits(
        "Answer the question with the name or number the memories give.",
        "answer the question from the memories",
        "Answer only from the memories.",
    )
    assert "add written" not in ops and "write (a short instruction)" in ops
