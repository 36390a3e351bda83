"""How optloop's commands print: a console sized for where its output goes, tables whose titles
never wrap mid-word, and the plain text a log file keeps of them.

On a terminal rich follows the terminal's width. Anywhere else (a file, a pipe, a CI log) rich
would take the width of whatever terminal it finds on another stream, else 80 columns, so the
same command would print differently from one shell to the next: :func:`make_console` fixes it
at :func:`plain_width`, ``$COLUMNS`` when set, else :data:`PLAIN_WIDTH` (120), and a log file's
copy (:func:`plain_text`) is rendered at the same width.

rich wraps a table's title to the table's own width, so a narrow table (two short columns) cuts
a long title mid-word, ``synthetic:recal`` / ``l?seed=0&episod``. :class:`Table` prints its title
as a line of its own above the table instead: always without a terminal (a plain line, left
aligned, wrapped only at spaces and only at the console's width), and on a terminal when the
title is wider than the table (a title that fits stays centred above it, as rich draws it).
"""

from __future__ import annotations

import copy
import io
import os
import sys
from collections.abc import Mapping
from typing import IO

import rich.table
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

PLAIN_WIDTH = 120
"""Columns of output that is not a terminal when ``$COLUMNS`` does not say: room for a table of
figures and a title with a dataset URI on one line."""


def plain_width(environ: Mapping[str, str] = os.environ) -> int:
    """The width of output that is not a terminal: ``$COLUMNS`` when it is a positive whole
    number, else :data:`PLAIN_WIDTH`."""
    columns = environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PLAIN_WIDTH


def is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal (a stream that cannot say is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a stream without isatty, or one already closed
        return False


def make_console(*, stderr: bool = False) -> Console:
    """A command's console on stdout (``stderr``: on stderr): the terminal's width on a terminal,
    :func:`plain_width` anywhere else."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if is_terminal(stream) else plain_width())


def plain_text(renderable: RenderableType, width: int | None = None) -> str:
    """``renderable`` as a log file keeps it: no colour, no terminal codes, at ``width`` (default
    :func:`plain_width`); a string or a :class:`~rich.text.Text` as written (not wrapped, no
    markup read), a table as :class:`Table` prints it without a terminal."""
    out = io.StringIO()
    console = Console(
        file=out,
        width=width or plain_width(),
        force_terminal=False,
        color_system=None,
        highlight=False,
    )
    line = isinstance(renderable, str | Text)
    console.print(renderable, markup=False, soft_wrap=line)
    return out.getvalue()


class Table(rich.table.Table):
    """A :class:`rich.table.Table` whose title is never cut mid-word (see the module docstring):
    without a terminal, or when it is wider than the table, it is printed as a line of its own
    above the table."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        title = self.title
        if not title or (console.is_terminal and self._title_fits(console, options, title)):
            yield from super().__rich_console__(console, options)
            return
        heading = (
            console.render_str(
                title, style=Style.pick_first(self.title_style, "table.title"), highlight=False
            )
            if isinstance(title, str)
            else title.copy()
        )
        heading.justify = "default"  # left, and no spaces padding it to the width
        yield heading
        untitled = copy.copy(self)  # the same columns and rows, drawn without the title
        untitled.title = None
        yield untitled

    def _title_fits(self, console: Console, options: ConsoleOptions, title: str | Text) -> bool:
        """Whether the title fits on one line of the table's width (what rich wraps it to)."""
        width = min(Measurement.get(console, options, self).maximum, options.max_width)
        length = Text.from_markup(title).cell_len if isinstance(title, str) else title.cell_len
        return length <= width
