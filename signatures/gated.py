"""The gated system's prompt site: ``gated.admit``, the LLM part of the admission gate.

``gated`` is optloop's own system (no library behind it), so the text below is ours and
the site uses DSPy's layout (``layout="dspy"``, JSONAdapter): the question, the scope it
is asked in and the candidates are three named inputs, and the output is one verdict per
candidate. The deterministic floors run before this call and after it
(:mod:`systems.gated`); the site sees only what the floors left open.
"""

from __future__ import annotations

from typing import Literal

import dspy
from pydantic import BaseModel

from optloop.sites import GATED_ADMIT

Verdict = Literal["admit", "negative", "reject"]


class GateVerdict(BaseModel):
    """One candidate's verdict, as the model writes it (``id`` is the candidate's number in the list)."""

    id: str
    verdict: Verdict
    reason: str


class AdmitMemories(dspy.Signature):
    """You decide which memories a software agent may rely on to answer a question. The agent works in one
    workspace (and path); each candidate memory shows where it was written, whether it is still active or was
    superseded by a later value, and whether the run that wrote it completed, failed or was rolled back. For
    every candidate give one verdict: "admit" if it is current, belongs to the agent's workspace and helps
    answer the question; "negative" if it records an attempt that did not work, which the agent should know
    to avoid but must not take as the answer; "reject" if it is stale, from another workspace or irrelevant.
    Give a short reason for each verdict."""  # noqa: E501

    question: str = dspy.InputField()
    scope: str = dspy.InputField(desc="the workspace and path the agent is working in")
    candidates: str = dspy.InputField(
        desc="one candidate per line: [id] (workspace, path, status, run outcome) text"
    )
    decisions: list[GateVerdict] = dspy.OutputField(desc="one verdict per candidate id")


SITE_SIGNATURES: dict[str, type[dspy.Signature]] = {GATED_ADMIT: AdmitMemories}
"""Site name -> signature, for every site the gated system adds to the shared ones."""
