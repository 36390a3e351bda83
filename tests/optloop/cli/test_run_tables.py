"""The summary ``optloop.run`` prints: three rows on dev and test (the system's own prompt, the
trivial-instruction control, the loop's best), each accuracy with its n and 95% CI, and the paired
differences loop - own prompt and loop - control on test with their verdicts (no LM)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from optloop.cli.run_tables import summary_table, tried_table
from optloop.loop.policy import NO_CONTROL, held_out_intervals
from optloop.loop.state import LoopConfig, LoopResult
from optloop.loop.trivial_control import NO_MEASURABLE_CHANGE, comparison_of
from tests.optloop.loop.test_promotion import evaluation

KEYS = [(f"e{i // 4}", f"q{i}") for i in range(20)]


def passing(n: int) -> dict[tuple[str, str], bool]:
    """The first ``n`` of 20 test questions pass."""
    return {k: i < n for i, k in enumerate(KEYS)}


def result(own: int, best: int, control: int | None, *, note: str = "", **config) -> LoopResult:
    """A finished run on 20 test questions: ``own``, ``best`` and ``control`` of them passed (the
    control ``None``: the run had none, ``note`` says why)."""
    before, after = evaluation(passing(own)), evaluation(passing(best))
    own_ci, best_ci, delta = held_out_intervals(before, after, seed=0)
    control_ci = control_delta = None
    if control is not None:
        control_ci, _, control_delta = held_out_intervals(
            evaluation(passing(control)), after, seed=0
        )
    return LoopResult(
        config=LoopConfig(system="mem0", run_name="r", **config),
        parent_run_id="p",
        targets=["mem0.extract"],
        tunable_sites=["mem0.extract"],
        tunable_knobs=[],
        baseline_dev=0.0,
        best_dev=0.95,
        best_trial=2,
        test_before=before.accuracy,
        test_after=after.accuracy,
        evaluations=3,
        changed_sites=["mem0.extract"],
        changed_knobs={},
        promoted=True,
        promotion_reason="its 95% CI is above 0, champion moved (--promote-if ci)",
        registered={},
        cost={"llm_calls": 10, "model_calls": 10, "tokens": 100, "seconds": 1.0},
        n_dev=20,
        n_test=20,
        test_before_ci=own_ci,
        test_after_ci=best_ci,
        delta_test_ci=delta,
        control_sites=[] if control is None else ["mem0.extract"],
        control_note=note,
        control_dev=None if control is None else 0.9,
        test_control_ci=control_ci,
        delta_control_ci=control_delta,
        beats_control=None if control_delta is None else control_delta.above_zero,
    )


def printed(res: LoopResult) -> str:
    out = io.StringIO()
    Console(file=out, width=250).print(summary_table(res))
    return out.getvalue()


def line(text: str, label: str) -> str:
    return next(row for row in text.splitlines() if label in row)


def test_three_rows_on_dev_and_test_and_both_paired_differences():
    """mem0's case: its own prompt gets nothing, a trivial instruction nearly everything, and the
    loop's +0.95 over the own prompt is no measurable change over the control."""
    res = result(own=0, best=19, control=18)
    text = printed(res)
    own, control, best = (
        line(text, "system's own prompt"),
        line(text, "trivial instruction (control: mem0.extract)"),
        line(text, "loop's best (trial 2)"),
    )
    assert "0.000 [0.000, 0.000] n=20" in own  # dev and test, each with its n and CI
    assert "0.900 [" in control and "] n=20" in control and "0.900 [0.750, 1.000] n=20" in control
    assert "0.950 [" in best and best.count("n=20") == 2
    versus_own, versus_control = (
        line(text, "loop \u2212 own prompt"),
        line(text, "loop \u2212 control"),
    )
    assert str(res.delta_test_ci) in versus_own and "measurably better" in versus_own
    assert "+0.950 (best of 4 on dev)" in versus_own
    assert res.delta_control_ci is not None and not res.delta_control_ci.excludes_zero
    assert str(res.delta_control_ci) in versus_control and NO_MEASURABLE_CHANGE in versus_control
    assert "+0.050" in versus_control  # on dev: 0.950 - 0.900
    assert "no: its prompt does not measurably beat a trivial instruction" in text
    comparison = comparison_of(res)
    assert [r.program for r in comparison.rows] == ["own", "control", "best"]
    assert comparison.beats_control is False
    assert [d.verdict for d in comparison.differences] == [
        "measurably better",
        NO_MEASURABLE_CHANGE,
    ]


def test_the_candidates_table_names_the_controls_dev_accuracy_beside_the_baselines():
    table = tried_table(result(own=0, best=19, control=18))
    assert table.title == "candidates tried on dev (baseline 0.000, control 0.900, n=20)"
    assert tried_table(result(own=0, best=19, control=None)).title == (
        "candidates tried on dev (baseline 0.000, n=20)"
    )


def test_a_loop_that_beats_the_control_says_so():
    text = printed(result(own=0, best=19, control=2))
    assert "measurably better" in line(text, "loop \u2212 control")
    assert "yes: its gain is more than a trivial instruction gets" in text


def test_a_start_prompt_is_named_as_such():
    text = printed(result(own=4, best=19, control=2, start={"mem0.extract": "Extract facts."}))
    assert "start prompt (--start)" in text and "loop \u2212 start prompt" in text


def test_no_control_says_why_in_its_row_and_leaves_one_difference():
    knobs = (
        "none: the blame names no prompt site (only knob:top_k), so there is no prompt to replace "
        "with the trivial instruction"
    )
    for note in (knobs, NO_CONTROL):
        text = printed(result(own=0, best=19, control=None, note=note))
        assert note[:60] in line(text, "trivial instruction (control)")
        assert "loop \u2212 own prompt" in text and "loop \u2212 control" not in text
        assert "beats the control" not in text


def test_a_result_from_before_the_control_still_loads_and_prints():
    res = result(own=0, best=19, control=None)
    old = json.loads(res.model_dump_json())
    for name in (
        "control_sites",
        "control_note",
        "control_dev",
        "test_control_ci",
        "delta_control_ci",
        "beats_control",
    ):
        del old[name]
    again = LoopResult.model_validate(old)
    assert again.test_control is None and again.beats_control is None
    assert "not evaluated" in line(printed(again), "trivial instruction (control)")
