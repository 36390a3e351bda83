"""docs/benchmarks.md is generated from the results files, and every results file carries its
provenance."""

from __future__ import annotations

import json

import pytest

from experiments import report


def test_benchmarks_page_is_up_to_date_with_the_results_files():
    assert report.PAGE.read_text(encoding="utf-8") == report.render(), (
        "docs/benchmarks.md differs from experiments/results/*.json: run python -m "
        "experiments.report"
    )


@pytest.mark.parametrize("path", sorted(report.RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_results_file_states_command_date_commit_model_and_machine(path):
    provenance = json.loads(path.read_text(encoding="utf-8")).get("provenance", {})
    assert {k for k, v in provenance.items() if v} >= {
        "command",
        "date",
        "commit",
        "model",
        "machine",
    }, path.name


def test_every_results_file_is_on_the_benchmarks_page_or_linked_from_it():
    page = report.PAGE.read_text(encoding="utf-8")
    names = [p.name for p in sorted(report.RESULTS.iterdir()) if p.suffix in (".json", ".md")]
    unlinked = [n for n in names if n not in page and n.replace(".md", ".json") not in page]
    assert not unlinked, f"results files nothing shows or links: {unlinked}"


def test_a_benchmark_stamps_its_results_with_their_provenance():
    from experiments.provenance import stamped

    data = stamped(
        {"rows": [1], "provenance": {"command": "old"}},
        "local:SmolLM2",
        command="python -m x --json y",
    )
    assert list(data) == ["provenance", "rows"]
    p = data["provenance"]
    assert (
        p["command"] == "python -m x --json y"
        and p["model"] == "local:SmolLM2"
        and p["commit"] != ""
    )
    assert len(p["date"]) == 10 and "CPUs" in p["machine"]


def _run(command: str, *, origin: str, delta: tuple, over_control: tuple) -> dict:
    def d(v: tuple) -> dict:
        return {"estimate": v[0], "low": v[1], "high": v[2], "n": 20}

    return {
        "provenance": {
            "command": command,
            "date": "2026-11-28",
            "commit": "abc1234",
            "model": "qwen2.5-coder-0.5b",
            "machine": "2 CPUs",
        },
        "trials": [{"trial": 1, "origin": origin, "dev": 1.0}],
        "best_trial": 1,
        "test_before": "0.000 [0.000, 0.000] n=20",
        "test_after": "0.850 [0.700, 1.000] n=20",
        "delta": d(delta),
        "control": {
            "dev": "0.500 [0.300, 0.700] n=20",
            "test": "0.550 [0.350, 0.750] n=20",
            "delta_best_minus_control": d(over_control),
        },
    }


def test_written_against_control_counts_only_written_texts_above_both(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    (tmp_path / "a.json").write_text(
        json.dumps(
            _run(
                "python -m optloop.run --system mem0 --proposer-lm local:qwen2.5-coder-1.5b "
                "--optimizer gepa --budget 3",
                origin="gepa round 2 #1 (proposer rewrite)",
                delta=(0.85, 0.7, 1.0),
                over_control=(0.3, 0.05, 0.55),
            )
        )
    )
    (tmp_path / "b.json").write_text(
        json.dumps(
            _run(
                "python -m optloop.run --system rag_bm25 --query-rewrite --budget 6",
                origin="edit round 1: retrieve.query del all (the signature's default)",
                delta=(0.2, 0.05, 0.4),
                over_control=(0.0, 0.0, 0.0),
            )
        )
    )
    (tmp_path / "other.json").write_text(json.dumps({"provenance": {}, "rows": []}))
    text = "\n".join(report.written_against_control())
    assert "1 of 2 runs end with a written text" in text
    assert "`a.json` (2026-11-28, abc1234)" in text
    assert "| mem0 | `the default` |" in text
    assert "rag_bm25 (query rewrite)" in text and "edit, budget 6" in text
    assert "+0.300 [+0.050, +0.550], measurably better" in text
    assert "+0.000 [+0.000, +0.000], no measurable change" in text
    assert "other.json" not in text


def test_written_against_control_is_absent_without_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert report.written_against_control() == []


def _repair_case(case: str, mode: str, origin: str, **extra: object) -> dict[str, object]:
    return {
        "case": case,
        "site": "md_flat.curate",
        "mode": mode,
        "optimizer": "edit",
        "writer": "qwen2.5-coder-1.5b",
        "arm": "targeted",
        "seed": 0,
        "sabotaged": 0.0,
        "after": 0.9,
        "recovered": 0.95,
        "sabotage_removed": True,
        "changed": ["md_flat.curate"],
        "best_trial": 2,
        "trials": [
            {
                "trial": 1,
                "origin": "edit round 1: md_flat.curate del all (the signature's "
                "default instruction)",
                "dev": 0.0,
            },
            {"trial": 2, "origin": origin, "dev": 0.8},
        ],
        **extra,
    }


def test_replaced_runs_gathers_replaced_cases_and_says_how_each_winner_was_made(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    written = _repair_case("curate-empty", "replace", "edit round 2: md_flat.curate write 2")
    default = _repair_case(
        "curate-empty",
        "replace",
        "edit round 1: md_flat.curate del all (the signature's default instruction)",
        seed=1,
        after=0.5,
        recovered=0.4,
    )
    kept = _repair_case("curate-empty", "replace", "x", seed=2, changed=[], sabotage_removed=False)
    added = _repair_case("curate-add", "add", "edit round 1: md_flat.curate del 0")
    (tmp_path / "repair_x.json").write_text(
        json.dumps(
            {
                "budget": 6,
                "model": "local:qwen2.5-coder-1.5b-instruct-q4_k_m.gguf:1117320768",
                "cases": [written, default, kept, added],
            }
        )
    )
    (tmp_path / "other.json").write_text(json.dumps({"cases": [written]}))
    text = "\n".join(report.replaced_runs())
    assert (
        "| curate-empty | md_flat.curate | qwen2.5-coder-1.5b-instruct-q4_k_m | edit, "
        "qwen2.5-coder-1.5b writes | 6 | targeted | 3 | 2/3 | 2/3 | default 1, unchanged 1, "
        "written 1 | 0.00 -> 0.77 |" in text
    )
    assert "curate-add" not in text and "other.json" not in text


def test_replaced_runs_is_absent_without_replaced_cases(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert report.replaced_runs() == []


def test_by_text_reads_only_the_trials_that_edited_the_sabotaged_site():
    case = _repair_case("curate-empty", "replace", "edit round 1: md_flat.curate write 2")
    case["clean"] = 0.95
    case["trials"].append(
        {
            "trial": 3,
            "origin": "edit round 2: answer del all (the signature's default)",
            "dev": 1.0,
        }
    )
    case["trials"].append({"trial": 4, "origin": "edit round 2: answer write 0", "dev": 1.0})
    assert (
        "| curate-empty | targeted | 0 | 0.00 | 0.80 | 0.00 | 0.90 | - | 0.95 |"
        in report._by_text([case], "own prompts")
    )
    case["control_test"] = 0.1
    assert "| 0.00 | 0.90 | 0.10 | 0.95 |" in report._by_text([case], "own prompts")


def test_a_winner_is_the_last_better_trial_at_the_sabotaged_site():
    case = _repair_case("curate-empty", "replace", "edit round 1: md_flat.curate write 2")
    case["trials"].append({"trial": 3, "origin": "edit round 2: answer del 0", "dev": 0.9})
    case["best_trial"] = 3
    assert report._winner_kind(case) == "written"
