"""Racing on dev (optloop.loop.racing): a candidate stops once it is significantly worse than the
best on the same questions; the controller counts it, never makes it the best, and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from optloop.loop.config import LoopConfig
from optloop.loop.evaluate import Evaluation, QuestionOutcome
from optloop.loop.policy import detectable_gain, power_line, questions_for
from optloop.loop.racing import MIN_QUESTIONS, Against, Race, RaceSpend, RaceStop, race_order
from optloop.loop.state import Checkpoint
from tests.optloop.loop import test_controller as fakes


def outcomes(passed: list[bool], per_episode: int = 4) -> list[QuestionOutcome]:
    return [
        QuestionOutcome(
            episode_id=f"e{i // per_episode}",
            question_id=f"q{i}",
            task_type="t",
            question="?",
            gold="g",
            prediction="g" if ok else "x",
            score=float(ok),
            passed=ok,
        )
        for i, ok in enumerate(passed)
    ]


def by_episode(answers: list[QuestionOutcome]) -> list[list[QuestionOutcome]]:
    episodes: dict[str, list[QuestionOutcome]] = {}
    for o in answers:
        episodes.setdefault(o.episode_id, []).append(o)
    return list(episodes.values())


def race_through(best: list[bool], mine: list[bool]) -> RaceStop | None:
    """Race ``mine`` against ``best`` episode by episode; the stop, or None when it ran to the
    end."""
    race = Race(outcomes(best), "trial 1")
    for episode in by_episode(outcomes(mine)):
        if (stop := race.observe(episode)) is not None:
            return stop
    return None


def test_a_candidate_worse_on_every_question_is_stopped_early() -> None:
    stop = race_through([True] * 40, [False] * 40)
    assert stop is not None
    assert MIN_QUESTIONS <= stop.questions < 40
    assert stop.of == 40
    assert stop.against == "trial 1"
    assert stop.best_accuracy == 1.0
    assert stop.p_value < 0.1


def test_a_candidate_better_on_every_question_is_never_stopped() -> None:
    assert race_through([False] * 40, [True] * 40) is None


def test_a_candidate_equal_to_the_best_is_never_stopped() -> None:
    answers = [i % 3 == 0 for i in range(40)]
    assert race_through(answers, answers) is None


def test_no_decision_before_the_minimum_of_questions() -> None:
    race = Race(outcomes([True] * 40), "start")
    first = outcomes([False] * (MIN_QUESTIONS - 1), per_episode=MIN_QUESTIONS - 1)
    assert race.observe(first) is None


def test_the_order_is_seeded_and_the_same_on_every_call() -> None:
    episodes = [f"e{i}" for i in range(30)]
    assert race_order(episodes, 0, "dev") == race_order(episodes, 0, "dev")
    assert race_order(episodes, 0, "dev") != race_order(episodes, 1, "dev")
    assert sorted(race_order(episodes, 3, "dev")) == sorted(episodes)


def test_race_spend_counts_questions_and_calls_of_a_full_evaluation() -> None:
    full = Evaluation(split="dev", candidate="a", outcomes=outcomes([True] * 20), llm_calls=100)
    stopped = Evaluation(
        split="dev",
        candidate="b",
        outcomes=outcomes([False] * 5),
        llm_calls=25,
        stopped=RaceStop(questions=5, of=20, against="start", best_accuracy=1.0, p_value=0.03),
    )
    spend = RaceSpend.of([full, stopped])
    assert (spend.candidates, spend.stopped) == (2, 1)
    assert (spend.questions, spend.full_questions) == (25, 40)
    assert (spend.llm_calls, spend.full_calls) == (125, 200)
    assert spend.stopped_share == 0.25
    assert "1 of 2 candidates stopped early" in spend.line()


def test_the_power_line_says_what_the_splits_can_show() -> None:
    assert detectable_gain(20, 0.3) == pytest.approx(0.207, abs=0.01)
    assert detectable_gain(400, 0.5) < 0.05
    small = power_line(20, 20, 0.3, 0.05)
    assert "wider than --min-gain 0.05" in small
    assert f"about {questions_for(0.05, 0.3)} test questions" in small
    assert "before the baseline" in power_line(20, 20, None, 0.05)
    assert "within --min-gain 0.1" in power_line(400, 400, 0.5, 0.1)
    # once the held-out split is measured, its own accuracy sets its width
    after = power_line(51, 196, 0.02, 0.05, test_accuracy=0.10)
    assert after.startswith(
        "power: dev 51 questions at the baseline's 0.02 and test 196 at its 0.10"
    )
    assert f"\u00b1{detectable_gain(196, 0.10):.2f} (95% CI" in after


# --- the controller, with the fakes of test_controller ------------------------------------------


def scripted_dev(
    monkeypatch: pytest.MonkeyPatch, n: int, dev: dict[tuple[str, str], tuple[int, str]]
) -> None:
    """Dev of ``n`` questions, each program's passes and blamed site as ``dev`` scripts them."""
    monkeypatch.setitem(fakes.QUESTIONS, "dev", n)
    monkeypatch.setattr(fakes, "DEV", dev)


