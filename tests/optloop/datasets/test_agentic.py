"""The agentic dataset: the generator's categories re-derived from its facts, the jsonl layout, the
log format, validation errors, and the context metrics."""

from __future__ import annotations

from collections import Counter

import pytest

from optloop.datasets import load_dataset
from optloop.datasets.agentic import (
    CATEGORIES,
    SESSION_KIND,
    AgenticEpisode,
    generate_records,
    mentions,
    parse_scope,
    parse_tag,
    path_matches,
    scope_header,
    score_context,
    tag_line,
    to_episode,
    write_agentic_jsonl,
)
from optloop.errors import DatasetError


@pytest.fixture(scope="module")
def records() -> list[AgenticEpisode]:
    return generate_records(records=60, seed=3)


def test_records_are_probes_split_evenly_over_the_four_categories(records):
    probes = [p for r in records for p in r.probes]
    assert len(probes) == 60 and len(records) == 8  # 8 probes an episode, the last one partial
    assert Counter(p.category for p in probes) == {c: 15 for c in CATEGORIES}
    assert generate_records(records=60, seed=3) == records
    assert generate_records(records=60, seed=4) != records


def test_each_category_is_what_its_facts_say(records):
    for record in records:
        for probe in record.probes:
            same = [
                f for f in record.facts if f.workspace == probe.workspace and f.key == probe.key
            ]
            holding = [f for f in same if f.value == probe.gold]
            assert len(holding) == 1, probe
            truth = holding[0]
            dead = [f for f in same if f.branch != "completed"]
            if probe.category == "clean_recall":
                assert (truth.branch, truth.status, probe.distractors) == (
                    "completed",
                    "active",
                    [],
                )
            elif probe.category == "superseded":
                old = next(f for f in same if f.value == probe.distractors[0])
                assert (
                    old.status == "superseded"
                    and old.branch == "completed"
                    and truth.status == "active"
                )
                assert record.facts.index(old) < record.facts.index(truth)
            elif probe.category == "dead_branch":
                bad = next(f for f in same if f.value == probe.distractors[0])
                assert bad in dead and bad.status == "active" and truth.branch == "completed"
                assert record.facts.index(truth) < record.facts.index(bad)
            else:
                assert probe.category == "failed_branch_truth"
                assert (truth.branch, truth.status, same, probe.distractors) == (
                    "failed",
                    "active",
                    [truth],
                    [],
                )
            assert truth.path == probe.path


def test_the_episode_is_a_tagged_agent_log_with_scoped_questions(records):
    record = records[0]
    episode = to_episode(record)
    assert all(s.kind == SESSION_KIND for s in episode.sessions)
    assert len(episode.sessions) == len({f.run for f in record.facts})
    first = episode.sessions[0]
    assert (
        parse_tag(first.turns[0].content)[1] == "run"
        and parse_tag(first.turns[-1].content)[1] == "end"
    )
    facts = {f.id: f for f in record.facts}
    for turn in episode.all_turns():
        text, kind, data = parse_tag(turn.content)
        if kind == "fact":
            assert text == facts[turn.id].content and data["value"] == facts[turn.id].value
    stamps = [s.timestamp for s in episode.sessions]
    assert stamps == sorted(stamps)
    for question, probe in zip(episode.questions, record.probes, strict=True):
        assert parse_scope(question.question) == (probe.workspace, probe.path, probe.question)
        assert question.evidence_ids == [f.id for f in record.facts if f.value == probe.gold]
        assert question.meta["distractors"] == probe.distractors and question.scorer == "contains"
        foreign = {f.value for f in record.facts if f.workspace != probe.workspace}
        assert set(question.meta["foreign"]) == foreign and foreign
        assert set(question.forbidden) == set(probe.distractors) | foreign
        assert question.task_type == probe.category


def test_the_uri_generates_and_a_written_file_loads_back_identically(tmp_path, records):
    generated = load_dataset("agentic:generate?records=60&seed=3")
    assert generated.name == "agentic:generate?records=60&seed=3&probes=8&workspaces=3"
    path = write_agentic_jsonl(records, tmp_path / "agent.jsonl")
    loaded = load_dataset(f"agentic:{path}")
    assert [e.model_dump() for e in loaded.episodes] == [
        e.model_dump() for e in generated.episodes
    ]
    assert (
        load_dataset("agentic:generate?records=10&seed=1&probes=5&workspaces=2")
        .episodes[0]
        .questions[4]
    )
    assert len(load_dataset("agentic:generate?records=60&seed=3&limit=2").episodes) == 2


