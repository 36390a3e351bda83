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
