"""A candidate: what the optimizer may change in a system, as plain data.

A :class:`Candidate` is the instructions and demos of every prompt site plus
the knob values. It is what the loop evaluates, checkpoints, logs to MLflow
and registers; optimizers turn their own program objects into candidates with
:func:`candidate_from_modules`. ``ingest_key`` is the part of a candidate that
decides what ingestion stores (the ingest-stage sites' instructions and
demos), so two candidates with the same key share one ingested store.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import dspy
from pydantic import BaseModel, Field

from optloop.text import sentences
from signatures._layout import USER_FIELD, jsonable, render_system

if TYPE_CHECKING:
    from systems.base import PromptSite


class SiteState(BaseModel):
    """One prompt site's tunable state."""

    instructions: str
    demos: list[dict[str, Any]] = Field(default_factory=list)


class Candidate(BaseModel):
    """Every site's state and the knob values; ``origin`` says which optimizer step made it."""

    sites: dict[str, SiteState]
    knobs: dict[str, Any] = Field(default_factory=dict)
    origin: str = "baseline"
    # The digest of the candidate this one was made from, where the optimizer keeps it (the edit
    # optimizer: a queued edit whose parent is no longer the best is dropped). Not in the digest.
    parent: str | None = None

    def digest(self, only: set[str] | None = None, *, with_knobs: bool = True) -> str:
        sites = {
            n: s.model_dump() for n, s in sorted(self.sites.items()) if only is None or n in only
        }
        payload = {"sites": sites, "knobs": self.knobs if with_knobs else {}}
        return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[
            :12
        ]

    def changed_sites(self, base: Candidate) -> list[str]:
        return [n for n, s in self.sites.items() if base.sites.get(n) != s]

    def changed_knobs(self, base: Candidate) -> list[str]:
        return [k for k, v in self.knobs.items() if base.knobs.get(k) != v]


def ingest_key(system: str, candidate: Candidate, stages: Mapping[str, str]) -> str:
    """What ingestion depends on: the system and its ingest-stage sites (``stages``: site ->
    stage)."""
    ingest_sites = {n for n, stage in stages.items() if stage == "ingest"}
    return f"{system}-{candidate.digest(ingest_sites, with_knobs=False)}"


def demo_dict(demo: Any) -> dict[str, Any]:
    """A DSPy demo (``dspy.Example`` or dict) as JSON-ready data."""
    data = demo.toDict() if hasattr(demo, "toDict") else dict(demo)
    return {k: jsonable(v) for k, v in data.items() if k != "augmented"}


def site_state(module: dspy.Predict) -> SiteState:
    return SiteState(
        instructions=module.signature.instructions, demos=[demo_dict(d) for d in module.demos]
    )


def candidate_from_modules(
    modules: Mapping[str, dspy.Predict], knobs: Mapping[str, Any], origin: str
) -> Candidate:
    return Candidate(
        sites={n: site_state(m) for n, m in modules.items()}, knobs=dict(knobs), origin=origin
    )


def trivial_instruction(signature: type[dspy.Signature]) -> str:
    """The instruction DSPy gives ``signature``'s fields when none is written ("Given the fields
    `question`, produce the fields `answer`."): the edit optimizer's deletion of every unit and
    the run's control (:mod:`optloop.loop.trivial_control`) both use it, so the two are the same
    text."""
    return dspy.make_signature(dict(signature.fields)).instructions


def apply_state(module: dspy.Predict, state: SiteState) -> None:
    module.signature = module.signature.with_instructions(state.instructions)
    module.demos = [dspy.Example(**d) for d in state.demos]


def prompt_text(site: PromptSite, state: SiteState) -> str:
    """The exact system prompt a site sends with ``state``: instructions, then rendered demos."""
    if site.layout == "library":
        return render_system(
            site.module.signature.with_instructions(state.instructions), state.demos
        )
    if not state.demos:
        return state.instructions
    shots = "\n\n".join(
        json.dumps({k: v for k, v in d.items() if k != USER_FIELD}, ensure_ascii=False)
        for d in state.demos
    )
    return f"{state.instructions}\n\n# Examples\n{shots}"


def _diff_lines(text: str) -> list[str]:
    """``text`` as the lines a prompt diff compares: prose one sentence a line (its white space
    folded, so a docstring's line breaks and an edited instruction's single line compare sentence
    by sentence); the examples block (``# Examples`` and the JSON demos after it) line by line as
    written."""
    prose, sep, examples = text.partition("\n\n# Examples\n")
    lines = [
        s for paragraph in prose.split("\n\n") for s in sentences(" ".join(paragraph.split())) if s
    ]
    if sep:
        lines += ["", "# Examples", *examples.splitlines()]
    return [f"{line}\n" for line in lines]


def prompt_diff(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """A unified diff of every site whose prompt text changed (sentence by
    sentence: :func:`_diff_lines`)."""
    chunks: list[str] = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name, ""), after.get(name, "")
        if a != b:
            chunks += difflib.unified_diff(
                _diff_lines(a),
                _diff_lines(b),
                fromfile=f"{name} (before)",
                tofile=f"{name} (after)",
            )
            chunks.append("\n")
    return "".join(chunks) or "(no prompt changed)\n"
