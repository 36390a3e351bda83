"""The proposal gate: which proposed instructions are evaluated, and the reasons it counts."""

from __future__ import annotations

import pytest

from optloop.loop.proposals.gate import (
    ProposalGate,
    Reason,
    active,
    current_gate,
    refusals,
    verdicts,
)
from optloop.loop.proposals.jobs import asks_for, site_job
from optloop.sites import ANSWER, MEM0_EXTRACT, QUERY_REWRITE

# What a 1.5B reflection model wrote as mem0's extraction instruction when handed GEPA's reflection
# template over mem0's own prompt: its own template echoed back, and a request for input.
GEPA_ECHO = (
    "I provided an assistant with instructions to perform a task for me. You are given those "
    "instructions, along with examples of different task inputs provided to the assistant along "
    "with the assistant's response for each of them. Please provide the task details and the "
    "examples of task inputs."
)
REQUEST = (
    "I wish to help you with a specific task. Please provide the task details and examples of "
    "task inputs."
)
SHIPPABLE = (
    "Extract every fact the user states about themselves, such as names, numbers, places and "
    "dates, as short self-contained memories. Keep each value exactly as the user wrote it."
)


@pytest.fixture
def gate(tmp_path):
    return ProposalGate(tmp_path / "proposals.jsonl")


def test_an_echo_of_gepas_reflection_template_is_refused(gate):
    reason, detail = gate.judge(MEM0_EXTRACT, GEPA_ECHO)
    assert reason is Reason.ECHO, detail


def test_a_request_for_input_is_refused_as_off_task(gate):
    assert gate.judge(MEM0_EXTRACT, REQUEST)[0] is Reason.OFF_TASK


def test_an_instruction_that_names_no_word_of_the_sites_job_is_off_task(gate):
    reason, detail = gate.judge(MEM0_EXTRACT, "You are a helpful assistant. Be polite and brief.")
    assert reason is Reason.OFF_TASK and "job" in detail


def test_a_shippable_extraction_instruction_passes(gate):
    assert gate.judge(MEM0_EXTRACT, SHIPPABLE) == (None, "")


def test_text_cut_by_the_token_limit_is_refused_first(gate):
    assert gate.judge(MEM0_EXTRACT, SHIPPABLE, cut_off=True)[0] is Reason.CUT_OFF


def test_malformed_text_is_refused(gate):
    assert gate.judge(ANSWER, "Answer the question with the")[0] is Reason.MALFORMED


def test_a_re_typing_of_the_task_text_shown_is_an_echo(gate):
    shown = (
        "- Later asked 'What is my locker number?' (right answer '6744'). The evidence was in "
        "the first conversation, but the extraction returned 0 items, none carrying it."
    )
    echo = (
        "The evidence was in the first conversation, but the extraction returned 0 items, none "
        "carrying it. Extract it."
    )
    assert gate.judge(MEM0_EXTRACT, echo, shown=shown)[0] is Reason.ECHO
    assert gate.judge(MEM0_EXTRACT, SHIPPABLE, shown=shown)[0] is None


def test_a_sentence_for_an_instruction_need_not_name_the_job(gate):
    sentence = "Include the dates the user mentions."
    assert gate.judge(MEM0_EXTRACT, sentence)[0] is Reason.OFF_TASK
    assert gate.judge(MEM0_EXTRACT, sentence, whole=False)[0] is None


def test_an_answer_instruction_that_tells_the_model_to_give_an_answer_passes(gate):
    text = "Give the shortest answer the memories support, or reply that you do not know."
    assert gate.judge(ANSWER, text) == (None, "")


def test_a_site_whose_job_is_unknown_is_not_judged_off_task(gate):
    assert site_job("some.library.prompt") is None
    assert gate.judge("some.library.prompt", "Be brief and polite.")[0] is None


def test_graphiti_sites_get_their_prompt_familys_job():
    job = site_job("graphiti.extract_edges.edge")
    assert job is not None and asks_for(job, "Extract the facts that relate two entities.")


def test_every_verdict_is_logged_and_refusals_are_counted_by_reason(gate, tmp_path):
    for text in (GEPA_ECHO, REQUEST, SHIPPABLE, "Store the"):
        gate.refuses(MEM0_EXTRACT, text, who="a test proposal")
    assert refusals([tmp_path / "proposals.jsonl"]) == {
        "echo": 1,
        "malformed": 1,
        "off_task": 1,
        "passed": 1,
    }
    logged = verdicts([tmp_path / "proposals.jsonl", tmp_path / "missing.jsonl"])
    assert [v.text for v in logged] == [GEPA_ECHO, REQUEST, SHIPPABLE, "Store the"]
    assert gate.counts["passed"] == 1


def test_a_line_cut_by_a_kill_is_skipped(tmp_path):
    log = tmp_path / "proposals.jsonl"
    ProposalGate(log).refuses(ANSWER, "Answer briefly.", who="t")
    with log.open("a") as f:
        f.write('{"site": "answer", "who"')
    assert refusals([log]) == {"passed": 1}


