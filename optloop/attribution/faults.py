"""The planted-fault harness: faults with known ground truth, to measure attribution.

Each :class:`Fault` breaks one operation of a system in a known way and knows
the site (or knob) and error type a correct attribution must name. Faults on
prompt sites are injected at the operation, as fault-injection studies do: the
site's DSPy module still makes its real LLM call, then its output (or input)
is corrupted the way the fault's description says ("extraction keeps only the
first fact", "the answer ignores the memories"). This makes the fault bite
even on a 135M model that would not follow a written instruction to misbehave,
so every induced failure has one known cause. Knob faults set the knob.

The harness runs each system clean and with each of its faults over the same
episodes. A question that passes clean and fails under the fault is a failure
the fault *caused*; every one is attributed and scored: site accuracy (the
blamed target is the planted one) and type accuracy (the error type is).
Among them, the *induced* failures are the ones with a sound baseline and a
fault that kept the evidence from the answer; the others are *set aside*, each
with its reason (:data:`SET_ASIDE_REASONS`), but attributed and reported all
the same, so the accuracy over every caused failure stands next to the
induced-only figure and the reader sees what the filter hides. Rates come with
a seeded 95% bootstrap interval (:func:`optloop.stats.bootstrap_mean`), an
empty sample says so instead of scoring 0, and a sample under
:data:`MIN_SAMPLE` is flagged as too small to support a figure.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy
from pydantic import BaseModel

from optloop.attribution.decisive import evidence_reaches_answer
from optloop.attribution.judges import default_judges
from optloop.attribution.taxonomy import Attribution, ErrorType, knob_target, library_target
from optloop.datasets import passed
from optloop.pipeline import Attributor, EpisodeResult, FreshStores, Workers, concurrency, run_episode
from optloop.sites import (ANSWER, GATED_ADMIT, GRAPHITI_EXTRACT_EDGES, MD_FLAT_CURATE, MEM0_EXTRACT, QUERY_REWRITE,
                           TIERED_EXTRACT)
from optloop.stats import bootstrap_mean
from optloop.text import words

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM
    from systems.base import MemorySystem

logger = logging.getLogger(__name__)

_NUMBERISH = re.compile(r"\d|\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b|\b(monday|tuesday|wednesday|"
                        r"thursday|friday|saturday|sunday|yesterday|today|tomorrow)\b", re.I)
UNRELATED_QUERY = "weather forecast for the weekend"


def _item_text(item: Any) -> str:
    from optloop.tracing.recorder import _text

    return _text(item)


def _normalize(text: str) -> str:
    return " ".join(words(text))


def _map_lists(prediction: dspy.Prediction, fn: Callable[[list[Any], dict[str, Any]], list[Any]],
               inputs: dict[str, Any]) -> dspy.Prediction:
    for key, value in list(prediction.items()):
        if isinstance(value, list):
            prediction[key] = fn(value, inputs)
    return prediction


def _already_in_file(item: Any, inputs: dict[str, Any]) -> bool:
    return bool(_normalize(_item_text(item))) and _normalize(_item_text(item)) in _normalize(
        str(inputs.get("memory_file", "")))


def _blur(text: str) -> str:
    """The same sentence with its specifics (names, numbers, places) replaced: an overwrite."""
    parts = text.split()  # the sentence's own words, case and spelling kept (not optloop.text.words)
    out = [("something" if i > 0 and (w[:1].isupper() or any(c.isdigit() for c in w)) else w)
           for i, w in enumerate(parts)]
    if out == parts and parts:
        out[-1] = "something"
    return " ".join(out)


# --- output/input transforms --------------------------------------------------------------


def drop_numbers(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return [i for i in items if not _NUMBERISH.search(_item_text(i))]


def first_only(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return items[:1]


def drop_all(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return []


def keys_only(items: list[Any], _: dict[str, Any]) -> list[Any]:
    """``Key|Value`` lines cut to their keys: the wrong format, every line malformed."""
    return [_item_text(i).split("|", 1)[0].strip() for i in items]


def forget_old(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    return [i for i in items if not _already_in_file(i, inputs)]


def blur_old(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    return [(_blur(i) if isinstance(i, str) and _already_in_file(i, inputs) else i) for i in items]


def _own_text(item: Any) -> str:
    """The text an extracted item carries: the string, or its ``text`` field."""
    if isinstance(item, str):
        return item
    if isinstance(item, BaseModel) and "text" in type(item).model_fields:
        return str(item.text)  # type: ignore[attr-defined]
    if isinstance(item, dict) and "text" in item:
        return str(item["text"])
    return _item_text(item)


def _with_text(item: Any, text: str) -> Any:
    """``item`` with its text replaced (a string, or a model or dict with a ``text`` field)."""
    if isinstance(item, str):
        return text
    if isinstance(item, BaseModel) and "text" in type(item).model_fields:
        return item.model_copy(update={"text": text})
    if isinstance(item, dict) and "text" in item:
        return {**item, "text": text}
    return item


def first_words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


def truncate_facts(items: list[Any], _: dict[str, Any]) -> list[Any]:
    """Every extracted fact kept, but cut to its first four words."""
    return [_with_text(i, first_words(_own_text(i), 4)) for i in items]


def truncate_new(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    """The facts already in the file kept as they are; every new fact cut to its first four words."""
    return [i if _already_in_file(i, inputs) else _with_text(i, first_words(_own_text(i), 4)) for i in items]


def compress_old(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    """The facts already in the file collapsed into one summary line (their first twelve words); new facts kept."""
    old = [i for i in items if _already_in_file(i, inputs)]
    new = [i for i in items if not _already_in_file(i, inputs)]
    if not old:
        return new
    return [first_words("; ".join(_own_text(i) for i in old), 12), *new]


def shift_numbers(text: str) -> str:
    """Every number one higher: ``3`` becomes ``4``, ``2023`` becomes ``2024``, ``10:30`` becomes ``11:31``."""
    return re.sub(r"\d+", lambda m: str(int(m.group()) + 1), text)


def strip_specifics(text: str) -> str:
    """``text`` without its names, numbers and dates (capitalized words after the first, digits, months, days)."""
    words = text.split()
    kept = [w for i, w in enumerate(words)
            if not ((i > 0 and w[:1].isupper()) or any(c.isdigit() for c in w) or _NUMBERISH.search(w))]
    return " ".join(kept)


def query_without_specifics(prediction: dspy.Prediction, inputs: dict[str, Any]) -> None:
    prediction["query"] = strip_specifics(str(inputs.get("question", "")))


def echo_question(prediction: dspy.Prediction, inputs: dict[str, Any]) -> None:
    prediction["answer"] = str(inputs.get("question", ""))


def first_memory_only(inputs: dict[str, Any]) -> dict[str, Any]:
    lines = str(inputs.get("memories", "")).splitlines()
    return {**inputs, "memories": lines[0] if lines else "(no memories)"}


@dataclass
class Fault:
    """One planted fault: where it is, what it does, what attribution must say."""

    name: str
    systems: tuple[str, ...]
    target: str  # the site, or knob:<name>, a correct attribution blames
    error_type: ErrorType
    description: str
    site: str | None = None  # the site whose module is corrupted
    lists: Callable[[list[Any], dict[str, Any]], list[Any]] | None = None
    outputs: dict[str, Any] = field(default_factory=dict)  # output fields forced to a value
    inputs: dict[str, Any] = field(default_factory=dict)  # input fields forced to a value
    knobs: dict[str, Any] = field(default_factory=dict)
    query_site: bool = False
    # A store fault: run after each session is ingested, with the ids stored before it.
    after_session: Callable[[MemorySystem, set[str]], None] | None = None
    # The site's inputs rewritten before its call, and its prediction edited (in place) after it, from the inputs.
    edit_inputs: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    edit_outputs: Callable[[dspy.Prediction, dict[str, Any]], None] | None = None
    added: str = "original"  # when the fault joined the catalogue: "original", or "issue-21" (written before any run)

    def applies_to(self, system: str) -> bool:
        return system in self.systems

    def apply(self, system: MemorySystem) -> None:
        for name, value in self.knobs.items():
            system.set_knob(name, value)
        if self.after_session is not None:
            self._wrap_ingest(system, self.after_session)
        if self.site is None:
            return
        module = system.prompt_sites()[self.site].module
        original = module.forward
        lists, forced_out, forced_in = self.lists, dict(self.outputs), dict(self.inputs)
        edit_inputs, edit_outputs = self.edit_inputs, self.edit_outputs

        def faulty_forward(**kwargs: Any) -> dspy.Prediction:
            kwargs = {**kwargs, **forced_in}
            if edit_inputs is not None:
                kwargs = edit_inputs(kwargs)
            prediction = original(**kwargs)
            if lists is not None:
                prediction = _map_lists(prediction, lists, kwargs)
            for key, value in forced_out.items():
                prediction[key] = value
            if edit_outputs is not None:
                edit_outputs(prediction, kwargs)
            return prediction

        module.forward = faulty_forward

    @staticmethod
    def _wrap_ingest(system: MemorySystem, hook: Callable[[MemorySystem, set[str]], None]) -> None:
        original = system.ingest

        def faulty_ingest(sessions: Any) -> None:
            for session in sessions:
                before = {m.id for m in system.all_memories()}
                original([session])
                hook(system, before)  # after the first session too (``before`` empty): the old hooks then do nothing

        system.ingest = faulty_ingest  # type: ignore[method-assign]


def delete_old(system: MemorySystem, before: set[str]) -> None:
    """The store removes every unit that existed before this session."""
    for memory_id in sorted(before):
        system.delete_memory(memory_id)


def overwrite_old(system: MemorySystem, before: set[str]) -> None:
    """The store rewrites every unit that existed before this session, its specifics blurred."""
    for item in system.all_memories():
        if item.id in before:
            system.update_memory(item.id, _blur(item.text.split(": ", 1)[-1]))


def _content(item: Any) -> str:
    """What ``update_memory`` takes for ``item``: a raw turn's content (its ``speaker: `` shown in front dropped)."""
    text = str(item.text)
    return text.split(": ", 1)[-1] if (item.metadata or {}).get("kind") == "turn" else text


