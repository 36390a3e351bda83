"""Optimizer plumbing that needs no model: frozen sites, the metric's feedback, GEPA's selector,
knob spaces."""

from __future__ import annotations

import dspy
import pytest

from optloop.loop.optimizers.gepa import BlamedSiteSelector
from optloop.loop.program import MemoryProgram, attr_name, feedback_metric, site_name
from systems import get_system


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    from optloop.embed import get_embedder
    from optloop.lm import LMSettings, OptloopLM
    from optloop.loop.evaluate import Evaluator

    lm = OptloopLM(LMSettings.from_spec("local", cache=False))  # never called here
    ev = Evaluator("md_flat", lm, tmp_path_factory.mktemp("ev"), embedder=get_embedder("local"))
    yield ev
    ev.close()


def test_only_tunable_sites_are_predictors(evaluator):
    base = evaluator.baseline()
    program = MemoryProgram(base, ["md_flat.curate"], evaluator.modules(base))
    assert [n for n, _ in program.named_predictors()] == ["md_flat__curate"]
    assert set(program.candidate("x").sites) == {"md_flat.curate", "answer"}
    assert program.candidate("x").digest() == base.digest()
    copy = program.deepcopy()
    copy.md_flat__curate.signature = copy.md_flat__curate.signature.with_instructions("changed")
    assert copy.candidate("x").changed_sites(program.candidate("x")) == ["md_flat.curate"]
    assert program.candidate("x").digest() == base.digest()  # the copy's change stays in the copy


def test_site_names_round_trip():
    assert site_name(attr_name("graphiti.extract_edges.edge")) == "graphiti.extract_edges.edge"
    assert site_name("answer.predict") == "answer"


def test_metric_returns_the_attribution_as_feedback():
    gold = dspy.Example(gold="Biscuit")
    pred = dspy.Prediction(
        answer="Rex",
        passed=False,
        score=0.0,
        attribution={
            "target": "md_flat.curate",
            "error_type": "ExtractionError",
            "explanation": "the dog's name was never stored",
        },
    )
    out = feedback_metric(gold, pred)
    assert out.score == 0.0 and out.site == "md_flat.curate" and "never stored" in out.feedback
    assert "blamed on md_flat.curate" in feedback_metric(gold, pred, pred_name="answer").feedback
    ok = feedback_metric(
        gold, dspy.Prediction(answer="Biscuit", passed=True, score=1.0, attribution=None)
    )
    assert ok.score == 1.0 and ok.feedback.startswith("Correct")


def test_gepa_selector_returns_blamed_components_first():
    select = BlamedSiteSelector(["md_flat.curate"])
    assert select(None, [], [], 0, {"answer": "a", "md_flat__curate": "b"}) == ["md_flat__curate"]
    assert select(None, [], [], 0, {"answer": "a"}) == ["answer"]


def test_the_advice_prompt_asks_for_exactly_the_modules_keys():
    from optloop.loop.optimizers.simba_step import advice_signature

    signature = advice_signature(["answer", "md_flat__curate"])
    assert list(signature.output_fields) == ["discussion", "answer", "md_flat__curate"]
    assert (
        "program_modules" in signature.input_fields
        and "worse_reward_info" in signature.input_fields
    )


def test_knob_choices_come_from_the_system_and_keep_the_current_value(evaluator):
    assert get_system("rag_bm25").knob_choices("top_k", 7) == [7, 1, 3, 5, 10, 20]
    assert get_system("rag_bm25").knob_choices("top_k") == [
        5,
        1,
        3,
        10,
        20,
    ]  # the default value first
    assert get_system("mem0").knob_choices("rerank") == [False, True]
    assert get_system("long_context").knob_choices("max_context_tokens", 3000) == [
        3000,
        2000,
        4000,
        6000,
        8000,
    ]
    recipes = get_system("graphiti").knob_choices("search_recipe")
    assert (
        recipes[0] == "COMBINED_HYBRID_SEARCH_RRF"
        and all(r.startswith(("EDGE_", "COMBINED_")) for r in recipes)
        and "EDGE_HYBRID_SEARCH_RRF" in recipes
    )
    assert evaluator.knob_choices("top_k", 2)[0] == 2  # md_flat's, through the evaluator
    with pytest.raises(KeyError):
        get_system("rag_bm25").knob_choices("threshold")


