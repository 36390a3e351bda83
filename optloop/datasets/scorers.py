"""Grading a prediction against a question's gold answer.

``score(question, prediction) -> float in [0, 1]`` dispatches on ``question.scorer``
(set by the loader from the task, never guessed here); ``passed`` compares the score
with the scorer's pass threshold (:data:`PASS_THRESHOLDS`). Scorers:

``exact``            normalized strings equal (SQuAD normalization: lower case, no
                     punctuation, no articles, single spaces).
``contains``         the normalized gold occurs in the normalized prediction as whole words.
``contains_all``     fraction of the gold's items (split on ``,`` and ``;``)
                     found in the prediction; passes only when all are there.
``f1``               token F1 (LoCoMo / SQuAD); passes at 0.5.
``f1_multi``         LoCoMo multi-hop F1: gold and prediction split on commas, mean over
                     gold parts of the best F1 against any predicted part.
``yes_no``           the prediction's polarity (first yes/no word) equals the gold's.
``multiple_choice``  the option letter parsed from the prediction ("B", "(B)",
                     "Answer: b", or the text of exactly one option) equals the gold letter.
``abstain``          the prediction declines to answer ("I don't know", "no information",
                     "not mentioned", ...).
``llm_judge``        ``judge(question, gold, prediction) -> bool`` when one is given;
                     without a judge: 1.0 if the gold is contained, else token F1.

Any scorer gives 0 when the prediction contains one of ``question.forbidden`` (a
stale or deleted value that must not come back). The judge is any callable; this
module never calls an LM itself.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from optloop.datasets._model import LETTERS
from optloop.text import normalize as normalize_answer  # the scorers' name for it
from optloop.text import singular as _singular
from optloop.text import words

if TYPE_CHECKING:
    from optloop.datasets._model import Question, ScorerName

logger = logging.getLogger(__name__)

Judge = Callable[[str, str, str], bool]
"""``judge(question, gold, prediction) -> bool``: any callable, e.g. an LLM judge."""

PASS_THRESHOLDS: dict[str, float] = {
    "exact": 1.0,
    "contains": 1.0,
    "contains_all": 1.0,
    "f1": 0.5,
    "f1_multi": 0.5,
    "yes_no": 1.0,
    "multiple_choice": 1.0,
    "abstain": 1.0,
    "llm_judge": 0.5,
}


def _contains(haystack: str, needle: str) -> bool:
    """Whole-word containment of already normalized strings."""
    if not needle:
        return False
    return f" {needle} " in f" {haystack} "


def _folded(text: str) -> str:
    return " ".join(_singular(t) for t in words(text))


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between normalized prediction and gold (0 when either is empty)."""
    pred_tokens = words(prediction)
    gold_tokens = words(gold)
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens and bool(gold_tokens))
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def multi_f1(prediction: str, gold: str) -> float:
    """LoCoMo's multi-answer F1: mean over comma-separated gold parts of the best part F1."""
    golds = [g for g in (p.strip() for p in gold.split(",")) if g]
    preds = [p for p in (p.strip() for p in prediction.split(",")) if p] or [prediction]
    if not golds:
        return 0.0
    return sum(max(token_f1(p, g) for p in preds) for g in golds) / len(golds)


def gold_items(gold: str) -> list[str]:
    """The items of a list-valued gold answer ("a, b, and c" -> ["a", "b", "c"]).

    Items are split on commas, semicolons and new lines only, so an item may itself
    contain "and" ("rock and roll").
    """
    parts = (re.sub(r"^\s*and\s+", "", p) for p in re.split(r"[,;\n]", gold))
    return [p.strip() for p in parts if normalize_answer(p)]


def contains_all(prediction: str, gold: str) -> float:
    """Fraction of the gold's items found (whole words, plurals folded) in the prediction."""
    items = gold_items(gold)
    if not items:
        return 0.0
    folded = _folded(prediction)
    return sum(_contains(folded, _folded(item)) for item in items) / len(items)


_YES = {"yes", "yeah", "yep", "yup", "true", "definitely", "certainly", "absolutely"}
_NO = {"no", "nope", "nah", "false", "never"}
_NEGATED_MODAL = re.compile(
    r"\b(would not|will not|wouldnt|wont|does not|doesnt|do not|dont|is not|isnt|cannot|cant|"
    r"should not|shouldnt|not)\b"
)


def parse_yes_no(text: str) -> str | None:
    """``"yes"``, ``"no"`` or ``None``: the first yes/no word, else a negation cue.

    "Yes — because ...", "no.", "Answer: No" and "She would not" parse; a prediction
    with neither a yes/no word nor a negation gives ``None`` (which never passes).
    """
    tokens = words(text)
    for token in tokens:
        if token in _YES:
            return "yes"
        if token in _NO:
            return "no"
    if tokens and _NEGATED_MODAL.search(" ".join(tokens)):
        return "no"
    return None


