"""The throughput benchmark end to end: record on a stand-in for the embedded LM, replay at N = 1 and 2."""

from __future__ import annotations

import json
import threading

import pytest

from experiments.bench import throughput
from optloop.datasets import load_dataset
from optloop.errors import ConfigError
from optloop.lm import LocalLlamaBackend
from tests._oracle import OracleLlama, gold_answers

DATASET = "builtin:tiny?limit=2"


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """``record`` of md_flat and mem0 with llama.cpp replaced by :class:`OracleLlama` (no model is loaded)."""
    model = tmp_path / "oracle.gguf"
    model.write_bytes(b"gguf")
    llama = OracleLlama(gold_answers(load_dataset(DATASET).episodes))
    monkeypatch.setattr(LocalLlamaBackend, "_model", lambda self: (llama, threading.Lock()))
    cache = tmp_path / "rec" / "lm_cache.sqlite"
    assert throughput.main(["record", "--systems", "md_flat,mem0", "--dataset", DATASET, "--cache", str(cache),
                            "--lm", f"local:{model}"]) == 0
    assert llama.calls > 0
    return cache


def test_replay_at_each_n_gives_the_recorded_evaluation_with_its_figures(recorded, tmp_path):
    out, table = tmp_path / "throughput.json", tmp_path / "throughput.md"
    recording = throughput.Recording.model_validate_json((recorded.parent / "recording.json").read_text())
    assert recording.identity == "local:oracle.gguf:4" and set(recording.systems) == {"md_flat", "mem0"}
    code = throughput.main(["replay", "--systems", "md_flat,mem0", "--n", "1,2", "--latency-ms", "20",
                            "--jitter-ms", "5", "--rate-429", "0,0.5", "--retry-after", "0.05", "--cache",
                            str(recorded), "--json", str(out), "--markdown", str(table)])
    assert code == 0
    results = json.loads(out.read_text())
    rows = results["rows"]
    assert [(r["system"], r["rate_429"], r["n"]) for r in rows] == [
        (s, rate, n) for s in ("md_flat", "mem0") for rate in (0.0, 0.5) for n in (1, 2)]
    assert results["identical"] is True and results["latency_ms"] == 20
    for system in ("md_flat", "mem0"):
        mine = [r for r in rows if r["system"] == system]
        assert {r["accuracy"] for r in mine} == {recording.systems[system].accuracy}
        assert {r["calls"] for r in mine} == {recording.systems[system].calls}
        assert all(r["misses"] == 0 and r["seconds"] > 0 and 0 < r["efficiency"] for r in mine)
        assert all(r["chain"] >= 1 and r["ideal_seconds"] >= r["chain"] * r["mean_latency_s"] - 0.01 for r in mine)
        assert sum(r["retries_429"] for r in mine if r["rate_429"]) > 0
        assert all(r["retries_429"] == 0 for r in mine if not r["rate_429"])
    assert any(r["accuracy"] > 0 for r in rows)
    assert "| md_flat | 2 | 0.5 |" in table.read_text()


def test_replay_refuses_what_was_not_recorded(tmp_path):
    cache = tmp_path / "lm_cache.sqlite"
    with pytest.raises(ConfigError, match="no recording at"):
        throughput.main(["replay", "--systems", "md_flat", "--cache", str(cache), "--json", str(tmp_path / "t.json")])
    recording = throughput.Recording(dataset=DATASET, identity="local:x.gguf:1", recorded_on="2000-01-01",
                                     systems={"md_flat": {"accuracy": 1.0, "calls": 1, "model_calls": 1, "seconds": 1},
                                              "mem0": {"accuracy": 1.0, "calls": 1, "model_calls": 1, "seconds": 1}})
    (tmp_path / "recording.json").write_text(recording.model_dump_json())
    with pytest.raises(ConfigError, match="no recording of graphiti"):
        throughput.main(["replay", "--systems", "graphiti", "--cache", str(cache), "--json", str(tmp_path / "t.json")])
    with pytest.raises(ConfigError, match="mem0's extraction prompt carries the date"):
        throughput.main(["replay", "--systems", "mem0", "--cache", str(cache), "--json", str(tmp_path / "t.json")])
