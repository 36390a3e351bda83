"""The proposal gate: a proposed instruction is evaluated only if it is one a person would ship
for its site.

Every optimizer's proposals pass through one :class:`ProposalGate` before anything runs them: the
edit optimizer's written edits and paraphrases, SIMBA's advice, GEPA's reflections, the proposer's
rewrites and Optuna's instruction choices. A proposal is refused as ``cut_off`` (it ends where a
token limit or a decoding bound fell), ``malformed``
(:func:`optloop.loop.proposals.units.problems`), ``echo`` (a re-typing of the proposer's own
prompt, at least :data:`ECHO_SHARE` of its word 5-grams, or a text fitted to the failures it was
shown) or ``off_task`` (not an instruction for the site's job, :mod:`optloop.loop.proposals.jobs`).
The judgement is by words, on purpose: the same on every run, and a reader can check each refusal;
whether an instruction is a *good* one is for the evaluation on dev to say. Each verdict is
appended to ``proposals.jsonl`` in the optimizer's work directory, so the counts survive a resumed
run; :func:`refusals` counts them by reason. What each reason catches, with examples:
``docs/loop.md`` ("Proposals a person would ship").
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from difflib import SequenceMatcher
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel

from optloop.loop.proposals.jobs import asks_for, site_job
from optloop.loop.proposals.units import problems
from optloop.text import normalize

logger = logging.getLogger(__name__)

ECHO_SHARE = 0.3  # of a proposal's word 5-grams found in the proposer's template: an echo
ECHO_MIN = 3  # and at least this many of them (a short instruction may share one phrase)
NGRAM = 5
# A run of this many words of the failures shown, quoted or not: the proposal restates a case
# ("To address the user's question about what aspects of the Harry Potter universe will be
# discussed ...") instead of instructing for the site.
RESTATED_WORDS = 7
LOG_NAME = "proposals.jsonl"

# Asking the reader for input is not an instruction to a model that has its input already.
_REQUEST = re.compile(
    r"\bplease\s+(?:provide|share|send|paste|specify|give|tell)\b"
    r"|\b(?:provide|share|send|give|tell)\s+(?:me|us)\b"
    r"|\b(?:could|can|would)\s+you\s+(?:please\s+)?(?:provide|share|send|give|tell)\b"
    r"|\bask the user (?:for|to)\b"
    # a chat closer offered to the reader: "If you have any questions, feel free to ask."
    r"|\bfeel free to (?:ask|reach out|contact)\b",
    re.IGNORECASE,
)
# Text about the prompt or the optimization rather than an instruction to the model: "The model
# should be programmed to ...", "This will ensure that the step no longer fails as in the cases".
_META = re.compile(
    r"\bbe programmed\b|\bthe step\b|\bthis step\b|\bthe failures?\b"
    r"|\bthe cases? (?:above|below|where)\b|\bno longer fails?\b"
    r"|\b(?:fix|change|edit|rewrite|improve|update|adjust|modify)\s+(?:the|this|your)\s+"
    r"(?:\w+\s+)?(?:prompt|instructions?)\b"
    # the writer's own rules restated: "The instruction should be general ... should not
    # mention functions, sessions, fields, or code."; or the task restated: "The instruction is
    # to rewrite the markdown memory file ..."
    r"|\bthe (?:new )?instructions? (?:should|must|needs? to|will|is to|are to)\b"
    r"|\bmention(?:s|ing)? functions\b|\bdescribes? the output format\b",
    re.IGNORECASE,
)
# A coder model's reflex: asked for an instruction, it specifies a program ("Write a function
# `rewrite_memory` that takes a string ..."); the site's model is not asked to write code.
_CODE = re.compile(
    r"\b(?:write|implement|define|create)\s+(?:a|an|the)\s+(?:python\s+)?"
    r"(?:function|method|class|script|program)\b",
    re.IGNORECASE,
)


# A phrase in quotes: an instruction that quotes the failures it was shown ('Search for "locker
# number"') is fitted to those cases, not written for the site.
_QUOTED = re.compile(r"[\"\u201c]([^\"\u201d]{3,80})[\"\u201d]")


def _quoted_from(text: str, shown: str) -> str | None:
    """A phrase of two words or more that ``text`` quotes from ``shown``, else None."""
    if not shown:
        return None
    folded = " ".join(shown.lower().split())
    for m in _QUOTED.finditer(text):
        phrase = " ".join(m.group(1).lower().split())
        if len(phrase.split()) >= 2 and phrase in folded:
            return m.group(1)
    return None


def _restated_from(text: str, shown: str) -> str | None:
    """The longest run of words ``text`` has from ``shown`` (case and punctuation aside), when it
    is :data:`RESTATED_WORDS` words or more, else None."""
    if not shown:
        return None
    words, said = _words(text), _words(shown)
    run = SequenceMatcher(None, words, said, autojunk=False).find_longest_match()
    return " ".join(words[run.a : run.a + run.size]) if run.size >= RESTATED_WORDS else None


# Where a sentence starts: after its end mark, at a line break, and at a quote (a quoted question
# in the failures shown starts with a capital that names nothing).
_SENTENCE_START = re.compile(r"(?<=[.!?:])\s+|\n+|[\"'\u2018\u201c]")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_NAME = re.compile(r"[A-Z][a-z]{2,}")


def _names(text: str, *, first: bool = False) -> set[str]:
    """The words ``text`` capitalizes inside a sentence: the names of people, places and things
    ("Maria", "John"); ``first``: a sentence's first word too."""
    found = set()
    for sentence in _SENTENCE_START.split(text):
        for token in _TOKEN.findall(sentence)[0 if first else 1 :]:
            if _NAME.fullmatch(token):
                found.add(token)
    return found