def lose_alternate_writes(system: MemorySystem, before: set[str]) -> None:
    """The store acknowledges every write of this session but persists only every other one (2nd, 4th, ... lost)."""
    new = [m.id for m in system.all_memories() if m.id not in before]
    for memory_id in new[1::2]:
        system.delete_memory(memory_id)


def shift_old_numbers(system: MemorySystem, before: set[str]) -> None:
    """The store rewrites every unit that existed before this session with each of its numbers one higher."""
    for item in system.all_memories():
        if item.id in before:
            shifted = shift_numbers(_content(item))
            if shifted != _content(item):
                system.update_memory(item.id, shifted)


_BASELINES_AND_MEM0 = ("mem0", "rag_bm25", "rag_embedding", "long_context")
_ALL_SYSTEMS = ("mem0", "graphiti", "long_context", "rag_bm25", "rag_embedding", "md_flat", "tiered", "gated")

CATALOGUE: tuple[Fault, ...] = (
    Fault("mem0-extract-drop-numbers", ("mem0",), MEM0_EXTRACT, ErrorType.EXTRACTION,
          "extraction drops every fact with a date or a number", site=MEM0_EXTRACT, lists=drop_numbers),
    Fault("mem0-extract-first-only", ("mem0",), MEM0_EXTRACT, ErrorType.EXTRACTION,
          "extraction keeps only the first fact of a session", site=MEM0_EXTRACT, lists=first_only),
    Fault("graphiti-edges-dropped", ("graphiti",), GRAPHITI_EXTRACT_EDGES, ErrorType.EXTRACTION,
          "edge (fact) extraction returns no facts", site=GRAPHITI_EXTRACT_EDGES, lists=drop_all),
    Fault("mdflat-curate-first-only", ("md_flat",), MD_FLAT_CURATE, ErrorType.EXTRACTION,
          "curation keeps the old file but only the first new fact", site=MD_FLAT_CURATE,
          lists=lambda items, inputs: [i for i in items if _already_in_file(i, inputs)]
          + [i for i in items if not _already_in_file(i, inputs)][:1]),
    Fault("mdflat-curate-overwrites", ("md_flat",), MD_FLAT_CURATE, ErrorType.UPDATE,
          "curation rewrites every existing fact with its specifics replaced", site=MD_FLAT_CURATE,
          lists=blur_old),
    Fault("mdflat-curate-forgets", ("md_flat",), MD_FLAT_CURATE, ErrorType.DELETION,
          "curation deletes every fact already in the file", site=MD_FLAT_CURATE, lists=forget_old),
    Fault("tiered-extract-first-only", ("tiered",), TIERED_EXTRACT, ErrorType.EXTRACTION,
          "the extraction stage keeps only the first Key|Value line of each message", site=TIERED_EXTRACT,
          lists=first_only),
    Fault("tiered-extract-keys-only", ("tiered",), TIERED_EXTRACT, ErrorType.EXTRACTION,
          "the extraction stage writes keys without values (the wrong format: every line malformed)",
          site=TIERED_EXTRACT, lists=keys_only),
    Fault("tiered-category-matches-nothing", ("tiered",), knob_target("search_recipe"), ErrorType.RETRIEVAL,
          "retrieval searches only a category no fact or summary is filed under (search_recipe=category:archived)",
          knobs={"search_recipe": "category:archived"}),
    Fault("store-deletes-old", ("mem0", "rag_bm25", "rag_embedding", "long_context"), library_target("{system}.store"),
          ErrorType.DELETION, "the store deletes every memory of earlier sessions when a session is added",
          after_session=delete_old),
    Fault("store-overwrites-old", ("mem0", "rag_bm25", "rag_embedding", "long_context"), library_target("{system}.store"),
          ErrorType.UPDATE, "the store rewrites every memory of earlier sessions with its specifics replaced",
          after_session=overwrite_old),
    Fault("top-k-1", ("mem0", "rag_bm25", "rag_embedding", "md_flat", "tiered"), knob_target("top_k"),
          ErrorType.RETRIEVAL, "top_k set to 1", knobs={"top_k": 1}),
    Fault("query-unrelated", ("mem0", "rag_bm25", "rag_embedding", "tiered"), QUERY_REWRITE, ErrorType.RETRIEVAL,
          "the query-rewrite site turns every question into an unrelated query", site=QUERY_REWRITE,
          outputs={"query": UNRELATED_QUERY}, query_site=True),
    Fault("answer-unknown", ("mem0", "graphiti", "long_context", "rag_bm25", "rag_embedding", "md_flat"), ANSWER,
          ErrorType.RESPONSE, "the answer site replies 'unknown'", site=ANSWER, outputs={"answer": "unknown"}),
    Fault("answer-ignores-memories", ("mem0", "graphiti", "long_context", "rag_bm25", "rag_embedding", "md_flat"),
          ANSWER, ErrorType.RESPONSE, "the answer site ignores the memories it is given", site=ANSWER,
          inputs={"memories": "(no memories)"}),
    # --- issue 21, part 2 -------------------------------------------------------------------------------------
    # Ten faults of kinds the catalogue did not have, over store, update, extraction, retrieval and answer.
    # Written down and committed BEFORE any run evaluated them (no figure was seen while writing them), so
    # they are not tuned to the walk. Each one's true target and type say what happened by the taxonomy's
    # definitions (taxonomy.ErrorType), not what the walk is expected to answer. Their first-run figures
    # are reported as they come, next to any later ones.
    # store: writes acknowledged but lost (the evidence never becomes a memory, by the store's fault)
    Fault("store-loses-alternate-writes", _BASELINES_AND_MEM0, library_target("{system}.store"),
          ErrorType.EXTRACTION, "the store acknowledges every write but persists only every other memory unit of "
          "a session (the 2nd, 4th, ... are lost)", after_session=lose_alternate_writes, added="issue-21"),
    # update: a plausible but wrong value written over a kept one (not blurred, not removed)
    Fault("store-shifts-numbers", _BASELINES_AND_MEM0, library_target("{system}.store"), ErrorType.UPDATE,
          "the store rewrites every memory of earlier sessions with each number one higher (3 -> 4, 2023 -> 2024)",
          after_session=shift_old_numbers, added="issue-21"),
    # update: a lossy summary of the existing memory (MemFail's summary error)
    Fault("mdflat-curate-compresses", ("md_flat",), MD_FLAT_CURATE, ErrorType.UPDATE,
          "curation collapses every fact already in the file into one summary line of its first twelve words",
          site=MD_FLAT_CURATE, lists=compress_old, added="issue-21"),
    # extraction: every fact kept, each cut short (partial facts, not dropped facts)
    Fault("mem0-extract-truncates", ("mem0",), MEM0_EXTRACT, ErrorType.EXTRACTION,
          "extraction keeps every fact but cuts each to its first four words", site=MEM0_EXTRACT,
          lists=truncate_facts, added="issue-21"),
    Fault("mdflat-curate-truncates-new", ("md_flat",), MD_FLAT_CURATE, ErrorType.EXTRACTION,
          "curation keeps the old file but cuts every new fact to its first four words", site=MD_FLAT_CURATE,
          lists=truncate_new, added="issue-21"),
    # retrieval: a score cut-off that filters (not a rank cut-off), a query that lost its key terms (not an
    # unrelated one), a search over the wrong layer of the graph
    Fault("threshold-strict", ("mem0", "rag_embedding"), knob_target("threshold"), ErrorType.RETRIEVAL,
          "the similarity threshold set to 0.99", knobs={"threshold": 0.99}, added="issue-21"),
    Fault("query-drops-specifics", ("mem0", "rag_bm25", "rag_embedding"), QUERY_REWRITE, ErrorType.RETRIEVAL,
          "the query rewrite returns the question with its names, numbers and dates removed", site=QUERY_REWRITE,
          edit_outputs=query_without_specifics, query_site=True, added="issue-21"),
    Fault("graphiti-recipe-nodes-only", ("graphiti",), knob_target("search_recipe"), ErrorType.RETRIEVAL,
          "search_recipe set to NODE_HYBRID_SEARCH_RRF: the search returns entity nodes, never the facts (edges)",
          knobs={"search_recipe": "NODE_HYBRID_SEARCH_RRF"}, added="issue-21"),
    # answer: a degenerate output (not a fixed one), and a context cut short at the answer (not emptied)
    Fault("answer-echoes-question", _ALL_SYSTEMS, ANSWER, ErrorType.RESPONSE,
          "the answer site replies with the question itself", site=ANSWER, edit_outputs=echo_question,
          added="issue-21"),
    Fault("answer-sees-first-memory", _ALL_SYSTEMS, ANSWER, ErrorType.RESPONSE,
          "the answer site sees only the first of the memories it is given", site=ANSWER,
          edit_inputs=first_memory_only, added="issue-21"),
    # --- gated (issue 22): written down before any run evaluated them. Truth is the taxonomy's definition: who
    # let the stale memory into the answer's positive context. Lenient floors leave status and branch to the
    # gate's LLM, so there the gate site decides; with the floors off and no LLM asked, the floors knob does.
    Fault("gated-gate-admits-all", ("gated",), GATED_ADMIT, ErrorType.CONTAMINATION,
          "floors lenient (status and branch left to the gate) and the gate admits every candidate it decides",
          site=GATED_ADMIT, knobs={"floors": "lenient"},
          lists=lambda items, _: [i.model_copy(update={"verdict": "admit", "reason": "looks relevant"})
                                  if getattr(i, "by", "floor") != "floor" else i for i in items]),
    Fault("gated-floors-off", ("gated",), knob_target("floors"), ErrorType.CONTAMINATION,
          "floors off and no LLM verdict (gate=floors_only): every retrieved candidate enters the answer",
          knobs={"floors": "off", "gate": "floors_only"}),
    Fault("gated-top-k-1", ("gated",), knob_target("top_k"), ErrorType.RETRIEVAL, "top_k set to 1",
          knobs={"top_k": 1}),
)


