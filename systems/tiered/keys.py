"""Words, keys, values and categories: how ``tiered`` names and files a fact, in code.

The extraction stage writes a key as it likes ("Sister Name", "my_home_city"); what is
stored is :func:`slug` of it, or the known key with the same words (:func:`known_key`),
so a fact's key does not depend on the model's spelling. A fact's category comes from its
key's words (:func:`category_of`); only a key that names no category takes the one the
model gave.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from optloop.text import singular
from optloop.text import words as text_words

_STOPWORDS = frozenset(
    """a an the i me my mine we our you your he she it its they them their is am are was were be
been being do does did have has had of to in on at for with from by about as and or but not no so
that this these those what which who whom when where why how please can could would will just
also all any some anything everything now then there here from user users s""".split()
)


def words(text: str) -> set[str]:
    """Content words (the one tokenizer, optloop.text.words, singular, stop words out); ``_``
    splits words."""
    return {singular(t) for t in text_words(text.replace("_", " ")) if t not in _STOPWORDS}


def normalize_value(value: str) -> str:
    return " ".join(value.lower().split()).strip(" .")


def slug(key: str) -> str:
    """A key as stored: lower case, words joined by ``_``, without a leading ``my_`` /
    ``user_``."""
    text = re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")
    for prefix in ("user_s_", "users_", "user_", "my_", "the_"):
        if text.startswith(prefix) and len(text) > len(prefix):
            text = text[len(prefix) :]
    return text


def known_key(key: str, known: Iterable[str]) -> str:
    """``key`` as stored: a known key with the same content words (``city_home`` -> ``home_city``,
    ``sisters_name`` -> ``sister_name``), else the key itself."""
    wanted = words(key)
    if not wanted:
        return key
    return next((k for k in known if k == key), None) or next(
        (k for k in known if words(k) == wanted), key
    )


def label_of(key: str) -> str:
    """A stored key as words: ``sister_name`` -> ``sister name``."""
    return key.replace("_", " ")


CATEGORIES: dict[str, frozenset[str]] = {
    "pets": frozenset(
        "pet dog cat puppy kitten hamster parrot rabbit horse fish vet groomer".split()
    ),
    "family": frozenset(
        """family sister brother sibling mother mom mum father dad parent niece nephew cousin
        aunt uncle grandmother grandma grandfather grandpa grandparent son daughter child kid baby
        wife husband partner spouse fiance fiancee""".split()
    ),
    "people": frozenset(
        "friend neighbour neighbor roommate flatmate birthday anniversary".split()
    ),
    "work": frozenset(
        """work job career manager boss colleague coworker office employer company team project
        salary occupation profession role client""".split()
    ),
    "health": frozenset(
        """health allergy allergic doctor dentist medication medicine gluten vegan vegetarian diet
        blood condition therapist""".split()
    ),
    "travel": frozenset(
        """travel trip flight seat gate train platform airport hotel passport ticket vacation
        holiday departure depart""".split()
    ),
    "home": frozenset(
        """home address city town live flat apartment house street neighbourhood neighborhood
        storage garage parking car moved""".split()
    ),
    "food": frozenset(
        "food tea coffee drink dish meal cuisine restaurant fruit snack dessert wine beer".split()
    ),
    "finance": frozenset("bank account card budget rent loan pin savings".split()),
    "schedule": frozenset("appointment meeting schedule class lesson deadline".split()),
}
GENERAL = "general"


def category_of(text: str) -> str:
    """The first category (in :data:`CATEGORIES` order) one of whose words ``text`` uses, else
    ``general``."""
    tokens = words(text)
    return next((name for name, vocabulary in CATEGORIES.items() if tokens & vocabulary), GENERAL)


def file_under(key: str, written: str | None) -> str:
    """A fact's category: its key's (:func:`category_of`), else the model's when it is a
    category."""
    from_key = category_of(key)
    if from_key != GENERAL or written not in CATEGORIES:
        return from_key
    return str(written)


def grounded(value: str, source: str) -> bool:
    """Whether at least half of the value's content words occur in ``source`` (the message and its
    context)."""
    value_words = words(value)
    if not value_words:
        return normalize_value(value) in normalize_value(source)
    return len(value_words & words(source)) / len(value_words) >= 0.5
