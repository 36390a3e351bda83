"""``tiered``: a three-tier personal-assistant memory (short / mid / long term) in one SQLite file.

The pattern of a local personal assistant, all in ``<run_dir>/tiered.sqlite``: **STM** (the
current conversation's turns, replaced when the next one starts), **MTM** (one summary per past
conversation, written by the ``tiered.summarize`` site, expiring ``MTM_TTL_DAYS`` after it) and
**LTM** (permanent user facts as key/value rows with embeddings, written by the ``tiered.extract``
site after every user message, which answers a list of ``{key, value, category}`` objects under a
schema). A new value for a held key supersedes the old row, which stays as history; a request to
forget is a deterministic rule, not the LM. Retrieval puts in context the most similar LTM facts,
the latest MTM summaries and the last STM turns; every row it can return is a memory unit in the
execution graph.

Modules, one job each: :mod:`~systems.tiered.keys` (words, keys, categories),
:mod:`~systems.tiered.extraction` (the extraction stage's answer read),
:mod:`~systems.tiered.store` (the SQLite file), :mod:`~systems.tiered.forgetting`,
:mod:`~systems.tiered.retrieval` and :mod:`~systems.tiered.system` (the flow and the protocol).
The guide, with what the trace shows, is ``docs/tiered.md``.
"""

from __future__ import annotations

from systems.tiered.extraction import Fact, ParsedExtraction, Refused, parse_facts
from systems.tiered.forgetting import (
    FORGOTTEN,
    forget,
    forget_request,
    match_keys,
    redact,
    subject_words,
)
from systems.tiered.keys import CATEGORIES, GENERAL, category_of, known_key, slug, words
from systems.tiered.retrieval import allowed_categories, conversation, recent_summaries
from systems.tiered.store import (
    DB_FILE,
    MTM_TTL_DAYS,
    SCHEMA_VERSION,
    LtmFact,
    MtmSummary,
    StmTurn,
    TieredStore,
)
from systems.tiered.system import TieredSystem

__all__ = [
    "CATEGORIES",
    "DB_FILE",
    "FORGOTTEN",
    "GENERAL",
    "MTM_TTL_DAYS",
    "SCHEMA_VERSION",
    "Fact",
    "LtmFact",
    "MtmSummary",
    "ParsedExtraction",
    "Refused",
    "StmTurn",
    "TieredStore",
    "TieredSystem",
    "allowed_categories",
    "category_of",
    "conversation",
    "forget",
    "forget_request",
    "known_key",
    "match_keys",
    "parse_facts",
    "recent_summaries",
    "redact",
    "slug",
    "subject_words",
    "words",
]
