"""What a run says while it runs, as words: the line of a finished trial (:func:`trial_line`), of
an attributed episode (:func:`episode_line`), a span of time (:func:`duration`), and the log they
are kept in (:class:`RunLog`, the file :data:`LOG_NAME`). How a command shows them on a console (a
status line on a terminal, plain lines elsewhere) is :mod:`optloop.cli.status`'s.

The lines themselves (:func:`trial_line`, :func:`episode_line`) are built here, so the loop,
attribution and anything that projects the run's end (an ETA) say them the same way.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.console import RenderableType

from optloop.output import plain_text

LOG_NAME = "run.log"


class RunLog:
    """A run's ``run.log``: every line appended with the time it was written. The loop's session
    (:mod:`optloop.loop.runs.session`) keeps one for every run, whoever started it; ``optloop
    attribute`` keeps one beside its reports. Safe to call from several threads (an optimizer's
    threads report too)."""

    def __init__(self, path: Path):
        self.path = path
        self._held: list[str] = []  # lines waiting for the log's folder (see write)
        self._writing = threading.Lock()

    def write(self, message: str, *, create: bool = True) -> None:
        """Append ``message``, a stamp on each of its lines. Without ``create`` it waits (held, in
        order) for the log's folder to exist: what a run says before it has begun (which run, its
        dataset) must not leave a run folder behind a run refused at its start; it is written
        with the first line written with ``create``."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._writing:
            self._held += [f"{stamp} {line}\n" for line in message.split("\n")]
            if not create and not self.path.parent.is_dir():
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as out:
                out.writelines(self._held)
            self._held.clear()

    def show(self, renderable: RenderableType) -> None:
        """What stays on a console (a table, a line of the result), as plain text
        (:func:`~optloop.output.plain_text`), written once the log's folder exists."""
        self.write(plain_text(renderable).rstrip("\n"), create=False)


def duration(seconds: float, *, minutes_from: float = 90, hours_from: float = 5400) -> str:
    """``41 s``, ``18 min``, ``2.5 h``: a span in the unit that reads best, seconds below
    ``minutes_from`` seconds, hours from ``hours_from`` seconds, minutes between. A progress line
    keeps the defaults (``75 s``, ``80 min``); a projection
    (:func:`optloop.loop.spending.eta.projected`)
    moves to the next unit at a whole minute and a whole hour."""
    if seconds < minutes_from:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < hours_from else f"{seconds / 3600:.1f} h"


def trial_line(
    trial: int,
    budget: int,
    dev: float,
    best: float,
    seconds: float,
    eta_s: float | None = None,
    *,
    stopped: str | None = None,
) -> str:
    """``trial 3/50 dev 0.550 (best 0.650) 41 s, ETA 18 min``: one finished trial, its dev
    accuracy, the best so far, how long it took and, when known, how long the rest of the run
    should take. ``stopped``: why a race stopped its evaluation (``trial 4/50 dev 0.250 (best
    0.650) 12 s, stopped after 8/20 questions: ...``)."""
    line = f"trial {trial}/{budget} dev {dev:.3f} (best {best:.3f}) {duration(seconds)}"
    if stopped is not None:
        line = f"{line}, {stopped}"
    return line if eta_s is None else f"{line}, ETA {duration(eta_s)}"


def episode_line(
    done: int,
    total: int,
    episode: str,
    questions: int,
    correct: int,
    failures: int,
    eta_s: float | None = None,
) -> str:
    """``episode 3/40 recall-2: 4/6 correct so far, 2 failures attributed, ETA 2 min``: one
    attributed episode, what the episodes done so far add up to and, when known, how long the rest
    should take."""
    line = (
        f"episode {done}/{total} {episode}: {correct}/{questions} correct so far, "
        f"{failures} failure{'' if failures == 1 else 's'} attributed"
    )
    return line if eta_s is None else f"{line}, ETA {duration(eta_s)}"
