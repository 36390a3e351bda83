"""`python -m optloop.run` on bad input: one line naming what to fix, non-zero exit, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from optloop.run import build_parser, main
from tests._servers import closed_port_url


def run(args, tmp_path):
    return subprocess.run([sys.executable, "-m", "optloop.run", *args, "--tracking-uri",
                           f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OPTLOOP_HOME": str(tmp_path / "state")})


def nothing_written(tmp_path: Path) -> bool:
    return not (tmp_path / "ml").exists() and not (tmp_path / "state" / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--system", "nosuch"], "invalid choice: 'nosuch'"),
    (["--budget", "0"], "0 is out of range"),
    (["--budget", "many"], "not a whole number"),
    (["--split", "0.5,0.3,0.3"], "must sum to 1"),
])
def test_bad_arguments_exit_with_one_line(args, message, tmp_path):
    result = run(args, tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert nothing_written(tmp_path)


def test_malformed_dataset_fails_before_any_state(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "e1", "sessions": []}\nnot json\n')
    result = run(["--system", "rag_bm25", "--dataset", f"jsonl:{bad}"], tmp_path)
    assert result.returncode == 2 and "optloop: error:" in result.stderr and "bad.jsonl" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and nothing_written(tmp_path)


def test_unreachable_endpoint_fails_before_any_state(tmp_path):
    result = run(["--system", "rag_bm25", "--lm", "openai:test", "--lm-base-url", closed_port_url(),
                  "--lm-retries", "0"], tmp_path)
    assert result.returncode == 75 and "optloop: error:" in result.stderr  # endpoint unavailable, not bad input
    assert nothing_written(tmp_path) and not (tmp_path / "state" / "lm_cache.sqlite").exists()


def test_too_few_episodes_is_a_dataset_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTLOOP_HOME", str(tmp_path / "state"))
    from optloop.errors import DatasetError

    with pytest.raises(DatasetError, match="at least 3 episodes"):
        main(["--system", "rag_bm25", "--dataset", "builtin:tiny?limit=2", "--tracking-uri",
              f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"])


def test_help_teaches_what_an_evaluation_is():
    text = build_parser().format_help()
    assert "One evaluation (what --budget counts)" in text and "--proposer-lm" in text and "--untargeted" in text


def test_split_and_promote_if_reach_the_config():
    args = build_parser().parse_args(["--split", "0.4, 0.3,0.3", "--promote-if", "delta"])
    assert args.split == (0.4, 0.3, 0.3) and args.promote_if == "delta"
    args = build_parser().parse_args([])
    assert args.split == (0.5, 0.25, 0.25) and args.promote_if == "ci"


@pytest.mark.parametrize("value, message", [
    ("0.5,0.5", "give three fractions TRAIN,DEV,TEST"),
    ("0.5,0.25,a", "give three numbers TRAIN,DEV,TEST"),
    ("0.6,0.3,0.3", "they must sum to 1"),
    ("1,0,0", "every fraction must be above 0"),
    ("0.5,-0.25,0.75", "every fraction must be above 0"),
])
def test_bad_split_is_one_line_exit_2(value, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--split", value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "--split" in err
    assert len(err.strip().splitlines()) == 1


def test_bad_promote_if_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--promote-if", "always"])
    assert exit_info.value.code == 2 and "invalid choice: 'always'" in capsys.readouterr().err


@pytest.mark.parametrize("start, message", [
    ("answer", "write SITE=TEXT"),
    ("nosuch=Be brief.", "--start nosuch: no such site on md_flat"),
])
def test_bad_start_instruction_exits_with_one_line_before_any_state(start, message, tmp_path):
    result = run(["--system", "md_flat", "--start", start], tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert nothing_written(tmp_path)
