"""An instruction as editable units, and the check that an edited instruction is well-formed text.

The edit optimizer (:mod:`optloop.loop.optimizers.edit`) deletes, swaps, paraphrases and restores
*units* of a prompt site's instruction. A unit is something a person could strike out and still
leave complete sentences behind:

* a **sentence** of a prose paragraph (a paragraph may wrap over several lines);
* a **clause** of a sentence that a semicolon joins to the rest ("Be brief; never explain."):
  deleting the last one moves the sentence's full stop back;
* a **list item** (a line starting ``-``, ``*``, ``•``, ``1.`` or ``1)``, with its indented
  continuation lines).

Everything else is kept as it is and never edited: headings, code blocks, example lines that
do not start with a letter (JSON, tags, quotes), and the white space between units. So
``Instruction.parse(text).text == text`` for any text, and an edit changes only the units it
names.

:func:`problems` says why an edited text is not one a person would ship (a sentence cut in
half, a dangling ``If ...,``, an unmatched quote, an empty sentence); the optimizer never
evaluates such a candidate.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

Kind = Literal["sentence", "clause", "item", "fixed"]

_ITEM = re.compile(r"^(?P<indent>[ \t]*)(?:[-*•]|\d{1,2}[.)])[ \t]+\S")
_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_HEADING = re.compile(r"^[ \t]*#")
# A labelled example line ("Output: {...}", "Observation Date: 2025-08-19"): data, not an
# instruction.
_LABEL = re.compile(r"^[ \t]*[A-Z][A-Za-z]*(?: [A-Z][A-Za-z]*){0,2}:(?:[ \t]|\r?\n|\Z)")
_SENTENCE_END = re.compile(r"[.!?][\"')\]”’]*(?=\s)")
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|cf|Mr|Mrs|Ms|Dr|No|approx)|\b[A-Z])\.\Z")
_CLAUSE_END = re.compile(r";(?=\s)")
# A sentence must not end on a word that needs more after it.
_DANGLING = {"a", "an", "the", "and", "or", "but", "if", "unless", "because", "whether", "than"}
# Openings of a subordinate clause: the sentence needs a main clause after a comma (or "then").
_SUBORDINATE = {
    "if",
    "when",
    "whenever",
    "unless",
    "although",
    "because",
    "while",
    "once",
    "since",
}


@dataclass(frozen=True)
class Unit:
    """One piece of an instruction: ``body`` then the white space ``trail`` before the next piece.

    ``group`` numbers the paragraph or list a unit belongs to (swaps stay inside one), ``kind`` is
    ``"fixed"`` for text that is never edited.
    """

    body: str
    trail: str
    kind: Kind
    group: int = 0


@dataclass
class Instruction:
    """An instruction as a sequence of units (see the module docstring); ``lead`` is its leading
    white space."""

    units: list[Unit]
    lead: str = ""
    _editable: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._editable = [i for i, u in enumerate(self.units) if u.kind != "fixed"]

    @classmethod
    def parse(cls, text: str) -> Instruction:
        lead = text[: len(text) - len(text.lstrip())]
        return cls(list(_units(text[len(lead) :])), lead=lead)

    @property
    def text(self) -> str:
        return self.lead + "".join(u.body + u.trail for u in self.units)

    @property
    def editable(self) -> list[Unit]:
        """The units an edit may touch, in order (what the optimizer numbers ``0 .. n-1``)."""
        return [self.units[i] for i in self._editable]

    def label(self, k: int) -> str:
        """How a person would name editable unit ``k`` (``"sentence 2"``, ``"list item 1"``),
        counted from 1."""
        unit = self.editable[k]
        same = [u for u in self.editable[: k + 1] if u.kind == unit.kind]
        return f"{'list item' if unit.kind == 'item' else unit.kind} {len(same)}"

    def delete(self, k: int) -> Instruction:
        """Without editable unit ``k``: its white space goes with it, and a paragraph's or a
        sentence's end stays where it was (the unit before it takes over the trailing line break or
        full stop)."""
        units = list(self.units)
        i = self._editable[k]
        gone = units.pop(i)
        before = units[i - 1] if i > 0 else None
        after = units[i] if i < len(units) else None
        if (
            gone.kind == "clause"
            and before is not None
            and before.kind == "clause"
            and before.group == gone.group
            and (after is None or after.kind != "clause" or after.group != gone.group)
        ):
            # the last clause of a sentence went: the clause before it ends the sentence now
            end = re.search(r"[.!?][\"')\]”’]*\Z", gone.body)
            units[i - 1] = replace(
                before, body=before.body.rstrip(";") + (end.group(0) if end else ".")
            )
        elif (
            gone.kind == "clause"
            and after is not None
            and after.kind == "clause"
            and after.group == gone.group
        ):
            units[i] = replace(after, body=_capitalized(after.body))  # the first clause went
        if before is not None and ("\n" in gone.trail or i == len(units)):
            units[i - 1] = replace(units[i - 1], trail=gone.trail)
        return Instruction(units, lead=self.lead)

    def swap(self, k: int, m: int) -> Instruction:
        """Editable units ``k`` and ``m`` (of the same kind and group) change places; white space
        stays."""
        units = list(self.units)
        i, j = self._editable[k], self._editable[m]
        units[i], units[j] = (
            replace(units[i], body=units[j].body),
            replace(units[j], body=units[i].body),
        )
        return Instruction(units, lead=self.lead)

    def replace_body(self, k: int, body: str) -> Instruction:
        """Editable unit ``k`` with another text (a paraphrase); a list item keeps its marker."""
        units = list(self.units)
        i = self._editable[k]
        unit = units[i]
        if unit.kind == "item":
            marker = re.match(r"\s*(?:[-*•]|\d{1,2}[.)])[ \t]+", unit.body)
            body = (marker.group(0) if marker else "") + body.strip()
        units[i] = replace(
            unit, body=_as_sentence(body.strip()) if unit.kind == "sentence" else body.strip()
        )
        return Instruction(units, lead=self.lead)

    def insert(self, k: int, body: str, kind: Kind) -> Instruction:
        """``body`` (a unit deleted earlier) put back before editable unit ``k`` (after the last at
        ``k == n``)."""
        units = list(self.units)
        if not self._editable:
            return Instruction([*units, Unit(body, "", kind)], lead=self.lead)
        if k >= len(self._editable):
            i = self._editable[-1]
            sep = "\n" if kind == "item" else " "
            units.insert(i + 1, Unit(body, units[i].trail, kind, units[i].group))
            units[i] = replace(units[i], trail=sep)
        else:
            i = self._editable[k]
            sep = "\n" if kind == "item" else " "
            units.insert(i, Unit(body, sep, kind, units[i].group))
        return Instruction(units, lead=self.lead)


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def _as_sentence(text: str) -> str:
    return text if not text or re.search(r"[.!?:][\"')\]”’]*\Z", text) else text + "."


def _blocks(text: str) -> Iterator[tuple[str, str, str]]:
    """``text`` as (kind, block, trailing white space): "prose", "item" or "fixed" blocks of whole
    lines."""
    lines = text.splitlines(keepends=True)
    i, fence = 0, False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if _FENCE.match(line) or fence:
            fence = fence != bool(_FENCE.match(line))
            kind, j = "fixed", i + 1
        elif (
            _HEADING.match(line)
            or _LABEL.match(line)
            or (stripped and not (stripped[0].isalpha() or _ITEM.match(line)))
        ):
            kind, j = "fixed", i + 1
        elif m := _ITEM.match(line):
            indent = len(m.group("indent"))
            j = i + 1
            while (
                j < len(lines)
                and lines[j].strip()
                and not _ITEM.match(lines[j])
                and len(lines[j]) - len(lines[j].lstrip()) > indent
                and lines[j].lstrip()[0].isalpha()
            ):
                j += 1
            kind = "item"
        else:
            j = i + 1
            while (
                j < len(lines)
                and lines[j].strip()
                and not _ITEM.match(lines[j])
                and not _HEADING.match(lines[j])
                and not _FENCE.match(lines[j])
                and not _LABEL.match(lines[j])
                and lines[j].strip()[0].isalpha()
            ):
                j += 1
            kind = "prose"
        # blank lines belong to the white space after the block
        while j < len(lines) and not lines[j].strip():
            j += 1
        block = "".join(lines[i:j])
        body = block.rstrip()
        yield kind, body, block[len(body) :]
        i = j


def _units(text: str) -> Iterator[Unit]:
    group = 0
    prev_item = False
    for kind, body, trail in _blocks(text):
        if kind == "item":
            group += 0 if prev_item else 1
            prev_item = "\n\n" not in trail
            yield Unit(body, trail, "item", group)
            continue
        prev_item = False
        group += 1
        if kind == "fixed":
            yield Unit(body, trail, "fixed", group)
            continue
        pieces = list(_split(body, _SENTENCE_END))
        for n, (sentence, space) in enumerate(pieces):
            last = n == len(pieces) - 1
            clauses = list(_split(sentence, _CLAUSE_END))
            if len(clauses) > 1:
                group += 1
                for c, (clause, gap) in enumerate(clauses):
                    yield Unit(
                        clause,
                        gap if c < len(clauses) - 1 else (trail if last else space),
                        "clause",
                        group,
                    )
                group += 1
            else:
                yield Unit(sentence, trail if last else space, "sentence", group)


def _split(text: str, end: re.Pattern[str]) -> Iterator[tuple[str, str]]:
    """``text`` cut after each match of ``end`` that is outside double quotes: (piece, white space
    after it)."""
    start = 0
    for m in end.finditer(text):
        piece = text[start : m.end()]
        if _ABBREVIATION.search(piece) or piece.count("(") > piece.count(")"):
            continue  # "e.g. a name" and "(say. this)" do not end a sentence
        if piece.count('"') % 2 or piece.count("“") != piece.count("”"):
            continue  # inside a quotation: 'Say "Hi. Bye." to them.' is one sentence
        space_end = m.end() + len(text[m.end() :]) - len(text[m.end() :].lstrip())
        if space_end >= len(text):
            break
        yield piece, text[m.end() : space_end]
        start = space_end
    if start < len(text):
        yield text[start:], ""


def problems(text: str) -> list[str]:
    """Why ``text`` is not a well-formed instruction (empty list: it is): an empty text, an empty
    sentence, a sentence cut after a comma or on a word that needs more, a subordinate clause with
    no main clause, an unmatched double quote or bracket in a unit."""
    if not text.strip():
        return ["the instruction is empty"]
    out: list[str] = []
    for unit in Instruction.parse(text).editable:
        out += [f"{p}: {unit.body.strip()[:60]!r}" for p in _unit_problems(unit)]
    return out


def well_formed(text: str) -> bool:
    return not problems(text)


def _unit_problems(unit: Unit) -> list[str]:
    body = unit.body.strip()
    if unit.kind == "item":
        body = re.sub(r"^(?:[-*•]|\d{1,2}[.)])[ \t]+", "", body)
    out = []
    words = re.findall(r"[A-Za-z']+", body)
    if not words:
        return ["an empty sentence"]
    if body.count('"') % 2 or body.count("“") != body.count("”"):
        out.append("an unmatched quote")
    for a, b in ("()", "[]", "{}"):
        if body.count(a) != body.count(b):
            out.append(f"an unmatched {a}{b}")
    if re.search(r"[.!?]\s+[.!?]", body):
        out.append("an empty sentence")
    if unit.kind == "item":
        return out
    tail = body.rstrip("\"')]”’")
    ends = (".", "!", "?", ":", ";") if unit.kind == "clause" else (".", "!", "?", ":")
    if not tail.endswith(ends):
        out.append("a sentence cut short")
    elif (last := tail.split()[-1].strip(".!?:;,").lower()) in _DANGLING and not tail.endswith(
        ":"
    ):
        out.append(f"a sentence ending on {last!r}")
    if (
        unit.kind == "sentence"
        and words[0].lower() in _SUBORDINATE
        and not re.search(r",\s*\S+\s+\S+|\bthen\b", body)
    ):
        out.append(f"a {words[0]!r} clause with no main clause")
    return out


__all__ = ["Instruction", "Unit", "problems", "well_formed"]
