"""Forgetting by rule, not by the LM: which messages are forget requests, what they remove, what
they redact.

A user message that *starts* as a request to forget, delete or erase something
(:func:`forget_request`) removes every LTM key that best matches what it names
(:func:`match_keys`), with the key's history rows, and replaces the removed values, and
any sentence that uses every word of the request, by ``[forgotten]`` in the STM turns,
the MTM summaries and the extraction log (:func:`redact`); the ``forgotten`` table keeps
the request and the keys, never a value (:func:`forget`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence

from optloop.text import sentences
from systems.tiered.keys import words
from systems.tiered.store import TieredStore

logger = logging.getLogger(__name__)

FORGOTTEN = "[forgotten]"

_FORGET = re.compile(
    r"^\s*(?:(?:ok(?:ay)?|hey|also|and|so|oh|hi|right|actually|please)\b[\s,!.]*)*"
    r"(?:(?:can|could|would|will)\s+you\s+)?(?:please\s+)?"
    r"(?:forget|delete|erase|remove|wipe)\b\s*(?P<what>.*)$",
    re.IGNORECASE | re.DOTALL,
)
_WHAT_END = re.compile(
    r"[,.;!?]|\s-\s|\bbecause\b|\bsince\b|\bas\s+i\b|\bi\s+(?:don'?t|do\s+not)\b", re.IGNORECASE
)
_WHAT_FILLER = re.compile(
    r"\b(?:about|all|everything|anything|please|from|your|memory|that|what|you\s+know)\b",
    re.IGNORECASE,
)

# Words that name which attribute of a thing is meant ("my cousin's *name*", "the *code* for my
# unit"): a sentence that stores the attribute gives its value ("my cousin, Leocadia"), not the
# word, so a sentence to forget needs only the other words of the request. (Found by the
# embedded-LM test: a summary held "my cousin, Leocadia" and survived "forget my cousin's name".)
_ATTRIBUTE_WORDS = frozenset(
    {"name", "code", "number", "value", "detail", "info", "information", "address"}
)


def forget_request(message: str) -> str | None:
    """What a "forget ..." request names (``"code for my storage unit"``), or ``None`` if the
    message is not one.

    Only a message that *starts* as a request counts ("Please forget my locker code",
    "Could you delete my old address?"); "I always forget my keys" does not.
    """
    match = _FORGET.match(message)
    if match is None:
        return None
    what = _WHAT_END.split(match["what"], maxsplit=1)[0]
    return " ".join(_WHAT_FILLER.sub(" ", what).split())


def subject_words(what: str) -> set[str]:
    """The words a sentence must all use to be about what a forget request names: its content words
    less the attribute words, unless that leaves none."""
    content = words(what)
    return (content - _ATTRIBUTE_WORDS) or content


def redact(
    text: str, values: Sequence[str], what_words: set[str] | frozenset[str] = frozenset()
) -> str:
    """``text`` with each value (as whole words) and each sentence using all of ``what_words``
    replaced by ``[forgotten]``."""
    for value in values:
        if value.strip():
            text = re.sub(
                rf"(?<!\w){re.escape(value.strip())}(?!\w)", FORGOTTEN, text, flags=re.IGNORECASE
            )
    if what_words:
        parts = sentences(text)
        if any(what_words <= words(sentence) for sentence in parts):
            text = " ".join(
                FORGOTTEN if what_words <= words(sentence) else sentence for sentence in parts
            )
    return text


def match_keys(store: TieredStore, what: str) -> list[str]:
    """The live keys a forget request's words name best (key and value words); ties all match."""
    wanted = words(what)
    facts = store.live_facts()
    if not wanted or not facts:
        return []
    scores = {
        fact.key: len(wanted & (words(fact.label) | words(fact.value))) / len(wanted)
        for fact in facts
    }
    best = max(scores.values())
    if best >= 0.5:
        return [key for key, score in scores.items() if score == best]
    query = store.embedder.embed_one(what)
    similarity = {
        fact.key: float(store.vectors[fact.id] @ query)
        for fact in facts
        if fact.id in store.vectors
    }
    key, score = max(similarity.items(), key=lambda pair: pair[1], default=(None, 0.0))
    return [key] if key is not None and score >= 0.6 else []


def forget(
    store: TieredStore,
    what: str,
    *,
    request: str = "",
    session_id: str | None = None,
    turn_id: str | None = None,
    timestamp: str | None = None,
) -> list[str]:
    """Forget what ``what`` names: the best-matching LTM keys go (live row and history), and their
    values, and every sentence using all of ``what``'s words, become ``[forgotten]`` in STM and MTM
    (the request's own turn excepted). Returns the keys removed; the ``forgotten`` table records
    the request."""
    keys = match_keys(store, what)
    what_words = subject_words(what)
    with store.transaction() as db:
        rows = store.delete_keys(keys)
        values = sorted({row["value"] for row in rows}, key=len, reverse=True)
        redacted = 0
        for table, id_column, text_column in (
            ("stm", "turn_id", "content"),
            ("mtm", "session_id", "summary"),
        ):
            for row in db.execute(
                f"SELECT {id_column} AS id, {text_column} AS text FROM {table}"
            ).fetchall():
                if table == "stm" and row["id"] == turn_id:
                    continue
                text = redact(row["text"], values, what_words)
                if text != row["text"]:
                    db.execute(
                        f"UPDATE {table} SET {text_column} = ? WHERE {id_column} = ?",
                        (text, row["id"]),
                    )
                    redacted += 1
        # The extraction log keeps what the site wrote; the forgotten values go from it too.
        for row in db.execute("SELECT id, written, stored, refused FROM extractions").fetchall():
            cleaned = [redact(row[column], values) for column in ("written", "stored", "refused")]
            if cleaned != [row["written"], row["stored"], row["refused"]]:
                db.execute(
                    "UPDATE extractions SET written = ?, stored = ?, refused = ? WHERE id = ?",
                    (*cleaned, row["id"]),
                )
        db.execute(
            "INSERT INTO forgotten(request, what, keys, session_id, turn_id, timestamp, "
            "rows_removed, texts_redacted) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                request or f"forget {what}",
                what,
                json.dumps(keys),
                session_id,
                turn_id,
                timestamp,
                len(rows),
                redacted,
            ),
        )
    logger.info(
        "tiered: forget %r removed keys %s (%d rows) and redacted %d texts",
        what,
        keys,
        len(rows),
        redacted,
    )
    return keys
