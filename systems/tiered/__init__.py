"""``tiered``: a three-tier personal-assistant memory (short / mid / long term) in one SQLite file.

The pattern of a local personal assistant. Everything lives in ``<run_dir>/tiered.sqlite``
(:mod:`systems.tiered.store`):

**STM** (table ``stm``)
    the current conversation's turns. A new conversation (the next session) replaces
    them; until then they are the assistant's chat history, always put in context.
**MTM** (table ``mtm``)
    one summary per past conversation, written by the ``tiered.summarize`` site when the
    conversation ends, and time-limited: a summary expires ``MTM_TTL_DAYS`` after its
    conversation and is purged when a later conversation starts after that.
**LTM** (table ``ltm``)
    permanent user facts as key/value rows, each with its embedding (the project's
    embedder, MiniLM by default). The dedicated **extraction stage**, the
    ``tiered.extract`` site, runs after every user message and answers a schema, a list
    of ``{key, value, category}`` objects, decoded under it so every answer parses
    (:mod:`systems.tiered.extraction` reads it: keys normalized and known keys reused in
    code; items that store nothing kept in the ``extractions`` table with the reason, next
    to what the model wrote and what was stored).

Updates and forgetting are explicit:

- *Supersede*: a new value for a key already held becomes the live row; the old row
  stays as history (``status = 'superseded'``, ``superseded_by`` the new row). Several
  values for one key in a single answer are a list, not an update: they are stored
  together as one value.
- *Forget* (:mod:`systems.tiered.forgetting`): a deterministic rule, not the LM. A user
  message that starts as a request to forget, delete or erase something removes every
  LTM key that best matches what it names, with the key's history rows, and replaces the
  removed values, and any sentence that uses every word of the request, by
  ``[forgotten]`` in the STM turns and MTM summaries; the ``forgotten`` table keeps the
  request and the keys, never a value. Such a message is a command, so it is **not**
  sent to the extraction stage: a fact stated in the same message is lost (the path that
  skips extraction, which the graph shows as the turn's ``extraction`` status). A fact
  keyed ``forget`` from the extraction site is not obeyed: it is refused.

Retrieval (:mod:`systems.tiered.retrieval`) puts in context, in this order: the ``top_k``
LTM facts most similar to the question (at least ``threshold``), the ``mtm_summaries``
most recent conversation summaries, and the last ``stm_turns`` turns of the current
conversation. The ``search_recipe`` knob decides which facts and summaries may be searched
at all: ``similarity``, ``category`` or ``category:<name>``. Every fact's category is
fixed when it is stored: its key's words decide, else the category the model wrote
(:mod:`systems.tiered.keys`).

What attribution sees: every row that retrieval can return is a memory unit
(``all_memories``): ``ltm:<key>`` (a supersede is an update of that unit, a forget its
deletion), ``mtm:<session>`` and ``stm:<turn>``, each with its table, row and
provenance in ``metadata`` (an LTM unit also the keys as the model wrote them). STM
turns are context, not stored memory: they are left out of
:meth:`TieredSystem.retrievable_kinds`, so a fact that only the conversation held is
judged never stored (and the extraction site blamed) rather than deleted when the next
conversation replaced the turns.

Modules, one job each: :mod:`~systems.tiered.keys` (words, keys, categories),
:mod:`~systems.tiered.extraction` (the extraction stage's answer read),
:mod:`~systems.tiered.store` (the SQLite file), :mod:`~systems.tiered.forgetting`,
:mod:`~systems.tiered.retrieval` and :mod:`~systems.tiered.system` (the flow and the protocol).
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
