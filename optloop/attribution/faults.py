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
episodes; a question that passes clean and fails under the fault is an
*induced failure*, and its attribution is scored: site accuracy (the blamed
target is the planted one) and type accuracy (the error type is).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy

from optloop.attribution.decisive import evidence_reaches_answer
from optloop.attribution.judges import default_judges
from optloop.attribution.taxonomy import Attribution, ErrorType, knob_target, library_target
from optloop.datasets import passed
from optloop.pipeline import Attributor, EpisodeResult, FreshStores, run_episode
from optloop.sites import ANSWER, GATED_ADMIT, GRAPHITI_EXTRACT_EDGES, MD_FLAT_CURATE, MEM0_EXTRACT, QUERY_REWRITE

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
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


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
    words = text.split()
    out = [("something" if i > 0 and (w[:1].isupper() or any(c.isdigit() for c in w)) else w)
           for i, w in enumerate(words)]
    if out == words and words:
        out[-1] = "something"
    return " ".join(out)


# --- output/input transforms --------------------------------------------------------------


def drop_numbers(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return [i for i in items if not _NUMBERISH.search(_item_text(i))]


def first_only(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return items[:1]


def drop_all(items: list[Any], _: dict[str, Any]) -> list[Any]:
    return []


def forget_old(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    return [i for i in items if not _already_in_file(i, inputs)]


def blur_old(items: list[Any], inputs: dict[str, Any]) -> list[Any]:
    return [(_blur(i) if isinstance(i, str) and _already_in_file(i, inputs) else i) for i in items]


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

        def faulty_forward(**kwargs: Any) -> dspy.Prediction:
            kwargs = {**kwargs, **forced_in}
            prediction = original(**kwargs)
            if lists is not None:
                prediction = _map_lists(prediction, lists, kwargs)
            for key, value in forced_out.items():
                prediction[key] = value
            return prediction

        module.forward = faulty_forward

    @staticmethod
    def _wrap_ingest(system: MemorySystem, hook: Callable[[MemorySystem, set[str]], None]) -> None:
        original = system.ingest

        def faulty_ingest(sessions: Any) -> None:
            for session in sessions:
                before = {m.id for m in system.all_memories()}
                original([session])
                if before:
                    hook(system, before)

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
    Fault("store-deletes-old", ("mem0", "rag_bm25", "rag_embedding", "long_context"), library_target("{system}.store"),
          ErrorType.DELETION, "the store deletes every memory of earlier sessions when a session is added",
          after_session=delete_old),
    Fault("store-overwrites-old", ("mem0", "rag_bm25", "rag_embedding", "long_context"), library_target("{system}.store"),
          ErrorType.UPDATE, "the store rewrites every memory of earlier sessions with its specifics replaced",
          after_session=overwrite_old),
    Fault("top-k-1", ("mem0", "rag_bm25", "rag_embedding", "md_flat"), knob_target("top_k"), ErrorType.RETRIEVAL,
          "top_k set to 1", knobs={"top_k": 1}),
    Fault("query-unrelated", ("mem0", "rag_bm25", "rag_embedding"), QUERY_REWRITE, ErrorType.RETRIEVAL,
          "the query-rewrite site turns every question into an unrelated query", site=QUERY_REWRITE,
          outputs={"query": UNRELATED_QUERY}, query_site=True),
    Fault("answer-unknown", ("mem0", "graphiti", "long_context", "rag_bm25", "rag_embedding", "md_flat"), ANSWER,
          ErrorType.RESPONSE, "the answer site replies 'unknown'", site=ANSWER, outputs={"answer": "unknown"}),
    Fault("answer-ignores-memories", ("mem0", "graphiti", "long_context", "rag_bm25", "rag_embedding", "md_flat"),
          ANSWER, ErrorType.RESPONSE, "the answer site ignores the memories it is given", site=ANSWER,
          inputs={"memories": "(no memories)"}),
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


@dataclass
class Case:
    """One induced failure and how its attribution scored."""

    system: str
    fault: str
    episode: str
    attribution: Attribution
    true_target: str
    true_type: ErrorType
    seconds: float
    llm_calls: int = 0  # LLM calls the attribution itself made (0 for the deterministic pass)

    @property
    def site_ok(self) -> bool:
        return self.attribution.target == self.true_target

    @property
    def type_ok(self) -> bool:
        return self.attribution.error_type == self.true_type


@dataclass
class PlantedRun:
    """The induced failures, and the fault-run failures not counted (``collateral``): the clean run
    passed without the evidence reaching its answer, or the fault left the evidence in front of it."""

    cases: list[Case]
    collateral: list[tuple[str, str, str]] = field(default_factory=list)  # (system, fault, question id)

    def __iadd__(self, other: PlantedRun) -> PlantedRun:
        self.cases += other.cases
        self.collateral += other.collateral
        return self


def _run(system_factory: Callable[..., MemorySystem], run_dir: Path, episode: Any, fault: Fault | None,
         dataset_uri: str, lm: OptloopLM, attributor: Attributor | None = None) -> EpisodeResult:
    """``episode`` through the one pipeline on a fresh system in ``run_dir``, with ``fault`` planted."""

    def make(_episode: Any) -> MemorySystem:
        shutil.rmtree(run_dir, ignore_errors=True)
        system = system_factory(run_dir, query_site=bool(fault and fault.query_site))
        if fault is not None:
            try:
                fault.apply(system)
            except BaseException:
                getattr(system, "close", lambda: None)()
                raise
        return system

    return run_episode(episode, FreshStores(make, lm, dataset_uri=dataset_uri), lm=lm, attributor=attributor)


class _Induced:
    """``Attributor.select`` of a fault run: which failures are induced by the fault (attributed), and the
    ones that are not, kept as ``collateral``."""

    def __init__(self, system: str, fault: Fault, passing: set[str], sound: set[str], judges: Any, embedder: Any,
                 collateral: list[tuple[str, str, str]]):
        self.system, self.fault, self.passing, self.sound = system, fault, passing, sound
        self.judges, self.embedder, self.collateral = judges, embedder, collateral

    def __call__(self, q: Any, prediction: str, graph: Any) -> bool:
        if q.id not in self.passing:
            return False
        if q.id not in self.sound:
            # The clean run passed without the evidence reaching the answer (a lucky guess):
            # no sound baseline to plant a fault against. Counted apart.
            self.collateral.append((self.system, self.fault.name, q.id))
            return False
        if self.fault.site != ANSWER and evidence_reaches_answer(graph, q, self.judges, embedder=self.embedder):
            # The fault did not keep the evidence from the answer; the answer changed only
            # because its context did. Not a failure of the planted operation: counted apart.
            self.collateral.append((self.system, self.fault.name, q.id))
            return False
        return True


def run_planted(systems: Sequence[str], dataset: Dataset, lm: OptloopLM, work: Path, *,
                embedder: Embedder | None = None, fault_names: Iterable[str] | None = None,
                progress: Callable[[str], None] | None = None) -> PlantedRun:
    """Run every system clean and under each of its faults; attribute every induced failure.

    Every run goes through the one episode pipeline (:func:`optloop.pipeline.run_episode`): the clean
    run unattributed, each fault run attributing only the failures the fault induced.
    """
    from systems import get_system

    if embedder is None:
        from optloop.embed import get_embedder

        embedder = get_embedder()
    names = list(fault_names) if fault_names else None
    cases: list[Case] = []
    collateral: list[tuple[str, str, str]] = []
    for system_name in systems:
        cls = get_system(system_name)

        def factory(run_dir: Path, query_site: bool = False, _cls: Any = cls) -> MemorySystem:
            return _cls(lm, run_dir, embedder=embedder, query_site=query_site)

        faults = faults_for(system_name, names)
        if not faults:
            continue
        for episode in dataset.episodes:
            clean_run = _run(factory, work / system_name / "clean" / episode.id, episode, None, dataset.uri, lm)
            clean_graph, clean = clean_run.graph, clean_run.predictions
            passing = {q.id for q in episode.questions if passed(q, clean[q.id])}
            judges = default_judges(embedder)
            # A clean pass is a sound baseline only if the evidence reached the answer (not a lucky guess).
            sound = {q.id for q in episode.questions
                     if q.id in passing and evidence_reaches_answer(clean_graph, q, judges, embedder=embedder)}
            if progress:
                progress(f"{system_name} {episode.id}: {len(passing)}/{len(episode.questions)} pass clean")
            if not passing:
                continue
            for fault in faults:
                induced = _Induced(system_name, fault, passing, sound, judges, embedder, collateral)
                run = _run(factory, work / system_name / fault.name / episode.id, episode, fault, dataset.uri, lm,
                           Attributor(judges, embedder, select=induced))
                for outcome in run.outcomes:
                    if outcome.attribution is not None:
                        cases.append(Case(system_name, fault.name, episode.id, outcome.attribution,
                                          fault.target.format(system=system_name), fault.error_type,
                                          run.attribution_s[outcome.question_id],
                                          run.attribution_calls[outcome.question_id]))
                if progress:
                    progress(f"{system_name} {episode.id} {fault.name}: {len(cases)} induced failures so far")
    return PlantedRun(cases, collateral)


def summarize(run: PlantedRun) -> dict[str, Any]:
    """``site_accuracy``, ``type_accuracy`` and ``n``, overall and per fault."""
    cases = run.cases

    def block(group: Sequence[Case]) -> dict[str, Any]:
        n = len(group)
        return {"n": n, "site_accuracy": sum(c.site_ok for c in group) / n if n else None,
                "type_accuracy": sum(c.type_ok for c in group) / n if n else None}

    by_fault: dict[str, list[Case]] = {}
    for c in cases:
        by_fault.setdefault(f"{c.system}/{c.fault}", []).append(c)
    by_type: dict[str, list[Case]] = {}
    for c in cases:
        by_type.setdefault(c.true_type.value, []).append(c)
    ms = sorted(c.seconds * 1000 for c in cases)
    return {**block(cases), "by_fault": {k: block(v) for k, v in sorted(by_fault.items())},
            "by_type": {k: block(v) for k, v in sorted(by_type.items())},
            "systems_covered": sorted({c.system for c in cases}),
            "attribution_llm_calls": sum(c.llm_calls for c in cases),
            "collateral": len(run.collateral),
            "median_attribution_ms": ms[len(ms) // 2] if ms else None,
            "p95_attribution_ms": ms[min(len(ms) - 1, int(len(ms) * 0.95))] if ms else None}