def parse_choice(text: str, options: list[str]) -> str | None:
    """The option letter a prediction picks, or ``None`` when it picks none or several.

    Tried in order: a bare letter ("B", "b.", "(b)"); "answer: B" / "answer is (b)" /
    "option B"; a parenthesized letter "(B)"; an upper-case letter opening the text
    ("B) Paris", "B. Paris", "B: Paris"); the text of exactly one option (an option
    whose text contains another's wins over it).
    """
    letters = LETTERS[: len(options)]
    upper = f"[{letters}]"
    either = f"[{letters}{letters.lower()}]"
    # A lower-case letter counts only when punctuation or the end follows it, so that
    # "the answer is a dog" does not read as option A.
    lower_ok = r"(?=\s*(?:$|[)\].:,]))"
    patterns = [
        rf"^[\s(\[]*({either})[\s)\].:]*$",
        rf"(?i:\b(?:answer|option|choice))\s*(?i:is)?\s*[:\-]?\s*[(\[]?\s*({upper})\b",
        rf"(?i:\b(?:answer|option|choice))\s*(?i:is)?\s*[:\-]?\s*[(\[]?\s*({either}){lower_ok}",
        rf"\(({either})\)",
        rf"^\s*({upper})[).:]",
    ]
    stripped = text.strip()
    for pattern in patterns:
        match = re.search(pattern, stripped)
        if match:
            return match.group(1).upper()
    folded = _folded(text)
    hits = [
        letters[i]
        for i, option in enumerate(options)
        if _folded(option) and _contains(folded, _folded(option))
    ]
    if len(hits) > 1:
        # One option's text may contain another's ("New York" vs "New York City"): keep the
        # longest.
        longest = max(hits, key=lambda letter: len(_folded(options[letters.index(letter)])))
        others = [h for h in hits if h != longest]
        if all(
            _folded(options[letters.index(h)]) in _folded(options[letters.index(longest)])
            for h in others
        ):
            return longest
        return None
    return hits[0] if hits else None


_ABSTAIN_PATTERNS = [
    r"\b(i|we) (dont|do not|cannot|cant|could not|couldnt) "
    r"(know|tell|recall|remember|find|say|answer|determine)\b",
    r"\b(dont|do not|doesnt|does not) (have|contain|include|mention|say|specify)\b",
    r"\bno "
    r"(information|info|record|records|mention|memory|memories|data|details|evidence|knowledge)\b",
    r"\bnot "
    r"(mentioned|specified|provided|stated|available|known|recorded|sure|certain|given|"
    r"discussed)\b",
    r"\bnever (mentioned|said|told|stated|discussed)\b",
    r"\b(not|isnt|is not) (enough|sufficient) information\b",
    r"\binsufficient information\b",
    r"\b(cannot|cant|unable to|not able to) (answer|determine|tell|say|find|know|recall)\b",
    r"\b(unknown|unanswerable|unclear|uncertain)\b",
    r"\bi have no\b",
    r"\bthere is no\b",
    r"\bno longer\b",
    r"\bnot anymore\b",
    r"\b(deleted|removed|forgotten|cancelled|canceled)\b",
    r"\bidk\b",
    r"^(none|nothing|n a|no answer|no idea)$",
]
_ABSTAIN = re.compile("|".join(_ABSTAIN_PATTERNS))


def is_abstention(text: str) -> bool:
    """Whether a prediction declines to answer (or says the fact is gone).

    Deletion phrases ("no longer", "was deleted") count: after a delete, saying the
    value is gone is the right abstention.
    """
    return bool(_ABSTAIN.search(normalize_answer(text)))


def _forbidden_hit(question: Question, prediction: str) -> str | None:
    folded = _folded(prediction)
    for value in question.forbidden:
        if _contains(folded, _folded(value)):
            return value
    return None


def _raw_score(question: Question, prediction: str, judge: Judge | None) -> float:
    gold = question.gold
    scorer: ScorerName = question.scorer
    if scorer == "exact":
        return float(normalize_answer(prediction) == normalize_answer(gold))
    if scorer == "contains":
        return float(_contains(_folded(prediction), _folded(gold)))
    if scorer == "contains_all":
        return contains_all(prediction, gold)
    if scorer == "f1":
        return token_f1(prediction, gold)
    if scorer == "f1_multi":
        return multi_f1(prediction, gold)
    if scorer == "yes_no":
        expected = parse_yes_no(gold)
        return float(expected is not None and parse_yes_no(prediction) == expected)
    if scorer == "multiple_choice":
        return float(parse_choice(prediction, question.options or []) == gold)
    if scorer == "abstain":
        return float(is_abstention(prediction))
    if scorer == "llm_judge":
        if judge is not None:
            return float(bool(judge(question.question, gold, prediction)))
        if _contains(_folded(prediction), _folded(gold)):
            return 1.0
        return token_f1(prediction, gold)
    raise ValueError(f"unknown scorer {scorer!r}")


def score(question: Question, prediction: str, judge: Judge | None = None) -> float:
    """Score in [0, 1] of ``prediction`` for ``question`` under its own scorer.

    ``judge`` is used only by ``scorer="llm_judge"`` questions; everything else is
    deterministic. A prediction naming a ``forbidden`` value scores 0.
    """
    prediction = prediction or ""
    if question.forbidden and _forbidden_hit(question, prediction):
        return 0.0
    value = _raw_score(question, prediction, judge)
    return min(1.0, max(0.0, value))


def pass_threshold(question: Question) -> float:
    """The score at or above which ``question`` counts as passed."""
    return PASS_THRESHOLDS[question.scorer]


def passed(
    question: Question, prediction: str, judge: Judge | None = None, threshold: float | None = None
) -> bool:
    """Whether ``score`` reaches ``threshold`` (default: the scorer's pass threshold)."""
    limit = pass_threshold(question) if threshold is None else threshold
    return score(question, prediction, judge) >= limit - 1e-9
