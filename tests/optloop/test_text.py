"""The one word tokenizer (optloop.text.words) and the modules that must use it."""

from __future__ import annotations

import re
from pathlib import Path

from optloop.text import normalize, singular, words

REPO = Path(__file__).resolve().parents[2]


def test_words_are_squad_normalized():
    assert words("The  Café's menu, in Zürich!") == ["cafes", "menu", "in", "zurich"]
    assert words("Don’t stop—now") == ["dont", "stop", "now"]
    assert words("") == [] and normalize("A b THE c") == "b c"
    assert [singular(w) for w in words("bucket hats, boxes, parties")] == [
        "bucket",
        "hat",
        "box",
        "party",
    ]


def test_every_word_match_goes_through_the_one_tokenizer():
    """Scorers, judges, BM25 (system and evidence), the recorder's similarity and the fault
    harness."""
    from optloop.attribution.evidence import hybrid_search  # noqa: F401 - imports resolve
    from optloop.attribution.judges import content_tokens
    from optloop.datasets.scorers import normalize_answer, token_f1
    from optloop.tracing.recorder import similar

    assert normalize_answer is normalize
    assert content_tokens("The hats of Alice") == {"hat", "alice"}
    assert token_f1("the Café", "cafe") == 1.0
    assert similar("Alice moved to Porto.", "alice moved to porto") == 1.0
    # A word list of one's own: a regex for words, or the words of lower-cased text as a set.
    # (" ".join(text.split()) only collapses whitespace and is no tokenizer: see optloop/text.py.)
    ad_hoc = re.compile(
        r"re\.findall\(r\"(\\w\+|\[a-z0-9\]\+)\"|set\([^()]*\.lower\(\)\.split\(\)"
    )
    offenders = [
        str(p.relative_to(REPO))
        for d in ("optloop", "systems", "signatures", "experiments")
        for p in (REPO / d).rglob("*.py")
        if ad_hoc.search(p.read_text())
    ]
    # loop/optimizers/simba.py counts the new words of an edit; it moves to words() with the loop
    # refactor.
    assert offenders in ([], ["optloop/loop/optimizers/simba.py"]), offenders
