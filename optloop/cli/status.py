"""What a command says while it runs: a live status line on a terminal, plain lines anywhere else.

On a terminal the current stage is one status line that updates in place. Without one (output to a
file, a pipe, a CI log) every stage and every trial is one plain line on stderr, so a log shows
where a run is instead of nothing for the whole baseline. Given a log
(:class:`~optloop.progress.RunLog`, or its path) each line is also appended to it with the time,
and so is what the command prints to stay (:meth:`RunProgress.show`), as
:func:`optloop.output.plain_text` renders it: ``optloop attribute`` keeps its ``run.log`` beside
its reports this way, one line per episode (:func:`~optloop.progress.episode_line`).
``optloop run`` hands none: its run's session keeps the run's ``run.log``
(:mod:`optloop.loop.runs.session`), and this shows the session's events. The library below only
calls the callback it is handed; this is what the commands hand it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType
from rich.text import Text

from optloop.progress import RunLog, duration


class RunProgress:
    """The ``progress`` callback of a run: ``progress(message)`` shows a stage or a trial line.

    Use it inside :meth:`shown`; ``log`` (the run's ``run.log``) gets every line whether or not a
    terminal shows it.
    """

    def __init__(
        self, console: Console, log: Path | RunLog | None = None, *, live: bool | None = None
    ):
        self.console = console
        self.log = RunLog(log) if isinstance(log, Path) else log
        self.live = console.is_terminal if live is None else live
        self._status: Any = None
        self._started = time.monotonic()

    @contextmanager
    def shown(self, first: str = "starting") -> Iterator[RunProgress]:
        """Show the progress for the duration of the block (a status line on a terminal)."""
        if not self.live:
            yield self
            return
        with self.console.status(first) as status:
            self._status = status
            try:
                yield self
            finally:
                self._status = None

    def __call__(self, message: str) -> None:
        self._write_log(message)
        if self._status is not None:
            self._status.update(message)
        elif not self.live:
            elapsed = duration(time.monotonic() - self._started)
            self.console.print(
                f"[{elapsed}] {message}", markup=False, highlight=False, soft_wrap=True
            )

    def line(self, message: str) -> None:
        """A line that stays (a finished trial): printed above the status line on a terminal, as a
        plain line elsewhere, and written to the log either way."""
        self._write_log(message)
        prefix = "" if self.live else f"[{duration(time.monotonic() - self._started)}] "
        self.console.print(f"{prefix}{message}", markup=False, highlight=False, soft_wrap=True)

    def show(self, renderable: RenderableType) -> None:
        """What the command prints to stay (a table, a line of the result): on the console as it
        is, and in the log as plain text (:func:`~optloop.output.plain_text`), every line stamped
        with the time. A string is one plain line (no markup read)."""
        line = isinstance(renderable, str | Text)
        self.console.print(renderable, markup=False, highlight=False, soft_wrap=line)
        if self.log is not None:
            self.log.show(renderable)

    def _write_log(self, message: str, *, create: bool = True) -> None:
        """Append ``message`` to the log, if there is one (:meth:`RunLog.write`)."""
        if self.log is not None:
            self.log.write(message, create=create)