def faults_for(system: str, names: Iterable[str] | None = None) -> list[Fault]:
    wanted = set(names) if names else None
    return [f for f in CATALOGUE if f.applies_to(system) and (wanted is None or f.name in wanted)]


# --- the harness --------------------------------------------------------------------------

UNSOUND_CLEAN = "unsound_clean_pass"
EVIDENCE_REACHED = "evidence_reached_answer"
SET_ASIDE_REASONS: dict[str, str] = {
    UNSOUND_CLEAN: "the clean pass was unsound: the evidence did not reach the clean answer (a lucky guess)",
    EVIDENCE_REACHED: "the evidence still reached the answer under the fault: the answer changed only because "
                      "its context did",
}
"""Why a failure a fault caused is set aside from the induced-only figure (it is attributed all the same)."""

MIN_SAMPLE = 10
"""A rate over fewer cases (or a system with fewer clean passes) is flagged as too small to support a figure."""


@dataclass
class Case:
    """One failure a fault caused (the question passed clean) and how its attribution scored.

    ``set_aside`` is ``None`` for an induced failure, else the key of :data:`SET_ASIDE_REASONS` that kept
    it out of the induced-only figure."""

    system: str
    fault: str
    episode: str
    attribution: Attribution
    true_target: str
    true_type: ErrorType
    seconds: float
    llm_calls: int = 0  # LLM calls the attribution itself made (0 for the deterministic pass)
    dataset: str = ""
    question_id: str = ""
    set_aside: str | None = None

    @property
    def induced(self) -> bool:
        return self.set_aside is None

    @property
    def site_ok(self) -> bool:
        return self.attribution.target == self.true_target

    @property
    def type_ok(self) -> bool:
        return self.attribution.error_type == self.true_type

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "fault": self.fault, "dataset": self.dataset, "episode": self.episode,
                "question_id": self.question_id or self.attribution.question_id, "induced": self.induced,
                "set_aside": self.set_aside, "why_set_aside": SET_ASIDE_REASONS.get(self.set_aside or "", ""),
                "true_target": self.true_target, "true_type": self.true_type.value, "site_ok": self.site_ok,
                "type_ok": self.type_ok, "attribution": self.attribution.model_dump(mode="json")}


