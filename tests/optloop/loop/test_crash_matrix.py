"""The crash-consistency matrix on the controller's fakes (``test_controller``): kill the run at
each checkpoint boundary in turn, resume it, compare with an uninterrupted run.

A kill is an exception at a named step (the fakes' :class:`Clock`); the sink keeps what was
recorded before it, as MLflow does. Each resumed run must equal the uninterrupted one in its
candidates, accuracies, registered prompt versions and aliases; leave no record running and no
trial twice; and cost at most one redone trial (an evaluation and a proposal) more, with every
process's spending added up. The same matrix on the real ``python -m optloop.run`` with a
scripted endpoint and SIGKILL is ``experiments.bench.crash`` (``test_crash_e2e.py``, slow).

``python -m tests.optloop.loop.test_crash_matrix`` prints the table.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from optloop.loop.state import Checkpoint, LoopConfig, LoopResult
from optloop.loop.workers.coordinator import SharedCoordinator
from tests.optloop.loop.test_controller import (
    EVALUATION_CALLS,
    ONE_TRIAL,
    PROPOSAL_CALLS,
    Clock,
    Killed,
    MemorySink,
    Run,
    trials_of,
    without_cost,
)

BUDGET = 5

# kill point -> where the fakes' clock kills the first process
CONTROL = "('trivial answer', 'seed extract')"  # the control's key in the fakes' step names

KILL_POINTS: dict[str, dict[str, Any]] = {
    "after the baseline": {"kill_after": "log_dev 0"},
    "during the control on dev": {"kill_on": f"evaluate dev {CONTROL}"},
    "after the control on dev (not yet checkpointed)": {"kill_after": f"evaluate dev {CONTROL}"},
    "during trial 1 (its child run open)": {"kill_on": "log_trial 1"},
    **{f"after trial {k}": {"kill_after": f"log_dev {k}"} for k in range(1, BUDGET + 1)},
    "during trial 3 (its checkpoint written)": {"kill_on": "open_trial 3"},
    "during the held-out test": {"kill_on": "evaluate test", "nth": 2},
    "during the control on test": {"kill_on": f"evaluate test {CONTROL}"},
    "after the control on test (checkpointed)": {"kill_on": "log_summary"},
    "during registry promotion": {"kill_after": "register"},
}


@dataclass
class Row:
    kill_point: str
    resumed: bool
    identical: bool
    extra_calls: int
    processes: int


def clean_run(tmp: Path) -> tuple[LoopResult, MemorySink, list[Any]]:
    sink = MemorySink(Clock())
    result = Run(tmp / "clean.json", sink, sink.clock, budget=BUDGET).run()
    return result, sink, trials_of(tmp / "clean.json")


def killed_and_resumed(
    tmp: Path, name: str, kills: list[dict[str, Any]]
) -> tuple[LoopResult, MemorySink, Path]:
    """The run killed at each of ``kills`` in turn (one process each), then resumed to the end."""
    path = tmp / f"{name}.json"
    sink = MemorySink(Clock())
    for kill in kills:
        clock = Clock(**kill)
        sink.clock = clock
        with pytest.raises(Killed):
            Run(path, sink, clock, budget=BUDGET).run()
    sink.clock = Clock()
    return Run(path, sink, sink.clock, budget=BUDGET).run(), sink, path


def check(
    result: LoopResult,
    sink: MemorySink,
    path: Path,
    clean: LoopResult,
    clean_sink: MemorySink,
    clean_trials: list[Any],
    where: str,
    processes: int,
) -> Row:
    identical = without_cost(result) == without_cost(
        clean
    )  # candidates, accuracies, registry, promotion
    assert identical, where
    assert trials_of(path) == clean_trials, where
    assert sink.registered == clean_sink.registered, (
        where
    )  # the same prompt versions, the champion alias alike
    assert result.registered == clean.registered, where
    assert sink.trials() == list(range(1, BUDGET + 1)), where  # no trial twice, none missing
    assert all(r["status"] == "FINISHED" for r in sink.children.values()), (
        where
    )  # no record left running
    assert sorted(p[0] for p in sink.dev) == list(range(BUDGET + 1)), (
        where
    )  # each acc_dev point once
    best_so_far = [(t, round(b, 3)) for t, _, b in sorted(sink.dev)]
    assert best_so_far == [(t, round(b, 3)) for t, _, b in sorted(clean_sink.dev)], where
    extra = result.cost["llm_calls"] - clean.cost["llm_calls"]
    assert 0 <= extra <= ONE_TRIAL * (processes - 1), (where, result.cost, clean.cost)
    assert result.cost["tokens"] == 100 * result.cost["llm_calls"], (
        where
    )  # every process's spending, added
    assert result.cost["processes"] == processes, where
    assert Checkpoint.load(path).finished, where
    return Row(where, True, identical, extra, processes)


def matrix(tmp: Path) -> list[Row]:
    clean, clean_sink, clean_trials = clean_run(tmp)
    rows = []
    for i, (label, kill) in enumerate(KILL_POINTS.items()):
        result, sink, path = killed_and_resumed(tmp, f"kill-{i}", [kill])
        rows.append(check(result, sink, path, clean, clean_sink, clean_trials, label, processes=2))
    twice = [
        KILL_POINTS["during trial 1 (its child run open)"],
        KILL_POINTS["during the held-out test"],
    ]
    result, sink, path = killed_and_resumed(tmp, "kill-twice", twice)
    rows.append(
        check(
            result,
            sink,
            path,
            clean,
            clean_sink,
            clean_trials,
            "during trial 1, then during the held-out test",
            processes=3,
        )
    )
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| kill point | resumed | identical | extra LLM calls | processes |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.kill_point} | {'yes' if r.resumed else 'no'} | {'yes' if r.identical else 'no'} | "
        f"{r.extra_calls:+d} | {r.processes} |"
        for r in rows
    ]
    return "\n".join(lines)


def test_the_crash_matrix_on_the_controller(tmp_path, capsys):
    rows = matrix(tmp_path)
    assert len(rows) == len(KILL_POINTS) + 1 and all(r.resumed and r.identical for r in rows)
    # a kill right after a checkpoint write redoes nothing; one inside a trial redoes that trial
    by_point = {r.kill_point: r.extra_calls for r in rows}
    assert by_point["after trial 2"] == 0 and by_point["during registry promotion"] == 0
    assert by_point["during trial 1 (its child run open)"] == EVALUATION_CALLS + PROPOSAL_CALLS
    assert by_point["during the held-out test"] == EVALUATION_CALLS
    assert by_point["during the control on dev"] == EVALUATION_CALLS
    assert by_point["during the control on test"] == EVALUATION_CALLS
    assert by_point["after the control on test (checkpointed)"] == 0
    with capsys.disabled():
        print("\n" + table(rows))


# --- the shared Optuna study: one of two workers killed ------------------------------------------


class SlowClock(Clock):
    """A clock whose dev evaluations take a while, so the other worker gets slots of the budget
    too."""

    def tick(self, what: str) -> None:
        super().tick(what)
        if what.startswith("evaluate dev"):
            time.sleep(0.3)


def test_a_killed_worker_of_a_shared_study_resumes_and_the_run_adds_up(tmp_path):
    config = LoopConfig(system="fake", run_name="shared", budget=4, optimizer="optuna")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    sink = MemorySink(Clock())
    results: dict[str, LoopResult] = {}
    errors: list[BaseException] = []
    runs: list[Run] = []
    opened: list[SharedCoordinator] = []

    def worker(name: str, clock: Clock) -> Run:
        coordinator = SharedCoordinator.join(config, storage, worker=name)
        coordinator.study.poll = 0.05
        opened.append(coordinator)
        run = Run(
            tmp_path / f"{name}.json",
            sink,
            clock,
            budget=4,
            coordinator=coordinator,
            prefix=f"{name}-",
        )
        runs.append(run)
        return run

    def work(name: str, run: Run) -> None:
        try:
            results[name] = run.run()
        except BaseException as exc:  # noqa: BLE001 - examined below
            errors.append(exc)

    leader = worker("w0", SlowClock())
    victim = worker(
        "w1", Clock(kill_on="evaluate dev", nth=1)
    )  # w1's first trial, its evaluation under way
    threads = {
        "w0": threading.Thread(target=work, args=("w0", leader)),
        "w1": threading.Thread(target=work, args=("w1", victim)),
    }
    try:
        for t in threads.values():
            t.start()
        threads["w1"].join(60)
        assert len(errors) == 1 and isinstance(errors[0], Killed), errors
        errors.clear()
        opened[1].close()  # the killed process's heartbeat stops with it
        killed_ckpt = Checkpoint.load(tmp_path / "w1.json")
        assert [t.evaluation for t in killed_ckpt.trials] == [None]  # its trial was half done
        again = worker("w1", Clock())  # the same command: the same worker id, its checkpoint
        restarted = threading.Thread(target=work, args=("w1", again))
        restarted.start()
        restarted.join(60)
        threads["w0"].join(60)
    finally:
        for c in opened:
            c.close()
    assert not errors, errors
    assert (
        results["w0"] == results["w1"] and results["w0"].evaluations == 4
    )  # one result, the budget exact
    assert sink.trials() == [
        1,
        2,
        3,
        4,
    ]  # every slot once: the killed worker's trial redone, not duplicated
    assert all(r["status"] == "FINISHED" for r in sink.children.values())
    assert len({r["candidate"] for r in sink.children.values()}) == 4
    spent = sum(run.meter.calls for run in runs)  # the leader, the killed w1, the restarted w1
    assert results["w0"].cost["llm_calls"] == spent and results["w0"].cost["processes"] == 3
    assert victim.meter.calls > 0  # the killed process's spending is in the total


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(table(matrix(Path(tmp))))
