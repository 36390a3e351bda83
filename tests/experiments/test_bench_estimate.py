"""The worked endpoint estimate: per-session and per-question figures from a recording, scaled to a run."""

from __future__ import annotations

import pytest

from experiments.bench import estimate
from experiments.bench.throughput import Recorded, Recording
from optloop.errors import ConfigError
from optloop.loop.cost import LMCost


def recording() -> Recording:
    # builtin:tiny: 4 episodes, 8 sessions, 9 questions
    # the extraction site: 8 of its 16 requests computed (the rest served by the cache), so tokens count double
    sites = {"graphiti.extract_nodes": LMCost(calls=16, model_calls=8, tokens=800, prompt_tokens=600),
             "answer": LMCost(calls=9, model_calls=9, tokens=900, prompt_tokens=810)}
    return Recording(dataset="builtin:tiny", identity="local:test", recorded_on="2026-11-23",
                     systems={"graphiti": Recorded(accuracy=0.5, calls=25, model_calls=25, seconds=1.0, sessions=8,
                                                   sites=sites)})


def test_per_unit_splits_ingestion_from_the_question_path():
    unit = estimate.per_unit(recording(), "graphiti", questions=9)
    assert (unit.session_calls, unit.session_prompt, unit.session_completion) == (2, 150, 50)
    assert (unit.question_calls, unit.question_prompt, unit.question_completion) == (1, 90, 10)


def test_the_run_adds_baseline_trials_and_test(tmp_path, capsys):
    path = tmp_path / "recording.json"
    path.write_text(recording().model_dump_json())
    # builtin:tiny as the shape: 2 sessions and 2.25 questions per conversation; 4 conversations -> 2/1/1
    assert estimate.main(["--recording", str(path), "--dataset", "builtin:tiny", "--conversations", "4",
                          "--budget", "3", "--n", "1"]) == 0
    out = capsys.readouterr().out
    per_conversation = 2 * 2 + 2.25 * 1  # calls: sessions x 2 + questions x 1
    evaluations = 2 * per_conversation + 1 * per_conversation + 3 * per_conversation + 2 * per_conversation
    assert f"{evaluations:,.0f}" in out  # total calls (train 2, dev 1 + 3 trials, test 1 twice)
    assert "Not included: the optimizer's own calls" in " ".join(out.split())


def test_a_system_not_recorded_is_a_clear_error(tmp_path):
    path = tmp_path / "recording.json"
    path.write_text(recording().model_dump_json())
    with pytest.raises(ConfigError, match="holds no mem0"):
        estimate.main(["--recording", str(path), "--system", "mem0", "--dataset", "builtin:tiny"])
