"""Candidates as data: digests, ingest keys, prompt text and diffs, target choice."""

from __future__ import annotations

import pytest

from optloop.attribution import blame
from optloop.attribution.taxonomy import Attribution, ErrorType
from optloop.errors import ConfigError
from optloop.loop.candidate import Candidate, SiteState, ingest_key, prompt_diff
from optloop.loop.runs.runner import LoopConfig, choose_targets

STAGES = {"md_flat.curate": "ingest", "answer": "answer"}


def cand(curate="Curate facts.", answer="Answer.", top_k=5, demos=()):
    return Candidate(
        sites={
            "md_flat.curate": SiteState(instructions=curate, demos=list(demos)),
            "answer": SiteState(instructions=answer),
        },
        knobs={"top_k": top_k},
    )


def test_answer_only_changes_keep_the_ingest_key():
    base = cand()
    assert ingest_key("md_flat", cand(answer="Answer briefly."), STAGES) == ingest_key(
        "md_flat", base, STAGES
    )
    assert ingest_key("md_flat", cand(top_k=9), STAGES) == ingest_key("md_flat", base, STAGES)
    assert ingest_key("md_flat", cand(curate="Keep dates."), STAGES) != ingest_key(
        "md_flat", base, STAGES
    )
    assert ingest_key(
        "md_flat", cand(demos=[{"user_content": "x", "facts": []}]), STAGES
    ) != ingest_key("md_flat", base, STAGES)
    assert ingest_key("mem0", base, STAGES) != ingest_key("md_flat", base, STAGES)


def test_digest_and_changes():
    base, other = cand(), cand(answer="Answer briefly.", top_k=3)
    assert base.digest() == cand().digest() != other.digest()
    assert other.changed_sites(base) == ["answer"] and other.changed_knobs(base) == ["top_k"]


def test_prompt_diff_names_only_changed_sites():
    diff = prompt_diff({"a": "One.\nTwo.", "b": "same"}, {"a": "One.\nThree.", "b": "same"})
    assert (
        "a (before)" in diff and "+Three." in diff and " One." in diff and "b (before)" not in diff
    )
    assert prompt_diff({"a": "x"}, {"a": "x"}) == "(no prompt changed)\n"


def test_prompt_diff_compares_sentences_whatever_the_line_breaks():
    """A docstring's instruction (wrapped) against the one-line edit of it: only the edited
    sentence differs."""
    before = (
        'Answer the question. Give the shortest answer that is\ncorrect. If unsure, reply "I '
        "don't know\"."
    )
    after = "Answer the question. Give the shortest answer that is correct. If unsure,"
    diff = prompt_diff({"answer": before}, {"answer": after}).splitlines()
    assert [
        line for line in diff if line[:1] in ("+", "-") and line[:3] not in ("---", "+++")
    ] == ['-If unsure, reply "I don\'t know".', "+If unsure,"]
    demos = prompt_diff(
        {"s": 'Be brief.\n\n# Examples\n{"q": 1}'}, {"s": 'Be brief.\n\n# Examples\n{"q": 2}'}
    )
    assert '-{"q": 1}' in demos and '+{"q": 2}' in demos and "-Be brief." not in demos


def attribution(target, error=ErrorType.EXTRACTION):
    return Attribution(question_id="q", error_type=error, target=target)


def config(**kw):
    return LoopConfig(system="md_flat", run_name="r", **kw)


def test_targets_are_the_blamed_prompt_sites_and_knobs():
    entries = blame(
        [
            attribution("md_flat.curate"),
            attribution("md_flat.curate"),
            attribution("knob:top_k", ErrorType.RETRIEVAL),
        ]
    )
    assert choose_targets(entries, config(), ["md_flat.curate", "answer"]) == (
        ["md_flat.curate"],
        ["top_k"],
        "",
    )
    sites, _, note = choose_targets(entries, config(untargeted=True), ["md_flat.curate", "answer"])
    assert sites == ["md_flat.curate", "answer"] and "untargeted" in note


def test_without_a_blamed_prompt_the_answer_site_is_targeted_and_the_note_says_why():
    entries = blame([attribution("knob:top_k", ErrorType.RETRIEVAL)])
    sites, knobs, note = choose_targets(entries, config(), ["md_flat.curate", "answer"])
    assert (sites, knobs) == (["answer"], ["top_k"]) and "no prompt site is to blame" in note


def test_given_sites_are_the_targets_and_the_note_names_the_blame_left_alone():
    entries = blame(
        [attribution("md_flat.curate"), attribution("knob:top_k", ErrorType.RETRIEVAL)]
    )
    sites, knobs, note = choose_targets(
        entries, config(sites=["answer"]), ["md_flat.curate", "answer"]
    )
    assert (sites, knobs) == (["answer"], [])
    assert note == (
        "--sites answer: the optimizer rewrites only this site; the blame also names "
        "md_flat.curate, knob:top_k, left as they are"
    )


def test_unknown_sites_are_refused():
    with pytest.raises(ConfigError, match="no such site"):
        choose_targets([], config(sites=["nope"]), ["answer"])


def test_budget_bounds_are_part_of_the_config():
    with pytest.raises(ValueError):
        config(budget=0)
    assert config().digest() == config().digest() != config(seed=1).digest()
