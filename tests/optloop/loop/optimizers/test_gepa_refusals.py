"""GEPA's reflections through the proposal gate: a cut answer is refused as cut off, whichever
thread GEPA runs the reflection in; refusals in a row end the round, which falls back to the
proposer's rewrite (the writer's short instruction for a long prompt). No model: scripted LMs and a
stand-in for llama.cpp."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dspy
import pytest
from dspy.utils import DummyLM
from dspy.utils.exceptions import LMError

from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.optimizers.gepa import GatedProposer, GepaOptimizer, GepaSettings
from optloop.loop.proposals.gate import LOG_NAME, ProposalGate, Reason, verdicts
from optloop.sites import PROPOSER
from tests.optloop.loop.optimizers.test_optimizer_state import (
    NO_EVAL,
    ScriptLM,
    ToyEvaluator,
    _dataset,
)

EXAMPLES = [{"Inputs": {"question": "?"}, "Generated Outputs": "Rex", "Feedback": "Biscuit"}]
PASSES = "Answer with the name only."
REFUSED = "Please provide the task details and examples of task inputs."  # off_task
# Cut mid-list where a bound closed the string: well-formed enough to pass as text on its own.
CUT_TEXT = "Answer the question from the memories. Rules: 1. Give the name only. 2. Answer"


def _llama_answer(content: str, finish: str) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "finish_reason": finish,
                "message": {"role": "assistant", "content": content},
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 512, "total_tokens": 612},
    }


class _Llama:
    """Stands in for llama_cpp.Llama: ``answer(max_chars)`` gives the reply under a schema whose
    strings hold at most ``max_chars`` characters; records the thread of each call."""

    def __init__(self, answer: Callable[[int], dict[str, Any]]):
        self.answer = answer
        self.bounds: list[int] = []
        self.threads: list[str] = []

    def create_chat_completion(self, **kwargs: Any) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        schema = kwargs["response_format"]["schema"]
        self.bounds.append(schema["properties"]["new_instruction"]["maxLength"])
        return self.answer(self.bounds[-1])


def _local_lm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, llama: _Llama) -> Any:
    from optloop.lm import LMSettings, LocalLlamaBackend, OptloopLM
    from optloop.lm.llama import ContextPool

    model = tmp_path / "fake.gguf"
    model.write_bytes(b"gguf")
    monkeypatch.setattr(LocalLlamaBackend, "_model", lambda self: ContextPool(lambda: llama, 1))
    return OptloopLM(LMSettings.from_spec(f"local:{model}", cache=False))


def _reflect_in_a_worker_thread(proposer: GatedProposer, lm: Any) -> dict[str, str]:
    """One reflection as GEPA would run it from a pool thread of its own: a bare context (no gate,
    no prompt site, no call collector of the caller's), the reflection LM set there."""

    def reflect() -> dict[str, str]:
        with dspy.context(lm=lm):
            return proposer({"answer": "Answer."}, {"answer": EXAMPLES}, ["answer"])

    with ThreadPoolExecutor(1, thread_name_prefix="gepa-worker") as pool:
        return pool.submit(reflect).result()


def test_a_reflection_cut_at_max_tokens_in_a_worker_thread_is_refused_as_cut_off(
    monkeypatch, tmp_path
):
    # Whole JSON, but the model ran out of tokens: the text ends where the limit fell.
    llama = _Llama(lambda _: _llama_answer(json.dumps({"new_instruction": CUT_TEXT}), "length"))
    lm = _local_lm(monkeypatch, tmp_path, llama)
    gate = ProposalGate(tmp_path / LOG_NAME)
    assert _reflect_in_a_worker_thread(GatedProposer(gate), lm) == {}
    assert llama.threads and all(name.startswith("gepa-worker") for name in llama.threads)
    assert dict(gate.counts) == {"cut_off": 1}
    [verdict] = verdicts([gate.log])
    assert verdict.reason is Reason.CUT_OFF and verdict.who == "GEPA's reflection"
    assert {r.site for r in lm.accounting.records} == {PROPOSER}
    assert all(r.truncated for r in lm.accounting.records)


def test_a_reflection_asked_again_under_tighter_bounds_is_refused_as_cut_off(
    monkeypatch, tmp_path
):
    """The model runs out of tokens under the first bounds; asked again, the grammar closes its
    string at the tighter bound mid-list with ``finish_reason`` ``stop``: still a cut text."""

    def answer(max_chars: int) -> dict[str, Any]:
        if max_chars >= 400:
            return _llama_answer('{"new_instruction": "Answer the question from', "length")
        return _llama_answer(json.dumps({"new_instruction": CUT_TEXT[:max_chars]}), "stop")

    llama = _Llama(answer)
    lm = _local_lm(monkeypatch, tmp_path, llama)
    gate = ProposalGate()
    assert _reflect_in_a_worker_thread(GatedProposer(gate), lm) == {}
    assert llama.bounds == [400, 100]
    assert dict(gate.counts) == {"cut_off": 1}
    assert lm.accounting.records[-1].truncated


@pytest.mark.parametrize(
    ("text", "cut"), [(CUT_TEXT, False), ((CUT_TEXT + " ") * 10, True)], ids=["short", "at-bound"]
)
def test_a_local_answer_whose_string_fills_its_bound_is_recorded_as_truncated(
    monkeypatch, tmp_path, text, cut
):
    llama = _Llama(
        lambda max_chars: _llama_answer(json.dumps({"new_instruction": text[:max_chars]}), "stop")
    )
    lm = _local_lm(monkeypatch, tmp_path, llama)
    gate = ProposalGate()
    _reflect_in_a_worker_thread(GatedProposer(gate), lm)
    assert llama.bounds == [400]
    assert lm.accounting.records[-1].truncated is cut
    assert (gate.counts["cut_off"] == 1) is cut


def _reflection_lm(replies: list[str | Exception]) -> DummyLM:
    """A reflection LM that writes ``replies`` in turn (an exception: that reflection fails)."""
    queue = iter(replies)

    def reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
        nxt = next(queue)
        if isinstance(nxt, Exception):
            raise nxt
        return {"new_instruction": nxt}

    return ScriptLM(reply)


def test_refused_reflections_in_a_row_exhaust_the_proposer_and_a_passing_one_resets_the_count():
    gate = ProposalGate()
    proposer = GatedProposer(gate, refusals_to_stop=2)
    lm = _reflection_lm([REFUSED, PASSES, REFUSED, RuntimeError("no answer"), PASSES])
    seen = []
    with dspy.context(lm=lm):
        for _ in range(5):
            try:
                proposer({"answer": "Answer."}, {"answer": EXAMPLES}, ["answer"])
            except LMError as exc:  # GEPA logs a failed reflection and goes on
                assert "no answer" in str(exc)
            seen.append((proposer.refused_in_a_row, proposer.should_stop(None)))
    # refused, passed (count starts again), refused, failed (a second in a row: stop), passed
    assert seen == [(1, False), (0, False), (1, False), (2, True), (0, False)]
    assert dict(gate.counts) == {"off_task": 2, "passed": 2}


def test_a_reflection_that_re_types_the_candidates_instruction_is_refused_as_an_echo():
    gate = ProposalGate()
    proposer = GatedProposer(gate, refusals_to_stop=2)
    with dspy.context(lm=_reflection_lm(["Answer with the name, only."])):
        assert proposer({"answer": PASSES}, {"answer": EXAMPLES}, ["answer"]) == {}
    assert dict(gate.counts) == {"echo": 1} and proposer.refused_in_a_row == 1


def test_a_reflection_that_answers_a_case_it_was_shown_is_refused_as_an_echo():
    # A 1.5B reflection over LoCoMo answer cases: an answer to one of them, not an instruction.
    shown = [
        {
            "Inputs": {
                "memories": "- [2022-12-17] Maria donated her old car to a homeless shelter",
                "question": "What did Maria donate to a homeless shelter in December 2023?",
            },
            "Generated Outputs": {"answer": "a luxury store"},
            "Feedback": "The answer ignored the memory that held it.",
        }
    ]
    answered = "Based on the memories, Maria donated her old car to a homeless shelter in 2022."
    gate = ProposalGate()
    with dspy.context(lm=_reflection_lm([answered, PASSES])):
        assert GatedProposer(gate)({"answer": "Answer."}, {"answer": shown}, ["answer"]) == {}
        kept = GatedProposer(gate)({"answer": "Answer."}, {"answer": shown}, ["answer"])
    assert kept == {"answer": PASSES}
    assert dict(gate.counts) == {"echo": 1, "passed": 1}


def test_the_gepa_settings_have_one_default_each_and_refuse_a_zero():
    assert GepaSettings().refusals_to_stop == 3 and GepaSettings().metric_calls is None
    with pytest.raises(ValueError):
        GepaSettings(refusals_to_stop=0)


LONG_START = " ".join(["Answer the question with one word from the memories."] * 15)
WRITTEN = "Answer each question with the one word the memories give. Reply with that word only."


def _refusing_proposer() -> tuple[ScriptLM, dict[str, int]]:
    """A proposer whose GEPA reflections all ask for input (refused: off_task) and whose writer
    writes a short instruction for the answer step."""
    calls = {"reflections": 0}
    count = itertools.count(1)

    def reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
        system, n = messages[0]["content"], next(count)
        if "examples_with_feedback" in system:  # GEPA's reflection
            calls["reflections"] += 1
            return {"new_instruction": f"Please provide the task details, draft {n}."}
        # the writer's short instruction
        return {"instruction": f"{WRITTEN} Write it as a plain word #{n}."}

    return ScriptLM(reply), calls


def test_a_gepa_round_stops_after_refused_reflections_and_falls_back_to_the_writer(tmp_path):
    dataset = _dataset()
    evaluator = ToyEvaluator(tmp_path / "work", dataset)
    proposer, calls = _refusing_proposer()
    granted = 200  # far more than the round spends before it stops
    optimizer = GepaOptimizer(
        evaluator, proposer, dataset, sites=["answer"], metric_calls=granted, refusals_to_stop=2
    )
    start = Candidate(sites={"answer": SiteState(instructions=LONG_START)})
    proposed = optimizer.propose(start, NO_EVAL)

    # Two reflections, both refused: the round ended there, not after its 200 metric calls: the
    # start program on train, then each reflection's mini-batch.
    assert calls["reflections"] == 2 and optimizer.gave_up and optimizer.rounds == 1
    minibatch = GepaOptimizer.REFLECTION_MINIBATCH
    spent = len(dataset.episodes) + 2 * minibatch
    ledger = json.loads((optimizer.log_dir() / "optloop.json").read_text())
    assert ledger == {"metric_calls": spent, "rounds": 1}  # what it left is not carried over
    assert len(evaluator.ran) == spent + len(dataset.episodes)  # + the rewrite's run of train

    # In the same round: the writer's short instruction for the long prompt, through the same gate.
    assert proposed is not None and proposed.origin.endswith("(proposer rewrite)")
    assert proposed.sites["answer"].instructions.startswith(WRITTEN)
    logged = verdicts([optimizer.work / LOG_NAME])
    assert [(v.who, v.reason) for v in logged] == [
        ("GEPA's reflection", Reason.OFF_TASK),
        ("GEPA's reflection", Reason.OFF_TASK),
        ("the writer's instruction", None),
        ("the writer's instruction", None),
    ]
    assert len(optimizer.queue) == optimizer.fallback_rewrites - 1  # the other rewrite waits

    # The next round resumes the GEPA run from what the first one spent, and stops alike.
    optimizer.queue.clear()
    again = optimizer.propose(start, NO_EVAL)
    assert calls["reflections"] == 4 and again is not None and optimizer.rounds == 2
    assert json.loads((optimizer.log_dir() / "optloop.json").read_text()) == {
        "metric_calls": spent + 2 * minibatch,
        "rounds": 2,
    }