def test_the_active_gate_is_the_one_code_inside_a_round_judges_with(gate):
    outside = current_gate()
    with active(gate):
        assert current_gate() is gate
    assert current_gate() is outside and outside is not gate


def test_the_run_summary_counts_the_proposals_by_the_gates_verdict():
    from optloop.cli.run_tables import proposals_line

    assert proposals_line({"passed": 9, "echo": 2, "off_task": 1, "cut_off": 1}) == (
        "9 passed, 4 refused (2 echo, 1 off_task, 1 cut_off)"
    )
    assert proposals_line({"passed": 3}) == "3 passed, 0 refused"


def test_an_instruction_that_names_an_answer_of_the_failures_shown_is_an_echo(gate):
    text = "Extract every fact, such as the town where the user was born, like Pamholm."
    reason, detail = gate.judge(MEM0_EXTRACT, text, values=["Pamholm", "Wustar"])
    assert reason is Reason.ECHO and "Pamholm" in detail
    assert gate.judge(MEM0_EXTRACT, SHIPPABLE, values=["Pamholm"])[0] is None


@pytest.mark.parametrize(
    "text",
    [
        "Ask the user for their question from the memories retrieved for it.",
        # a sentence a run's writer put into the answer instruction, which the gate passed
        "Ask the user to provide a question they can answer based on the information they have "
        "stored in their memory.",
        "The model should be programmed to answer questions from the memories retrieved for it.",
        "Keep every fact, because the step lost some before.",
        "If the extraction process fails, you need to fix the extraction prompt to ensure that "
        "the fact is kept.",
        "Then rewrite this prompt so that it keeps more facts.",
        "If you have any questions, feel free to ask.",
    ],
)
def test_text_about_the_prompt_or_asking_the_user_is_off_task_even_as_a_sentence(gate, text):
    assert gate.judge(ANSWER, text, whole=False)[0] is Reason.OFF_TASK


def test_a_whole_instruction_that_tells_the_reader_to_fix_the_prompt_is_off_task(gate):
    """A proposal of a GEPA run on mem0 that passed before the rule: an extraction instruction
    whose last sentence is addressed to whoever maintains the prompt, not to the model."""
    text = (
        "To extract memories from the new messages of a conversation, you need to specify the "
        "session in which the memories were stored and the fact to extract. The memory should be "
        "stored in a specific memory unit, and the extraction process should return the "
        "extracted fact. If the extraction process fails, you need to fix the extraction prompt "
        "to ensure that the fact is kept."
    )
    reason, detail = gate.judge(MEM0_EXTRACT, text)
    assert reason is Reason.OFF_TASK and "fix the extraction prompt" in detail
    fine = "Extract the facts about the user from the messages; follow the format instructions."
    assert gate.judge(MEM0_EXTRACT, fine)[0] is None


def test_an_instruction_that_restates_the_writers_rules_is_off_task(gate):
    """A written instruction that won a repair run before the rule: one sentence for the model,
    then the writer's own rules about the instruction, paraphrased (so few 5-grams match)."""
    text = (
        "The model should answer the user's question from the memories retrieved for it. The "
        "instruction should be general and not focus on specific facts, values, or topics. The "
        "instruction should not mention functions, sessions, fields, or code. The instruction "
        "should not describe the output format."
    )
    reason, detail = gate.judge(ANSWER, text)
    assert reason is Reason.OFF_TASK and "the instruction should" in detail.lower()
    assert (
        gate.judge(ANSWER, "Answer from the memories. Follow the instructions below.")[0] is None
    )


def test_a_question_in_place_of_an_instruction_is_off_task(gate):
    """A paraphrase of the answer prompt's second sentence a run's proposer turned into a
    question; an instruction that asks itself a question and then instructs passes."""
    question = "What is a name, number, date, yes or no, or an option letter?"
    reason, detail = gate.judge(ANSWER, question, whole=False)
    assert reason is Reason.OFF_TASK and "asks a question" in detail
    fine = "Does a memory hold the answer? If none does, reply I don't know."
    assert gate.judge(ANSWER, fine, whole=False)[0] is None