@pytest.mark.parametrize(
    "uri, message",
    [
        ("agentic:generate?size=3", "unknown query parameter"),
        ("agentic:generate?workspaces=1", "workspaces"),
        ("agentic:generate?records=0", "records"),
    ],
)
def test_bad_generator_uris_fail_before_any_work(uri, message):
    with pytest.raises(DatasetError, match=message):
        load_dataset(uri)


def _write(tmp_path, record: dict) -> str:
    import json

    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return f"agentic:{path}"


def _fact(i: int, run: str, value: str, **extra) -> dict:
    return {
        "id": f"f{i}",
        "run": run,
        "key": "api.port",
        "value": value,
        "content": f"The API listens on {value}.",
        "workspace": "billing",
        **extra,
    }


PROBE = {
    "id": "p",
    "question": "Which port?",
    "gold": "20002",
    "workspace": "billing",
    "category": "superseded",
    "recall": ["20002"],
    "distractors": ["20001"],
}


@pytest.mark.parametrize(
    "facts, probe, message",
    [
        (
            [_fact(1, "r1", "20001"), _fact(2, "r2", "20002")],
            PROBE,
            "facts\\[0\\].status.*mark it superseded",
        ),
        (
            [
                _fact(1, "r1", "20001", status="superseded"),
                _fact(2, "r2", "20002"),
                _fact(3, "r1", "20003"),
            ],
            PROBE,
            "not contiguous",
        ),
        (
            [
                _fact(1, "r1", "20001", status="superseded"),
                _fact(2, "r1", "20002", branch="failed"),
            ],
            PROBE,
            "mixes",
        ),
        (
            [_fact(1, "r1", "20002")],
            {**PROBE, "recall": ["29999"]},
            "marker '29999' appears in no fact",
        ),
        (
            [_fact(1, "r1", "20002")],
            {**PROBE, "workspace": "search"},
            "no fact was written in workspace 'search'",
        ),
        ([_fact(1, "r1", "20002", branch="merged")], PROBE, "branch"),
    ],
)
def test_malformed_records_name_the_line_and_field(tmp_path, facts, probe, message):
    with pytest.raises(DatasetError, match=f"bad.jsonl: line 1: .*{message}"):
        load_dataset(_write(tmp_path, {"id": "e", "facts": facts, "probes": [probe]}))


def test_a_file_takes_no_query_parameters(tmp_path, records):
    path = write_agentic_jsonl(records[:1], tmp_path / "a.jsonl")
    with pytest.raises(DatasetError, match="unknown query parameter"):
        load_dataset(f"agentic:{path}?seed=2")


def test_log_format_helpers():
    assert parse_tag("Set the port.\n" + tag_line("fact", {"key": "k", "value": "v"})) == (
        "Set the port.",
        "fact",
        {"key": "k", "value": "v"},
    )
    assert parse_tag("no tag here") == ("no tag here", None, {})
    assert parse_tag("broken\n@fact {not json}") == ("broken\n@fact {not json}", None, {})
    assert parse_scope(f"{scope_header('billing', 'services/api')} Which port?") == (
        "billing",
        "services/api",
        "Which port?",
    )
    assert parse_scope("[workspace auth] Which host?") == ("auth", "", "Which host?")
    assert parse_scope("Which host?") == (None, "", "Which host?")
    assert path_matches("services/api", "services/api/handlers") and path_matches("", "infra")
    assert path_matches("services/api/v2", "services/api") and not path_matches(
        "services/worker", "services/api"
    )
    assert mentions("Port is 24817.", "24817") and not mentions("Port is 248170.", "24817")
    assert mentions("host db-alpha-11 today", "db-alpha-11") and not mentions(
        "db-alpha-112", "db-alpha-11"
    )


def test_context_metrics_recall_contamination_leakage_and_clean(records):
    episode = to_episode(records[0])
    question = next(q for q in episode.questions if q.meta["category"] == "superseded")
    gold, stale, foreign = (
        question.gold,
        question.meta["distractors"][0],
        question.meta["foreign"][0],
    )

    clean = score_context(question, [f"The value is {gold}."])
    assert (clean.recall, clean.contaminated, clean.leaked, clean.clean) == (
        1.0,
        False,
        False,
        True,
    )
    dirty = score_context(question, [f"It is {gold}.", f"It was {stale}."])
    assert dirty.contaminated and not dirty.clean and dirty.recall == 1.0
    negative_only = score_context(question, [], [f"It was {stale}.", f"Elsewhere {foreign}."])
    assert (
        not negative_only.contaminated and negative_only.leaked
    )  # leakage counts the whole context
    missing = score_context(question, ["nothing useful"], [f"this did not work: {gold}"])
    assert (missing.recall, missing.recall_any, missing.positive, missing.negative) == (
        0.0,
        1.0,
        1,
        1,
    )
    assert missing.category == "superseded"
