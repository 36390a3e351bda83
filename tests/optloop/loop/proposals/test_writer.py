"""The writer: small writing tasks for the proposer, from the attribution evidence, judged by the
gate."""

from __future__ import annotations

import pytest
from dspy.utils import DummyLM

from optloop.attribution.taxonomy import Attribution, ErrorType
from optloop.loop.proposals.gate import ProposalGate
from optloop.loop.proposals.writer import Writer, describe, failure_cases, long_instruction
from optloop.sites import ANSWER, MEM0_EXTRACT


def _failure(i: int, site: str = MEM0_EXTRACT) -> Attribution:
    return Attribution(
        question_id=f"q{i}",
        question=f"What is my locker number {i}?",
        gold=f"67{i}",
        prediction="I don't know",
        error_type=ErrorType.EXTRACTION,
        op_id="op-3",
        target=site,
        explanation=(
            f"the evidence ('My locker number is 67{i}.', gold answer '67{i}') was in session s1, "
            "but the mem0.extract call (op-3) returned 0 item(s), none carrying it, and no memory "
            "unit ever held it. Fix the extraction prompt so this kind of fact is kept."
        ),
    )


def test_failure_cases_say_in_plain_words_what_was_said_asked_and_lost():
    text = failure_cases([_failure(1), _failure(2, ANSWER)], MEM0_EXTRACT)
    assert text == (
        "- The conversation said: 'My locker number is 671.'. Later asked 'What is my locker "
        "number 1?' (answer: '671'). This step stored nothing that says it."
    )  # only the failure blamed on the site; no operation ids, sessions or site names


def test_failure_cases_are_drawn_with_the_seed_when_there_are_many():
    failures = [_failure(i) for i in range(10)]
    a = failure_cases(failures, MEM0_EXTRACT, seed=1)
    assert a == failure_cases(failures, MEM0_EXTRACT, seed=1)
    assert a.count("\n") == 3


def test_a_known_site_is_described_by_its_job():
    step, output = describe(MEM0_EXTRACT)
    assert "extract the memories to store" in step and "JSON" in output


def test_a_library_prompt_is_long_and_a_short_instruction_is_not():
    assert long_instruction("word " * 500)
    assert not long_instruction("Answer the question from the memories.")


def _writer(tmp_path, answer: dict[str, str]) -> Writer:
    proposer = DummyLM([answer])
    return Writer(proposer, ProposalGate(tmp_path / "proposals.jsonl"))


def test_the_writer_returns_a_short_instruction_for_the_sites_job(tmp_path):
    text = "Extract every fact the user states about themselves as a short memory."
    writer = _writer(tmp_path, {"instruction": text})
    assert writer.instruction(MEM0_EXTRACT, failure_cases([_failure(1)], MEM0_EXTRACT), rollout=0)
    assert writer.gate.counts == {"passed": 1}


@pytest.mark.parametrize(
    "written",
    [
        "Please provide the task details and examples of task inputs.",
        "You are a helpful assistant.",
        "Extract every fact the user states about",
    ],
)
def test_what_the_gate_refuses_makes_no_instruction(tmp_path, written):
    writer = _writer(tmp_path, {"instruction": written})
    assert writer.instruction(MEM0_EXTRACT, "- none", rollout=0) is None
    assert writer.gate.counts["passed"] == 0


def test_an_added_sentence_need_not_name_the_job_but_must_be_well_formed(tmp_path):
    assert (
        _writer(tmp_path, {"sentence": "Include the dates the user mentions."}).sentence(
            MEM0_EXTRACT, "- none", rollout=0
        )
        == "Include the dates the user mentions."
    )
    assert (
        _writer(tmp_path, {"sentence": "Include the dates the"}).sentence(
            MEM0_EXTRACT, "- none", rollout=0
        )
        is None
    )


def test_a_rewrite_that_gives_the_same_sentence_back_is_none(tmp_path):
    same = "Keep every number."
    writer = _writer(tmp_path, {"new_sentence": same})
    assert writer.rewrite(MEM0_EXTRACT, same, "- none", rollout=0) is None


def test_quotes_and_labels_around_a_written_text_are_removed(tmp_path):
    writer = _writer(tmp_path, {"sentence": '"Sentence: Keep every number the user gives."'})
    assert (
        writer.sentence(MEM0_EXTRACT, "- none", rollout=0) == "Keep every number the user gives."
    )


def test_the_chat_formats_end_marker_left_on_the_line_is_removed(tmp_path):
    writer = _writer(
        tmp_path, {"sentence": "Keep every number the user gives. [[ ## completed ## ]]"}
    )
    assert (
        writer.sentence(MEM0_EXTRACT, "- none", rollout=0) == "Keep every number the user gives."
    )


def test_restating_the_job_or_the_sentence_rewritten_is_no_echo_but_naming_an_answer_is(tmp_path):
    cases = failure_cases([_failure(1)], MEM0_EXTRACT)
    restated = "Extract the memories to store from the new messages of a conversation, every fact."
    assert _writer(tmp_path, {"instruction": restated}).instruction(MEM0_EXTRACT, cases, rollout=0)
    rewritten = "Keep the personal facts the user states, and keep every number they give."
    assert _writer(tmp_path, {"new_sentence": rewritten}).rewrite(
        MEM0_EXTRACT, "Keep the personal facts the user states.", cases, rollout=0
    )
    fitted = "Extract every fact the user states, such as the locker number 671."
    assert (
        _writer(tmp_path, {"instruction": fitted}).instruction(MEM0_EXTRACT, cases, rollout=0)
        is None
    )