def test_a_sentence_that_restates_a_case_shown_without_quotes_is_an_echo(gate):
    """The sentence a 1.5B writer added to graphiti's answer prompt on LoCoMo: it restates a dev
    question in 14 words and passed the 5-gram share (11 of its 39 are the case's)."""
    shown = (
        "- Later asked 'What aspects of the Harry Potter universe will be discussed in John's "
        "fan project collaborations?' (answer: 'characters, spells, magical creatures'). The "
        "memories held it, but the reply was 'I don't know'."
    )
    text = (
        "To address the user's question about what aspects of the Harry Potter universe will be "
        "discussed in John's fan project collaborations, the conversation should be revised to "
        "include the information that the Harry Potter universe will be discussed, which would "
        "be 'characters, spells, and magical creatures'."
    )
    reason, detail = gate.judge(ANSWER, text, shown=shown, whole=False)
    assert reason is Reason.ECHO
    assert "what aspects of the harry potter universe will be discussed in john's fan" in detail
    # six words of a case in a row are not yet a restatement; a general sentence passes
    assert (
        gate.judge(ANSWER, "Say what the memories held, but keep it short.", shown=shown)[0]
        is None
    )
    assert (
        gate.judge(
            ANSWER,
            "When the memories hold the answer, give it in a few words.",
            shown=shown,
            whole=False,
        )[0]
        is None
    )


def test_an_instruction_that_quotes_the_failures_shown_is_an_echo(gate):
    shown = "- RetrievalError: the question asked for the user's locker number; nothing found"
    text = 'Reply with the single word nothing. Search for "locker number" in the memory store.'
    reason, detail = gate.judge(QUERY_REWRITE, text, shown=shown, whole=False)
    assert reason is Reason.ECHO and "locker number" in detail
    # one quoted word, or a phrase the failures do not hold, is not fitted to them
    for fine in ('Keep the "name" of the thing asked about.', 'Never reply "I do not know" here.'):
        assert gate.judge(QUERY_REWRITE, fine, shown=shown, whole=False)[0] is None


@pytest.mark.parametrize(
    ("text", "found", "fine"),
    [
        # a winning curate text on the 1.5B that opened by restating its writing task
        (
            "The instruction is to rewrite the markdown memory file so it keeps every lasting "
            "fact of the conversation.",
            "the instruction is to",
            "Rewrite the markdown memory file so it keeps every lasting fact of the conversation.",
        ),
        # a curate instruction the 1.5B wrote: a coder model's function spec
        (
            "Write a function `rewrite_memory` that takes a string `memory` as input and returns "
            "a new string with every lasting fact of the conversation stored separately.",
            "write a function",
            "Write every lasting fact of the conversation into the memory file, one per line.",
        ),
    ],
)
def test_a_curate_text_that_restates_the_task_or_asks_for_a_program_is_off_task(
    gate, text, found, fine
):
    reason, detail = gate.judge("md_flat.curate", text)
    assert reason is Reason.OFF_TASK and found in detail.lower()
    assert gate.judge("md_flat.curate", fine)[0] is None


def test_a_re_typing_of_the_instruction_it_would_replace_is_an_echo(gate):
    # A 1.5B proposer's rewrite of optloop's answer instruction on LoCoMo: the same words, its
    # double quotes made single.
    current = (
        "Answer the user's question using only the memories below. Give the shortest answer "
        'that is correct. If the memories do not contain the answer, reply "I don\'t know".'
    )
    retyped = current.replace('"', "'")
    assert gate.judge(ANSWER, retyped, replaces=current) == (
        Reason.ECHO,
        "it re-types the instruction it would replace",
    )
    changed = retyped.replace("the shortest answer", "a short answer")
    assert gate.judge(ANSWER, changed, replaces=current) == (None, "")
    assert gate.judge(ANSWER, retyped) == (None, "")  # nothing to compare with


# The writer's failure cases on LoCoMo (optloop.loop.proposals.writer.failure_cases), abridged.
LOCOMO_CASES = (
    "- The conversation said: 'I started volunteering at the shelter with Rob'. Later asked 'Who "
    "inspired John to start volunteering?' (answer: 'his aunt'). The memories held it, but the "
    "reply was 'John'.\n"
    "- Later asked 'Why did Maria decide to run for office again?' (answer: 'to help'). This step "
    "stored nothing about it."
)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        # what a 1.5B writer added to the answer instruction, and the loop's best on dev for it
        (
            "To address the issue of John not starting volunteering, the assistant can encourage "
            "him to decline and focus on other activities.",
            "John",
        ),
        ("Maria's reasons for running for office are personal; answer briefly.", "Maria"),
    ],
)
def test_a_sentence_that_names_a_person_of_the_failures_shown_is_an_echo(gate, text, name):
    assert gate.judge(ANSWER, text, shown=LOCOMO_CASES, whole=False) == (
        Reason.ECHO,
        f"it names {name!r} from the failures it was shown",
    )


def test_a_name_the_instruction_already_has_or_a_capital_that_starts_a_quote_is_no_echo(gate):
    # "Who" starts a quoted question in the cases, "Answer" starts a sentence: neither is a name.
    text = "Answer with the name of the person Who the question asks about."
    assert gate.judge(ANSWER, text, shown=LOCOMO_CASES, whole=False) == (None, "")
    kept = "Reply as John would, in his words."
    assert gate.judge(ANSWER, kept, shown=LOCOMO_CASES, replaces=kept + " Be brief.")[0] != (
        Reason.ECHO
    )
