"""A run's progress: plain lines (and run.log) without a terminal, a status line with one."""

from __future__ import annotations

import io

from rich.console import Console

from optloop.cli.status import RunProgress
from optloop.progress import duration, episode_line, trial_line


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


def test_an_episode_line_says_the_episode_the_counts_so_far_and_an_eta_when_known():
    assert (
        episode_line(3, 40, "recall-2", 6, 4, 2, eta_s=120)
        == "episode 3/40 recall-2: 4/6 correct so far, 2 failures attributed, ETA 2 min"
    )
    assert episode_line(1, 1, "tiny-food", 2, 1, 1) == (
        "episode 1/1 tiny-food: 1/2 correct so far, 1 failure attributed"
    )


def test_what_a_command_shows_is_printed_as_is_and_logged_as_plain_stamped_lines(tmp_path):
    from optloop.output import Table

    out = io.StringIO()
    log = tmp_path / "run" / "run.log"
    progress = RunProgress(Console(file=out, force_terminal=False, width=120), log)
    progress.show("dataset synthetic:recall?seed=0&episodes=40: 20 dev and 20 test questions")
    table = Table(title="optloop.run r1: rag_bm25 on synthetic:recall?seed=0&episodes=40, edit")
    table.add_column("")
    table.add_column("baseline", justify="right")
    table.add_row("dev accuracy", "0.450")
    progress.show(table)
    assert not log.exists()  # nothing written before the run's folder exists
    with progress.shown() as say:
        say("evaluating baseline on train (40 questions)")
    logged = [line.split(" ", 2)[2] for line in log.read_text().splitlines()]
    printed = out.getvalue().splitlines()
    first = "dataset synthetic:recall?seed=0&episodes=40: 20 dev and 20 test questions"
    assert logged[0] == printed[0] == first
    assert logged[1] == printed[1] == table.title  # the title a line of its own, whole
    assert logged[2:7] == printed[2:7] and logged[5].startswith("│ dev accuracy")
    assert logged[-1] == "evaluating baseline on train (40 questions)"
    progress.show("MLflow parent run abc")  # once the folder exists, written at once
    assert log.read_text().splitlines()[-1].endswith(" MLflow parent run abc")