def _named_from(text: str, shown: str, replaces: str = "") -> str | None:
    """A name of ``shown`` (:func:`_names`) that ``text`` has and the text it would replace does
    not, else None: an instruction for a site is written for every conversation, so one that names
    a person of the failures shown ("the issue of John not starting volunteering") is fitted to
    them."""
    if not shown:
        return None
    kept = set(_words(replaces))
    named = _names(text, first=True) & _names(shown)
    return min((n for n in named if n.lower() not in kept), default=None)


def _only_questions(text: str) -> bool:
    """Whether every sentence of ``text`` is a question ("What is a name, number, date, yes or
    no, or an option letter?": a paraphrase turned into one)."""
    sentences = [p for p in re.split(r"(?<=[.?!])\s+", text.strip()) if p]
    return bool(sentences) and all(p.endswith("?") for p in sentences)


class Reason(StrEnum):
    """Why a proposal was refused (the order is the order they are checked in)."""

    CUT_OFF = "cut_off"
    MALFORMED = "malformed"
    ECHO = "echo"
    OFF_TASK = "off_task"


class Verdict(BaseModel):
    """One proposal and what the gate said of it (one line of the gate's log)."""

    site: str
    who: str
    text: str
    reason: Reason | None = None
    detail: str = ""


def _words(text: str) -> list[str]:
    """Its words, lower case, an apostrophe kept inside one ("john's"), not around it."""
    return re.findall(r"[a-z0-9]+(?:'[a-z0-9]+)*", text.lower())


def _ngrams(text: str) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


_TEMPLATES: list[type] = []


def register_template(signature: type) -> type:
    """Count ``signature`` (a DSPy signature a proposer is given) as a proposer template: a
    proposal that re-types it is an echo. Used as a decorator where the signature is defined, so
    this module imports none of them."""
    _TEMPLATES.append(signature)
    return signature


