"""The project's own jsonl: format is exactly the Episode model's JSON, one per line."""

from __future__ import annotations

from pathlib import Path

from optloop.datasets import load_dataset, write_jsonl


def test_jsonl_round_trips_any_loaded_dataset(tmp_path: Path) -> None:
    original = load_dataset("synthetic:meme?seed=5&episodes=2")
    path = write_jsonl(original.episodes, tmp_path / "out" / "episodes.jsonl")
    reloaded = load_dataset(f"jsonl:{path}")
    assert reloaded.name == "jsonl:episodes"
    assert reloaded.episodes == original.episodes
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2


def test_jsonl_skips_blank_lines(tmp_path: Path) -> None:
    episodes = load_dataset("builtin:tiny").episodes[:2]
    path = tmp_path / "user.jsonl"
    path.write_text(
        "\n" + episodes[0].model_dump_json() + "\n\n" + episodes[1].model_dump_json() + "\n",
        encoding="utf-8",
    )
    assert [e.id for e in load_dataset(f"jsonl:{path}").episodes] == [e.id for e in episodes]


def test_an_empty_gold_is_refused_naming_the_line_and_field(tmp_path: Path) -> None:
    """Every answer to it would be graded wrong; an "I don't know" question is marked abstain."""
    import json

    import pytest

    from optloop.errors import DatasetError

    episode = json.loads(load_dataset("builtin:tiny").episodes[0].model_dump_json())
    episode["questions"][0]["gold"] = " "
    path = tmp_path / "user.jsonl"
    path.write_text(json.dumps(episode) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        load_dataset(f"jsonl:{path}")
    assert str(info.value).startswith(
        f"{path}: line 1: field 'questions[0].gold': empty, so every answer would be graded wrong"
    )
    episode["questions"][0] |= {"gold": "", "abstain": True, "scorer": "abstain"}
    path.write_text(json.dumps(episode) + "\n", encoding="utf-8")
    assert load_dataset(f"jsonl:{path}").episodes[0].questions[0].abstain
