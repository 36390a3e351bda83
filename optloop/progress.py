"""What a run says while it runs: a live status line on a terminal, plain lines anywhere else.

On a terminal the current stage is one status line that updates in place. Without one (output to a
file, a pipe, a CI log) every stage and every trial is one plain line on stderr, so a log shows
where a run is instead of nothing for the whole baseline. Either way each line is appended, with
the time, to the run's ``run.log`` (:data:`LOG_NAME`, in the run's directory).

The lines themselves (:func:`trial_line`) are built here, so the loop and anything that projects
the run's end (an ETA) say them the same way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

LOG_NAME = "run.log"


def duration(seconds: float, *, minutes_from: float = 90, hours_from: float = 5400) -> str:
    """``41 s``, ``18 min``, ``2.5 h``: a span in the unit that reads best, seconds below
    ``minutes_from`` seconds, hours from ``hours_from`` seconds, minutes between. A progress line
    keeps the defaults (``75 s``, ``80 min``); a projection (:func:`optloop.loop.eta.projected`)
    moves to the next unit at a whole minute and a whole hour."""
    if seconds < minutes_from:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < hours_from else f"{seconds / 3600:.1f} h"


def trial_line(
    trial: int, budget: int, dev: float, best: float, seconds: float, eta_s: float | None = None
) -> str:
    """``trial 3/50 dev 0.550 (best 0.650) 41 s, ETA 18 min``: one finished trial, its dev
    accuracy, the best so far, how long it took and, when known, how long the rest of the run
    should take."""
    line = f"trial {trial}/{budget} dev {dev:.3f} (best {best:.3f}) {duration(seconds)}"
    return line if eta_s is None else f"{line}, ETA {duration(eta_s)}"


class RunProgress:
    """The ``progress`` callback of a run: ``progress(message)`` shows a stage or a trial line.

    Use it inside :meth:`shown`; ``log`` (the run's ``run.log``) gets every line whether or not a
    terminal shows it.
    """

    def __init__(self, console: Console, log: Path | None = None, *, live: bool | None = None):
        self.console = console
        self.log = log
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

    def _write_log(self, message: str) -> None:
        if self.log is None:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a", encoding="utf-8") as out:
            out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
