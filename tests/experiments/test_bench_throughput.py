"""The throughput benchmark end to end: record on a stand-in for the embedded LM, replay at N = 1
and 2."""

from __future__ import annotations

import json

import pytest

from experiments.bench import throughput
from optloop.datasets import load_dataset
from optloop.errors import ConfigError
from optloop.lm import LocalLlamaBackend
from optloop.lm.llama import ContextPool
from tests._oracle import OracleLlama, gold_answers

DATASET = "builtin:tiny?limit=2"


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """``record`` of md_flat and mem0 with llama.cpp replaced by :class:`OracleLlama` (no model is
    loaded)."""
    model = tmp_path / "oracle.gguf"
    model.write_bytes(b"gguf")
    llama = OracleLlama(gold_answers(load_dataset(DATASET).episodes))
    monkeypatch.setattr(LocalLlamaBackend, "_model", lambda self: ContextPool(lambda: llama, 1))
    cache = tmp_path / "rec" / "lm_cache.sqlite"
    assert (
        throughput.main(
            [
                "record",
                "--systems",
                "md_flat,mem0",
                "--dataset",
                DATASET,
                "--cache",
                str(cache),
                "--lm",
                f"local:{model}",
            ]
        )
        == 0
    )
    assert llama.calls > 0
    return cache


def test_replay_at_each_n_gives_the_recorded_evaluation_with_its_figures(recorded, tmp_path):
    out, table = tmp_path / "throughput.json", tmp_path / "throughput.md"
    recording = throughput.Recording.model_validate_json(
        (recorded.parent / "recording.json").read_text()
    )
    assert recording.identity == "local:oracle.gguf:4" and set(recording.systems) == {
        "md_flat",
        "mem0",
    }
    code = throughput.main(
        [
            "replay",
            "--systems",
            "md_flat,mem0",
            "--n",
            "1,2",
            "--latency-ms",
            "20",
            "--jitter-ms",
            "5",
            "--rate-429",
            "0,0.5",
            "--retry-after",
            "0.05",
            "--cache",
            str(recorded),
            "--json",
            str(out),
            "--markdown",
            str(table),
        ]
    )
    assert code == 0
    results = json.loads(out.read_text())
    rows = results["rows"]
    assert [(r["system"], r["rate_429"], r["n"]) for r in rows] == [
        (s, rate, n) for s in ("md_flat", "mem0") for rate in (0.0, 0.5) for n in (1, 2)
    ]
    assert results["identical"] is True and results["latency_ms"] == 20
    for system in ("md_flat", "mem0"):
        mine = [r for r in rows if r["system"] == system]
        assert {r["accuracy"] for r in mine} == {recording.systems[system].accuracy}
        assert {r["calls"] for r in mine} == {recording.systems[system].calls}
        assert all(r["misses"] == 0 and r["seconds"] > 0 and 0 < r["efficiency"] for r in mine)
        assert all(
            r["chain"] >= 1 and r["ideal_seconds"] >= r["chain"] * r["mean_latency_s"] - 0.01
            for r in mine
        )
        assert sum(r["retries_429"] for r in mine if r["rate_429"]) > 0
        assert all(r["retries_429"] == 0 for r in mine if not r["rate_429"])
    assert any(r["accuracy"] > 0 for r in rows)
    assert "| md_flat | 2 | 0.5 |" in table.read_text()
    summary = {s["system"]: s for s in results["summary"]}
    assert set(summary) == {"md_flat", "mem0"} and all(s["lost"] == 0 for s in summary.values())
    assert all(
        set(s["cost_429"]) == {"1", "2"} for s in summary.values()
    )  # JSON keys: each N with 429 rows
    assert "429s cost N=1" in table.read_text()


def test_replay_refuses_what_was_not_recorded(tmp_path):
    cache = tmp_path / "lm_cache.sqlite"
    with pytest.raises(ConfigError, match="no recording at"):
        throughput.main(
            [
                "replay",
                "--systems",
                "md_flat",
                "--cache",
                str(cache),
                "--json",
                str(tmp_path / "t.json"),
            ]
        )
    recording = throughput.Recording(
        dataset=DATASET,
        identity="local:x.gguf:1",
        recorded_on="2000-01-01",
        systems={
            "md_flat": {"accuracy": 1.0, "calls": 1, "model_calls": 1, "seconds": 1},
            "mem0": {"accuracy": 1.0, "calls": 1, "model_calls": 1, "seconds": 1},
        },
    )
    (tmp_path / "recording.json").write_text(recording.model_dump_json())
    with pytest.raises(ConfigError, match="no recording of graphiti"):
        throughput.main(
            [
                "replay",
                "--systems",
                "graphiti",
                "--cache",
                str(cache),
                "--json",
                str(tmp_path / "t.json"),
            ]
        )
    with pytest.raises(ConfigError, match="mem0's extraction prompt carries the date"):
        throughput.main(
            [
                "replay",
                "--systems",
                "mem0",
                "--cache",
                str(cache),
                "--json",
                str(tmp_path / "t.json"),
            ]
        )


