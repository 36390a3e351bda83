"""Which run ``python -m optloop.run`` works on (:func:`~optloop.loop.runs.resume.choose_run`, the
library's rule, re-exported) and the command that resumes it (:func:`resume_command`)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from optloop.loop.runs.resume import Asked, Choice, choose_run, saved_line

__all__ = ["Asked", "Choice", "choose_run", "resume_command", "saved_line"]


def resume_command(argv: Sequence[str]) -> str:
    """The command that resumes this run: the same one, without ``--new``."""
    return shlex.join(["python", "-m", "optloop.run", *(a for a in argv if a != "--new")])
