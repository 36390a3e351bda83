"""The names of the files a loop run leaves: MLflow artifacts and the run's checkpoint.

One module, so the writer (``optloop.loop.tracking.sink``, ``optloop.loop.runs.runner``), the
readers (``optloop export``) and the tests name them the same way. These names are stored in
MLflow: renaming one is a data migration (see ``docs/architecture.md``, "Names that are stored").
"""

from __future__ import annotations

# --- the parent run (one per ``optloop.run``) -----------------------------------------------
PROMPTS_BEFORE = "prompts_before.json"
"""Every site's prompt text in the start program: ``{site: text}``."""
PROMPTS_AFTER = "prompts_after.json"
"""Every site's prompt text in the best program: ``{site: text}`` (what ``optloop export``
reads)."""
PROMPTS_DIFF = "prompts.diff"
"""A unified diff of the prompts that changed (also on each trial's child run)."""
BEST_CANDIDATE = "best_candidate.json"
"""The best :class:`~optloop.loop.candidate.Candidate`: every site's instructions and demos, the
knobs."""
ATTRIBUTION_REPORT = "attribution_report.json"
"""The baseline's attributions on train and dev and the blame that chose the targets."""
QUESTIONS_TEST = "questions_test.csv"
"""Every test question, before and after."""
SUMMARY = "summary.json"
"""The report's comparison: the start program, the trivial-instruction control and the best on dev
and test, each accuracy with its n and 95% CI, the paired differences on test, whether the best
beat the control, and the control's prompts (:mod:`optloop.loop.trivial_control`)."""
ACCURACY_PLOT = "accuracy_by_trial.png"
BLAME_PLOT = "blame_by_site.png"
PROGRAM = "program.json"
"""The best program as DSPy saves it (every site's module under its attribute name)."""

PARENT_ARTIFACTS = frozenset(
    {
        PROMPTS_BEFORE,
        PROMPTS_AFTER,
        PROMPTS_DIFF,
        BEST_CANDIDATE,
        ATTRIBUTION_REPORT,
        QUESTIONS_TEST,
        SUMMARY,
        ACCURACY_PLOT,
        BLAME_PLOT,
        PROGRAM,
    }
)

# --- a trial's child run --------------------------------------------------------------------
CANDIDATE = "candidate.json"
"""The trial's :class:`~optloop.loop.candidate.Candidate`."""
ATTRIBUTION = "attribution.json"
"""The trial's attributions on dev and their blame."""
QUESTIONS_DEV = "questions_dev.csv"
"""Every dev question of the trial."""

CHILD_ARTIFACTS = frozenset({CANDIDATE, PROMPTS_DIFF, ATTRIBUTION, QUESTIONS_DEV})

# --- the run's state directory --------------------------------------------------------------
CHECKPOINT = "checkpoint.json"
"""``<state>/runs/<run>/checkpoint.json``: what a resumed run starts from."""

__all__ = [
    "ACCURACY_PLOT",
    "ATTRIBUTION",
    "ATTRIBUTION_REPORT",
    "BEST_CANDIDATE",
    "BLAME_PLOT",
    "CANDIDATE",
    "CHECKPOINT",
    "CHILD_ARTIFACTS",
    "PARENT_ARTIFACTS",
    "PROGRAM",
    "PROMPTS_AFTER",
    "PROMPTS_BEFORE",
    "PROMPTS_DIFF",
    "QUESTIONS_DEV",
    "QUESTIONS_TEST",
    "SUMMARY",
]