def proposer_templates() -> tuple[str, ...]:
    """The prompts optloop's proposers are given, less what varies per call: GEPA's reflection
    template (read from the installed ``gepa``), DSPy's SIMBA advice signature, and optloop's own
    proposer signatures (:func:`register_template`: the writer's, the paraphrase's, the
    rewrite's)."""
    return _library_templates() + tuple(_signature_text(s) for s in _TEMPLATES)


@functools.cache
def _library_templates() -> tuple[str, ...]:
    texts: list[str] = []
    try:
        from gepa.strategies.instruction_proposal import InstructionProposalSignature

        texts.append(str(InstructionProposalSignature.default_prompt_template))
    except (ImportError, AttributeError):  # another gepa: its template is not where we look
        logger.debug("GEPA's reflection template not found; echoes of it are not detected")
    try:
        from dspy.teleprompt.simba_utils import OfferFeedback

        texts.append(_signature_text(OfferFeedback))
    except (ImportError, AttributeError):
        logger.debug("DSPy's SIMBA advice signature not found")
    return tuple(texts)


def _signature_text(signature: type) -> str:
    """A DSPy signature's instruction and field descriptions: what a proposer reads of it."""
    fields = getattr(signature, "fields", {})
    parts = [str(getattr(signature, "instructions", "") or "")]
    for field in fields.values():
        extra = getattr(field, "json_schema_extra", None) or {}
        parts.append(str(extra.get("desc") or ""))
    return "\n".join(p for p in parts if p)


class ProposalGate:
    """Judges proposed instructions (see the module doc); ``log``: where verdicts are appended
    (``None``: kept in memory only)."""

    def __init__(self, log: Path | None = None, *, templates: Iterable[str] | None = None):
        self.log = log
        self._templates = tuple(templates) if templates is not None else None
        self._template_grams: set[tuple[str, ...]] | None = None
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def template_grams(self) -> set[tuple[str, ...]]:
        if self._template_grams is None:
            texts = self._templates if self._templates is not None else proposer_templates()
            self._template_grams = set().union(*(_ngrams(t) for t in texts)) if texts else set()
        return self._template_grams

    def judge(
        self,
        site: str,
        text: str,
        *,
        cut_off: bool = False,
        shown: str = "",
        values: Sequence[str] = (),
        whole: bool = True,
        replaces: str = "",
    ) -> tuple[Reason | None, str]:
        """The reason ``text`` is refused as an instruction for ``site`` (``None``: it passes) and
        what was found. ``cut_off``: the proposer's call was cut at a limit; ``shown``: the
        task text the proposer was given beside its template (an echo of it is refused too);
        ``values``: the answers of the failures it was shown (an instruction that names one is
        fitted to those cases, not written for the site: refused as an echo); ``whole``: ``text``
        is a whole instruction, which must name the site's job (a sentence added to one, or
        written in place of one of its sentences, need not); ``replaces``: the text it would
        replace (a re-typing of it, the same words up to case, articles, quotes and punctuation,
        is refused as an echo: evaluating it would spend a candidate on the instruction already
        there)."""
        if cut_off:
            return Reason.CUT_OFF, "the proposer's text was cut at its token limit or bound"
        if faults := problems(text):
            return Reason.MALFORMED, "; ".join(faults)
        if replaces and normalize(text) == normalize(replaces):
            return Reason.ECHO, "it re-types the instruction it would replace"
        for value in values:
            if len(value) >= 3 and re.search(rf"\b{re.escape(value)}\b", text, re.IGNORECASE):
                return Reason.ECHO, f"it names {value!r}, an answer of the failures it was shown"
        if quoted := _quoted_from(text, shown):
            return Reason.ECHO, f"it quotes {quoted!r} from the failures it was shown"
        if restated := _restated_from(text, shown):
            return Reason.ECHO, f"it restates {restated!r} from the failures it was shown"
        if named := _named_from(text, shown, replaces):
            return Reason.ECHO, f"it names {named!r} from the failures it was shown"
        grams = _ngrams(text)
        if grams:
            seen = grams & (self.template_grams() | (_ngrams(shown) if shown else set()))
            if len(seen) >= ECHO_MIN and len(seen) / len(grams) >= ECHO_SHARE:
                return (
                    Reason.ECHO,
                    f"{len(seen)} of its {len(grams)} word 5-grams are in the proposer's prompt",
                )
        if _only_questions(text):
            return Reason.OFF_TASK, "it asks a question instead of instructing"
        if m := _REQUEST.search(text):
            return Reason.OFF_TASK, f"it asks for input ({m.group(0)!r}) instead of instructing"
        if m := _META.search(text):
            return Reason.OFF_TASK, f"it talks about the prompt ({m.group(0)!r}), not to the model"
        if m := _CODE.search(text):
            return Reason.OFF_TASK, f"it asks for a program ({m.group(0)!r}), not the site's job"
        job = site_job(site) if whole else None
        if job is not None and not asks_for(job, text):
            return Reason.OFF_TASK, f"it names no word of the site's job ({job.task[:60]}...)"
        return None, ""

    def refuses(
        self,
        site: str,
        text: str,
        *,
        who: str,
        cut_off: bool = False,
        shown: str = "",
        values: Sequence[str] = (),
        whole: bool = True,
        replaces: str = "",
    ) -> bool:
        """Whether to refuse ``text`` (see :meth:`judge`), recorded in the log either way, and said
        in a log line when refused; ``who`` names the proposal ("GEPA's reflection")."""
        reason, detail = self.judge(
            site, text, cut_off=cut_off, shown=shown, values=values, whole=whole, replaces=replaces
        )
        verdict = Verdict(site=site, who=who, text=text, reason=reason, detail=detail)
        with self._lock:
            self.counts[reason.value if reason else "passed"] += 1
            if self.log is not None:
                self.log.parent.mkdir(parents=True, exist_ok=True)
                with self.log.open("a", encoding="utf-8") as f:
                    f.write(verdict.model_dump_json() + "\n")
        if reason is not None:
            logger.info(
                "%s for %s refused (%s: %s): %r", who, site, reason.value, detail, text[:120]
            )
        return reason is not None


