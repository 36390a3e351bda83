"""The baseline table's argument handling and bookkeeping, without an LM.

Bad systems, URIs and config files must fail (exit 2, one line) before the LM is
built; a run with a stub system and a stub LM checks the tables, JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.bench import baselines
from experiments.bench import systems as bench_systems
from optloop.cli.command import run_cli
from optloop.datasets import Question, Session
from optloop.lm import Accounting, CallRecord
from systems import SYSTEMS
from systems.base import MemoryItem


@pytest.fixture
def no_lm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the LM is a test failure: argument errors must come first."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("the LM was built before the arguments were checked")

    monkeypatch.setattr(baselines, "bench_lm", refuse)
    monkeypatch.setattr(bench_systems, "bench_lm", refuse)


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(
        **{"config": None, "systems": None, "datasets": None, "episodes": None, **kw}
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--systems", "rag_bm25,nope"], "unknown system 'nope'"),
        (["--systems", ","], "names no system"),
        (["--datasets", "nope:x"], "unknown dataset scheme"),
        (["--datasets", "builtin:tiny,synthetic:recall?seed=0&limit=x"], "'limit'"),
        (["--datasets", "memfail:no_such_task"], "unknown task"),
    ],
)
def test_bad_arguments_exit_2_before_the_lm(no_lm, capsys, argv: list[str], needle: str) -> None:
    assert run_cli(baselines.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("optloop: error:") and needle in err and err.count("\n") == 1


def test_a_bad_config_file_exits_2_naming_the_field(no_lm, capsys, tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        'name = "x"\nsystems = ["rag_bm25"]\ndatasets = ["builtin:tiny"]\nbudget = 0\n'
    )
    assert run_cli(baselines.main, ["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "'budget'" in err


def test_episodes_below_one_is_a_usage_error(no_lm) -> None:
    with pytest.raises(SystemExit) as info:
        baselines.main(["--episodes", "0"])
    assert info.value.code == 2


def test_systems_bench_unknown_system_exits_2_before_the_lm(no_lm, capsys) -> None:
    assert run_cli(bench_systems.main, ["--systems", "nope"]) == 2
    assert "unknown system 'nope'" in capsys.readouterr().err


def test_default_plan_skips_slow_systems_and_absent_memfail_tasks(
    monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPTLOOP_SHARED_DATA", str(tmp_path))  # no MemFail data at all
    plan = baselines.make_plan(_args())
    assert plan.systems == [
        "long_context",
        "rag_bm25",
        "rag_embedding",
        "md_flat",
        "tiered",
        "gated",
    ]
    assert [d.uri for d in plan.datasets] == ["synthetic:meme?seed=0&episodes=3"]
    assert len(plan.datasets[0].episodes) == 3
    assert len(plan.skipped) == len(baselines.MEMFAIL_TASKS)
    assert all("skipped" in note for note in plan.skipped)


def test_default_plan_takes_the_memfail_tasks_present(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "memfail").mkdir()
    (tmp_path / "memfail" / "persona_dataset.csv").write_text(
        'entity,entity_facts,questions\nAda,"[""Ada paints.""]","[{""text"": ""What does Ada '
        'do?"", ""ground_truth_answer"": ""paints""}]"\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("OPTLOOP_SHARED_DATA", str(tmp_path))
    plan = baselines.make_plan(_args(episodes=2))
    assert [d.uri for d in plan.datasets] == [
        "memfail:persona?limit=2",
        "synthetic:meme?seed=0&episodes=2",
    ]
    assert len(plan.skipped) == len(baselines.MEMFAIL_TASKS) - 1


def test_flags_override_the_config(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(
        'name = "x"\nsystems = ["md_flat", "rag_bm25"]\ndatasets = ["builtin:tiny", '
        '"builtin:meme"]\n'
        "episodes = 1\n"
    )
    plan = baselines.make_plan(_args(config=path))
    assert plan.systems == ["md_flat", "rag_bm25"]
    assert [d.uri for d in plan.datasets] == ["builtin:tiny?limit=1", "builtin:meme?limit=1"]
    plan = baselines.make_plan(
        _args(config=path, systems="long_context", datasets="builtin:tiny?limit=3", episodes=2)
    )
    assert plan.systems == ["long_context"]
    assert [len(d.episodes) for d in plan.datasets] == [3]


def test_dataset_lists_keep_commas_inside_a_query() -> None:
    assert baselines.split_uris(
        "builtin:tiny, memfail:persona?tasks=persona,persona_misleading&limit=2,,synthetic:meme"
    ) == [
        "builtin:tiny",
        "memfail:persona?tasks=persona,persona_misleading&limit=2",
        "synthetic:meme",
    ]
    plan = baselines.make_plan(
        _args(datasets="builtin:tiny?tasks=update,exact_recall,builtin:meme?limit=1")
    )
    assert [d.uri for d in plan.datasets] == [
        "builtin:tiny?tasks=update,exact_recall",
        "builtin:meme?limit=1",
    ]


def test_task_labels_carry_the_family_and_keep_conditional_difficulty_apart() -> None:
    def q(task: str) -> Question:
        return Question(id="q", question="?", gold="x", task_type=task, scorer="contains")

    assert (
        baselines.task_label("memfail:conditional_hard?limit=3", q("conditional"))
        == "memfail/conditional_hard"
    )
    assert (
        baselines.task_label("memfail:persona", q("persona_misleading"))
        == "memfail/persona_misleading"
    )
    assert baselines.task_label("memfail:persona:/x/p.csv", q("persona")) == "memfail/persona"
    assert baselines.task_label("synthetic:meme?seed=0&episodes=3", q("cascade")) == "meme/cascade"
    assert baselines.task_label("builtin:tiny", q("update")) == "tiny/update"
    assert baselines.task_label("locomo:/d/l.json", q("multi_hop")) == "locomo/multi_hop"


class EchoSystem:
    """Stands in for a memory system: answers with everything ingested, one fake LM call per
    session."""

    def __init__(self, lm, run_dir: Path, *, embedder=None) -> None:
        self.lm, self.text = lm, ""
        Path(run_dir).mkdir(parents=True, exist_ok=True)

    def ingest(self, sessions: Sequence[Session]) -> None:
        for session in sessions:
            self.text += " ".join(t.content for t in session.turns) + " "
            self.lm.accounting.add(
                CallRecord(
                    site="ingest",
                    model="stub",
                    prompt_tokens=1,
                    completion_tokens=1,
                    seconds=0.0,
                    cached=False,
                )
            )

    def retrieve(self, question: str) -> list[MemoryItem]:
        return [MemoryItem(id="all", text=self.text)]

    def answer(self, question: str, memories: list[MemoryItem]) -> str:
        return memories[0].text

    def all_memories(self) -> list[MemoryItem]:
        return [MemoryItem(id="all", text=self.text)]

    def prompt_sites(self) -> dict:
        return {}

    def close(self) -> None:  # MemorySystem's protocol: nothing held open
        pass


def test_a_stub_run_fills_both_tables_and_the_files(monkeypatch, capsys, tmp_path: Path) -> None:
    monkeypatch.setitem(SYSTEMS, "echo", f"{__name__}:EchoSystem")
    lm = SimpleNamespace(accounting=Accounting(), backend=SimpleNamespace(identity="stub"))
    monkeypatch.setattr(baselines, "bench_lm", lambda *_a, **_k: lm)
    out_json, out_md, out_probes = tmp_path / "bl.json", tmp_path / "bl.md", tmp_path / "probes.md"
    argv = [
        "--systems",
        "echo",
        "--datasets",
        "builtin:tiny,synthetic:meme?seed=0&episodes=1",
        "--json",
        str(out_json),
        "--markdown",
        str(out_md),
        "--probes",
        str(out_probes),
    ]
    assert run_cli(baselines.main, argv) == 0

    data = json.loads(out_json.read_text())
    assert data["systems"] == ["echo"] and data["lm"] == "stub"
    assert {"tiny/update", "meme/cascade", "meme/absence", baselines.ALL_ROW} <= set(
        data["accuracy"]
    )
    assert (
        data["accuracy"]["tiny/exact_recall"]["echo"]["accuracy"] == 1.0
    )  # the answer holds every fact
    cost = data["cost"]["echo"]
    assert cost["episodes"] == 4 + 1
    sessions = 8 + 7  # builtin:tiny has 8 sessions, the first synthetic:meme?seed=0 episode 7
    assert (
        cost["calls_per_episode"] == pytest.approx(sessions / 5)
        and cost["seconds_per_episode"] >= 0
    )
    assert data["accuracy"][baselines.ALL_ROW]["echo"]["n"] == sum(
        d["questions"] for d in data["datasets"]
    )
    markdown = out_md.read_text()
    assert (
        "| task | echo |" in markdown and "| echo | 5 |" in markdown and "meme/cascade" in markdown
    )
    # The provenance, the accuracy's interval, and per probe: expected, got, pass, the context.
    assert set(data["provenance"]) == {"command", "date", "commit", "model", "machine"}
    assert data["provenance"]["model"] == "stub" and "--probes" in data["provenance"]["command"]
    n = data["accuracy"][baselines.ALL_ROW]["echo"]["n"]
    interval = data["accuracy_ci"]["echo"]
    assert interval["n"] == n and interval["low"] <= interval["estimate"] <= interval["high"]
    overall = data["accuracy"][baselines.ALL_ROW]["echo"]
    assert interval["estimate"] == pytest.approx(overall["accuracy"], abs=1e-4)
    probes = data["probes"]["echo"]
    assert len(probes) == n and sum(p["pass"] for p in probes) == overall["correct"]
    first = probes[0]
    assert first["got"] == first["context"][0] and first["expected"] and first["question"]
    assert data["episodes"]["echo"][0]["tiers"] == {"memory": [first["got"]]}
    assert data["extraction"] == {}  # no extraction log in this system
    assert markdown.startswith("- command: `python -m ")
    table = out_probes.read_text()
    assert "| probe | task | expected | got | pass | in context |" in table
    assert "- MEMORY (1):" in table
    printed = capsys.readouterr().out
    assert "accuracy per task type" in printed and "cost per episode" in printed


def test_systems_bench_writes_its_figures_with_provenance(monkeypatch, tmp_path: Path) -> None:
    row = {
        "system": "rag_bm25",
        "episodes": 1,
        "sessions": 2,
        "questions": 4,
        "calls_per_session": 0.0,
        "seconds_per_session": 0.5,
        "calls_per_question": 1.0,
        "seconds_per_question": 2.0,
        "accuracy": 0.25,
        "mean_score": 0.4,
        "ingest_seconds_per_episode": 1.0,
        "calls_per_evaluation": 4,
        "seconds_per_evaluation": 9.0,
        "per_episode": [],
    }
    fake_lm = SimpleNamespace(backend=SimpleNamespace(identity="fake"))
    monkeypatch.setattr(bench_systems, "bench_lm", lambda *a, **k: fake_lm)
    monkeypatch.setattr(bench_systems, "bench_system", lambda *a, **k: dict(row))
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    argv = ["--systems", "rag_bm25", "--json", str(out), "--markdown", str(md)]
    assert bench_systems.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["provenance"]["command"] and data["systems"] == [row]
    assert (
        "| rag_bm25 | 1 / 2 / 4 | 1 | 0.5 | 0.0 | 2.0 | 1.0 | 4 | 0.25 / 0.40 |" in md.read_text()
    )
