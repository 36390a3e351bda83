"""Blame targets as typed values: ``Target(kind, name)`` and its string form, which every report
keeps."""

from __future__ import annotations

import pytest

from optloop import sites
from optloop.attribution import Attribution, ErrorType, Target, blame
from optloop.attribution.taxonomy import is_knob, is_prompt_site, knob_target, library_target


@pytest.mark.parametrize(
    "text, kind, name",
    [
        ("answer", "site", "answer"),
        ("mem0.extract", "site", "mem0.extract"),
        ("retrieve.query", "site", "retrieve.query"),
        ("knob:top_k", "knob", "top_k"),
        ("library:mem0.store", "library", "mem0.store"),
    ],
)
def test_a_target_reads_and_writes_its_string_form(text, kind, name):
    target = Target.parse(text)
    assert (target.kind, target.name) == (kind, name) and str(target) == text
    assert target.is_prompt_site is (kind == "site") is is_prompt_site(text)
    assert is_knob(text) is (kind == "knob")


def test_the_helpers_build_the_same_strings():
    assert knob_target("top_k") == str(Target.knob("top_k")) == "knob:top_k"
    assert (
        library_target("mem0.store") == str(Target.library("mem0.store")) == "library:mem0.store"
    )
    assert Target.site(sites.ANSWER) == Target.parse("answer")
    assert not is_knob(None) and not is_prompt_site(None)


def test_attributions_and_blame_entries_give_their_target_typed():
    attributions = [
        Attribution(question_id="q1", error_type=ErrorType.RETRIEVAL, target="knob:top_k"),
        Attribution(question_id="q2", error_type=ErrorType.RESPONSE, target=sites.ANSWER),
        Attribution(question_id="q3", error_type=ErrorType.UNKNOWN),
    ]
    assert [a.blamed for a in attributions] == [Target.knob("top_k"), Target.site("answer"), None]
    assert {e.blamed for e in blame(attributions)} == {Target.knob("top_k"), Target.site("answer")}
