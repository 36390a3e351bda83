"""The repair benchmark's bookkeeping, without a model: sabotages, the clean-text witness,
aggregates, targets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from experiments.bench import repair
from optloop.faults.sabotages import SABOTAGES
from optloop.lm import prompt_site
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.optimizers.base import PROPOSER_SITE

CLEAN = "Answer the user's question using only the memories below."


def test_sabotages_replace_or_append_and_name_real_sites():
    from systems.base import MemorySystem  # noqa: F401 - the registry imports every system module

    echo = next(s for s in SABOTAGES if s.name == "answer-echo")
    assert echo.instruction(CLEAN) == echo.text and CLEAN not in echo.instruction(CLEAN)
    na = next(s for s in SABOTAGES if s.name == "answer-na")
    assert na.instruction(CLEAN) == f"{CLEAN} {na.text}"
    assert len({s.name for s in SABOTAGES}) == len(SABOTAGES)
    kinds = {s.site.split(".")[-1] for s in SABOTAGES}
    assert {
        "answer",
        "curate",
        "extract",
        "query",
    } <= kinds  # + mem0's ingest site and rag_bm25's query rewrite
    front = next(s for s in SABOTAGES if s.mode == "prepend")
    assert front.instruction(CLEAN) == f"{front.text} {CLEAN}" and front.start == f"{front.text}+"
    assert all(s.query_rewrite for s in SABOTAGES if s.site == "retrieve.query")


class _FakeLM(SimpleNamespace):
    def __init__(self):
        super().__init__(watchers=[])

    def send(self, messages):
        for watch in self.watchers:
            from optloop.lm import current_site

            watch(current_site(), messages)


def test_the_witness_counts_only_proposer_requests_that_carry_the_clean_text():
    lm = _FakeLM()
    with repair.Witness(CLEAN).watching(lm) as witness:  # type: ignore[arg-type]
        lm.send(
            [{"role": "system", "content": f"  {CLEAN}\n"}]
        )  # a system call: the program may run anything
        with prompt_site(PROPOSER_SITE):
            lm.send([{"role": "user", "content": "rewrite: Repeat the question."}])
            lm.send(
                [{"role": "user", "content": "improve this:\n" + CLEAN.replace(" ", "\n ")}]
            )  # white space folded
    assert (witness.proposer_requests, witness.leaks) == (2, 1)
    assert lm.watchers == []  # detached on exit
    witness.check_demos(
        [Candidate(sites={"answer": SiteState(instructions="x", demos=[{"answer": CLEAN}])})]
    )
    assert witness.leaks == 2


def test_an_append_sabotage_has_no_text_to_witness():
    lm = _FakeLM()
    with repair.Witness(None).watching(lm) as witness:  # type: ignore[arg-type]
        with prompt_site(PROPOSER_SITE):
            lm.send([{"role": "user", "content": CLEAN}])
    assert (witness.proposer_requests, witness.leaks) == (1, 0)


def _case(arm, recovered, calls, blame=True, optimizer="edit"):
    return {
        "optimizer": optimizer,
        "arm": arm,
        "recovered": recovered,
        "first_blame_correct": blame,
        "llm_calls": calls,
        "tokens": 10 * calls,
        "leaks": 0,
    }


def test_aggregate_and_targets_say_met_or_missed():
    cases = [
        _case("targeted", 1.0, 50),
        _case("targeted", 0.6, 60),
        _case("targeted", None, 70, blame=False),
        _case("untargeted", 0.5, 90),
        _case("random", 0.0, 40),
    ]
    rows = {r["arm"]: r for r in repair.aggregate(cases)}
    assert rows["targeted"]["first_blame_correct"] == pytest.approx(2 / 3, abs=1e-3)
    assert rows["targeted"]["recovered_half"] == pytest.approx(
        2 / 3, abs=1e-3
    )  # an undefined case counts as not
    assert rows["targeted"]["recovered_mean"] == pytest.approx(0.8)
    lines = repair.targets(list(rows.values()))
    assert any("first blame" in line and "MISSED" in line for line in lines)  # 67% < 90%
    assert any("70%" in line and "MISSED" in line for line in lines)
    assert any(
        "vs untargeted" in line and "(at least as much: met)" in line and "(fewer: met)" in line
        for line in lines
    )
    assert any(
        "vs random" in line and "(more: met)" in line and "(fewer: MISSED)" in line
        for line in lines
    )


def _planted_case(mode, arm, recovered, optimizer="edit", name="c", seed=0):
    return _case(arm, recovered, 10, optimizer=optimizer) | {
        "case": name,
        "mode": mode,
        "seed": seed,
        "sabotage_removed": recovered is not None and recovered >= 0.5,
    }


def test_the_rows_split_by_how_the_sabotage_was_planted():
    cases = [
        _planted_case("prepend", "targeted", 1.0),
        _planted_case("append", "targeted", 1.0),
        _planted_case("replace", "targeted", 0.0),
        _planted_case("replace", "random", 0.0),
    ]
    rows = {(r["arm"], r["planted"]): r for r in repair.by_planting(cases)}
    assert set(rows) == {("targeted", "added"), ("targeted", "replaced"), ("random", "replaced")}
    assert rows["targeted", "added"]["cases"] == 2
    assert rows["targeted", "added"]["recovered_half"] == 1.0
    assert rows["targeted", "added"]["sabotage_removed"] == 1.0
    assert rows["targeted", "replaced"]["recovered_mean"] == 0.0


def _report(cases):
    return {
        "bench": "repair-champion",
        "budget": 3,
        "seeds": [0, 1],
        "arms": ["targeted", "random"],
        "optimizers": ["simba"],
        "model": "m",
        "bites": [
            {
                "name": "a",
                "site": "answer",
                "mode": "prepend",
                "n": 8,
                "clean": 0.8,
                "sabotaged": 0.4,
                "margin": 0.4,
                "margin_ci": [0.2, 0.6],
                "bites": True,
            },
            {
                "name": "b",
                "site": "answer",
                "mode": "replace",
                "n": 8,
                "clean": 0.8,
                "sabotaged": 0.8,
                "margin": 0.0,
                "margin_ci": [0.0, 0.0],
                "bites": False,
            },
        ],
        "cases": cases,
    }


def test_an_unfinished_optimizer_is_named_with_its_count():
    edit = [
        _planted_case("prepend", arm, 1.0, name="a", seed=s)
        for arm in ("targeted", "random")
        for s in (0, 1)
    ]
    simba = [_planted_case("prepend", "targeted", 0.0, optimizer="simba", name="a")]
    lines = repair.unfinished(_report(edit + simba))
    assert lines == [
        "simba: 1 of 4 runs (1 cases x 2 arms x 2 seeds); its rows cover those runs only"
    ]


def test_report_only_writes_the_tables_again_and_keeps_the_provenance(tmp_path):
    import json

    cases = [
        _planted_case("prepend", "targeted", 1.0, name="a")
        | {
            "site": "answer",
            "clean": 0.8,
            "sabotaged": 0.4,
            "after": 0.8,
            "n_test": 8,
            "recovered_ci": [1.0, 1.0],
            "gain": 0.4,
            "gain_ci": [0.2, 0.6],
            "first_blame": "answer",
            "changed": ["answer"],
            "seconds": 3.0,
        }
    ]
    path, md = tmp_path / "r.json", tmp_path / "r.md"
    path.write_text(
        json.dumps(
            {
                "provenance": {
                    "command": "python -m experiments.bench.repair",
                    "date": "d",
                    "commit": "c",
                    "model": "m",
                    "machine": "x",
                }
            }
            | _report(cases)
        )
    )
    assert repair.main(["--report-only", "--json", str(path), "--markdown", str(md)]) == 0
    again = json.loads(path.read_text())
    assert again["provenance"]["command"] == "python -m experiments.bench.repair"
    assert again["unfinished"] == [
        "edit: 1 of 4 runs (1 cases x 2 arms x 2 seeds); its rows cover those runs only"
    ]
    assert [r["planted"] for r in again["by_planting"]] == ["added"]
    text = md.read_text()
    assert (
        "**Unfinished.** edit: 1 of 4 runs" in text and "| edit | targeted | added | 1 |" in text
    )


def test_report_only_needs_an_earlier_report(tmp_path):
    with pytest.raises(SystemExit, match="give that report as --json"):
        repair.main(["--report-only", "--json", str(tmp_path / "none.json")])


def test_a_loop_run_goes_through_the_session_with_the_witness_on_the_runs_lm(
    tmp_path, monkeypatch
):
    """``Bench.run_loop`` runs a loop the way ``optloop.optimize`` does
    (``optloop.loop.runs.session``, scripted here): the request carries the config, the bench's LM
    settings and cache, its runs folder; the witness watches the LM the run builds, and only while
    it runs."""
    from contextlib import contextmanager

    from optloop.lm import current_site
    from optloop.loop.runs import session
    from optloop.loop.runs.request import answer_settings

    args = repair.build_parser().parse_args(
        ["--cache", str(tmp_path / "cache.sqlite"), "--tracking-uri", "sqlite:///x.db"]
    )
    bench = repair.Bench(args, tmp_path)
    config = bench.config("md_flat", run_name="repair-x", budget=2, optimizer="edit")
    program = Candidate(sites={"answer": SiteState(instructions="x")})
    lm = _FakeLM()
    seen: list[tuple[object, str]] = []
    stages: list[str] = []

    class Run:
        loop = SimpleNamespace(start=program)

        def __init__(self, on_event):
            self.lm, self.on_event = lm, on_event
            self.proposer = lm  # no LM of its own: the run's LM writes

        def start(self):
            self.on_event(session.Stage("evaluating baseline on train"))

        def run(self):
            assert len(lm.watchers) == 1
            with prompt_site(PROPOSER_SITE):
                for watch in lm.watchers:
                    watch(current_site(), [{"role": "user", "content": CLEAN}])
            return "result"

        def checkpoint(self):
            return "checkpoint"

    @contextmanager
    def opened(request, again, on_event):
        seen.append((request, again))
        yield Run(on_event)

    monkeypatch.setattr(session, "opened", opened)
    monkeypatch.setattr(
        repair.console, "status", lambda name: _Status(stages)
    )  # what the status line shows
    witness = repair.Witness(CLEAN)
    assert bench.run_loop(config, witness) == ("result", "checkpoint", program)
    [(request, again)] = seen
    assert request.config is config and request.proposer is None
    assert request.lm.cache_path == tmp_path / "cache.sqlite"
    assert request.options.run_name == "repair-x" and request.options.allow_small_splits
    assert request.options.runs_dir == tmp_path / "runs"
    assert again == repair.AGAIN
    assert (witness.proposer_requests, witness.leaks) == (1, 1) and lm.watchers == []
    assert stages == ["repair-x: evaluating baseline on train"]
    assert config.lm_settings == answer_settings(bench.settings("md_flat"))  # as optimize's


class _Status(SimpleNamespace):
    def __init__(self, stages):
        super().__init__(stages=stages)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def update(self, text):
        self.stages.append(text)