@dataclass
class CleanBaseline:
    """One episode of one system run clean: the denominator the faults are measured against."""

    system: str
    dataset: str
    episode: str
    questions: int
    passed: int  # questions that passed clean
    sound: int  # of those, the ones whose evidence reached the answer


@dataclass
class FaultTally:
    """One fault on one episode: how many clean passes it turned into failures (``caused``; each is a
    :class:`Case`), and how many questions failed clean and under the fault alike (not its doing)."""

    system: str
    dataset: str
    episode: str
    fault: str
    true_target: str
    true_type: str
    added: str
    questions: int
    passed_clean: int
    caused: int = 0
    failed_both: int = 0
    ran: bool = True  # False: nothing passed clean, so the fault was not run


@dataclass
class PlantedRun:
    """Every failure the faults caused (``cases``: induced and set aside), the clean runs' denominators
    (``baselines``) and each fault's tally per episode (``tallies``)."""

    cases: list[Case]
    baselines: list[CleanBaseline] = field(default_factory=list)
    tallies: list[FaultTally] = field(default_factory=list)

    @property
    def induced(self) -> list[Case]:
        return [c for c in self.cases if c.induced]

    @property
    def set_aside(self) -> list[Case]:
        return [c for c in self.cases if not c.induced]

    @property
    def collateral(self) -> list[tuple[str, str, str]]:
        """The set-aside failures as (system, fault, question id), as this report first called them."""
        return [(c.system, c.fault, c.question_id) for c in self.set_aside]

    def __iadd__(self, other: PlantedRun) -> PlantedRun:
        self.cases += other.cases
        self.baselines += other.baselines
        self.tallies += other.tallies
        return self


