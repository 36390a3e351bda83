"""What optloop's commands print without a terminal: a fixed width, and table titles never cut
mid-word."""

from __future__ import annotations

import io

import rich.table
from rich.console import Console

from optloop.output import PLAIN_WIDTH, Table, make_console, plain_text, plain_width

TITLE = (
    "rag_bm25 on synthetic:recall?seed=0&episodes=4: 3 failures of 8 questions, attributed "
    "(error type by site)"
)


def _narrow(cls: type[rich.table.Table]) -> rich.table.Table:
    """A two-column table far narrower than its title (the attribute table's shape)."""
    table = cls(title=TITLE)
    table.add_column("site / knob")
    table.add_column("ResponseError", justify="right")
    table.add_row("answer", "3")
    return table


def test_rich_alone_cuts_a_long_title_to_the_table_width():
    """What the table titles looked like in a log: wrapped to the table's 31 columns."""
    text = plain_text(_narrow(rich.table.Table))
    assert TITLE not in text.splitlines() and "synthetic:recall?seed=0&episodes=4" not in text


def test_without_a_terminal_a_long_title_is_one_plain_line_above_the_table():
    lines = plain_text(_narrow(Table), width=120).splitlines()
    assert lines[0] == TITLE  # whole, left aligned, no padding
    assert lines[1].startswith("┏") and lines[3].startswith("┡")
    assert all(len(line) <= 120 for line in lines) and "\x1b" not in "".join(lines)


def test_a_title_longer_than_the_width_wraps_at_spaces_only():
    lines = plain_text(_narrow(Table), width=60).splitlines()
    words = [w for line in lines[:3] for w in line.split()]
    assert " ".join(words[: len(TITLE.split())]) == TITLE and all(len(x) <= 60 for x in lines)


def test_on_a_terminal_a_title_that_fits_stays_centred_and_a_long_one_goes_above():
    out = io.StringIO()
    terminal = Console(file=out, force_terminal=True, width=160, color_system=None)
    short = Table(title="checks")
    short.add_column("a fairly long column")
    short.add_row("x")
    terminal.print(short)
    terminal.print(_narrow(Table))
    lines = out.getvalue().splitlines()
    assert lines[0].strip() == "checks" and lines[0].startswith(" ")  # rich's own title
    assert TITLE in lines


def test_without_a_terminal_the_width_is_columns_else_120(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert plain_width() == PLAIN_WIDTH == 120
    assert make_console().width == 120  # stdout is captured: not a terminal
    monkeypatch.setenv("COLUMNS", "200")
    assert make_console(stderr=True).width == 200
    assert plain_width({"COLUMNS": "wide"}) == plain_width({"COLUMNS": "0"}) == 120


def test_a_plain_line_is_kept_whole_and_its_markup_unread():
    line = "dataset jsonl:[data]/x.jsonl: " + "word " * 40
    assert plain_text(line, width=40) == line + "\n"
