"""Judges: does a variable's text still carry the evidence?

Cheap first. :class:`LexicalJudge` decides most cases (the gold answer's words
are in the text, or the evidence message's content words are); it abstains
(``None``) when neither gives a clear signal. :class:`EmbeddingJudge` decides
by cosine similarity to the evidence. :class:`LLMJudge` asks an LM and is only
used when asked for (the deterministic pass makes no LLM call).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import dspy

from optloop.attribution.evidence import Evidence
from optloop.text import singular, words

if TYPE_CHECKING:
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM

STOPWORDS = frozenset(
    """a an the i me my we our you your he she it its they them their is am are was were be been
being do does did have has had of to in on at for with from by about as and or but not no so that
this these those what which who whom when where why how user assistant s t just also very really
now then there here into out up over after before again any all some can could will would should
may might must shall""".split()
)


def content_tokens(text: str) -> set[str]:
    return {singular(t) for t in words(text) if t not in STOPWORDS}


class Judge(Protocol):
    name: str

    def carries(self, texts: Sequence[str], evidence: Evidence) -> list[bool | None]: ...


class LexicalJudge:
    """Gold-answer words plus the evidence's context words; else the evidence's words alone.

    A text carries the evidence when it holds the gold answer's content words
    *and* some of the evidence's other words ("User's sister is Lena" carries
    "My sister is called Lena"; "Lena has a cat" does not). Without an
    informative answer (yes/no, a choice letter) it needs half of the
    evidence's content words. In between it abstains.
    """

    name = "lexical"

    def __init__(
        self,
        answer_recall: float = 0.6,
        context_recall: float = 0.2,
        evidence_recall: float = 0.5,
        undecided_below: float = 0.25,
    ):
        self.answer_recall = answer_recall
        self.context_recall = context_recall
        self.evidence_recall = evidence_recall
        self.undecided_below = undecided_below

    def carries(self, texts: Sequence[str], evidence: Evidence) -> list[bool | None]:
        answer = content_tokens(evidence.answer) if evidence.answer_is_informative else set()
        key = (
            set().union(*(content_tokens(t.split(":", 1)[-1]) for t in evidence.texts))
            if evidence.texts
            else set()
        )
        context = key - answer
        out: list[bool | None] = []
        for text in texts:
            tokens = content_tokens(text)
            if answer:
                if len(answer & tokens) / len(answer) < self.answer_recall:
                    out.append(False)
                elif len(context) < 2:
                    out.append(True)
                else:
                    ratio = len(context & tokens) / len(context)
                    out.append(
                        True if ratio >= self.context_recall else False if ratio == 0 else None
                    )
            elif key:
                recall = len(key & tokens) / len(key)
                out.append(
                    True
                    if recall >= self.evidence_recall
                    else False
                    if recall < self.undecided_below
                    else None
                )
            else:
                out.append(None)
        return out


class EmbeddingJudge:
    """Cosine similarity to the evidence messages (and answer) above a threshold."""

    name = "embedding"

    def __init__(self, embedder: Embedder, threshold: float = 0.55):
        self.embedder = embedder
        self.threshold = threshold

    def carries(self, texts: Sequence[str], evidence: Evidence) -> list[bool | None]:
        refs = (
            [*evidence.texts, evidence.answer]
            if evidence.answer_is_informative
            else list(evidence.texts)
        )
        if not refs or not texts:
            return [None] * len(texts)
        sims = self.embedder.embed(list(texts)) @ self.embedder.embed(refs).T
        return [bool(row.max() >= self.threshold) for row in sims]


class CarriesEvidence(dspy.Signature):
    """Decide whether the memory text contains the information in the evidence (the gold answer's fact)."""

    evidence: str = dspy.InputField()
    gold_answer: str = dspy.InputField()
    memory: str = dspy.InputField()
    contains: bool = dspy.OutputField()


class LLMJudge:
    """Asks an LM; the most expensive judge, used last and only when configured."""

    name = "llm"

    def __init__(self, lm: OptloopLM):
        self.lm = lm
        self.predict = dspy.Predict(CarriesEvidence)

    def carries(self, texts: Sequence[str], evidence: Evidence) -> list[bool | None]:
        from optloop.lm import prompt_site

        out: list[bool | None] = []
        with prompt_site("judge"), dspy.context(lm=self.lm, adapter=dspy.JSONAdapter()):
            for text in texts:
                out.append(
                    bool(
                        self.predict(
                            evidence="\n".join(evidence.texts),
                            gold_answer=evidence.answer,
                            memory=text,
                        ).contains
                    )
                )
        return out


class JudgeChain:
    """Asks each judge in turn for the texts the previous ones left undecided.

    ``calls`` counts, per judge, the texts it was asked about. One attribution judges on a
    :meth:`session` of the evaluator's chain: its own verdict cache and counts (its
    ``Attribution.judge_calls``), added to the chain's own. So an attribution's figures never
    depend on what other attributions judged before it or beside it (they run at once at
    ``--concurrency`` > 1):
    the verdict cache is keyed by the question's evidence, which another question seldom shares.
    """

    def __init__(self, judges: Sequence[Judge], *, parent: JudgeChain | None = None):
        self.judges = list(judges)
        self.calls: dict[str, int] = {}
        self._cache: dict[tuple[str, tuple[str, tuple[str, ...]]], bool] = {}
        self._parent = parent
        self._lock = threading.Lock()

    def session(self) -> JudgeChain:
        """A chain over the same judges with a cache and counts of its own, also counted in this
        one's."""
        return JudgeChain(self.judges, parent=self)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + n
        if self._parent is not None:
            self._parent._count(name, n)

    def carries(self, texts: Sequence[str], evidence: Evidence) -> list[bool]:
        key_base = (evidence.answer, tuple(evidence.message_ids))
        with self._lock:
            result: list[bool | None] = [self._cache.get((t, key_base)) for t in texts]
        for judge in self.judges:
            todo = [i for i, r in enumerate(result) if r is None]
            if not todo:
                break
            self._count(judge.name, len(todo))
            for i, verdict in zip(
                todo, judge.carries([texts[i] for i in todo], evidence), strict=True
            ):
                result[i] = verdict
        final = [bool(r) for r in result]
        with self._lock:
            for t, r in zip(texts, final, strict=True):
                self._cache[(t, key_base)] = r
        return final

    def any(self, texts: Sequence[str], evidence: Evidence) -> bool:
        return any(self.carries(texts, evidence)) if texts else False


def default_judges(embedder: Embedder | None = None, lm: OptloopLM | None = None) -> JudgeChain:
    judges: list[Judge] = [LexicalJudge()]
    if embedder is not None:
        judges.append(EmbeddingJudge(embedder))
    if lm is not None:
        judges.append(LLMJudge(lm))
    return JudgeChain(judges)