def _run(system_factory: Callable[..., MemorySystem], run_dir: Path, episode: Any, fault: Fault | None,
         dataset_uri: str, lm: OptloopLM, attributor: Attributor | None = None,
         workers: Workers | None = None) -> EpisodeResult:
    """``episode`` through the one pipeline on a fresh system in ``run_dir``, with ``fault`` planted."""

    def make(_episode: Any) -> MemorySystem:
        shutil.rmtree(run_dir, ignore_errors=True)
        system = system_factory(run_dir, query_site=bool(fault and fault.query_site))
        if fault is not None:
            try:
                fault.apply(system)
            except BaseException:
                system.close()
                raise
        return system

    return run_episode(episode, FreshStores(make, lm, dataset_uri=dataset_uri), lm=lm, attributor=attributor,
                       workers=workers)


class _Caused:
    """``Attributor.select`` of a fault run: every failure of a question that passed clean is attributed
    (the fault caused it); ``reasons`` records, per question id, why one is set aside from the induced-only
    figure (``None``: induced)."""

    def __init__(self, fault: Fault, passing: set[str], sound: set[str], judges: Any, embedder: Any):
        self.fault, self.passing, self.sound = fault, passing, sound
        self.judges, self.embedder = judges, embedder
        self.reasons: dict[str, str | None] = {}

    def __call__(self, q: Any, prediction: str, graph: Any) -> bool:
        if q.id not in self.passing:
            return False  # it failed clean too: not the fault's doing
        if q.id not in self.sound:
            # The clean run passed without the evidence reaching the answer (a lucky guess):
            # no sound baseline to plant a fault against.
            self.reasons[q.id] = UNSOUND_CLEAN
        elif (self.fault.site != ANSWER and self.fault.error_type is not ErrorType.CONTAMINATION
              and evidence_reaches_answer(graph, q, self.judges, embedder=self.embedder)):
            # (a contamination fault leaves the evidence in reach by definition: a stale value joins it)
            # The fault did not keep the evidence from the answer; the answer changed only because
            # its context did.
            self.reasons[q.id] = EVIDENCE_REACHED
        else:
            self.reasons[q.id] = None
        return True


