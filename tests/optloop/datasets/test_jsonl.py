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
    path.write_text("\n" + episodes[0].model_dump_json() + "\n\n" + episodes[1].model_dump_json() + "\n", encoding="utf-8")
    assert [e.id for e in load_dataset(f"jsonl:{path}").episodes] == [e.id for e in episodes]
