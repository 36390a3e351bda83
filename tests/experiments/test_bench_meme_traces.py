"""The MEME published-traces benchmark on the hand-written fixture: its figures, JSON keys and
tables."""

from __future__ import annotations

import json

from experiments.bench import meme_traces
from tests._meme_fixture import FIXTURE

KEYS = {
    "n",
    "agreement",
    "confusion",
    "per_system",
    "ms_per_failure",
    "llm_calls",
    "disagreements",
}


def test_bench_json_has_the_promised_keys_and_the_fixtures_figures(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert meme_traces.main(["--path", str(FIXTURE), "--json", str(out), "--lexical-only"]) == 0
    report = json.loads(out.read_text())
    assert KEYS <= set(report)
    assert report["n"] == 7 and report["probes"] == 8 and report["llm_calls"] == 0
    assert abs(report["agreement"] - 6 / 7) < 1e-9
    assert report["confusion"]["encoding"] == {
        "encoding": 2,
        "maintenance": 0,
        "retrieval": 0,
        "answering": 0,
        "none": 0,
    }
    assert report["confusion"]["maintenance"]["maintenance"] == 1
    assert report["confusion"]["retrieval"] == {
        "encoding": 0,
        "maintenance": 0,
        "retrieval": 1,
        "answering": 1,
        "none": 0,
    }
    assert report["confusion"]["answering"]["answering"] == 2
    assert report["per_system"]["flat"] == {"n": 3, "agree": 3, "agreement": 1.0}
    assert report["per_system"]["chunks"]["agreement"] == 0.75
    assert 0 < report["ms_per_failure"] < 1000
    (d,) = report["disagreements"]
    assert (d["probe"], d["system"], d["label"], d["verdict"], d["stage"]) == (
        "after/Cascade-D (1-hop)",
        "chunks",
        "retrieval",
        "ResponseError",
        "answering",
    )
    assert d["explanation"].startswith("[fact weekly_report_recipient='Cy Diaz']")
    printed = capsys.readouterr().out
    assert "agreement 0.857" in printed and "1 disagreement (mark each" in printed
    assert "[fact weekly_report_recipient" in printed  # rich markup escaped


def test_evaluate_counts_an_unattributed_verdict_as_a_disagreement():
    from optloop.attribution.taxonomy import ErrorType
    from optloop.attribution.traces import attribute_traces
    from optloop.tracing.meme_traces import import_traces

    failures = attribute_traces(import_traces(FIXTURE))
    failures[0].attribution = failures[0].attribution.model_copy(
        update={"error_type": ErrorType.UNKNOWN}
    )
    report = meme_traces.evaluate(failures)
    assert report["n"] == 7 and abs(report["agreement"] - 5 / 7) < 1e-9
    assert sum(row["none"] for row in report["confusion"].values()) == 1
    assert any(d["stage"] is None for d in report["disagreements"])
