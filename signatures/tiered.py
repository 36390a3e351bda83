"""Prompt sites of the ``tiered`` assistant memory (see :mod:`systems.tiered`).

``tiered.extract`` runs after every user message and writes long-term facts as
``Key|Value`` lines; ``tiered.summarize`` runs once at the end of a conversation
and writes its mid-term summary. ``tiered`` is optloop's own system, not an
installed library, so the texts below are ours, and both sites use DSPy's own
layout (``layout="dspy"``, JSONAdapter) with named inputs, so a tracer sees what
each call consumed: the message, the turns before it and the keys already known.

:data:`SITE_SIGNATURES` maps each site to its signature: the export's prompt pack
reads the fields from it.
"""

from __future__ import annotations

import dspy

from optloop.sites import TIERED_EXTRACT, TIERED_SUMMARIZE


class ExtractKeyValueFacts(dspy.Signature):
    """You keep the long-term memory of a personal assistant about its user. Read the user's newest
    message, with the turns just before it for context, and write down every lasting fact it states or
    clearly implies about the user and the people, pets, places, belongings, plans and preferences in
    their life. Write each fact as one line in the form Key|Value. The key is a short lowercase name of
    the attribute with words joined by underscores, such as sister_name or home_city; the value is the
    detail itself (a name, number, date, place or thing), copied exactly as the user wrote it. Write one
    line per fact: a message that gives three facts needs three lines. When the message changes something
    already known, reuse that known key so the new value replaces the old one. Write nothing for
    greetings, questions, requests and small talk, and never write a value the message does not give."""

    known_keys: str = dspy.InputField(desc="keys already in memory, comma-separated ('(none)' when empty)")
    conversation: str = dspy.InputField(desc="the turns just before the message, one 'speaker: text' line each")
    message: str = dspy.InputField(desc="the user's newest message")
    facts: list[str] = dspy.OutputField(desc="one 'Key|Value' line per fact; an empty list when there is none")


class SummarizeConversation(dspy.Signature):
    """You keep the mid-term memory of a personal assistant. Summarize the conversation below, which has
    just ended, in two to four sentences written about the user in the third person ("The user ...").
    Keep what the user said about themselves, the people in their life, their plans, requests and
    decisions, and copy every name, number and date exactly. Leave out greetings and small talk, and
    add nothing that was not said."""

    conversation: str = dspy.InputField(desc="the conversation: its date, then one 'speaker: text' line per turn")
    summary: str = dspy.OutputField(desc="two to four sentences")


SITE_SIGNATURES: dict[str, type[dspy.Signature]] = {
    TIERED_EXTRACT: ExtractKeyValueFacts,
    TIERED_SUMMARIZE: SummarizeConversation,
}
