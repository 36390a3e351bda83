"""``experiments.bench.racing``: an arm run on its own is read back by a later call, and an arm
started from another's LM cache says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench import racing

CI = {"low": 0.1, "high": 0.5, "estimate": 0.3, "n": 2}


def finished_arm(home: Path, seconds: float) -> None:
    """What ``optloop.run --json`` and its checkpoint leave of a run with one trial that was not
    the best."""
    (home / "runs" / "r").mkdir(parents=True)
    outcome = {"episode_id": "e0", "question_id": "q0", "passed": True}
    (home / "runs" / "r" / "checkpoint.json").write_text(
        json.dumps(
            {
                "trials": [{"trial": 1, "improved": False, "evaluation": {"outcomes": [outcome]}}],
                "test_after": {"outcomes": [outcome]},
            }
        )
    )
    result = {
        "racing": {
            "stopped": 0,
            "questions": 1,
            "full_questions": 1,
            "llm_calls": 3,
            "full_calls": 3,
        },
        "cost": {"llm_calls": 7, "seconds": seconds},
        "best_trial": 0,
        "tried": [],
        "best_dev": 0.5,
        "test_before_ci": CI,
        "test_after_ci": CI,
        "delta_test_ci": CI,
    }
    (home / "result.json").write_text(json.dumps(result))


def test_an_arm_an_earlier_call_ran_is_read_back_with_the_runs_own_seconds(
    tmp_path: Path,
) -> None:
    assert racing._read_arm(tmp_path / "race") is None
    finished_arm(tmp_path / "race", 1234.5)
    arm = racing._read_arm(tmp_path / "race")
    assert arm is not None
    assert arm["wall_s"] == 1234.5 and arm["run_llm_calls"] == 7 and arm["cache_from"] is None
    assert arm["candidates"] == 1 and arm["loser_share"] == 1.0
    # saved figures win over the result (they hold the wall time the bench measured)
    (tmp_path / "race" / racing.FIGURES).write_text(json.dumps(arm | {"wall_s": 99.0}))
    read = racing._read_arm(tmp_path / "race")
    assert read is not None and read["wall_s"] == 99.0


def test_an_arm_run_from_anothers_cache_says_so_in_the_table(tmp_path: Path) -> None:
    finished_arm(tmp_path / "race", 100.0)
    race = racing._read_arm(tmp_path / "race")
    assert race is not None
    arms = {"race": race, "no-race": race | {"cache_from": "race", "wall_s": 10.0}}
    results = {"arms": arms, "comparison": racing.compare(arms), "run_args": "--system mem0"}
    text = "\n".join(racing.figures(results))
    assert "| 10 (race's LM cache) |" in text and "| 100 |" in text


def test_a_missing_or_unknown_arm_is_one_line_naming_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--work", str(tmp_path), "--json", str(tmp_path / "r.json")]
    common += ["--markdown", str(tmp_path / "r.md")]
    with pytest.raises(SystemExit) as exited:
        racing.main([*common, "--arms", "fast", "--", "--system", "mem0"])
    assert exited.value.code == 2 and "--arms: unknown fast" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        racing.main([*common, "--arms", "no-race", "--", "--system", "mem0"])
    assert exited.value.code == 2
    assert "race: no finished arm in" in capsys.readouterr().err
    assert not (tmp_path / "no-race").exists()
