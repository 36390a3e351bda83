"""The defaults table: a measured row with its day, an unmeasured one named as such."""

from __future__ import annotations

import json

from experiments.bench.defaults import Row, _merged, _previous_rows, to_markdown

PROVENANCE = {
    "command": "python -m experiments.bench.defaults --report-only",
    "date": "2026-11-27",
    "commit": "abc1234",
    "model": "local:SmolLM2",
    "machine": "2 CPUs",
}


def test_a_measured_row_shows_its_headroom_and_day_and_an_unmeasured_one_says_so():
    rows = [
        Row(
            system="md_flat",
            dataset="synthetic:recall?seed=0&episodes=40",
            n_dev=20,
            n_test=20,
            dev="0.000 [0.000, 0.000] n=20",
            dev_accuracy=0.0,
            train_accuracy=0.0,
            headroom=False,
            baseline_seconds=147.8,
            hours=1.39,
            measured="2026-11-27",
        ),
        Row(system="mem0", note="not measured"),
    ]
    text = to_markdown(rows, {"provenance": PROVENANCE, "budget": 50})
    lines = text.splitlines()
    md_flat = next(line for line in lines if line.startswith("| md_flat"))
    assert md_flat.split(" | ")[5:] == ["NO", "148", "1.4", "2026-11-27 |"]
    assert "| mem0 | not measured |" in text
    assert "| projected hours, --budget 50 | measured |" in text


def test_systems_left_out_keep_their_rows_from_the_earlier_report(tmp_path):
    earlier = [Row(system="rag_bm25", note="a"), Row(system="mem0", note="old")]
    path = tmp_path / "defaults.json"
    path.write_text(json.dumps({"rows": [r.model_dump() for r in earlier]}))

    rows = _merged(_previous_rows(path), [Row(system="mem0", note="new"), Row(system="x")])

    assert [(r.system, r.note) for r in rows] == [("rag_bm25", "a"), ("mem0", "new"), ("x", "")]
    assert _previous_rows(tmp_path / "missing.json") == []
