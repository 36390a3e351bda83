"""Prompt-site names, as constants.

A site's name is a plain string wherever it is stored (candidates, checkpoints, blame
targets, MLflow metrics, registry names:
:func:`optloop.loop.tracking.prompt_registry.registry_name`), so these values never change. Every
system has :data:`ANSWER` and may add :data:`QUERY_REWRITE` (``systems/base.py``); the library
sites below are the ones optloop's own code names (the fault catalogue, export); graphiti's are
generated from graphiti's prompt library (``systems/graphiti_system.py``). :data:`PROPOSER` is no
system's site: every call an optimizer makes to write or edit a prompt is charged to it.
How sites, blame targets and the loop fit together: ``docs/architecture.md``.
"""

from __future__ import annotations

ANSWER = "answer"
"""Every system's answer call: the question and the retrieved memories in, the answer out."""

QUERY_REWRITE = "retrieve.query"
"""The optional query rewrite before retrieval (``query_site=True``)."""

SHARED_SITES = (ANSWER, QUERY_REWRITE)
"""Sites every system can have (their registry names get the system: ``optloop.mem0.answer``)."""

MEM0_EXTRACT = "mem0.extract"
MEM0_RERANK = "mem0.rerank"
MD_FLAT_CURATE = "md_flat.curate"
GRAPHITI_EXTRACT_EDGES = "graphiti.extract_edges.edge"
TIERED_EXTRACT = "tiered.extract"
"""tiered's extraction stage: one call after every user message, ``Key|Value`` lines into long-term
memory."""
TIERED_SUMMARIZE = "tiered.summarize"
"""tiered's end-of-session summary: one call per conversation, written to mid-term memory."""
GATED_ADMIT = "gated.admit"
"""The gated system's admission gate: which retrieved memories enter the answer prompt
(``systems/gated.py``)."""

PROPOSER = "optimizer.proposer"
"""Not a system's site: the LLM calls optimizers make to write or edit prompts are charged here."""

__all__ = [
    "ANSWER",
    "GATED_ADMIT",
    "GRAPHITI_EXTRACT_EDGES",
    "MD_FLAT_CURATE",
    "MEM0_EXTRACT",
    "MEM0_RERANK",
    "PROPOSER",
    "QUERY_REWRITE",
    "SHARED_SITES",
    "TIERED_EXTRACT",
    "TIERED_SUMMARIZE",
]
