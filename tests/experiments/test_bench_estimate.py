"""The worked endpoint estimate: per-session and per-question figures from a recording, projected
by ``optloop.run --estimate``'s run model, the optimizer's own calls included."""

from __future__ import annotations

import pytest

from experiments.bench import estimate
from experiments.bench.throughput import Recorded, Recording
from optloop.datasets import load_dataset
from optloop.errors import ConfigError
from optloop.lm.pricing import model_price
from optloop.loop.cost import LMCost
from optloop.loop.evaluate import Evaluation
from optloop.loop.optimizers.work import cost_model
from optloop.loop.spending.estimate import Estimate, measured_chains, work_units
from optloop.loop.spending.estimate import estimate as product_estimate
from optloop.loop.state import Checkpoint


def recording() -> Recording:
    # builtin:tiny: 4 episodes, 8 sessions, 9 questions
    # the extraction site: 8 of its 16 requests computed (the rest served by the cache), so tokens
    # count double
    sites = {
        "graphiti.extract_nodes": LMCost(calls=16, model_calls=8, tokens=800, prompt_tokens=600),
        "answer": LMCost(calls=9, model_calls=9, tokens=900, prompt_tokens=810),
    }
    return Recording(
        dataset="builtin:tiny",
        identity="local:test",
        recorded_on="2026-11-23",
        systems={
            "graphiti": Recorded(
                accuracy=0.5, calls=25, model_calls=25, seconds=1.0, sessions=8, sites=sites
            )
        },
    )


def tiny() -> estimate.Shape:
    return estimate.Shape.of(
        load_dataset("builtin:tiny")
    )  # 2 sessions and 2.25 questions a conversation


def test_per_unit_splits_ingestion_from_the_question_path():
    unit = estimate.per_unit(recording(), "graphiti", questions=9)
    assert (unit.session_calls, unit.session_prompt, unit.session_completion) == (2, 150, 50)
    assert (unit.question_calls, unit.question_prompt, unit.question_completion) == (1, 90, 10)


def test_the_optimizers_shape_comes_from_the_recording_and_the_train_split():
    unit = estimate.per_unit(recording(), "graphiti", questions=9)
    shape = estimate.run_shape(recording(), "graphiti", unit, tiny(), budget=3, train=2)
    assert shape.sites == ["graphiti.extract_nodes", "answer"] and shape.ingest_sites == [
        "graphiti.extract_nodes"
    ]
    assert (shape.train_episodes, shape.train_questions) == (2, round(2 * 2.25))
    assert (shape.ingest_calls, shape.question_calls) == (
        2 * 2,
        1,
    )  # per conversation: 2 sessions x 2 calls
    assert (shape.ingest_tokens, shape.question_tokens) == (100, 100)  # per call
    assert shape.prompt_tokens == {"graphiti.extract_nodes": 75, "answer": 90}  # per computed call


def modeled(
    budget: int = 3, concurrency: int = 4
) -> tuple[Estimate, estimate.PerUnit, estimate.Shape]:
    unit, shape = estimate.per_unit(recording(), "graphiti", questions=9), tiny()
    price = model_price("gpt-4o-mini")
    assert price is not None
    work = cost_model("simba")(
        estimate.run_shape(recording(), "graphiti", unit, shape, budget=budget, train=8)
    )
    figures = estimate.run_estimate(
        unit,
        shape,
        [8, 4, 4],
        budget=budget,
        work=work,
        price=price,
        latency_s=0.5,
        concurrency=concurrency,
    )
    return figures, unit, shape


def test_the_optimizer_is_a_part_and_the_parts_add_up_to_the_total():
    figures, _, _ = modeled()
    names = [p.part for p in figures.parts]
    assert names == [
        "baseline (train + dev)",
        "3 trials",
        "optimizer (simba, modeled)",
        "held-out test",
    ]
    assert figures.optimizer is not None and figures.parts[2].calls == round(
        figures.optimizer.calls + figures.optimizer.proposer_calls
    )
    assert figures.total.calls == sum(p.calls for p in figures.parts)
    assert figures.total.tokens == sum(p.tokens or 0 for p in figures.parts)
    assert figures.total.cost_usd == pytest.approx(sum(p.cost_usd or 0 for p in figures.parts))
    assert figures.total.hours == pytest.approx(sum(p.hours or 0 for p in figures.parts))


