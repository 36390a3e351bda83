"""Find the gold evidence of a question among the messages of a graph.

The dataset's evidence turn ids when it gives them; otherwise a hybrid search
over the raw messages with the question plus the gold answer: BM25 and
embedding rankings fused by reciprocal rank (k=60, as in Cormack et al.).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from rank_bm25 import BM25Okapi

from optloop.datasets.scorers import normalize_answer
from optloop.text import words

if TYPE_CHECKING:
    from optloop.datasets import Question
    from optloop.embed import Embedder
    from optloop.tracing.graph import ExecutionGraph

RRF_K = 60
UNINFORMATIVE = {"yes", "no", "unknown", "none", "true", "false", "i dont know", "not mentioned"}


@dataclass
class Evidence:
    """What a memory must carry for the question to be answerable."""

    message_ids: list[str]  # message variable ids
    texts: list[str]
    answer: str  # the gold answer as text (a multiple-choice letter resolved to its option)
    source: str  # dataset | search | none
    sessions: list[str] = field(default_factory=list)

    @property
    def answer_is_informative(self) -> bool:
        norm = normalize_answer(self.answer)
        return bool(norm) and norm not in UNINFORMATIVE and len(norm) > 1


def gold_text(question: Question) -> str:
    if question.scorer == "multiple_choice" and question.options:
        index = ord(question.gold.strip().upper()[:1] or "A") - ord("A")
        if 0 <= index < len(question.options):
            return question.options[index]
    return question.gold


def hybrid_search(
    graph: ExecutionGraph, query: str, embedder: Embedder | None, k: int = 2
) -> list[str]:
    """Message variable ids ranked by BM25 + embedding, fused by reciprocal rank."""
    messages = graph.by_cls("message")
    if not messages:
        return []
    ids = [m.id for m in messages]
    corpus = [words(m.text) or ["_"] for m in messages]
    bm25 = BM25Okapi(corpus).get_scores(words(query) or ["_"])
    rankings = [list(np.argsort(-bm25, kind="stable"))]
    if embedder is not None:
        vectors = embedder.embed([m.text for m in messages])
        rankings.append(list(np.argsort(-(vectors @ embedder.embed_one(query)), kind="stable")))
    fused = np.zeros(len(ids))
    for ranking in rankings:
        for rank, index in enumerate(ranking):
            fused[index] += 1.0 / (RRF_K + rank + 1)
    return [ids[i] for i in np.argsort(-fused, kind="stable")[:k]]


def find_evidence(
    graph: ExecutionGraph, question: Question, embedder: Embedder | None = None
) -> Evidence:
    answer = gold_text(question)
    ids = [f"message:{t}@0" for t in question.evidence_ids if f"message:{t}@0" in graph.variables]
    source = "dataset" if ids else "none"
    if not ids and not question.abstain:
        ids = hybrid_search(graph, f"{question.question} {answer}", embedder)
        source = "search" if ids else "none"
    variables = [graph.variables[i] for i in ids]
    return Evidence(
        message_ids=ids,
        texts=[v.text for v in variables],
        answer=answer,
        source=source,
        sessions=list(dict.fromkeys(v.session_id for v in variables if v.session_id)),
    )
