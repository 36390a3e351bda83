"""Words of a text: the one tokenizer optloop compares, scores and retrieves texts with.

:func:`words` is used wherever a text is cut into words to be matched against other
words: the scorers' token F1 and yes/no parsing, the attribution judges' content words,
BM25 (the ``rag_bm25`` system's index and the evidence search), the recorder's
"same fact, reworded" similarity and the planted-fault harness. It is SQuAD's answer
normalization (lower case, accents folded, apostrophes dropped, punctuation to spaces,
articles dropped) split on whitespace, so "The Café's" and "cafes" meet as ``cafes``.

Kept apart on purpose, because they answer other questions:

* ``systems.baselines.estimate_tokens`` estimates how many *model* tokens a text costs
  in a prompt (characters / 4), for a context budget; words are not model tokens.
* the token counts in :class:`optloop.lm.CallRecord` are the model's own tokenizer's,
  as the backend reports them.
* ``" ".join(text.split())`` collapses whitespace to show or compare a text verbatim;
  it cuts nothing into words.
* ``faults.corruptions._blur`` rewrites a sentence word by word and must keep each
  word's case and spelling.

:func:`start_text` is the one rule for a start instruction (``--start SITE=TEXT``, a planted
instruction fault): the text itself, or the site's own instruction with it appended or put in
front.
"""

from __future__ import annotations

import re
import string
import unicodedata

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation + "‘’“”–—…"})


def normalize(text: str) -> str:
    """SQuAD-style normalization: lower case, strip accents, punctuation and articles; single
    spaces."""
    text = unicodedata.normalize("NFKD", str(text))
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = text.replace("'", "").replace("’", "")
    text = text.translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def words(text: str) -> list[str]:
    """The words of ``text``, normalized (see the module docstring), in order, repeats kept."""
    return normalize(text).split()


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """``text`` cut after each ``.``, ``!`` or ``?`` that white space follows, as written (nothing
    normalized; ``[""]`` for an empty text): the sentences an instruction is edited, diffed or
    redacted by."""
    return _SENTENCE_END.split(text)


def singular(token: str) -> str:
    """Light plural folding so "bucket hats" still contains "bucket hat"; no stemmer needed."""
    if len(token) > 3 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("es") and token[-3] in "sxz":
        return token[:-2]
    if len(token) > 2 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def start_text(own: str, start: str) -> str:
    """A start instruction: ``start`` itself; with a leading ``+`` the site's own instruction with
    it appended; with a trailing ``+`` the site's own instruction with it put in front (the ``+``
    stands where ``own`` goes)."""
    if start.startswith("+"):
        return f"{own.rstrip()} {start[1:].strip()}"
    if start.endswith("+"):
        return f"{start[:-1].strip()} {own.lstrip()}"
    return start