def run_planted(systems: Sequence[str], dataset: Dataset, lm: OptloopLM, work: Path, *,
                embedder: Embedder | None = None, fault_names: Iterable[str] | None = None,
                progress: Callable[[str], None] | None = None) -> PlantedRun:
    """Run every system clean and under each of its faults; attribute every failure a fault caused.

    Every run goes through the one episode pipeline (:func:`optloop.pipeline.run_episode`): the clean
    run unattributed, each fault run attributing the failures of the questions that passed clean (each
    marked induced or set aside, with the reason). At ``--concurrency`` N > 1 the episodes of a system
    go N at a time (each its clean run, then its fault runs), their results and ``progress`` lines
    taken in episode order.
    """
    from systems import get_system

    if embedder is None:
        from optloop.embed import get_embedder

        embedder = get_embedder()
    names = list(fault_names) if fault_names else None
    planted = PlantedRun([])
    say = progress or (lambda line: None)
    for system_name in systems:
        cls = get_system(system_name)

        def factory(run_dir: Path, query_site: bool = False, _cls: Any = cls) -> MemorySystem:
            return _cls(lm, run_dir, embedder=embedder, query_site=query_site)

        faults = faults_for(system_name, names)
        if not faults:
            continue

        def plant(episode: Any, workers: Workers | None = None, report: Callable[[str], None] = say,
                  _system: str = system_name, _factory: Any = factory, _faults: Any = faults) -> PlantedRun:
            return _plant_episode(_system, _factory, _faults, episode, dataset.uri, lm, work, embedder, workers,
                                  report)

        n = concurrency(lm)
        if n == 1:
            for episode in dataset.episodes:
                planted += plant(episode)
            continue
        with Workers(n) as workers:
            for piece, lines in workers.episodes(lambda episode: _with_lines(plant, episode, workers),
                                                 dataset.episodes):
                planted += piece
                for line in lines:
                    say(line)
    return planted


def _with_lines(plant: Callable[..., PlantedRun], episode: Any, workers: Workers) -> tuple[PlantedRun, list[str]]:
    """``plant(episode)`` with its progress lines kept, to be said in episode order."""
    lines: list[str] = []
    return plant(episode, workers, lines.append), lines


