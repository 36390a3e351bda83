"""Prompt sites of the ``tiered`` assistant memory (see :mod:`systems.tiered`).

``tiered.extract`` runs after every user message and answers a schema: a list of
:class:`ExtractedFact` objects (``key``, ``value``, ``category``), decoded under that
schema on the embedded model and sent as a JSON schema to an endpoint, so every answer
parses. ``tiered.summarize`` runs once at the end of a conversation and writes its
mid-term summary. ``tiered`` is optloop's own system, not an installed library, so the
texts below are ours, and both sites use DSPy's own layout (``layout="dspy"``,
JSONAdapter) with named inputs, so a tracer sees what each call consumed: the message,
the turns before it and the keys already known.

:data:`SITE_SIGNATURES` maps each site to its signature: the export's prompt pack
reads the fields (and the response schema) from it, so a product applies the same schema.
"""

from __future__ import annotations

from typing import Literal

import dspy
from pydantic import BaseModel, Field

from optloop.sites import TIERED_EXTRACT, TIERED_SUMMARIZE

Category = Literal[
    "pets",
    "family",
    "people",
    "work",
    "health",
    "travel",
    "home",
    "food",
    "finance",
    "schedule",
    "general",
]
"""The categories a fact can be filed under (``systems.tiered.keys.CATEGORIES`` and
``general``)."""

MAX_KEY_CHARS = 32
MAX_VALUE_CHARS = 48


class ExtractedFact(BaseModel):
    """One lasting fact about the user, as the extraction stage writes it."""

    key: str = Field(
        max_length=MAX_KEY_CHARS,
        description="short lowercase attribute name, words joined by "
        "underscores, e.g. sister_name",
    )
    value: str = Field(
        max_length=MAX_VALUE_CHARS, description="the detail itself, as the user wrote it"
    )
    category: Category = Field(description="what the fact is about")


class ExtractKeyValueFacts(dspy.Signature):
    """You keep the long-term memory of a personal assistant about its user. Read the user's newest
    message, with the turns just before it for context, and write down every lasting fact it states or
    clearly implies about the user and the people, pets, places, belongings, plans and preferences in
    their life. Write each fact as one object with a key, a value and a category. The key is a short
    lowercase name of the attribute with words joined by underscores, such as sister_name, home_city or
    gym_locker_number; the value is the detail itself (a name, number, date, place or thing), copied
    exactly as the user wrote it. Write one object per fact: a message that gives three facts needs three
    objects. When the message changes something already known, reuse that known key so the new value
    replaces the old one. Write an empty list for greetings, questions, requests and small talk, and never
    write a value the message does not give."""  # noqa: E501

    known_keys: str = dspy.InputField(
        desc="keys already in memory, comma-separated ('(none)' when empty)"
    )
    conversation: str = dspy.InputField(
        desc="the turns just before the message, one 'speaker: text' line each"
    )
    message: str = dspy.InputField(desc="the user's newest message")
    facts: list[ExtractedFact] = dspy.OutputField(
        desc="one object per fact; an empty list when there is none"
    )


class SummarizeConversation(dspy.Signature):
    """You keep the mid-term memory of a personal assistant. Summarize the conversation below, which has
    just ended, in two to four sentences written about the user in the third person ("The user ...").
    Keep what the user said about themselves, the people in their life, their plans, requests and
    decisions, and copy every name, number and date exactly. Leave out greetings and small talk, and
    add nothing that was not said."""  # noqa: E501

    conversation: str = dspy.InputField(
        desc="the conversation: its date, then one 'speaker: text' line per turn"
    )
    summary: str = dspy.OutputField(desc="two to four sentences")


SITE_SIGNATURES: dict[str, type[dspy.Signature]] = {
    TIERED_EXTRACT: ExtractKeyValueFacts,
    TIERED_SUMMARIZE: SummarizeConversation,
}