_ACTIVE: contextvars.ContextVar[ProposalGate | None] = contextvars.ContextVar(
    "optloop_proposal_gate", default=None
)
_UNLOGGED = ProposalGate()


def current_gate() -> ProposalGate:
    """The gate of the optimizer whose round is running (:func:`active`), so code deep inside a
    DSPy optimizer's step (SIMBA's advice, GEPA's proposer) judges with it; outside any round, a
    gate that logs nowhere."""
    return _ACTIVE.get() or _UNLOGGED


@contextlib.contextmanager
def active(gate: ProposalGate) -> Iterator[ProposalGate]:
    """``gate`` is :func:`current_gate` inside the block."""
    token = _ACTIVE.set(gate)
    try:
        yield gate
    finally:
        _ACTIVE.reset(token)


def verdicts(paths: Iterable[Path]) -> list[Verdict]:
    """Every verdict in the gate logs at ``paths`` (missing files skipped; a line cut by a kill is
    skipped)."""
    out: list[Verdict] = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(Verdict.model_validate(json.loads(line)))
            except (json.JSONDecodeError, ValueError):
                continue
    return out


def refusals(paths: Iterable[Path]) -> dict[str, int]:
    """Proposals refused by reason (and ``passed``), over the gate logs at ``paths``."""
    counts = Counter(v.reason.value if v.reason else "passed" for v in verdicts(paths))
    return dict(sorted(counts.items()))


def logs_under(root: Path) -> list[Path]:
    """The gate logs of every optimizer under a run's directory."""
    return sorted(root.rglob(LOG_NAME)) if root.exists() else []


__all__ = [
    "LOG_NAME",
    "ProposalGate",
    "active",
    "current_gate",
    "Reason",
    "Verdict",
    "logs_under",
    "proposer_templates",
    "refusals",
    "register_template",
    "verdicts",
]