@pytest.fixture
def twenty_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dev of 20 questions in 5 episodes: the start program passes 16; ``answer:1`` none (worse on
    every question the start program passes); ``answer:2`` all 20."""
    scripted_dev(
        monkeypatch,
        20,
        {
            ("seed answer", "seed extract"): (16, fakes.ANSWER),
            ("answer:1", "seed extract"): (0, fakes.ANSWER),
            ("answer:2", "seed extract"): (20, fakes.ANSWER),
            ("answer:3", "seed extract"): (0, fakes.ANSWER),
            ("answer:4", "seed extract"): (0, fakes.ANSWER),
        },
    )


def run(
    tmp_path: Path,
    *,
    race: bool = True,
    clock: fakes.Clock | None = None,
    batch: int = 1,
    stall: int = 2,
) -> fakes.Run:
    clock = clock or fakes.Clock()
    return fakes.Run(
        tmp_path / "ckpt.json",
        fakes.MemorySink(clock),
        clock,
        budget=4,
        race=race,
        batch=batch,
        stall=stall,
    )


def test_the_loop_stops_a_losing_candidate_counts_it_and_never_makes_it_the_best(
    tmp_path: Path, twenty_dev: None
) -> None:
    loop = run(tmp_path)
    result = loop.run()
    tried = {t.origin.split(": ")[-1]: t for t in result.tried}
    assert tried["answer 1"].stopped and not tried["answer 2"].stopped
    assert result.best_trial == 2 and result.best_dev == 1.0
    # answer:3 and answer:4 raced against trial 2, the new best
    assert tried["answer 3"].stopped and tried["answer 4"].stopped
    assert result.evaluations == 4  # --budget counts the stopped candidates
    stopped_lines = [line for line in loop.lines if line.stopped is not None]
    assert len(stopped_lines) == 3
    assert "vs the start program's" in (stopped_lines[0].stopped or "")
    assert "vs trial 2's" in (stopped_lines[-1].stopped or "")
    assert "stopped after" in stopped_lines[0].text()
    assert result.racing is not None and result.racing.stopped == 3
    assert result.racing.questions < result.racing.full_questions == 80
    assert result.power.startswith("power: dev 20 questions at the baseline")
    assert " and test 24 at its " in result.power


def test_a_batch_races_each_candidate_against_the_best_it_started_from(
    tmp_path: Path, twenty_dev: None
) -> None:
    loop = run(tmp_path, batch=2)
    result = loop.run()
    assert loop.evaluator.batches == [2, 2]
    assert [t.stopped for t in result.tried] == [True, False, True, True]
    assert result.best_trial == 2


def test_without_racing_every_candidate_answers_every_dev_question(
    tmp_path: Path, twenty_dev: None
) -> None:
    result = run(tmp_path, race=False).run()
    assert not any(t.stopped for t in result.tried)
    assert result.racing is not None and result.racing.stopped == 0
    assert result.racing.questions == result.racing.full_questions == 80
    assert result.best_trial == 2


def test_a_resumed_run_races_the_same_way(tmp_path: Path, twenty_dev: None) -> None:
    whole = run(tmp_path / "whole").run()
    (tmp_path / "cut").mkdir()
    first = run(tmp_path / "cut", clock=fakes.Clock(kill_on="evaluate dev", nth=5))
    with pytest.raises(fakes.Killed):
        first.run()
    resumed = run(tmp_path / "cut").run()
    assert [(t.trial, t.dev, t.stopped) for t in resumed.tried] == [
        (t.trial, t.dev, t.stopped) for t in whole.tried
    ]
    assert resumed.best_trial == whole.best_trial


def test_against_names_the_start_program_and_uses_the_run_seed() -> None:
    against = Against(outcomes([True] * 8), "the start program", seed=7)
    assert against.race().against == "the start program"


# --- headroom: whether the blamed site's prompt can matter ---------------------------------------


def test_headroom_agrees_only_on_enough_questions_and_differs_when_the_ci_excludes_0() -> None:
    from optloop.loop.trivial_control import headroom

    same = [i % 2 == 0 for i in range(100)]
    assert headroom(["a"], same, same, min_gain=0.05, seed=0).verdict == "agree"
    assert headroom(["a"], same[:20], same[:20], min_gain=0.05, seed=0).verdict == "unknown"
    better = [True] * 100
    found = headroom(["a"], same, better, min_gain=0.05, seed=0)
    assert found.verdict == "differ" and "the prompt there matters" in found.line()
    assert (
        "the model's, not the prompt's"
        in headroom(["a"], same, same, min_gain=0.05, seed=0).line()
    )


@pytest.fixture
def model_bound_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dev of 80 questions on which the start program and the control (the trivial instruction at
    ``answer``) pass the same 40, their failures blamed on ``answer`` and ``mem.extract``."""
    scripted_dev(
        monkeypatch,
        80,
        {
            ("seed answer", "seed extract"): (40, fakes.ANSWER),
            ("trivial answer", "seed extract"): (40, fakes.ANSWER),
        },
    )


