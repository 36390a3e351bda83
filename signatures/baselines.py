"""Prompt sites of the baseline memory systems (see :mod:`systems.baselines`).

Only ``md_flat`` has a prompt of its own: ``md_flat.curate`` rewrites the
markdown memory file after each session, as MEME's MD-flat agent does. MD-flat
is a baseline, not an installed library, so there is no library prompt to seed
from and no product to export back into: the text below is ours, and the site
uses DSPy's own layout (``layout="dspy"``, JSONAdapter) with the memory file
and the session transcript as two named inputs, so a tracer sees both as the
variables the curation consumed.
"""

from __future__ import annotations

import dspy


class CurateMarkdownMemory(dspy.Signature):
    """You keep a user's long-term memory as a flat markdown file: one fact per line. You are given the
    current memory file and a new conversation session. Return the complete updated list of facts:
    keep every fact from the file that is still true, add each new durable fact the session states
    about the user and the people, places, projects and things they mention (names, dates, numbers,
    relations), and when the session changes a fact, replace the old fact with the new value instead of
    keeping both. Remove a fact when the user says it was cancelled, deleted or is no longer true. Write
    each fact as one short self-contained sentence that names its subject. Do not invent facts and do
    not record small talk."""  # noqa: E501

    memory_file: str = dspy.InputField(
        desc="the current memory file, one '- fact' line each ('(empty)' at first)"
    )
    session: str = dspy.InputField(
        desc="the new session: its date, then one 'speaker: message' line per turn"
    )
    facts: list[str] = dspy.OutputField(
        desc="the full updated list of facts, one sentence each, without '- '"
    )
