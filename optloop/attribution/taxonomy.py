"""The error taxonomy and the attribution record.

Types follow MemTrace (the operation that failed); each maps to MemFail's
failure label (what the user sees), so reports speak both languages.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field


class ErrorType(str, Enum):
    EXTRACTION = "ExtractionError"  # the evidence never became a memory
    UPDATE = "UpdateError"  # a memory that carried it was rewritten without it
    DELETION = "DeletionError"  # a memory that carried it was removed
    RETRIEVAL = "RetrievalError"  # stored, but not among the memories the answer saw
    RESPONSE = "ResponseError"  # the answer saw it and still got it wrong
    # a stale, dead-branch or other-workspace fact was retrieved or admitted into the answer's
    # positive context, and the answer used it
    CONTAMINATION = "ContaminationError"
    UNKNOWN = "Unattributed"  # no evidence to follow (abstention, or nothing matched)


MEMFAIL_LABEL: dict[ErrorType, str] = {
    ErrorType.EXTRACTION: "not_stored",
    ErrorType.UPDATE: "summary_error",
    ErrorType.DELETION: "summary_error",
    ErrorType.RETRIEVAL: "not_retrieved",
    ErrorType.RESPONSE: "reasoning_error",
    ErrorType.CONTAMINATION: "stale_context",  # MemFail has no label of its own for it
    ErrorType.UNKNOWN: "unknown",
}

KNOB_PREFIX = "knob:"
LIBRARY_PREFIX = "library:"

TargetKind = Literal["site", "knob", "library"]
_PREFIXES: dict[str, str] = {"knob": KNOB_PREFIX, "library": LIBRARY_PREFIX}


@dataclass(frozen=True)
class Target:
    """What a failure is blamed on, and so what could fix it.

    ``kind`` is ``site`` (a prompt site an optimizer can rewrite: ``answer``, ``mem0.extract``),
    ``knob`` (a non-LLM parameter: ``top_k``) or ``library`` (a step of the library no prompt
    decides: ``mem0.store``). Its string form (``str(target)``, read back by :meth:`parse`) is what
    attributions, reports, checkpoints and MLflow carry: ``answer``, ``knob:top_k``,
    ``library:mem0.store``.
    """

    kind: TargetKind
    name: str

    @classmethod
    def site(cls, name: str) -> Target:
        return cls("site", name)

    @classmethod
    def knob(cls, name: str) -> Target:
        return cls("knob", name)

    @classmethod
    def library(cls, step: str) -> Target:
        return cls("library", step)

    @classmethod
    def parse(cls, text: str) -> Target:
        """The target whose string form is ``text``."""
        for kind, prefix in _PREFIXES.items():
            if text.startswith(prefix):
                return cls(kind, text[len(prefix) :])  # type: ignore[arg-type]
        return cls("site", text)

    @property
    def is_prompt_site(self) -> bool:
        """Whether an optimizer can fix this target by rewriting a prompt."""
        return self.kind == "site"

    def __str__(self) -> str:
        return _PREFIXES.get(self.kind, "") + self.name


def knob_target(name: str) -> str:
    """Blame target for a non-LLM parameter: ``knob:top_k``."""
    return str(Target.knob(name))


def library_target(step: str) -> str:
    """Blame target for a step of the library no prompt decides: ``library:mem0.store``."""
    return str(Target.library(step))


def is_knob(target: str | None) -> bool:
    return bool(target) and Target.parse(str(target)).kind == "knob"


def is_prompt_site(target: str | None) -> bool:
    """Whether an optimizer can fix ``target`` by rewriting a prompt."""
    return bool(target) and Target.parse(str(target)).is_prompt_site


class Attribution(BaseModel):
    """Why one question failed: the decisive operation, its type, what to fix."""

    question_id: str
    question: str = ""
    gold: str = ""
    prediction: str = ""
    error_type: ErrorType
    op_id: str | None = None
    target: str | None = Field(None, description="the prompt site to fix, or knob:<name>")
    explanation: str = ""
    evidence_ids: list[str] = Field(
        default_factory=list, description="message variable ids of the evidence"
    )
    evidence_source: str = Field("", description="dataset | search | none")
    ambiguous: bool = False
    judge_calls: dict[str, int] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)

    @property
    def blamed(self) -> Target | None:
        """``target`` as a :class:`Target` (``None`` when no target was found)."""
        return None if self.target is None else Target.parse(self.target)

    @property
    def memfail_label(self) -> str:
        return MEMFAIL_LABEL[self.error_type]

    def to_annotation(self) -> dict[str, Any]:
        """The MemTraceBench annotation record of this attribution."""
        return {
            "query_id": self.question_id,
            "query": self.question,
            "golden_answers": [self.gold],
            "prediction": self.prediction,
            "source_evidence_ids": list(self.evidence_ids),
            "final_error_type": self.error_type.value,
            "final_op_id": self.op_id,
            "site": self.target,
            "explanation": self.explanation,
            "memfail_label": self.memfail_label,
        }
