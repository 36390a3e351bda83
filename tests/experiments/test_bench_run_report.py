"""``experiments.bench.run_report``: a finished run's directory as a results file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.bench.run_report import blame_table, by_category, main, report, system_of
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.evaluate import Evaluation
from optloop.loop.state import Checkpoint, Trial
from optloop.pipeline._episode import QuestionOutcome


def evaluation(split: str, scores: list[float]) -> Evaluation:
    outcomes = [
        QuestionOutcome(
            episode_id=f"e{i}",
            question_id=f"e{i}:q",
            task_type="exact_recall",
            question="q?",
            gold="g",
            prediction="g" if s else "x",
            score=s,
            passed=bool(s),
        )
        for i, s in enumerate(scores)
    ]
    return Evaluation(split=split, candidate="c", outcomes=outcomes)


def finished_run(tmp_path: Path, *, finished: bool = True) -> Path:
    run = tmp_path / "graphiti-edit-1"
    run.mkdir()
    best = Candidate(sites={"answer": SiteState(instructions="A.")}, origin="edit round 1: del 0")
    Checkpoint(
        config_digest="x",
        split={"train": ["a", "b"], "dev": ["c"], "test": ["d"]},
        targets=["answer"],
        baseline_train=evaluation("train", [1, 0]),
        baseline_dev=evaluation("dev", [1, 0, 0, 0]),
        trials=[Trial(trial=1, candidate=best, evaluation=evaluation("dev", [1, 1, 0, 0]))],
        test_before=evaluation("test", [0, 0, 1, 0]) if finished else None,
        test_after=evaluation("test", [1, 0, 1, 1]) if finished else None,
        finished=finished,
    ).save(run / "checkpoint.json")
    (run / "run.log").write_text(
        "2026-11-26 10:00:00 evaluating baseline on train (2 questions)\n"
        "2026-11-26 10:00:00 power: dev 4 and test 4 questions show gains of ±0.45\n"
        "2026-11-26 10:01:00 evaluating baseline on dev (4 questions)\n"
        "2026-11-26 10:01:30 headroom: answer: 4 dev questions cannot tell\n"
        "2026-11-26 10:02:00 headroom after trial 2 (2 without a new best), answer: agree\n"
        "2026-11-26 10:02:00 trial 1/50 dev 0.500 (best 0.500) 30 s, ETA 5 min\n"
        "2026-11-26 10:03:00 evaluating baseline on test (4 questions)\n"
        "2026-11-26 10:05:00 done\n"
    )
    return run


def test_the_report_holds_the_split_the_trials_and_the_paired_delta(tmp_path):
    run = finished_run(tmp_path)
    console = tmp_path / "out.txt"
    console.write_text(
        "projected: 90 calls, 900 tokens; ETA 4 min for the rest of the run (Ctrl-C stops it)\n"
        "[2 min] trial 1/50 dev 0.500 (best 0.500) 30 s, ETA 5 min\n"
    )
    data = report(run, console)
    assert data["split"] == {"train": 2, "dev": 1, "test": 1}
    assert data["questions"] == {"dev": 4, "test": 4}
    assert data["baseline_dev"] == "0.250 [0.000, 0.750] n=4"
    assert data["trials"] == [{"trial": 1, "origin": "edit round 1: del 0", "dev": 0.5}]
    assert data["delta"]["estimate"] == pytest.approx(0.5) and data["delta"]["n"] == 4
    assert data["projection_printed"] == [
        "projected: 90 calls, 900 tokens; ETA 4 min for the rest of the run (Ctrl-C stops it)"
    ]
    assert data["trial_lines"] == ["[2 min] trial 1/50 dev 0.500 (best 0.500) 30 s, ETA 5 min"]
    assert data["wall_s"] == 300
    assert [s["at_s"] for s in data["stages"]] == [0, 60, 180]


def test_the_files_carry_their_provenance_and_an_unfinished_run_is_refused(tmp_path):
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["--run-dir", str(finished_run(tmp_path)), "--command", "python -m optloop.run"]
    assert main([*argv, "--commit", "abc1234", "--json", str(out), "--markdown", str(md)]) == 0
    data = json.loads(out.read_text())
    assert data["provenance"]["command"] == "python -m optloop.run"
    assert data["provenance"]["commit"] == "abc1234" and data["provenance"]["model"]
    assert "held-out delta [95% CI] | +0.500" in md.read_text()
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(SystemExit, match="has not finished"):
        report(finished_run(other, finished=False), None)


def test_by_category_counts_each_arm_and_the_blame_counts_failures_by_site_and_type():
    from optloop.attribution.taxonomy import Attribution, ErrorType

    before = evaluation("test", [0, 0.5, 1, 0])
    after = evaluation("test", [1, 0.5, 1, 1])
    for i, o in enumerate([*before.outcomes, *after.outcomes]):
        o.task_type = "temporal" if i % 2 else "single_hop"
    cats = by_category({"before": before, "after": after})
    assert cats["categories"]["single_hop"]["before"] == {
        "n": 2,
        "accuracy": 0.5,
        "mean_score": 0.5,
    }
    assert cats["categories"]["temporal"]["after"] == {"n": 2, "accuracy": 1.0, "mean_score": 0.75}
    assert cats["mean_score"]["before"]["estimate"] == pytest.approx(0.375)
    assert cats["deltas"]["after - before"]["estimate"] == pytest.approx(0.5)
    assert "after - control" not in cats["deltas"]
    error = next(iter(ErrorType))
    before.outcomes[0].attribution = Attribution(
        question_id="e0:q", error_type=error, target="mem0.extract"
    )
    assert blame_table([before]) == [
        {"target": "mem0.extract", "error_type": error.value, "failures": 1},
        {"target": "(not attributed)", "error_type": "-", "failures": 1},
    ]


def test_each_evaluation_s_cost_is_listed_in_run_order(tmp_path):
    data = report(finished_run(tmp_path), None)
    assert [r["evaluation"] for r in data["evaluations"]] == [
        "baseline train",
        "baseline dev",
        "trial 1 dev",
        "test before",
        "test after",
    ]
    assert data["evaluations"][0]["questions"] == 2


def test_only_the_prompts_the_best_changed_are_shown_with_their_diff(tmp_path):
    run = finished_run(tmp_path)
    ckpt = Checkpoint.load(run / "checkpoint.json")
    assert ckpt.test_after is not None
    ckpt.test_after.candidate = ckpt.trials[0].candidate.digest()  # the best was tested after
    ckpt.save(run / "checkpoint.json")
    unchanged = report(run, None, start={"answer": "A."})
    assert unchanged["best_prompts"] == {} and unchanged["best_diffs"] == {}
    changed = report(run, None, start={"answer": "Answer briefly."})
    assert changed["best_prompts"] == {"answer": "A."}
    assert "-Answer briefly.\n+A.\n" in changed["best_diffs"]["answer"]
    assert system_of("python -m optloop.run --system 'mem0' --budget 4") == "mem0"
    assert system_of("python -m optloop.run --budget 4") is None


def test_the_wall_time_of_a_resumed_run_leaves_out_the_time_it_stood_stopped(tmp_path):
    run = finished_run(tmp_path)
    (run / "run.log").write_text(
        "2026-11-26 10:00:00 optloop.run x: mem0 on d, gepa, budget 3 (a new run: ...)\n"
        "2026-11-26 10:10:00 trial 1/3 dev 0.500 (best 0.500) 30 s, ETA 5 min\n"
        "2026-11-26 12:00:00 optloop.run resuming x, the latest unfinished run of these settings\n"
        "2026-11-26 12:05:00 evaluating baseline on test (4 questions)\n"
        "2026-11-26 12:06:00 optloop.run x: mem0 on d, gepa, budget 3\n"
    )
    data = report(run, None)
    assert (data["wall_s"], data["processes"], data["stopped_s"]) == (960, 2, 6600)
    assert [s["at_s"] for s in data["stages"]] == [7500]  # stages count from the run's start
    from experiments.bench.run_report import _wall

    assert _wall(data).startswith("16 min over 2 processes (not counting the 110 min it stood")


def test_the_power_line_and_every_headroom_check_are_reported_as_the_run_said_them(tmp_path):
    console = tmp_path / "console.txt"
    console.write_text("headroom: answer: 4 dev questions cannot tell; after the trials, agree\n")
    data = report(finished_run(tmp_path), console)
    assert data["power"].startswith("power: dev 4 and test 4")
    assert data["headroom"] == [
        "headroom: answer: 4 dev questions cannot tell",
        "headroom after trial 2 (2 without a new best), answer: agree",
        "headroom: answer: 4 dev questions cannot tell; after the trials, agree",
    ]
    (tmp_path / "x").mkdir()
    assert report(finished_run(tmp_path / "x"), None)["headroom"][-1].startswith("headroom after")


def test_a_resumed_runs_repeated_lines_are_reported_once_and_the_summarys_power_after(tmp_path):
    run = finished_run(tmp_path)
    log = (run / "run.log").read_text().splitlines(keepends=True)
    # a second process says its power line and first headroom check again
    (run / "run.log").write_text("".join([*log[:4], *log[1:2], *log[3:4], *log[4:]]))
    console = tmp_path / "console.txt"
    console.write_text(
        "projected: 9 calls, 9 tokens; ETA 4 min for the rest of the run\n"
        "projected: 9 calls, 9 tokens; ETA 4 min for the rest of the run\n"
        "power: dev 4 questions at the baseline's 0.25 and test 4 at its 0.25 show gains\n"
    )
    data = report(run, console)
    assert data["projection_printed"] == [
        "projected: 9 calls, 9 tokens; ETA 4 min for the rest of the run"
    ]
    assert data["headroom"][:2] == [
        "headroom: answer: 4 dev questions cannot tell",
        "headroom after trial 2 (2 without a new best), answer: agree",
    ]
    assert data["power"].startswith("power: dev 4 and test 4")
    assert data["power_after"].startswith("power: dev 4 questions at the baseline's 0.25")
    (tmp_path / "x").mkdir()
    assert report(finished_run(tmp_path / "x"), None)["power_after"] is None
