"""The repair benchmark on a champion (``--champion``), without a model: the loop and the
evaluations are scripted, the bench's own bookkeeping runs as it does on the embedded model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from experiments.bench import repair
from optloop.faults.sabotages import CHAMPION_CASES, RECALL_CASES, SABOTAGES
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.state import LoopConfig
from optloop.stats import Interval

CLEAN = {
    "retrieve.query": "Rewrite the question into a search query.",
    "answer": 'Answer from the memories. If the memories do not contain the answer, reply "I '
    "don't know\".",
}
WORSE = "Answer from the memories. Reply in one word."  # trial 1: beaten by trial 2
CHAMPION = "Answer from the memories."  # trial 2: the best on dev
UNKNOWN = next(s for s in SABOTAGES if s.name == "recall-answer-unknown-prepend")
ABSTAIN = next(s for s in SABOTAGES if s.name == "recall-answer-abstain-append")
CASE_FIELDS = {
    "case",
    "site",
    "optimizer",
    "arm",
    "seed",
    "first_blame_correct",
    "sabotage_removed",
    "recovered",
    "recovered_ci",
    "llm_calls",
}


def _evaluation(passed: list[int], blamed: str = "answer") -> SimpleNamespace:
    outcomes = [
        SimpleNamespace(episode_id=f"e{i}", question_id="q", passed=bool(p))
        for i, p in enumerate(passed)
    ]
    return SimpleNamespace(
        outcomes=outcomes,
        accuracy=sum(passed) / len(passed),
        n=len(passed),
        blame=lambda: [SimpleNamespace(target=blamed)],
        attributions=lambda: [SimpleNamespace(target=blamed)],
    )


def _candidate(**sites: str) -> Candidate:
    return Candidate(sites={s: SiteState(instructions=t) for s, t in {**CLEAN, **sites}.items()})


def _result(best_trial: int, *, targets: list[str], changed: list[str]) -> SimpleNamespace:
    return SimpleNamespace(
        best_trial=best_trial,
        targets=targets,
        tunable_sites=targets,
        changed_sites=changed,
        baseline_dev=0.4,
        best_dev=0.6 if best_trial else 0.4,
        test_before=0.2,
        test_after=0.8 if best_trial else 0.2,
        delta_test_ci=Interval(estimate=0.6, low=0.2, high=0.9, n=5),
        n_dev=5,
        n_test=5,
        promoted=bool(best_trial),
        cost={"llm_calls": 100, "model_calls": 40, "tokens": 1000},
    )


class ScriptedBench(repair.Bench):
    """The bench with its loop runs and whole-dataset evaluations scripted.

    The champion's run: round 1's best trial is 2 (``CHAMPION``; trial 1, ``WORSE``, lost on
    dev), round 2 finds nothing better (or, with ``champion_wins=False``, round 1 finds
    nothing). An arm's run: ``targeted`` promotes the champion's text back (the sabotage
    removed); ``untargeted`` removes it in trial 1 but promotes trial 2, which keeps it;
    ``random`` promotes nothing."""

    champion_wins = True
    runs: list[LoopConfig] = []

    def lm(self, system: str) -> Any:
        return self.lms.setdefault(system, SimpleNamespace(model="fake", watchers=[]))

    def evaluate(self, sabotage, champion):
        program = {**CLEAN, **champion}
        return program, list(CLEAN), _evaluation([1] * 8 + [0] * 2), _evaluation([1] * 3 + [0] * 7)

    def run_loop(self, config, witness=None):
        type(self).runs.append(config)
        base = _candidate(**config.start)
        if config.run_name.startswith("champion-"):
            round_one = not config.start
            best = 2 if round_one and self.champion_wins else 0
            trials = [_candidate(answer=WORSE), _candidate(answer=CHAMPION)] if round_one else []
            ckpt = SimpleNamespace(
                trials=[SimpleNamespace(trial=i + 1, candidate=c) for i, c in enumerate(trials)]
            )
            return (
                _result(best, targets=["answer"], changed=["answer"] if best else []),
                ckpt,
                base,
            )
        site = next(s for s in SABOTAGES if s.name in config.run_name).site
        program = self.champions and next(iter(self.champions.values()))["instructions"] or CLEAN
        mended = _candidate(**{**config.start, site: program[site]})
        best, trials = {
            "targeted": (1, [mended]),
            "untargeted": (2, [mended, base]),
            "random": (0, [base]),
        }[next(a for a in repair.ARMS if f"-{a}-" in config.run_name)]
        ckpt = SimpleNamespace(
            trials=[
                SimpleNamespace(trial=i + 1, candidate=c, evaluation=None)
                for i, c in enumerate(trials)
            ],
            test_before=_evaluation([0, 0, 1, 0, 0]),
            test_after=_evaluation([1, 1, 1, 1, 0] if best else [0, 0, 1, 0, 0]),
            baseline_train=None,
            baseline_dev=_evaluation([0, 1]),
            control_dev=None,
            control_test=_evaluation([0, 1, 1, 0, 0]),
        )
        return _result(best, targets=[site], changed=[site] if best else []), ckpt, base


@pytest.fixture
def bench(monkeypatch):
    ScriptedBench.runs = []
    ScriptedBench.champion_wins = True
    monkeypatch.setattr(repair, "Bench", ScriptedBench)
    return ScriptedBench


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "repair_champion.json"
    code = repair.main(
        [
            "--champion",
            "--cases",
            f"{UNKNOWN.name},{ABSTAIN.name}",
            "--seeds",
            "0",
            "--optimizers",
            "edit",
            "--work",
            str(tmp_path / "work"),
            "--json",
            str(out),
            "--markdown",
            str(tmp_path / "repair_champion.md"),
            *extra,
        ]
    )
    assert code == 0
    return json.loads(out.read_text())


def _arm_starts(bench: type[ScriptedBench]) -> dict[str, dict[str, str]]:
    return {c.run_name: c.start for c in bench.runs if c.run_name.startswith("repair-")}


def test_the_champion_is_the_best_trials_instructions_and_the_sabotages_are_planted_on_it(
    bench, tmp_path
):
    report = _run(tmp_path)
    champion = report["champion"]
    assert champion["instructions"] == {**CLEAN, "answer": CHAMPION}  # trial 2, not trial 1
    assert champion["changed"] == ["answer"] and not champion["from_clean"]
    assert [r["best_trial"] for r in champion["rounds"]] == [2, 0]  # round 2: nothing beat it
    rounds = [c for c in bench.runs if c.run_name.startswith("champion-")]
    assert [c.start for c in rounds] == [{}, {"answer": CHAMPION}]
    assert all(c.optimizer == "edit" and c.seed == 0 and c.budget == 3 for c in rounds)
    starts = _arm_starts(bench)
    assert starts["repair-recall-answer-unknown-prepend-targeted-edit-s0"] == {
        "answer": f"{UNKNOWN.text} {CHAMPION}"
    }
    assert starts["repair-recall-answer-abstain-append-random-edit-s0"] == {
        "answer": f"{CHAMPION} {ABSTAIN.text}"
    }
    assert all(b["clean_instruction"] == CHAMPION and b["on_champion"] for b in report["bites"])


def test_sabotage_removed_is_read_from_the_promoted_prompt(bench, tmp_path):
    report = _run(tmp_path)
    removed = {(c["case"], c["arm"]): c["sabotage_removed"] for c in report["cases"]}
    assert removed[(UNKNOWN.name, "targeted")] is True
    # untargeted: trial 1 took the text out, but trial 2 (which keeps it) is the one promoted
    assert removed[(UNKNOWN.name, "untargeted")] is False
    assert removed[(UNKNOWN.name, "random")] is False  # nothing promoted: the sabotaged start
    edit = {r["arm"]: r for r in report["aggregate"]}
    assert edit["targeted"]["sabotage_removed"] == 1.0 and edit["random"]["sabotage_removed"] == 0
    assert any("sabotage's text" in t and "met" in t for t in report["targets"])


def test_the_report_has_every_field_and_its_markdown_beside_it(bench, tmp_path):
    report = _run(tmp_path)
    assert set(report["provenance"]) == {"command", "date", "commit", "model", "machine"}
    assert report["bench"] == "repair-champion" and report["champion_budget"] == 3
    assert len(report["cases"]) == 2 * 3  # two cases bite, three arms, one seed, one optimizer
    for case in report["cases"]:
        assert CASE_FIELDS <= set(case), CASE_FIELDS - set(case)
        assert isinstance(case["first_blame_correct"], bool)
        assert isinstance(case["sabotage_removed"], bool)
        assert len(case["recovered_ci"]) == 2
    targeted = next(c for c in report["cases"] if c["arm"] == "targeted")
    # the loop's control is kept where the run evaluated it (test here, not dev)
    assert targeted["control_test"] == 0.4 and "control_dev" not in targeted
    # champion 0.8 on the test keys (e0..e4: all passed), sabotaged 0.2, after 0.8: all won back
    assert targeted["clean"] == 1.0 and targeted["recovered"] == pytest.approx(0.75)
    assert {r["arm"] for r in report["aggregate"]} == set(repair.ARMS)
    md = (tmp_path / "repair_champion.md").read_text()
    assert md.startswith("Command: `") and "Champion: the champion changes answer" in md
    assert "| sabotage removed |" in md and CHAMPION in md


def test_a_rerun_reuses_the_champion(bench, tmp_path):
    first = _run(tmp_path)
    assert first["champion"]["reused"] is False
    bench.runs = []
    second = _run(tmp_path)
    assert not [c for c in bench.runs if c.run_name.startswith("champion-")]
    assert second["champion"]["reused"] is True
    assert second["champion"]["instructions"] == first["champion"]["instructions"]
    assert list((tmp_path / "work").glob("champion-rag_bm25-*.json"))
    bench.runs = []  # another budget is another champion
    _run(tmp_path, "--champion-budget", "2")
    assert [c.budget for c in bench.runs if c.run_name.startswith("champion-")] == [2, 2]


def test_when_nothing_beats_the_clean_program_the_champion_is_the_clean_program(bench, tmp_path):
    bench.champion_wins = False
    report = _run(tmp_path)
    champion = report["champion"]
    assert champion["from_clean"] and champion["instructions"] == CLEAN
    assert "the champion is the clean program" in champion["note"]
    assert len(champion["rounds"]) == 1
    starts = _arm_starts(bench)
    assert starts["repair-recall-answer-unknown-prepend-targeted-edit-s0"] == {
        "answer": f"{UNKNOWN.text} {CLEAN['answer']}"
    }
    # the clean instruction already says what the abstain case plants: dropped, not run
    assert [d["name"] for d in report["dropped"]] == [ABSTAIN.name]
    assert report["dropped"][0]["already_there"] is True
    assert {c["case"] for c in report["cases"]} == {UNKNOWN.name}
    assert "the champion is the clean program" in (tmp_path / "repair_champion.md").read_text()


def test_planted_puts_the_sabotage_on_the_program_it_is_given():
    program = {**CLEAN, "answer": CHAMPION}
    assert repair.planted(UNKNOWN, program, {"answer": CHAMPION}) == {
        "answer": f"{UNKNOWN.text} {CHAMPION}"
    }
    assert repair.planted(UNKNOWN, CLEAN, {}) == {"answer": f"{UNKNOWN.text} {CLEAN['answer']}"}
    assert repair.holds(f"x\n{ABSTAIN.text.replace(' ', '  ')}", ABSTAIN.text)


def test_the_champion_cases_are_the_recall_ones_and_the_abstain_ones():
    assert set(RECALL_CASES) < set(CHAMPION_CASES)
    assert set(CHAMPION_CASES) - set(RECALL_CASES) == {
        "recall-answer-abstain-prepend",
        "recall-answer-abstain-append",
    }
    from signatures.common import AnswerFromMemories

    assert repair.holds(
        AnswerFromMemories.instructions, ABSTAIN.text
    )  # the clean rule, word for word


def test_champion_refuses_cases_of_two_datasets(bench, tmp_path):
    with pytest.raises(SystemExit, match="one system and dataset"):
        repair.main(
            ["--champion", "--cases", f"{UNKNOWN.name},answer-echo", "--work", str(tmp_path)]
        )


def test_the_benchmarks_page_shows_the_champion_and_the_removed_column(
    bench, tmp_path, monkeypatch
):
    from experiments import report

    _run(tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    section = "\n\n".join(report.repair())
    assert "Champion: the champion changes answer" in section
    assert (
        f"| answer | {CHAMPION} |" in section and "| retrieve.query | (the clean one) |" in section
    )
    assert "sabotage removed" in section and "No results file yet" not in section
    monkeypatch.setattr(report, "RESULTS", tmp_path / "nothing")
    assert report.REPAIR_CHAMPION_COMMAND in "\n\n".join(report.repair())


def test_screen_order_is_its_own_optimizer_row_and_the_evidence_order_is_restored(
    bench, tmp_path, monkeypatch
):
    from optloop.loop.optimizers.edit import EditOptimizer

    seen: list[bool] = []
    run_loop = ScriptedBench.run_loop

    def watching(self, config, witness=None):
        if config.run_name.startswith("repair-"):
            seen.append(EditOptimizer.evidence)
        return run_loop(self, config, witness)

    monkeypatch.setattr(ScriptedBench, "run_loop", watching)
    report = _run(tmp_path, "--edit-order", "screen")
    assert seen and not any(seen)  # every arm ran with the screen's order alone
    assert EditOptimizer.evidence is True  # and optloop.run's order is back afterwards
    assert {c["edit_order"] for c in report["cases"]} == {"screen"}
    assert {r["optimizer"] for r in report["aggregate"]} == {"edit (screen order)"}
    targeted = next(c for c in report["cases"] if c["arm"] == "targeted")
    untargeted = next(c for c in report["cases"] if c["arm"] == "untargeted")
    random_arm = next(c for c in report["cases"] if c["arm"] == "random")
    assert (targeted["tried_before_best"], untargeted["tried_before_best"]) == (0, 0)
    assert random_arm["tried_before_best"] is None  # nothing beat the start
    md = (tmp_path / "repair_champion.md").read_text()
    assert "| edit (screen order) | targeted |" in md and "tried before the best" in md


def test_resume_runs_only_what_the_report_lacks(bench, tmp_path):
    first = _run(tmp_path, "--arms", "targeted")
    assert len(first["cases"]) == 2
    bench.runs = []
    second = _run(tmp_path, "--arms", "targeted,random", "--resume")
    arms_run = [c.run_name for c in bench.runs if c.run_name.startswith("repair-")]
    assert arms_run and all("-random-" in name for name in arms_run)
    assert len(second["cases"]) == 4
    assert second["cases"][:2] == first["cases"]
    with pytest.raises(SystemExit, match="--json"):
        repair.main(["--resume", "--cases", UNKNOWN.name])


def test_a_writer_makes_rows_of_its_own_and_the_champion_is_found_without_it(bench, tmp_path):
    """``--proposer-lm``: every arm's run writes with that LM, the champion's runs do not (so
    rows with and without a writer mend the same program), and the rows are labelled with the
    writer, so ``--resume`` without it does not take them for its own."""
    writer = "local:/models/writer-1.5b.gguf"
    report = _run(tmp_path, "--arms", "targeted", "--proposer-lm", writer)
    champion = [c for c in bench.runs if c.run_name.startswith("champion-")]
    arms = [c for c in bench.runs if c.run_name.startswith("repair-")]
    assert champion and all(c.proposer_lm == "same" for c in champion)
    assert arms and all(c.proposer_lm == writer for c in arms)
    assert all("-edit-writer-1.5b-" in c.run_name for c in arms)
    assert {c["writer"] for c in report["cases"]} == {"writer-1.5b"}
    assert {r["optimizer"] for r in report["aggregate"]} == {"edit, writer-1.5b writes"}
    assert report["provenance"]["model"].endswith("; writer-1.5b.gguf writes")
    md = (tmp_path / "repair_champion.md").read_text()
    assert "| edit, writer-1.5b writes | targeted |" in md
    bench.runs = []
    again = _run(tmp_path, "--arms", "targeted", "--resume")
    assert [c.run_name for c in bench.runs if c.run_name.startswith("repair-")]  # ran again
    assert len(again["cases"]) == 2 * len(report["cases"])


def test_the_writer_settings_keep_the_bench_cache(tmp_path):
    args = repair.build_parser().parse_args(
        ["--cache", str(tmp_path / "c.sqlite"), "--proposer-lm", "local:/m/w.gguf"]
    )
    bench = repair.Bench(args, tmp_path)
    proposer = bench.proposer("rag_bm25")
    assert proposer is not None and proposer.cache_path == tmp_path / "c.sqlite"
    assert bench.writer() == "w"
    args.proposer_lm = "local:qwen2.5-coder-1.5b"  # a short spec, dots and all
    assert bench.writer() == "qwen2.5-coder-1.5b"
    assert repair.Bench(repair.build_parser().parse_args([]), tmp_path).proposer("md_flat") is None
