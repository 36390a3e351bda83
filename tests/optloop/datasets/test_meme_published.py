"""``meme:`` on MEME's published layout: two episodes, task mapping, evidence parts, one-line
errors."""

from __future__ import annotations

import pytest

from optloop.datasets import load_dataset, passed
from optloop.datasets.meme_published import published_task, read_all
from optloop.errors import DatasetError
from tests._meme_fixture import EPISODE, FIXTURE, copy_fixture


def test_published_task_types_map_to_memes_six():
    assert published_task("Exact") == published_task("Exact (exact recall)") == "exact_recall"
    assert published_task("Multi-hop") == "aggregation"
    assert published_task("Multiple-update") == "tracking"
    assert published_task("Deletion (before delete)") == "deletion"
    assert published_task("Cascade-D (1-hop)") == "cascade"
    assert published_task("Cascade-U (1-hop)") == "absence"
    assert published_task("Temporal") is None


def test_checkout_and_file_load_the_same_two_episodes():
    by_dir = load_dataset(f"meme:{FIXTURE}")
    by_file = load_dataset(f"meme:{FIXTURE / EPISODE}")
    assert (
        [e.id for e in by_dir.episodes]
        == [e.id for e in by_file.episodes]
        == ["fx_001-before", "fx_001-after"]
    )
    before, after = by_dir.episodes
    assert [s.id for s in before.sessions] == [
        "s0",
        "s1",
        "s2",
    ]  # asked right after session probe_before_idx
    assert [s.id for s in after.sessions] == ["s0", "s1", "s2", "s3", "s4"]
    assert after.sessions[3].turns[3].content.startswith("Please delete the log drain endpoint")
    assert before.meta["asked_after_session"] == "s2" and after.meta["phase"] == "after"


def test_questions_scorers_and_evidence_parts():
    before, after = load_dataset(f"meme:{FIXTURE}").episodes
    (deletion_before,) = before.questions
    assert deletion_before.id == "fx_001-before:deletion"
    assert (deletion_before.scorer, deletion_before.abstain) == (
        "contains",
        False,
    )  # the value is still there
    assert deletion_before.evidence_ids == ["s1:t4"]

    q = {x.task_type: x for x in after.questions}
    assert set(q) == {"tracking", "deletion", "cascade"}
    assert q["tracking"].evidence_ids == ["s1:t2", "s3:t2"]
    assert [p["value"] for p in q["tracking"].meta["evidence_parts"]] == [
        "Karnex Pack",
        "Dranith Stack",
    ]
    # after the deletion: abstain, the value forbidden, the evidence is the retraction turn
    deletion = q["deletion"]
    assert (deletion.scorer, deletion.abstain, deletion.forbidden) == (
        "abstain",
        True,
        ["logs.example.io/app"],
    )
    assert deletion.meta["evidence_parts"] == [
        {
            "turn_id": "s3:t4",
            "entity": "log_drain_endpoint",
            "value": "logs.example.io/app",
            "kind": "retraction",
        }
    ]
    assert passed(deletion, "That endpoint was deleted at your request.")
    assert not passed(deletion, "It is logs.example.io/app.")
    # the cascade needs its rule and the root's change (team lead Ana Silva -> Dee Evans)
    kinds = [(p["kind"], p["value"]) for p in q["cascade"].meta["evidence_parts"]]
    assert kinds == [("fact", "Cy Diaz"), ("change", "Dee Evans")]
    assert q["cascade"].evidence_ids == ["s1:t8", "s3:t6"]


def test_read_all_keeps_every_systems_probe_with_its_label():
    (published,) = read_all(FIXTURE)
    assert published.systems == ["flat", "chunks"] and published.tag == "fx_001"
    assert len(published.probes) == 8
    failed = [p for p in published.probes if not p.passed]
    assert len(failed) == 7 and all(p.failure_stage for p in failed)
    flat_tracking = next(
        p for p in published.probes if p.system == "flat" and p.question_id.endswith("tracking")
    )
    assert (flat_tracking.answer, flat_tracking.failure_stage) == ("Dranith Stack", "maintenance")
    assert published.context_path(flat_tracking).is_file()


def _drop_public(tmp_path):
    import shutil

    root = copy_fixture(tmp_path)
    shutil.rmtree(root / "public")
    return root


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            lambda d: d["results"]["flat"]["after"][0].update(task_type="Temporal"),
            "field 'task_type': unknown task",
        ),
        (
            lambda d: d["results"]["chunks"]["after"][1].update(u_pass="no"),
            "results.chunks.after[1]: field 'u_pass'",
        ),
        (
            lambda d: d["results"]["chunks"]["after"][0].update(question="Other?"),
            "field 'question': differs from",
        ),
        (
            lambda d: d["results"]["chunks"]["after"].pop(),
            "results.chunks.after: 2 probes, but flat has 3",
        ),
        (
            lambda d: d["sessions"][1]["gold_facts"][0].update(conveyed_in_turn=40),
            "conveyed_in_turn': turn 40 is outside",
        ),
        (
            lambda d: d["results"]["flat"]["after"][0]["failure_analysis"].update(
                failure_stage="typing"
            ),
            "failure_stage': unknown stage 'typing'",
        ),
        (
            lambda d: d["systems"].append("ghost"),
            "field 'ghost': system listed in 'systems' has no results",
        ),
    ],
)
def test_malformed_published_file_fails_in_one_line(tmp_path, change, needle):
    root = copy_fixture(tmp_path, change)
    with pytest.raises(DatasetError) as info:
        load_dataset(f"meme:{root}")
    message = str(info.value)
    assert needle in message and "\n" not in message and "fx001.json" in message


def test_missing_public_folder_or_src_data_is_named(tmp_path):
    with pytest.raises(DatasetError, match=r"public/fx001 not found .*fetch public/fx001"):
        load_dataset(f"meme:{_drop_public(tmp_path / 'a')}")
    empty = tmp_path / "b"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no src/data folder"):
        load_dataset(f"meme:{empty}")
