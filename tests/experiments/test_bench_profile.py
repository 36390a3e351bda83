"""The profile bench's comparison of two evaluations' answers and its tables (no model)."""

from __future__ import annotations

from experiments.bench.profile import PARTS, compare, to_markdown


def answers(**by_key: str) -> dict[str, dict[str, str]]:
    return {key: {"site": "extract nodes", "answer": text} for key, text in by_key.items()}


def test_calls_are_compared_by_key_and_each_different_answer_is_listed():
    first = answers(a='{"x": 1}', b='{"y": 2}', c="Paris")
    other = answers(a='{"x": 1}', b='{"y": 3}', d="Lyon")
    cmp = compare(first, other)
    assert cmp["same"] == 1 and cmp["only_first"] == 1 and cmp["only_other"] == 1
    assert cmp["different"] == [
        {"site": "extract nodes", "before": '{"y": 2}', "after": '{"y": 3}'}
    ]


def run(config: str, seconds: float) -> dict:
    return {
        "config": config,
        "seconds": seconds,
        "sessions": 12,
        "seconds_per_session": round(seconds / 12, 1),
        "questions": 10,
        "accuracy": {"estimate": 0.1, "low": 0.0, "high": 0.3, "n": 10},
        "calls": 41,
        "parts_s": dict.fromkeys(PARTS, 1.0),
        "prompt_tokens_evaluated": 1000,
        "tokens_generated": 100,
    }


def test_the_markdown_has_the_speed_up_every_part_and_the_answers_compared():
    report = {
        "provenance": {"command": "python -m experiments.bench.profile", "date": "2026-11-26"},
        "system": "graphiti",
        "dataset": "synthetic:suite?seed=0",
        "runs": [run("1:llama.cpp", 600.0), run("8:grammar-first", 300.0)],
        "comparisons": [
            {
                "same": 40,
                "different": [{"site": "s", "before": "a", "after": "b"}],
                "only_first": 0,
                "only_other": 0,
                "delta": {"estimate": 0.0, "low": 0.0, "high": 0.0, "n": 10},
            }
        ],
    }
    text = to_markdown(report)
    assert "| 8:grammar-first | 300.0 | 25.0 | 2.00x |" in text
    assert all(f"| {part} |" in text for part in PARTS)
    assert "40 same, 1 different" in text and "`a` -> `b`" in text