def test_dspy_progress_bars_are_hidden_inside_a_round_unless_verbose(capsys):
    import logging

    import tqdm

    from optloop.loop.optimizers.rounds import dspy_bars_hidden

    dspy_logger = logging.getLogger("dspy")
    old = dspy_logger.level
    try:
        for level, shown in ((logging.ERROR, False), (logging.INFO, True)):
            dspy_logger.setLevel(level)
            with dspy_bars_hidden():
                import sys

                for _ in tqdm.tqdm(
                    range(3), file=sys.stdout, desc="bar-under-test", disable=False
                ):  # what DSPy's executor does (its disable= overrides TQDM_DISABLE)
                    pass
            assert ("bar-under-test" in capsys.readouterr().out) is shown
    finally:
        dspy_logger.setLevel(old)


def test_a_run_starts_from_the_given_instructions_replaced_appended_or_prepended(evaluator):
    from optloop.loop.runs.runner import LoopConfig, start_candidate

    own = evaluator.baseline().sites["answer"].instructions
    replaced = start_candidate(
        evaluator, LoopConfig(system="md_flat", run_name="x", start={"answer": "Echo it."})
    )
    assert (
        replaced.sites["answer"].instructions == "Echo it."
        and own not in replaced.sites["answer"].instructions
    )
    assert replaced.sites["md_flat.curate"] == evaluator.baseline().sites["md_flat.curate"]
    appended = start_candidate(
        evaluator, LoopConfig(system="md_flat", run_name="x", start={"answer": "+Be brief."})
    )
    assert appended.sites["answer"].instructions == f"{own.rstrip()} Be brief."
    prepended = start_candidate(
        evaluator, LoopConfig(system="md_flat", run_name="x", start={"answer": "Be brief.+"})
    )
    assert prepended.sites["answer"].instructions == f"Be brief. {own.lstrip()}"
    assert (
        start_candidate(evaluator, LoopConfig(system="md_flat", run_name="x"))
        == evaluator.baseline()
    )


class _OneSite(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.answer = dspy.Predict(dspy.Signature("question -> answer", "Answer the question."))


def test_simba_appends_only_advice_that_is_a_well_formed_instruction():
    from optloop.loop.optimizers.simba_step import append_advice

    program = _OneSite()
    for fragment in ("Your answer is", 'Say "the name.', "True"):
        assert append_advice(program, {"answer": fragment}) == []
    assert program.answer.signature.instructions == "Answer the question."
    assert append_advice(program, {"answer": "Give the name only."}) == ["answer"]
    assert program.answer.signature.instructions == "Answer the question.\n\nGive the name only."


@pytest.mark.parametrize(
    ("advice", "made"),
    [("My dog is named Susstun. Your answer is", False), ("Name the dog.", True)],
)
def test_a_simba_rule_step_whose_advice_is_cut_short_makes_no_program(advice, made):
    from dspy.utils import DummyLM

    from optloop.loop.optimizers.simba_step import Run, _rule_strategy

    example = dspy.Example(question="What is the dog's name?", gold="Biscuit").with_inputs(
        "question"
    )
    good = Run(example, dspy.Prediction(answer="Biscuit"), [], 1.0)
    bad = Run(example, dspy.Prediction(answer="Rex"), [], 0.0)
    proposer = DummyLM([{"discussion": "d", "answer": advice}], adapter=dspy.JSONAdapter())
    program = _OneSite()
    if made:
        _rule_strategy(program, [good, bad], 0.0, 1.0, proposer)
        assert program.answer.signature.instructions.endswith(advice)
    else:
        with pytest.raises(ValueError, match="no well-formed advice"):
            _rule_strategy(program, [good, bad], 0.0, 1.0, proposer)
        assert program.answer.signature.instructions == "Answer the question."


@pytest.mark.parametrize(
    ("written", "kept"),
    [("I am a function with a name of", None), ("Answer with the name only.", "same")],
)
def test_a_proposer_rewrite_that_is_not_a_well_formed_instruction_is_left_out(written, kept):
    from dspy.utils import DummyLM

    from optloop.loop.optimizers.propose import propose_instruction

    proposer = DummyLM([{"new_instruction": written}], adapter=dspy.JSONAdapter())
    text = propose_instruction(proposer, "answer", "Answer the question.", "- none", rollout=0)
    assert text == (written if kept else None)


@pytest.mark.parametrize(
    ("written", "kept"),
    [('Answer with "the name.', False), ("Answer with the name only.", True)],
)
def test_gepa_proposals_that_are_not_well_formed_instructions_make_no_candidate(written, kept):
    from dspy.utils import DummyLM

    from optloop.loop.optimizers.gepa import GatedProposer

    reflection = DummyLM([{"new_instruction": written}], adapter=dspy.JSONAdapter())
    examples = [{"Inputs": {"question": "?"}, "Generated Outputs": "Rex", "Feedback": "Biscuit"}]
    with dspy.context(lm=reflection):
        proposed = GatedProposer()({"answer": "Answer."}, {"answer": examples}, ["answer"])
    assert proposed == ({"answer": written} if kept else {})