def _row(
    system: str, n: int, rate: float, seconds: float, ideal: float, latency: float = 0.3
) -> throughput.Row:
    return throughput.Row(
        system=system,
        n=n,
        rate_429=rate,
        seconds=seconds,
        ideal_seconds=ideal,
        efficiency=0.0,
        accuracy=0.5,
        calls=10,
        retries_429=0,
        misses=0,
        chain=2,
        mean_latency_s=latency,
    )


def test_floor_429_is_the_serial_cost_of_honouring_retry_after():
    # 10 % of attempts refused: 1/9 of a 429 a call, each a 1.05 s wait against 0.3 s calls.
    assert throughput.floor_429(0.1, 1.0, 0.3) == pytest.approx(1 + (0.1 / 0.9) * 1.05 / 0.3)
    assert throughput.floor_429(0.1, 1.0, 0.3) > throughput.TARGET_COST_429
    assert throughput.floor_429(0.1, 1.0, 1.0) < throughput.TARGET_COST_429
    assert throughput.floor_429(0.0, 1.0, 0.3) == 1.0


def test_summary_reads_speedup_share_and_429_cost_off_the_rows():
    rows = [
        _row("mem0", 1, 0.0, 10.0, 8.0),
        _row("mem0", 8, 0.0, 2.0, 1.0),
        _row("mem0", 1, 0.1, 13.0, 8.0),
        _row("mem0", 8, 0.1, 2.4, 1.0),
        _row("md_flat", 1, 0.0, 4.0, 3.0),
    ]
    mem0, md_flat = throughput.summarize(rows)
    assert (mem0.speedup, mem0.ideal_speedup, mem0.share_of_ideal) == (5.0, 8.0, 0.625)
    assert mem0.cost_429 == {1: 1.3, 8: 1.2}
    assert mem0.floor_429_n1 == pytest.approx(throughput.floor_429(0.1, 1.0, 0.3), abs=1e-3)
    assert md_flat.speedup is None and md_flat.cost_429 == {}  # no N=8 row, no 429 rows
    lines = throughput.summary_lines([mem0])
    assert "0.62 of it (target >= 0.8: MISSED)" in lines[0]
    assert mem0.serial_429 == {1: 1.0, 8: 1.0}  # the rows had no retries: nothing to wait out
    assert (
        "N=1 1.30x (met; 1.00x if nothing overlapped the waits)" in lines[1]
        and "expect 1.39x at N=1" in lines[1]
    )


def test_update_keeps_other_systems_rows_replayed_with_the_same_settings(tmp_path):
    settings = {"latency_ms": 300.0, "jitter_ms": 50.0, "retry_after_s": 1.0, "seed": 0}
    path = tmp_path / "throughput.json"
    assert throughput.kept_results(path, ["mem0"], settings) is None  # nothing there yet
    rows = [
        _row("graphiti", 1, 0.0, 20.0, 13.0).model_dump(),
        _row("mem0", 1, 0.0, 9.0, 6.0).model_dump(),
    ]
    summary = [{"system": "graphiti", "lost": 0}, {"system": "mem0", "lost": 2}]
    path.write_text(
        json.dumps(
            {"rows": rows, "summary": summary, "different": ["mem0 at N=2, 429s 0"], **settings}
        )
    )
    kept = throughput.kept_results(path, ["mem0"], settings)
    assert [r["system"] for r in kept["rows"]] == ["graphiti"]
    assert kept["summary"] == [{"system": "graphiti", "lost": 0}] and kept["different"] == []
    with pytest.raises(ConfigError, match="latency_ms 300.0 there, 100.0 now"):
        throughput.kept_results(path, ["mem0"], {**settings, "latency_ms": 100.0})


def test_a_repeated_cell_is_its_median_run():
    runs = [_row("mem0", 8, 0.0, seconds, 1.0) for seconds in (5.0, 4.2, 4.6)]
    row = throughput.median_run(runs)
    assert row.seconds == 4.6 and row.seconds_runs == [5.0, 4.2, 4.6]
    assert throughput.median_run(runs[:1]) is runs[0]
    assert throughput.median_run(runs[:2]).seconds == 4.2  # the lower middle of an even count