def _plant_episode(system_name: str, factory: Callable[..., MemorySystem], faults: Sequence[Fault], episode: Any,
                   dataset_uri: str, lm: OptloopLM, work: Path, embedder: Embedder, workers: Workers | None,
                   say: Callable[[str], None]) -> PlantedRun:
    """One episode of :func:`run_planted`: its clean run, then each fault's run, attributed."""
    planted = PlantedRun([])
    clean_run = _run(factory, work / system_name / "clean" / episode.id, episode, None, dataset_uri, lm,
                     workers=workers)
    clean_graph, clean = clean_run.graph, clean_run.predictions
    passing = {q.id for q in episode.questions if passed(q, clean[q.id])}
    judges = default_judges(embedder)
    # A clean pass is a sound baseline only if the evidence reached the answer (not a lucky guess).
    sound = {q.id for q in episode.questions
             if q.id in passing and evidence_reaches_answer(clean_graph, q, judges, embedder=embedder)}
    planted.baselines.append(CleanBaseline(system_name, dataset_uri, episode.id, len(episode.questions),
                                           len(passing), len(sound)))
    say(f"{system_name} {episode.id}: {len(passing)}/{len(episode.questions)} pass clean")
    for fault in faults:
        tally = FaultTally(system_name, dataset_uri, episode.id, fault.name,
                           fault.target.format(system=system_name), fault.error_type.value, fault.added,
                           len(episode.questions), len(passing), ran=bool(passing))
        planted.tallies.append(tally)
        if not passing:
            continue
        caused = _Caused(fault, passing, sound, judges, embedder)
        run = _run(factory, work / system_name / fault.name / episode.id, episode, fault, dataset_uri, lm,
                   Attributor(judges, embedder, select=caused), workers=workers)
        for outcome in run.outcomes:
            if outcome.passed:
                continue
            if outcome.question_id not in passing:
                tally.failed_both += 1
            elif outcome.attribution is not None:
                tally.caused += 1
                planted.cases.append(Case(
                    system_name, fault.name, episode.id, outcome.attribution, tally.true_target,
                    fault.error_type, run.attribution_s[outcome.question_id],
                    run.attribution_calls[outcome.question_id], dataset=dataset_uri,
                    question_id=outcome.question_id, set_aside=caused.reasons.get(outcome.question_id)))
        say(f"{system_name} {episode.id} {fault.name}: {tally.caused} failure(s) caused "
            f"({sum(c.fault == fault.name and c.induced for c in planted.cases)} induced)")
    return planted


# --- the figures --------------------------------------------------------------------------


def rate(values: Sequence[bool], *, what: str, seed: int = 0, min_n: int = MIN_SAMPLE) -> dict[str, Any]:
    """The share of ``values`` that are true, with its seeded 95% bootstrap interval.

    An empty sample gives ``estimate`` ``None`` and the note "nothing to score (0 <what>)"; a sample
    under ``min_n`` is flagged ``small_sample`` with a note saying it is too small to support a figure."""
    n = len(values)
    if n == 0:
        return {"n": 0, "k": 0, "estimate": None, "low": None, "high": None, "confidence": 0.95,
                "small_sample": True, "note": f"nothing to score (0 {what})"}
    interval = bootstrap_mean([float(v) for v in values], seed=seed)
    small = n < min_n
    return {"n": n, "k": int(sum(bool(v) for v in values)), "estimate": interval.estimate, "low": interval.low,
            "high": interval.high, "confidence": interval.confidence, "small_sample": small,
            "note": f"too small to support a figure (n={n} < {min_n})" if small else ""}


def format_rate(r: dict[str, Any], *, compact: bool = False) -> str:
    """``0.750 [0.250, 1.000] (n=4)``, with the small-sample warning; the empty sample's note instead of a number.

    ``compact`` (a table cell): ``3/4 0.75 [0.25, 1.00]*``, ``*`` marking a sample too small to support a figure."""
    if not r["n"]:
        return "nothing to score" if compact else r["note"]
    if compact:
        return f"{r['k']}/{r['n']} {r['estimate']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" + ("*" if r["small_sample"]
                                                                                          else "")
    text = f"{r['estimate']:.3f} [{r['low']:.3f}, {r['high']:.3f}] (n={r['n']})"
    return f"{text}; {r['note']}" if r["note"] else text


def _block(group: Sequence[Case], what: str, seed: int) -> dict[str, Any]:
    """``n``, point ``site_accuracy`` / ``type_accuracy`` (``None`` when empty) and both rates with intervals."""
    site = rate([c.site_ok for c in group], what=what, seed=seed)
    kind = rate([c.type_ok for c in group], what=what, seed=seed)
    return {"n": len(group), "site_accuracy": site["estimate"], "type_accuracy": kind["estimate"], "site": site,
            "type": kind}


