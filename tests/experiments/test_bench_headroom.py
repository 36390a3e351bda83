"""``experiments.bench.headroom``'s arguments: a case file's instruction and the split's shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.bench.headroom import build_parser, given_text, seed_cache, shares_of

REPO = Path(__file__).resolve().parents[2]


def test_a_case_file_gives_the_text_between_its_two_rules(tmp_path: Path) -> None:
    case = tmp_path / "case.md"
    case.write_text("# A case\n\nwhy\n\n---\nWrite facts.\n\nOne a line.\n---\nafter\n")
    assert given_text(case) == "Write facts.\n\nOne a line."
    case.write_text("no rules\n")
    with pytest.raises(ValueError, match="no instruction between two lines"):
        given_text(case)


def test_the_committed_locomo_case_holds_an_instruction() -> None:
    text = given_text(REPO / "experiments" / "cases" / "mem0_extract_locomo.md")
    assert text.startswith("You read a chat") and "---" not in text


def test_the_held_out_split_of_a_run_with_other_shares_is_asked_for() -> None:
    args = build_parser().parse_args(
        ["--systems", "mem0", "--lms", "local", "--datasets", "x", "--split", "test"]
        + ["--shares", "0.2,0.2,0.6"]
    )
    assert args.split == "test" and shares_of(args.shares) == (0.2, 0.2, 0.6)
    with pytest.raises(ValueError, match="three numbers"):
        shares_of("0.5,0.5")


def test_a_combination_s_cache_starts_as_a_copy_of_a_run_s_and_is_never_overwritten(
    tmp_path: Path,
) -> None:
    import sqlite3
    from contextlib import closing

    source = tmp_path / "run" / "lm_cache.sqlite"
    source.parent.mkdir()
    with closing(sqlite3.connect(source)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE calls (k TEXT, v TEXT)")
        db.execute("INSERT INTO calls VALUES ('prompt', 'answer')")
        db.commit()
        target = tmp_path / "home" / "mem0-m" / "lm_cache.sqlite"
        seed_cache(source, target)  # while the run still holds its cache open
    with closing(sqlite3.connect(target)) as db:
        assert db.execute("SELECT v FROM calls").fetchall() == [("answer",)]
        db.execute("DELETE FROM calls")
        db.commit()
    seed_cache(source, target)  # already there: left as it is
    with closing(sqlite3.connect(target)) as db:
        assert db.execute("SELECT v FROM calls").fetchall() == []
    with pytest.raises(ValueError, match="no such LM cache file"):
        seed_cache(tmp_path / "missing.sqlite", tmp_path / "new" / "lm_cache.sqlite")
