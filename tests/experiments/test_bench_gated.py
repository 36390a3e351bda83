"""The gated benchmark on a few generated probes, with a bag-of-words embedder and no LLM."""

from __future__ import annotations

import json

import pytest

from experiments.bench import gated as bench
from optloop.datasets.agentic import CATEGORIES
from tests.systems._gated_fakes import BowEmbedder


@pytest.fixture(scope="module")
def scores(tmp_path_factory):
    _, scores, seconds = bench.run(24, 0, 5, BowEmbedder(), tmp_path_factory.mktemp("work"))
    assert set(seconds) == {bench.RAG, bench.GATED}
    return scores


def test_every_arm_scores_every_probe_in_the_same_order(scores):
    assert set(scores) == set(bench.ARMS)
    ids = [s.question_id for s in scores[bench.RAG]]
    assert len(ids) == 24 and all(
        [s.question_id for s in scores[arm]] == ids for arm in bench.ARMS
    )


def test_the_floors_keep_stale_and_foreign_values_out_and_cost_the_failed_branch_truth(scores):
    gated = scores[bench.GATED]
    assert not any(s.contaminated or s.leaked for s in gated)
    assert all(
        s.recall == 0 and s.recall_any == 1 for s in gated if s.category == "failed_branch_truth"
    )
    assert any(s.leaked for s in scores[bench.RAG])  # no workspace notion
    off = scores["gated floors=off"]
    assert not any(s.leaked for s in off)  # the retrieval scope alone keeps other workspaces out
    assert any(s.contaminated for s in off)


def test_summary_json_and_markdown(scores, tmp_path):
    summary = bench.summarize(scores, seed=0)
    overall = summary["arms"][bench.GATED]["all"]
    assert overall["contamination"].estimate == 0 and overall["recall"].n == 24
    assert set(summary["arms"][bench.RAG]["by_category"]) == set(CATEGORIES)
    delta = summary["deltas_vs_rag"][bench.GATED]["all"]["leakage"]
    assert delta.estimate < 0 and delta.n == 24
    report = {
        "dataset": "agentic:generate?records=24&seed=0",
        "top_k": 5,
        "embedder": "test:bow",
        "summary": summary,
    }
    text = bench.markdown(report)
    assert "| gated |" in text and "failed_branch_truth" in text
    data = json.loads(json.dumps(bench._jsonable(report)))
    assert set(data["summary"]["arms"][bench.GATED]["all"]["recall"]) == {
        "estimate",
        "low",
        "high",
        "n",
        "confidence",
    }


def test_main_writes_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "get_embedder", lambda spec: BowEmbedder())
    out = tmp_path / "gated.json"
    assert (
        bench.main(
            ["--records", "8", "--json", str(out), "--markdown", str(tmp_path / "gated.md")]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["n"] == 8 and report["llm_calls"] == 0 and "floors_only" in report["gated_mode"]
    assert (tmp_path / "gated.md").read_text().startswith("# gated vs rag_embedding")
