"""What a run says while it runs, as words: the line of a finished trial (:func:`trial_line`), of
an attributed episode (:func:`episode_line`), a span of time (:func:`duration`) and the name of
the log a command keeps them in (:data:`LOG_NAME`). How a command shows them (a status line on a
terminal, plain lines elsewhere, the ``run.log``) is :mod:`optloop.cli.status`'s.

The lines themselves (:func:`trial_line`, :func:`episode_line`) are built here, so the loop,
attribution and anything that projects the run's end (an ETA) say them the same way.
"""

from __future__ import annotations

LOG_NAME = "run.log"


def duration(seconds: float, *, minutes_from: float = 90, hours_from: float = 5400) -> str:
    """``41 s``, ``18 min``, ``2.5 h``: a span in the unit that reads best, seconds below
    ``minutes_from`` seconds, hours from ``hours_from`` seconds, minutes between. A progress line
    keeps the defaults (``75 s``, ``80 min``); a projection
    (:func:`optloop.loop.budget.eta.projected`)
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
