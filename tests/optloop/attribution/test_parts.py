"""Part-by-part attribution of the published fixture: each MEME stage, the retraction judge, the
skip rule."""

from __future__ import annotations

import numpy as np
import pytest

from optloop.attribution.evidence import Evidence
from optloop.attribution.parts import Part, RetractionJudge, attribute_parts, parts_to_walk, states
from optloop.attribution.taxonomy import ErrorType
from optloop.attribution.traces import MEME_STAGE, attribute_traces, llm_calls
from optloop.embed import CachedEmbedder, Embedder
from optloop.tracing.meme_traces import import_traces
from tests._meme_fixture import FIXTURE


@pytest.fixture(scope="module")
def verdicts():
    return {(f.system, f.question.id): f for f in attribute_traces(import_traces(FIXTURE))}


@pytest.mark.parametrize(
    "system, question, error_type, part",
    [
        # encoding: the flat file never recorded the deletion request, nor the new team lead
        ("flat", "fx_001-after:deletion", ErrorType.EXTRACTION, "retraction log_drain_endpoint"),
        ("flat", "fx_001-after:cascade", ErrorType.EXTRACTION, "change team_lead"),
        # maintenance: session s3 removed the line that held Karnex Pack
        (
            "flat",
            "fx_001-after:tracking",
            ErrorType.DELETION,
            "fact package_manager='Karnex Pack'",
        ),
        # retrieval: the chunk with Karnex Pack was stored and kept but not retrieved
        (
            "chunks",
            "fx_001-after:tracking",
            ErrorType.RETRIEVAL,
            "fact package_manager='Karnex Pack'",
        ),
        # answering: the evidence (the value; the deletion request) was in front of the answer
        ("chunks", "fx_001-before:deletion", ErrorType.RESPONSE, "fact log_drain_endpoint"),
        ("chunks", "fx_001-after:deletion", ErrorType.RESPONSE, "retraction log_drain_endpoint"),
    ],
)
def test_each_stage_is_found_at_its_part(verdicts, system, question, error_type, part):
    failure = verdicts[system, question]
    a = failure.attribution
    assert a.error_type is error_type and a.details["part"].startswith(part)
    assert failure.stage == failure.probe.failure_stage == MEME_STAGE[error_type]
    assert a.question_id == question and a.explanation.startswith(f"[{part}")


def test_the_decisive_op_is_in_the_session_that_broke(verdicts):
    flat = verdicts["flat", "fx_001-after:tracking"]
    graph = next(
        r.graph
        for r in import_traces(FIXTURE)
        if (r.system, r.episode.id) == ("flat", "fx_001-after")
    )
    op = graph.op(flat.attribution.op_id)
    assert (op.name, op.session_id) == ("delete", "s3")
    change = verdicts["flat", "fx_001-after:cascade"].attribution
    assert (
        graph.op(change.op_id).session_id == "s3"
    )  # the store of the session holding the change event


def test_the_earliest_failing_part_wins_and_stated_parts_are_skipped(verdicts):
    cascade = verdicts["flat", "fx_001-after:cascade"].attribution
    assert [p["error_type"] for p in cascade.details["parts"]] == [
        "ResponseError",
        "ExtractionError",
    ]
    tracking = verdicts["chunks", "fx_001-after:tracking"].attribution
    assert tracking.details["skipped"] == [
        "fact package_manager='Dranith Stack'"
    ]  # the answer states it
    # the arguable label: rule and change were both retrieved, optloop says the answer failed
    assert verdicts["chunks", "fx_001-after:cascade"].stage == "answering"


def test_no_llm_and_a_verdict_for_every_failure(verdicts):
    assert len(verdicts) == 7 and llm_calls(verdicts.values()) == 0
    assert all(f.attribution.judge_calls.get("llm", 0) == 0 for f in verdicts.values())


def test_retraction_judge_needs_the_deletion_and_the_name_on_one_line():
    judge = RetractionJudge("log_drain_endpoint")
    ev = Evidence(
        message_ids=["m"],
        texts=["Please delete the log drain endpoint x.io/app"],
        answer="x.io/app",
        source="dataset",
    )
    assert judge.carries(
        [
            "User asked to delete the log drain endpoint from memory",  # entity + deletion
            "x.io/app was removed at the user's request",  # value + deletion
            "Logs drain to x.io/app",  # the stale fact: no deletion said
            "User deleted an old branch\nLogs drain to x.io/app",  # both, but not on one line
        ],
        ev,
    ) == [True, True, False, False]


def test_parts_to_walk_skips_what_the_answer_states_unless_nothing_is_left():
    a, b = Part("s1:t2", "pm", "Karnex Pack"), Part("s3:t2", "pm", "Dranith Stack")
    assert parts_to_walk([a, b], "Dranith Stack") == ([a], [b])
    assert parts_to_walk([a, b], "Karnex Pack, Dranith Stack") == ([a, b], [])
    change = Part("s3:t6", "team_lead", "Dee Evans", "change")
    assert parts_to_walk([change], "Dee Evans") == ([change], [])  # only facts are skipped
    assert states("We use Dranith Stack now", "Dranith Stack") and not states(
        "Dranith", "Dranith Stack Modules"
    )


def test_without_parts_the_plain_walk_runs(verdicts):
    failure = verdicts["chunks", "fx_001-before:deletion"]
    graph = next(
        r.graph
        for r in import_traces(FIXTURE)
        if (r.system, r.episode.id) == ("chunks", "fx_001-before")
    )
    bare = failure.question.model_copy(update={"meta": {}})
    plain = attribute_parts(graph, bare, failure.probe.answer)
    assert plain.error_type is ErrorType.RESPONSE and "part" not in plain.details


class _CountingEmbedder(Embedder):
    batch_size = 8

    def __init__(self):
        self.seen: list[str] = []

    @property
    def name(self) -> str:
        return "counting"

    @property
    def dim(self) -> int:
        return 2

    def _embed_batch(self, texts):
        self.seen += texts
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)


def test_cached_embedder_embeds_each_text_once():
    inner = _CountingEmbedder()
    cached = CachedEmbedder(inner)
    first = cached.embed(["a", "bb", "a"])
    second = cached.embed(["bb", "ccc"])
    assert inner.seen == ["a", "bb", "ccc"]
    assert np.allclose(first[0], first[2]) and np.allclose(first[1], second[0])
