"""Importing MEME's published traces: units per store format, snapshot diffs as operations,
probes."""

from __future__ import annotations

import pytest

from optloop.errors import DatasetError
from optloop.tracing.graph import ExecutionGraph
from optloop.tracing.meme_traces import context_items, import_traces, split_units, unit_format
from optloop.tracing.memtrace import from_memtrace, to_memtrace
from tests._meme_fixture import FIXTURE, copy_fixture

WIKI = (
    "INDEX:\n# Index\n\nDAILY (2024-01-02):\n---\n## Session 1\nTeam lead is Ana.\n\n"
    "CONCEPTS (oncall):\n---\ntitle: x\n---\nPaired."
)
CHUNKS = (
    "[Session: a]\nUser: hi\nAssistant: hello\n\n---\n\n[Session: b]\nUser: log\nspans lines\n"
)
MEM0 = "[7a77d5a5] User likes tea\n[0acf8914] User has a cat\n\n[7a77d5a5] User likes tea\n"


def test_units_follow_the_store_format():
    assert (
        unit_format([WIKI]) == "wiki"
        and unit_format(["x", CHUNKS]) == "chunks"
        and unit_format([MEM0]) == "lines"
    )
    wiki = split_units(WIKI, "wiki")
    assert list(wiki) == ["INDEX:", "DAILY (2024-01-02):", "CONCEPTS (oncall):"]
    assert wiki["DAILY (2024-01-02):"].endswith("Team lead is Ana.")
    chunks = split_units(CHUNKS, "chunks")
    assert (
        list(chunks.values())[1] == "[Session: b]\nUser: log\nspans lines"
    )  # a multi-line turn stays whole
    lines = split_units(MEM0, "lines")
    assert list(lines) == [
        "7a77d5a5",
        "0acf8914",
        "7a77d5a5#2",
    ]  # the [hex id] is the identity; repeats kept


def test_context_items_split_blocks_or_lines_and_read_scores():
    items = context_items(
        "[score=0.59] User asked to delete the endpoint\n[score=0.33] Logs drain to x\n", "lines"
    )
    assert [(i["rank"], i["score"], i["text"]) for i in items] == [
        (1, 0.59, "User asked to delete the endpoint"),
        (2, 0.33, "Logs drain to x"),
    ]
    assert [i["text"][:12] for i in context_items(CHUNKS, "chunks")] == [
        "[Session: a]",
        "[Session: b]",
    ]


def _runs():
    return {(r.system, r.episode.id): r for r in import_traces(FIXTURE)}


def test_one_graph_per_system_and_episode_with_a_store_per_session():
    runs = _runs()
    assert sorted(runs) == [
        ("chunks", "fx_001-after"),
        ("chunks", "fx_001-before"),
        ("flat", "fx_001-after"),
        ("flat", "fx_001-before"),
    ]
    graph = runs["flat", "fx_001-after"].graph
    assert (
        graph.meta["unit_format"] == "lines"
        and runs["chunks", "fx_001-after"].graph.meta["unit_format"] == "chunks"
    )
    stores = [op for op in graph.operations if op.name == "store"]
    assert [op.session_id for op in stores] == ["s0", "s1", "s2", "s3", "s4"]
    s1 = stores[1]
    assert (
        s1.inputs[0] == "message:s1:t1@0" and len(s1.inputs) == 9
    )  # the session's messages are the source
    assert [graph.variables[v].text for v in s1.outputs][
        0
    ] == "[2024/01/02] Package manager: Karnex Pack"


def test_a_removed_line_is_a_delete_in_its_session():
    graph = _runs()["flat", "fx_001-after"].graph
    (delete,) = [op for op in graph.operations if op.name == "delete"]
    assert delete.session_id == "s3"
    (old,) = [graph.variables[v] for v in delete.inputs if v.startswith("memory:")]
    (tomb,) = [graph.variables[v] for v in delete.outputs]
    assert old.text == "[2024/01/02] Package manager: Karnex Pack"
    assert (tomb.name, tomb.version, tomb.status, tomb.text) == (
        old.name,
        old.version + 1,
        "deleted",
        "",
    )
    dranith = graph.latest(
        "memory",
        graph.variables[
            next(
                v
                for op in graph.operations
                if op.name == "store" and op.session_id == "s3"
                for v in op.outputs
            )
        ].name,
    )
    assert dranith is not None and "Dranith Stack" in dranith.text


def test_a_similar_replacement_is_an_update_of_the_same_unit(tmp_path):
    root = copy_fixture(tmp_path)
    snap = root / "public/fx001/snap/flat"
    for k in (3, 4):  # reword the lead's line instead of dropping the package manager's
        text = (snap / f"{k}.txt").read_text()
        (snap / f"{k}.txt").write_text(
            text.replace("Team lead: Ana Silva", "Team lead: Ana Silva (on leave)")
        )
    graph = {(r.system, r.episode.id): r for r in import_traces(root)}[
        "flat", "fx_001-after"
    ].graph
    (update,) = [op for op in graph.operations if op.name == "update"]
    before = next(graph.variables[v] for v in update.inputs if v.startswith("memory:"))
    (after,) = [graph.variables[v] for v in update.outputs]
    assert (after.name, after.version) == (
        before.name,
        before.version + 1,
    ) and after.text.endswith("(on leave)")


def test_each_probe_is_a_retrieve_and_an_answer_holding_what_was_published():
    run = _runs()["chunks", "fx_001-after"]
    qid = "fx_001-after:deletion"
    retrieve, answer = run.graph.question_ops(qid)
    assert (retrieve.name, answer.name) == ("retrieve", "answer")
    items = run.graph.variables[retrieve.outputs[0]].data["items"]
    assert len(items) == 2 and "Please delete the log drain endpoint" in items[0]["text"]
    assert (
        items[0]["var"] is not None and items[0]["var"] in retrieve.inputs
    )  # linked to the stored chunk
    assert run.graph.variables[answer.outputs[0]].text == "logs.example.io/app"
    assert [q.id for q, _ in run.failures()] == [
        "fx_001-after:tracking",
        qid,
        "fx_001-after:cascade",
    ]


def test_graphs_survive_json_and_memtrace_round_trips():
    graph = _runs()["flat", "fx_001-after"].graph
    assert ExecutionGraph.from_json(graph.to_json()) == graph
    back, _ = from_memtrace(to_memtrace(graph))
    assert back == graph


def test_a_missing_snapshot_or_context_is_one_line(tmp_path):
    root = copy_fixture(tmp_path)
    (root / "public/fx001/snap/chunks/3.txt").unlink()
    with pytest.raises(
        DatasetError, match=r"chunks/3\.txt: snapshot of chunks after session s3 missing$"
    ):
        import_traces(root)
    root = copy_fixture(tmp_path / "b")
    (root / "public/fx001/retr/flat_after_Deletion.txt").unlink()
    with pytest.raises(
        DatasetError, match=r"retrieved context of results\.flat\.after\[1\] missing$"
    ):
        import_traces(root)
