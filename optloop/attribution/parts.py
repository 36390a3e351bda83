"""Questions whose evidence has several parts: walk each part, keep the earliest failure.

A question's ``meta["evidence_parts"]`` (``turn_id``, ``entity``, ``value``, ``kind``;
the published-MEME loader fills it) names what the answer needs: each value of a list
answer, the change of a cascade's root, the retraction of a deleted fact. The
decisive walk (:func:`optloop.attribution.decisive.attribute`) follows one piece of
evidence, so :func:`attribute_parts` runs it once per part, as a question whose gold
is the part's value and whose evidence is the part's turn, and keeps the verdict
earliest in data flow (extraction, then update/deletion, then retrieval, then
response; the first part on a tie).

A part whose value the answer already states did not break and is skipped, unless
that leaves nothing to walk. A retraction part is judged by :class:`RetractionJudge`
(a line that names the deleted value or entity *and* says it was deleted); the other
parts by optloop's deterministic chain: the lexical judge, then (given an embedder)
the embedding judge for what the lexical one leaves undecided. Without an embedder an
undecided text counts as not carrying the evidence. No LLM. Without parts the plain
walk runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optloop.attribution.decisive import attribute
from optloop.attribution.evidence import Evidence
from optloop.attribution.judges import (
    EmbeddingJudge,
    Judge,
    JudgeChain,
    LexicalJudge,
    content_tokens,
)
from optloop.attribution.taxonomy import Attribution, ErrorType
from optloop.datasets._model import EvidencePart
from optloop.datasets.scorers import normalize_answer

if TYPE_CHECKING:
    from optloop.datasets import Question
    from optloop.embed import Embedder
    from optloop.tracing.graph import ExecutionGraph

STAGE_RANK: dict[ErrorType, int] = {
    ErrorType.EXTRACTION: 0,
    ErrorType.UPDATE: 1,
    ErrorType.DELETION: 1,
    ErrorType.RETRIEVAL: 2,
    ErrorType.CONTAMINATION: 2,
    ErrorType.RESPONSE: 3,
    ErrorType.UNKNOWN: 4,
}
# share of a value's content words the answer must hold to state it (the lexical judge's bar)
STATED = 0.6
_RETRACTED = re.compile(
    r"\b(delete|deleted|deletes|deleting|deletion|remove|removed|removes|removing|removal|"
    r"forget|forgot|forgotten|erase|erased|discard|discarded|retract|retracted|no longer)\b"
)


Part = EvidencePart  # the name this module's callers use


def question_parts(question: Question) -> list[Part]:
    """The parts named in ``question.meta["evidence_parts"]`` (none when absent)."""
    raw = question.meta.get("evidence_parts") or []
    return [
        Part(
            str(p["turn_id"]),
            str(p.get("entity", "")),
            str(p.get("value", "")),
            str(p.get("kind", "fact")),
        )
        for p in raw
    ]


class RetractionJudge:
    """A text carries a retraction when one of its lines names the value or entity and says it was
    deleted."""

    name = "retraction"

    def __init__(self, entity: str, recall: float = STATED):
        self.entity = content_tokens(entity.replace("_", " "))
        self.recall = recall

    def carries(self, texts: Sequence[str], evidence: Evidence) -> list[bool | None]:
        refs = [r for r in (content_tokens(evidence.answer), self.entity) if r]
        return [any(self._line(line, refs) for line in text.splitlines()) for text in texts]

    def _line(self, line: str, refs: list[set[str]]) -> bool:
        if not _RETRACTED.search(normalize_answer(line)):
            return False
        tokens = content_tokens(line)
        return any(len(ref & tokens) / len(ref) >= self.recall for ref in refs)


def states(prediction: str, value: str) -> bool:
    """Whether the answer already states ``value`` (most of its content words)."""
    wanted = content_tokens(value)
    return bool(wanted) and len(wanted & content_tokens(prediction)) / len(wanted) >= STATED


def fact_judges(embedder: Embedder | None = None) -> JudgeChain:
    """optloop's deterministic chain: lexical, then embedding (when there is an embedder)."""
    judges: list[Judge] = [LexicalJudge()]
    if embedder is not None:
        judges.append(EmbeddingJudge(embedder))
    return JudgeChain(judges)


def judges_for(part: Part, embedder: Embedder | None = None) -> JudgeChain:
    return (
        JudgeChain([RetractionJudge(part.entity)])
        if part.kind == "retraction"
        else fact_judges(embedder)
    )


def parts_to_walk(parts: Sequence[Part], prediction: str) -> tuple[list[Part], list[Part]]:
    """(parts to walk, parts skipped because the answer states them)."""
    stated = [p for p in parts if p.kind == "fact" and states(prediction, p.value)]
    walk = [p for p in parts if p not in stated]
    return (walk, stated) if walk else (list(parts), [])


def _part_question(question: Question, part: Part) -> Question:
    return question.model_copy(
        update={
            "gold": part.value,
            "evidence_ids": [part.turn_id],
            "abstain": False,
            "scorer": "contains",
            "forbidden": [],
        }
    )


def attribute_parts(
    graph: ExecutionGraph, question: Question, prediction: str, embedder: Embedder | None = None
) -> Attribution:
    """The decisive error of a failed question, part by part (the plain walk when it has none)."""
    parts = question_parts(question)
    if not parts:
        return attribute(graph, question, prediction, fact_judges(embedder), embedder=embedder)
    walk, skipped = parts_to_walk(parts, prediction)
    verdicts = [
        (
            part,
            attribute(
                graph,
                _part_question(question, part),
                prediction,
                judges_for(part, embedder),
                embedder=embedder,
            ),
        )
        for part in walk
    ]
    part, decisive = min(verdicts, key=lambda pv: STAGE_RANK[pv[1].error_type])
    calls: dict[str, int] = {}
    for _, verdict in verdicts:
        for name, n in verdict.judge_calls.items():
            calls[name] = calls.get(name, 0) + n
    details: dict[str, Any] = {
        **decisive.details,
        "part": part.label,
        "parts": [
            {"part": p.label, "error_type": v.error_type.value, "op_id": v.op_id}
            for p, v in verdicts
        ],
        "skipped": [p.label for p in skipped],
    }
    return decisive.model_copy(
        update={
            "question_id": question.id,
            "question": question.question,
            "gold": question.gold,
            "explanation": f"[{part.label}] {decisive.explanation}",
            "judge_calls": calls,
            "details": details,
        }
    )


__all__ = [
    "Part",
    "RetractionJudge",
    "STAGE_RANK",
    "attribute_parts",
    "fact_judges",
    "parts_to_walk",
    "question_parts",
    "states",
]
