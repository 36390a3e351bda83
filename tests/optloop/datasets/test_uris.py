"""Dataset URIs: scheme dispatch and the query parameters every scheme accepts."""

from __future__ import annotations

import pytest

from optloop.datasets import load_dataset, parse_uri
from optloop.errors import DatasetError


def test_parse_uri_splits_scheme_rest_and_query() -> None:
    assert parse_uri("memfail:persona:/d/p.csv?limit=2&questions=1") == (
        "memfail",
        "persona:/d/p.csv",
        {"limit": "2", "questions": "1"},
    )
    assert parse_uri("BUILTIN:tiny") == ("builtin", "tiny", {})


def test_limit_offset_and_questions_cut_the_dataset() -> None:
    full = load_dataset("builtin:tiny")
    cut = load_dataset("builtin:tiny?offset=1&limit=2&questions=1")
    assert [e.id for e in cut.episodes] == [e.id for e in full.episodes[1:3]]
    assert all(len(e.questions) == 1 for e in cut.episodes)
    assert cut.uri == "builtin:tiny?offset=1&limit=2&questions=1"


def test_tasks_keeps_only_those_questions_and_drops_empty_episodes() -> None:
    dataset = load_dataset("synthetic:meme?episodes=2&tasks=cascade,absence")
    assert len(dataset.episodes) == 2
    assert all(
        {q.task_type for q in e.questions} == {"cascade", "absence"} for e in dataset.episodes
    )
    assert len(load_dataset("builtin:tiny?tasks=multi_session").episodes) == 2


@pytest.mark.parametrize(
    ("uri", "pattern"),
    [
        ("tiny", r"not a dataset URI"),
        ("hf:foo", r"unknown dataset scheme 'hf' \(one of: builtin, memfail"),
        (
            "builtin:tiny?limit=0",
            r"builtin:tiny\?limit=0: field 'limit': expected an integer >= 1, got '0'",
        ),
        ("builtin:tiny?limit=two", r"field 'limit': expected an integer >= 1"),
        ("builtin:tiny?seed=3", r"field 'seed': unknown query parameter"),
        ("builtin:tiny?limit", r"field 'limit': query parameter needs a value"),
        ("builtin:tiny?tasks=cascade", r"field 'tasks': no questions of task 'cascade'"),
        ("builtin:tiny?offset=99", r"no episodes left"),
        (
            "memfail:recall",
            r"unknown task 'recall' \(choose one of: coexisting, conditional_easy, "
            r"conditional_hard, "
            r"persona, long_hop\)",
        ),
        ("memfail:persona:/nonexistent/p.csv", r"/nonexistent/p.csv: file not found"),
        ("locomo:", r"locomo: no file given"),
        ("synthetic:chaos", r"unknown generator 'chaos'"),
        (
            "synthetic:suite?episodes=3",
            r"field 'episodes': unknown query parameter \(accepted: seed\)",
        ),
    ],
)
def test_bad_uris_fail_with_one_line_dataset_errors(uri: str, pattern: str) -> None:
    with pytest.raises(DatasetError, match=pattern) as err:
        load_dataset(uri)
    assert "\n" not in str(err.value)