def _ms(cases: Sequence[Case]) -> tuple[float | None, float | None]:
    ms = sorted(c.seconds * 1000 for c in cases)
    if not ms:
        return None, None
    return ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.95))]


def summarize(run: PlantedRun, *, seed: int = 0, min_n: int = MIN_SAMPLE) -> dict[str, Any]:
    """The planted figures: the induced-only accuracy (top-level ``n``, ``site_accuracy``, ``type_accuracy``
    and ``induced``) next to the accuracy over every failure a fault caused (``all_failures``), what was
    set aside and why (``set_aside``), per fault and per planted type, and the denominators (clean passes
    per system and dataset, failures caused per fault). Every rate has a seeded 95% interval."""
    cases, induced, aside = run.cases, run.induced, run.set_aside

    fault_keys = list(dict.fromkeys(f"{t.system}/{t.fault}" for t in run.tallies))
    fault_keys += [k for k in dict.fromkeys(f"{c.system}/{c.fault}" for c in cases) if k not in fault_keys]
    by_fault: dict[str, Any] = {}
    for key in sorted(fault_keys):
        group = [c for c in cases if f"{c.system}/{c.fault}" == key]
        tallies = [t for t in run.tallies if f"{t.system}/{t.fault}" == key]
        first = tallies[0] if tallies else None
        ind = [c for c in group if c.induced]
        by_fault[key] = {
            **_block(ind, "induced failures", seed),  # n, site/type accuracy: induced only, as before
            "caused": len(group), "induced": _block(ind, "induced failures", seed),
            "all": _block(group, "failures caused", seed),
            "set_aside": {r: sum(c.set_aside == r for c in group) for r in SET_ASIDE_REASONS},
            "questions": sum(t.questions for t in tallies), "passed_clean": sum(t.passed_clean for t in tallies),
            "failed_both": sum(t.failed_both for t in tallies),
            "true_target": first.true_target if first else (group[0].true_target if group else ""),
            "true_type": first.true_type if first else (group[0].true_type.value if group else ""),
            "added": first.added if first else "",
        }
    by_type: dict[str, Any] = {}
    for t in sorted({c.true_type.value for c in cases}):
        group = [c for c in cases if c.true_type.value == t]
        ind = [c for c in group if c.induced]
        by_type[t] = {**_block(ind, "induced failures", seed), "caused": len(group),
                      "induced": _block(ind, "induced failures", seed), "all": _block(group, "failures caused", seed)}

    # The faults by when they joined the catalogue: the issue-21 ones' figures apart from the original ones'.
    added_of = {(t.system, t.fault): t.added for t in run.tallies}
    by_added: dict[str, Any] = {}
    for added in sorted(set(added_of.values()) | {added_of.get((c.system, c.fault), "original") for c in cases}):
        group = [c for c in cases if added_of.get((c.system, c.fault), "original") == added]
        ind = [c for c in group if c.induced]
        by_added[added] = {**_block(ind, "induced failures", seed), "caused": len(group),
                           "induced": _block(ind, "induced failures", seed),
                           "all": _block(group, "failures caused", seed),
                           "passed_clean": sum(t.passed_clean for t in run.tallies if t.added == added)}

    denominators = []
    for system, dataset in dict.fromkeys((b.system, b.dataset) for b in run.baselines):
        rows = [b for b in run.baselines if (b.system, b.dataset) == (system, dataset)]
        passed_clean = sum(b.passed for b in rows)
        small = passed_clean < min_n
        denominators.append({
            "system": system, "dataset": dataset, "episodes": len(rows), "questions": sum(b.questions for b in rows),
            "passed_clean": passed_clean, "sound_clean": sum(b.sound for b in rows),
            "failures_caused": sum(c.system == system and c.dataset == dataset for c in cases),
            "small_sample": small,
            "note": f"{passed_clean} clean pass(es) < {min_n}: too small to support a figure" if small else ""})

    median, p95 = _ms(cases)
    return {
        **_block(induced, "induced failures", seed),  # n, site_accuracy, type_accuracy: induced only, as before
        "induced": _block(induced, "induced failures", seed),
        "all_failures": _block(cases, "failures caused", seed),
        "set_aside": {"n": len(aside), "by_reason": {
            r: {"description": d, **_block([c for c in aside if c.set_aside == r], "failures set aside for this reason",
                                           seed)} for r, d in SET_ASIDE_REASONS.items()}},
        "by_fault": by_fault, "by_type": by_type, "by_added": by_added, "denominators": denominators,
        "tallies": [asdict(t) for t in run.tallies],
        "systems_covered": sorted({c.system for c in cases}),
        "attribution_llm_calls": sum(c.llm_calls for c in cases),
        "collateral": len(aside),
        "median_attribution_ms": median, "p95_attribution_ms": p95,
        "min_sample": min_n, "seed": seed, "confidence": 0.95,
    }
