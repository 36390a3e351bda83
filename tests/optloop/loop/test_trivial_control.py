"""The trivial-instruction control as data: its instruction, its candidate, the sites it rewrites,
and the verdict on a paired difference (no LM)."""

from __future__ import annotations

import dspy
import pytest

from optloop.attribution import blame
from optloop.attribution.taxonomy import Attribution, ErrorType
from optloop.loop.candidate import Candidate, SiteState, trivial_instruction
from optloop.loop.policy import NO_CONTROL, control_sites
from optloop.loop.state import LoopConfig
from optloop.loop.trivial_control import NO_MEASURABLE_CHANGE, control_candidate, verdict
from optloop.stats import Interval
from tests.optloop.loop.optimizers.test_edit import FakeEvaluator, _train

SITES = ["md_flat.curate", "answer"]


def test_the_trivial_instruction_is_dspys_default_for_the_fields_whatever_the_site_says():
    signature = dspy.Signature("memories, question -> answer", "Reply with exactly N/A.")
    text = trivial_instruction(signature)
    assert text == "Given the fields `memories`, `question`, produce the fields `answer`."
    assert trivial_instruction(signature.with_instructions("Anything else.")) == text


def test_the_edit_optimizers_deletion_of_every_unit_is_the_same_text():
    from dspy.utils import DummyLM

    from optloop.loop.optimizers.edit import EditOptimizer

    evaluator = FakeEvaluator()
    opt = EditOptimizer(evaluator, DummyLM([]), _train(), sites=["answer"], seed=0, extra=0)
    [every_unit] = [e for e in opt.edits("One. Two. Three.", "answer") if "del all" in e.ops[0]]
    assert every_unit.text == trivial_instruction(evaluator.sites["answer"].module.signature)


def test_the_control_candidate_changes_only_the_named_instructions():
    demo = {"question": "q", "answer": "a"}
    start = Candidate(
        sites={
            "md_flat.curate": SiteState(instructions="Curate.", demos=[demo]),
            "answer": SiteState(instructions="Answer.", demos=[demo]),
        },
        knobs={"top_k": 3},
        origin="baseline (start instructions)",
    )
    control = control_candidate(start, {"answer": "Given the fields ..."})
    assert control.sites["answer"] == SiteState(instructions="Given the fields ...", demos=[demo])
    assert control.sites["md_flat.curate"] == start.sites["md_flat.curate"]
    assert control.knobs == {"top_k": 3} and control.changed_sites(start) == ["answer"]
    assert control.origin == "control: the trivial instruction at answer"
    assert control.digest() != start.digest()


def entries(*targets: str):
    failures = [
        Attribution(question_id=f"q{i}", error_type=ErrorType.RESPONSE, target=t)
        for i, t in enumerate(targets)
    ]
    return blame(failures, passed=1)


def config(**update) -> LoopConfig:
    return LoopConfig(system="md_flat", run_name="r", **update)


@pytest.mark.parametrize(
    "blamed, settings, sites",
    [
        (("answer", "answer", "md_flat.curate"), {}, ["answer", "md_flat.curate"]),
        (("answer", "knob:top_k"), {}, ["answer"]),  # the knob left as it is
        (("knob:top_k",), {"sites": ["md_flat.curate"]}, ["md_flat.curate"]),
        (("answer",), {"untargeted": True}, SITES),
    ],
)
def test_the_control_rewrites_the_sites_of_the_first_targeting(blamed, settings, sites):
    found, note = control_sites(entries(*blamed), config(**settings), SITES)
    assert sorted(found) == sorted(sites) and note == ""


def test_no_prompt_site_blamed_or_no_control_asked_leaves_none_and_says_why():
    found, note = control_sites(entries("knob:top_k", "knob:top_k"), config(), SITES)
    assert found == [] and note == (
        "none: the blame names no prompt site (only knob:top_k), so there is no prompt to "
        "replace with the trivial instruction"
    )
    found, note = control_sites([], config(), SITES)
    assert found == [] and note.startswith("none: no failure was blamed on a prompt site")
    assert control_sites(entries("answer"), config(control=False), SITES) == ([], NO_CONTROL)


@pytest.mark.parametrize(
    "low, high, said",
    [
        (0.05, 0.3, "measurably better"),
        (-0.3, -0.05, "measurably worse"),
        (0.0, 0.2, NO_MEASURABLE_CHANGE),  # a CI that touches 0 does not exclude it
        (-0.1, 0.1, NO_MEASURABLE_CHANGE),
    ],
)
def test_a_difference_whose_ci_crosses_zero_is_no_measurable_change(low, high, said):
    assert verdict(Interval(estimate=(low + high) / 2, low=low, high=high, n=20)) == said
