"""A run's progress: plain lines (and run.log) without a terminal, a status line with one."""

from __future__ import annotations

import io

from rich.console import Console

from optloop.progress import RunProgress, duration, trial_line


def test_a_trial_line_says_the_trial_its_dev_accuracy_the_best_its_time_and_an_eta_when_known():
    assert (
        trial_line(3, 50, 0.55, 0.65, 41.2, eta_s=18 * 60)
        == "trial 3/50 dev 0.550 (best 0.650) 41 s, ETA 18 min"
    )
    assert trial_line(1, 3, 0.25, 0.25, 130) == "trial 1/3 dev 0.250 (best 0.250) 2 min"
    assert duration(3 * 3600) == "3.0 h"


def test_without_a_terminal_every_message_is_a_plain_line_and_in_the_run_log(tmp_path):
    out = io.StringIO()
    log = tmp_path / "runs" / "r" / "run.log"
    progress = RunProgress(Console(file=out, force_terminal=False), log)
    assert not progress.live
    with progress.shown() as say:
        say("evaluating baseline on train (40 questions)")
        say(trial_line(1, 3, 0.5, 0.5, 12))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].endswith("] evaluating baseline on train (40 questions)")
    assert (
        lines[1].endswith("trial 1/3 dev 0.500 (best 0.500) 12 s") and "\x1b" not in out.getvalue()
    )
    logged = log.read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in logged] == [
        "evaluating baseline on train (40 questions)",
        "trial 1/3 dev 0.500 (best 0.500) 12 s",
    ]


def test_on_a_terminal_the_status_line_updates_and_no_line_is_printed_per_message(tmp_path):
    out = io.StringIO()
    progress = RunProgress(Console(file=out, force_terminal=True), tmp_path / "run.log")
    with progress.shown() as say:
        say("trial 1/3: edit proposing for answer")
        assert progress._status is not None
    assert "trial 1/3: edit proposing for answer" not in out.getvalue().splitlines()
    assert (tmp_path / "run.log").read_text().count("\n") == 1