def test_a_model_bound_site_gives_its_budget_to_the_other_targets(
    tmp_path: Path, model_bound_answer: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optloop.loop import controller as controller_module

    # the blame names answer first, then mem.extract: both are targets
    monkeypatch.setattr(
        controller_module,
        "choose_targets",
        lambda entries, config, names: ([fakes.ANSWER, fakes.EXTRACT], [], ""),
    )
    monkeypatch.setattr(
        controller_module,
        "control_sites",
        lambda entries, config, names: ([fakes.ANSWER], ""),
    )
    loop = run(tmp_path)
    result = loop.run()
    assert "agree within \u00b10.05 on 80 dev questions" in result.headroom
    assert result.headroom.endswith("the budget goes to mem.extract")
    assert loop.optimizers[0].sites == [fakes.EXTRACT]
    assert any(m.startswith("headroom: answer:") for m in loop.messages)


def test_the_control_answers_train_only_where_dev_cannot_tell_and_both_can() -> None:
    from optloop.loop.trivial_control import control_candidate, widens

    def ev(split: str, program: str, passes: int, n: int) -> Evaluation:
        candidate = (
            fakes.BASE
            if program == "own"
            else control_candidate(fakes.BASE, {fakes.ANSWER: program})
        )
        return fakes.evaluation(split, candidate, passes, n, fakes.ANSWER)

    config = LoopConfig(system="fake", run_name="r", min_gain=0.05)

    def at(train: Evaluation, dev: Evaluation, control: Evaluation | None) -> bool:
        ckpt = Checkpoint(config_digest="", baseline_train=train, baseline_dev=dev)
        return widens(ckpt.model_copy(update={"control_dev": control}), config)

    train, dev = ev("train", "own", 20, 40), ev("dev", "own", 10, 20)
    assert at(train, dev, None)  # before the control: dev's 20 are too few
    assert at(train, dev, ev("dev", "trivial", 10, 20))  # dev cannot tell
    assert not at(train, dev, ev("dev", "trivial", 20, 20))  # dev tells: they differ
    assert not at(train, dev, dev)  # the control is the start program
    assert not at(ev("train", "own", 20, 30), dev, None)  # 50 questions of the 60 needed


@pytest.fixture
def small_dev_model_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dev of 20 questions (too few to show agreement within ±0.05) and train of 40, on which the
    start program and the control (the trivial instruction at ``answer``) pass the same half, their
    failures blamed on ``answer``; the blame names ``answer`` and ``mem.extract``."""
    from optloop.loop import controller as controller_module

    scripted_dev(
        monkeypatch,
        20,
        {
            ("seed answer", "seed extract"): (10, fakes.ANSWER),
            ("trivial answer", "seed extract"): (10, fakes.ANSWER),
        },
    )
    monkeypatch.setitem(fakes.QUESTIONS, "train", 40)
    monkeypatch.setattr(
        controller_module,
        "choose_targets",
        lambda entries, config, names: ([fakes.ANSWER, fakes.EXTRACT], [], ""),
    )
    monkeypatch.setattr(
        controller_module, "control_sites", lambda entries, config, names: ([fakes.ANSWER], "")
    )


def test_when_dev_cannot_tell_the_control_answers_train_too_and_the_verdict_reads_both(
    tmp_path: Path, small_dev_model_bound: None
) -> None:
    loop = run(tmp_path)
    result = loop.run()
    train = [digest for split, digest in loop.evaluator.calls if split == "train"]
    assert train[0] == fakes.BASE.digest() and len(train) == 2  # the baseline, then the control
    agree = "own and the trivial instruction agree within \u00b10.05 on 60 train and dev questions"
    assert result.headroom.startswith(f"headroom: answer: {agree}")
    assert "the budget goes to mem.extract" in result.headroom
    assert loop.optimizers[0].sites == [fakes.EXTRACT]
    assert any(
        m.startswith("headroom: answer: 20 dev questions cannot tell")
        and m.endswith("the control answers train too (40 questions)")
        for m in loop.messages
    )
    ckpt = Checkpoint.load(tmp_path / "ckpt.json")
    assert ckpt.control_train is not None and ckpt.control_train.n == 40


def test_a_resumed_run_reads_the_controls_train_answers_from_the_checkpoint(
    tmp_path: Path, small_dev_model_bound: None
) -> None:
    (tmp_path / "clean").mkdir()
    clean = run(tmp_path / "clean").run()
    with pytest.raises(fakes.Killed):
        run(tmp_path, clock=fakes.Clock(kill_on="propose")).run()
    resumed = run(tmp_path)
    assert fakes.without_cost(resumed.run()) == fakes.without_cost(clean)
    assert not [c for c in resumed.evaluator.calls if c[0] == "train"]


def test_train_too_small_to_show_agreement_is_not_spent_on_the_control(
    tmp_path: Path, small_dev_model_bound: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(fakes.QUESTIONS, "train", 30)  # 50 questions: 3 / 0.05 is 60
    loop = run(tmp_path)
    result = loop.run()
    assert result.headroom.startswith("headroom: answer: 20 dev questions cannot tell")
    assert [c for c in loop.evaluator.calls if c[0] == "train"] == [("train", fakes.BASE.digest())]
    assert Checkpoint.load(tmp_path / "ckpt.json").control_train is None


@pytest.mark.parametrize(("written", "verdict"), [(40, "agree"), (80, "differ")])
def test_after_the_trials_the_best_written_instruction_joins_own_and_the_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: int, verdict: str
) -> None:
    from optloop.loop import controller as controller_module

    dev = {
        ("seed answer", "seed extract"): (40, fakes.ANSWER),
        ("trivial answer", "seed extract"): (40, fakes.ANSWER),
    }
    for k in range(1, 5):
        dev[(f"answer:{k}", "seed extract")] = (written if k == 1 else 20, fakes.ANSWER)
    scripted_dev(monkeypatch, 80, dev)
    # the blame names answer alone: the budget stays there, whatever the first check says
    monkeypatch.setattr(
        controller_module,
        "choose_targets",
        lambda entries, config, names: ([fakes.ANSWER], [], ""),
    )
    monkeypatch.setattr(
        controller_module, "control_sites", lambda entries, config, names: ([fakes.ANSWER], "")
    )
    result = run(tmp_path).run()
    first, _, after = result.headroom.partition("; after the trials, ")
    assert first.startswith("headroom: answer: own and the trivial instruction agree")
    assert after.startswith("answer: own, the trivial instruction and trial 1's instruction")
    if verdict == "agree":
        assert "agree within \u00b10.05 on 80 dev questions" in after
        assert "written - own +0.000 [+0.000, +0.000]" in after
        assert after.endswith("a larger model at that site or a knob would move them")
    else:
        assert "differ on 80 dev questions" in after and after.endswith("the prompt there matters")


@pytest.fixture
def blame_brings_extract_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dev of 80 questions. The start program and the control (the trivial instruction at
    ``answer``) pass the same 40, their failures blamed on ``answer`` alone, so the first check
    agrees but the budget has nowhere else to go. Trial 1 (``answer:1``) passes 41 and its failures
    are blamed on ``mem.extract``, which the blame then names beside ``answer``; trials 2 and 3
    pass 1 (a stall of two)."""
    from optloop.loop import controller as controller_module

    scripted_dev(
        monkeypatch,
        80,
        {
            ("seed answer", "seed extract"): (40, fakes.ANSWER),
            ("trivial answer", "seed extract"): (40, fakes.ANSWER),
            ("answer:1", "seed extract"): (41, fakes.EXTRACT),
        },
    )
    monkeypatch.setattr(
        controller_module,
        "choose_targets",
        lambda entries, config, names: (
            [fakes.ANSWER, fakes.EXTRACT]
            if any(e.target == fakes.EXTRACT for e in entries)
            else [fakes.ANSWER],
            [],
            "",
        ),
    )
    monkeypatch.setattr(
        controller_module, "control_sites", lambda entries, config, names: ([fakes.ANSWER], "")
    )


def test_a_stall_checks_the_headroom_again_and_moves_the_budget_off_a_model_bound_site(
    tmp_path: Path, blame_brings_extract_back: None
) -> None:
    loop = run(tmp_path)
    result = loop.run()
    assert result.headroom.startswith(
        "headroom: answer: own and the trivial instruction agree"
    ) and ("the blame names no other target, so the budget stays there" in result.headroom)
    assert (
        "; after trial 3 (2 without a new best), answer: own, the trivial instruction and trial "
        "1's instruction agree within \u00b10.05 on 80 dev questions" in result.headroom
    )
    assert "the rest of the budget goes to mem.extract" in result.headroom
    assert loop.optimizer.retargets[-1] == ([fakes.EXTRACT], [])
    ckpt = Checkpoint.load(tmp_path / "ckpt.json")
    assert [(r.after_trial, r.left) for r in ckpt.rechecks] == [(3, [fakes.ANSWER])]
    # the trial after the re-check rewrites mem.extract, not answer
    last = max(ckpt.trials, key=lambda t: t.trial)
    assert last.trial == 4
    assert last.candidate.sites[fakes.EXTRACT].instructions == "mem.extract:1"
    assert any(
        m.startswith("headroom after trial 3 (2 without a new best)") for m in loop.messages
    )


def test_a_resumed_run_keeps_the_budget_where_the_re_check_moved_it(
    tmp_path: Path, blame_brings_extract_back: None
) -> None:
    (tmp_path / "clean").mkdir()
    clean = run(tmp_path / "clean").run()
    with pytest.raises(fakes.Killed):
        run(tmp_path, clock=fakes.Clock(kill_on="propose", nth=4)).run()
    resumed = run(tmp_path)
    assert fakes.without_cost(resumed.run()) == fakes.without_cost(clean)
    assert resumed.optimizer.sites == [fakes.EXTRACT]
    assert len(Checkpoint.load(tmp_path / "ckpt.json").rechecks) == 1


def test_a_written_instruction_that_differs_keeps_the_budget_and_stall_0_never_checks_again(
    tmp_path: Path, blame_brings_extract_back: None
) -> None:
    fakes.DEV[("answer:1", "seed extract")] = (60, fakes.EXTRACT)
    for name in ("differs", "never"):
        (tmp_path / name).mkdir()
    loop = run(tmp_path / "differs")
    result = loop.run()
    assert "after trial 3 (2 without a new best)" in result.headroom
    assert "differ on 80 dev questions" in result.headroom
    assert loop.optimizer.sites == [fakes.ANSWER, fakes.EXTRACT]
    never = run(tmp_path / "never", stall=0)
    assert "after trial" not in never.run().headroom
    assert not Checkpoint.load(tmp_path / "never" / "ckpt.json").rechecks