def test_the_bench_and_the_products_estimate_agree_on_the_same_baseline():
    figures, unit, shape = modeled()
    price = model_price("gpt-4o-mini")
    assert price is not None

    def measured(split: str, conversations: int) -> Evaluation:
        f = estimate.evaluation(
            unit, shape, conversations, price=price, latency_s=0.5, concurrency=4
        )
        assert f.llm_calls == int(f.llm_calls) and f.tokens == int(
            f.tokens
        )  # 16 conversations: whole figures
        ingest = conversations * shape.sessions * unit.session_calls
        return Evaluation(
            split=split,
            candidate="c",
            outcomes=[],
            llm_calls=int(f.llm_calls),
            model_calls=int(f.model_calls),
            ingest_calls=int(ingest),
            stores_built=conversations,
            tokens=int(f.tokens),
            cost_usd=f.cost_usd,
            lm_seconds=f.lm_seconds,
            seconds=f.seconds,
        )

    ckpt = Checkpoint(
        config_digest="x", baseline_train=measured("train", 8), baseline_dev=measured("dev", 4)
    )
    tiny = load_dataset("builtin:tiny")  # its 4 conversations, as dev's and test's
    units = work_units(tiny)
    assert units == shape.units(4)
    chains = measured_chains(ckpt, tiny, tiny)  # every conversation of 2 sessions, the longest too
    assert chains is not None and chains.dev == chains.test == shape.chain(unit) == 2 * 2 + 1
    product = product_estimate(
        ckpt,
        budget=3,
        concurrency=4,
        dev_units=units,
        test_units=units,
        chains=chains,
        optimizer=figures.optimizer,
        proposer_price=(price.input, price.output),
    )
    assert [p.part for p in product.parts][1:] == [p.part for p in figures.parts][1:]
    for ours, theirs in zip(
        [*figures.parts, figures.total], [*product.parts, product.total], strict=True
    ):
        assert (ours.evaluations, ours.calls, ours.tokens) == (
            theirs.evaluations,
            theirs.calls,
            theirs.tokens,
        )
        assert ours.cost_usd == pytest.approx(theirs.cost_usd) and ours.hours == pytest.approx(
            theirs.hours
        )
        assert ours.floor == theirs.floor
    assert figures.latency_s == pytest.approx(product.latency_s) == 0.5


def test_at_a_high_concurrency_the_longest_conversations_chain_sets_the_time():
    # 4 dev conversations of 2 sessions: 25 requests an evaluation; the longest chains 2 x 2 + 1 =
    # 5, at 0.5 s each
    figures, unit, shape = modeled(concurrency=16)
    trials, test = figures.parts[1], figures.parts[3]
    for part in (trials, test):
        assert (
            part.floor is not None
            and part.floor.binds
            and part.floor.requests == shape.chain(unit) == 5
        )
    assert trials.hours == pytest.approx(3 * 5 * 0.5 / 3600) and test.hours == pytest.approx(
        2 * 5 * 0.5 / 3600
    )
    assert figures.parts[0].hours == pytest.approx(
        2 * 5 * 0.5 / 3600
    )  # the modeled baseline's train and dev too
    assert len(figures.floor_lines()) == 2
    slow, _, _ = modeled(concurrency=4)  # 25 / 4 = 6.25 requests' time: more than the chain's 5
    assert slow.floor_lines() == [] and slow.parts[1].hours == pytest.approx(
        3 * 25 * 0.5 / 4 / 3600
    )


def table_rows(out: str) -> dict[str, list[str]]:
    """The printed table's rows: part -> its other cells."""
    rows = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in out.splitlines()
        if line.startswith("│")
    ]
    return {row[0]: row[1:] for row in rows}


def estimated(tmp_path, capsys, monkeypatch, *extra: str) -> str:
    """The printed estimate of 3 trials on 4 conversations shaped as builtin:tiny (2 sessions and
    2.25 questions per conversation; split 2/1/1), at concurrency 1."""
    monkeypatch.setenv("COLUMNS", "200")  # one line a row
    path = tmp_path / "recording.json"
    path.write_text(recording().model_dump_json())
    argv = ["--recording", str(path), "--dataset", "builtin:tiny", "--conversations", "4"]
    assert estimate.main([*argv, "--budget", "3", "--n", "1", *extra]) == 0
    return capsys.readouterr().out


def test_the_run_adds_baseline_trials_optimizer_and_test(tmp_path, capsys, monkeypatch):
    out = estimated(tmp_path, capsys, monkeypatch)
    rows = table_rows(out)
    assert list(rows) == [
        "baseline (train + dev)",
        "3 trials",
        "optimizer (simba, modeled)",
        "held-out test",
        "total",
    ]
    per_conversation = 2 * 2 + 2.25 * 1  # calls: sessions x 2 + questions x 1
    assert rows["3 trials"][1] == f"{round(3 * per_conversation)}"  # dev: 1 conversation
    calls = {part: int(cells[1].replace(",", "")) for part, cells in rows.items()}
    assert calls.pop("total") == sum(calls.values()) and calls["optimizer (simba, modeled)"] > 0
    assert "target sites: the recorded ingest sites plus answer" in " ".join(out.split())


def test_the_optimizer_is_chosen_by_option(tmp_path, capsys, monkeypatch):
    out = estimated(tmp_path, capsys, monkeypatch, "--optimizer", "optuna")
    assert "optimizer (optuna, modeled)" in table_rows(out)


def test_a_system_not_recorded_is_a_clear_error(tmp_path):
    path = tmp_path / "recording.json"
    path.write_text(recording().model_dump_json())
    with pytest.raises(ConfigError, match="holds no mem0"):
        estimate.main(["--recording", str(path), "--system", "mem0", "--dataset", "builtin:tiny"])


def test_sites_not_recorded_are_refused():
    unit = estimate.per_unit(recording(), "graphiti", questions=9)
    assert (
        estimate.run_shape(
            recording(), "graphiti", unit, tiny(), budget=3, train=2, targets=["answer"]
        ).ingest_sites
        == []
    )
    with pytest.raises(
        ConfigError, match="--sites graphiti.nowhere: not in the recording of graphiti"
    ):
        estimate.run_shape(
            recording(), "graphiti", unit, tiny(), budget=3, train=2, targets=["graphiti.nowhere"]
        )
