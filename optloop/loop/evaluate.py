"""Evaluate a candidate: ingest (or reuse the store), answer, score, attribute every failure.

One **evaluation** is one candidate run over one split: every episode's store
(ingested with the candidate's ingest-stage prompts, or reused), then each
question retrieved, answered and scored, and each wrong answer attributed to
its decisive operation. ``--budget N`` counts these on the dev split.

Ingestion reuse (DESIGN decision 7): the store after ingesting an episode is
kept, live, under the key (system, ingest sites' instructions and demos,
episode). A candidate that changes only retrieve or answer sites, or knobs,
asks its questions against the same store and costs only its question calls.
Ingestion always runs on the system's own LM (an optimizer's temperature
variants apply to retrieve and answer sites), so a store is a pure function of
its key; the persistent LM cache makes rebuilding an evicted store cheap.

LM faults: the LM layer retries transient faults. A fault that outlasts the
retries fails the question it hit (or every question of the episode whose
ingestion it hit): recorded on the outcome, and the evaluation goes on. An
*unreachable* endpoint (refused, timing out twice in a call, or answering only
HTTP 5xx to 3 calls in a row) is different:
failing every remaining question would waste the run, so the evaluation raises
:class:`~optloop.errors.EndpointDownError` and the loop stops with its
checkpoint intact (the same command resumes it). Every episode whose calls hit a
fault, cured or not, has its execution graph saved under
``<work>/graphs/<split>/<candidate>/<episode>.json``: the faulted operations
carry ``lm_attempts``, ``lm_faults`` and ``lm_error``.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy
from pydantic import BaseModel, Field

from optloop.attribution import Attribution, attribute, blame, default_judges
from optloop.datasets import Dataset, Episode, Question, passed, score
from optloop.errors import EndpointDownError, LMError, LMUnreachableError
from optloop.loop.candidate import Candidate, apply_state, candidate_from_modules, ingest_key
from optloop.tracing.graph import ExecutionGraph
from optloop.tracing.recorder import Recorder
from systems import get_system

if TYPE_CHECKING:
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM
    from systems.base import MemorySystem

logger = logging.getLogger(__name__)


class QuestionOutcome(BaseModel):
    episode_id: str
    question_id: str
    task_type: str
    question: str
    gold: str
    prediction: str
    score: float
    passed: bool
    attribution: Attribution | None = None
    error: str | None = Field(None, description="the LM fault that stopped this question (it counts as failed)")


class Evaluation(BaseModel):
    """One candidate on one split."""

    split: str
    candidate: str = Field(description="the candidate's digest")
    outcomes: list[QuestionOutcome]
    llm_calls: int = Field(0, description="LLM requests made (cache hits included)")
    model_calls: int = Field(0, description="requests the model actually computed (not from the cache)")
    ingest_calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    stores_reused: int = 0
    stores_built: int = 0
    lm_attempt_faults: int = Field(0, description="failed LM attempts during this evaluation, cured or not")
    lm_cured: int = Field(0, description="of those, attempts whose call a retry then completed")
    lm_failed_calls: int = Field(0, description="LM calls that failed after their retries (their questions failed)")
    fault_graphs: list[str] = Field(default_factory=list,
                                    description="saved execution graphs of the episodes whose LM calls hit a fault")

    @property
    def errors(self) -> int:
        return sum(o.error is not None for o in self.outcomes)

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def accuracy(self) -> float:
        return sum(o.passed for o in self.outcomes) / self.n if self.n else 0.0

    def per_task(self) -> dict[str, float]:
        tasks: dict[str, list[bool]] = {}
        for o in self.outcomes:
            tasks.setdefault(o.task_type, []).append(o.passed)
        return {t: sum(v) / len(v) for t, v in sorted(tasks.items())}

    def attributions(self) -> list[Attribution]:
        return [o.attribution for o in self.outcomes if o.attribution is not None]

    def error_counts(self) -> dict[str, int]:
        return dict(Counter(a.error_type.value for a in self.attributions()))

    def blame(self) -> list[Any]:
        return blame(self.attributions())


@dataclass
class Store:
    """An episode ingested under one ingest key: the live system and the ingestion graph."""

    system: MemorySystem
    graph: ExecutionGraph
    llm_calls: int


class Evaluator:
    """Runs candidates of one system over episodes, reusing stores by ingest key."""

    def __init__(self, system_name: str, lm: OptloopLM, work: Path, *, embedder: Embedder | None = None,
                 knobs: Mapping[str, Any] | None = None, dataset_uri: str = "", max_live: int = 8):
        from optloop.embed import get_embedder

        self.system_name = system_name
        self.cls = get_system(system_name)
        self.lm = lm
        self.work = Path(work)
        self.embedder = embedder or get_embedder()
        self.dataset_uri = dataset_uri
        self.max_live = max_live
        self.judges = default_judges(self.embedder)
        self.template = self.cls(lm, self.work / "template", embedder=self.embedder, knobs=dict(knobs or {}))
        self.sites = self.template.prompt_sites()
        self.stages = {name: site.stage for name, site in self.sites.items()}
        self._stores: OrderedDict[tuple[str, str], Store] = OrderedDict()
        self._episodes: dict[str, tuple[Episode, dict[str, Question]]] = {}

    def register(self, *datasets: Dataset) -> None:
        """Make these datasets' episodes known to :meth:`lookup` (what a program's examples name)."""
        for dataset in datasets:
            for episode in dataset.episodes:
                self._episodes[episode.id] = (episode, {q.id: q for q in episode.questions})

    def lookup(self, episode_id: str, question_id: str) -> tuple[Episode, Question]:
        episode, questions = self._episodes[episode_id]
        return episode, questions[question_id]

    def __deepcopy__(self, memo: dict[int, Any]) -> Evaluator:
        return self  # programs holding the evaluator are deep-copied by optimizers; the stores are shared

    # --- candidates -----------------------------------------------------------------------

    def baseline(self) -> Candidate:
        return candidate_from_modules({n: s.module for n, s in self.sites.items()}, self.template.knobs(), "baseline")

    def modules(self, candidate: Candidate) -> dict[str, dspy.Predict]:
        """Fresh DSPy modules carrying ``candidate``'s instructions and demos, one per site."""
        modules = {}
        for name, site in self.sites.items():
            module = site.module.deepcopy()
            module.lm = None
            if name in candidate.sites:
                apply_state(module, candidate.sites[name])
            modules[name] = module
        return modules

    # --- stores ---------------------------------------------------------------------------

    def store(self, candidate: Candidate, episode: Episode, modules: Mapping[str, dspy.Predict]) -> tuple[Store, bool]:
        """The episode ingested with ``candidate``'s ingest sites; ``True`` when it was reused."""
        key = (ingest_key(self.system_name, candidate, self.stages), episode.id)
        if key in self._stores:
            self._stores.move_to_end(key)
            return self._stores[key], True
        run_dir = self.work / "stores" / key[0] / episode.id
        shutil.rmtree(run_dir, ignore_errors=True)
        system = self.cls(self.lm, run_dir, embedder=self.embedder, knobs=candidate.knobs)
        ingest_modules = {n: m for n, m in modules.items() if self.stages.get(n) == "ingest"}
        saved_lms = {n: m.lm for n, m in ingest_modules.items()}
        mark = self.lm.accounting.mark()
        recorder = None
        try:
            for module in ingest_modules.values():
                module.lm = None  # ingestion runs on the system's own LM (see the module docstring)
            system.use_modules(dict(modules))
            with Recorder(system, episode, dataset=self.dataset_uri) as recorder:
                recorder.ingest(episode.sessions)
        except BaseException as exc:
            getattr(system, "close", lambda: None)()
            if recorder is not None:  # what ran before the fault, the failed call marked: for the fault graph
                exc.partial_graph = recorder.graph  # type: ignore[attr-defined]
            raise
        finally:
            for name, lm in saved_lms.items():
                ingest_modules[name].lm = lm
        store = Store(system, recorder.graph, self.lm.accounting.totals(since=mark).calls)
        self._stores[key] = store
        while len(self._stores) > self.max_live:
            _, old = self._stores.popitem(last=False)
            getattr(old.system, "close", lambda: None)()
        return store, False

    # --- questions ------------------------------------------------------------------------

    def ask(self, store: Store, candidate: Candidate, modules: Mapping[str, dspy.Predict], episode: Episode,
            question: Question, *, attribute_failures: bool = True,
            graph: ExecutionGraph | None = None) -> QuestionOutcome:
        """Retrieve, answer, score and attribute one question against ``store``.

        ``graph`` (a copy of ``store.graph``) collects this question's operations, the
        failed one included when an LM fault stops it: one graph for an episode's questions.
        """
        system = store.system
        system.use_modules(dict(modules))
        for name, value in candidate.knobs.items():
            system.set_knob(name, value)
        with Recorder.resume(system, store.graph) as recorder:
            try:
                prediction = recorder.ask(question)
            finally:
                if graph is not None:
                    graph.absorb(recorder.graph, since=len(store.graph.operations))
        ok = passed(question, prediction)
        attribution = None
        if not ok and attribute_failures:
            attribution = attribute(recorder.graph, question, prediction, self.judges, embedder=self.embedder)
        return QuestionOutcome(episode_id=episode.id, question_id=question.id, task_type=question.task_type,
                               question=question.question, gold=question.gold, prediction=prediction,
                               score=score(question, prediction), passed=ok, attribution=attribution)

    def evaluate(self, candidate: Candidate, dataset: Dataset, *, split: str = "dev",
                 progress: Callable[[int], None] | None = None) -> Evaluation:
        """Run ``candidate`` over every episode of ``dataset``; ``progress(n)`` after each question.

        Raises :class:`EndpointDownError` when the LM endpoint is unreachable (see the module docstring).
        """
        self.check_endpoint()
        modules = self.modules(candidate)
        mark = self.lm.accounting.mark()
        started = time.perf_counter()
        outcomes, ingest_calls, reused, built, graphs = [], 0, 0, 0, []
        for episode in dataset.episodes:
            episode_mark = self.lm.accounting.mark()
            try:
                store, was_cached = self.store(candidate, episode, modules)
            except LMError as exc:  # the candidate's ingestion hit an LM fault: its questions fail, the loop goes on
                partial = getattr(exc, "partial_graph", None)
                if partial is not None:
                    graphs.append(self._save_graph(partial, split, candidate, episode))
                self._stop_if_down(exc)
                logger.warning("episode %s: ingestion failed under candidate %s: %s", episode.id, candidate.origin, exc)
                outcomes += [self._failed(episode, q, f"ingestion: {exc}") for q in episode.questions]
                continue
            if was_cached:
                reused += 1
            else:
                built += 1
                ingest_calls += store.llm_calls
            graph = store.graph.model_copy(deep=True)
            graph.meta["evaluation"] = {"split": split, "candidate": candidate.digest(), "origin": candidate.origin,
                                        "store_reused": was_cached, "first_op": 0 if not was_cached
                                        else len(store.graph.operations)}
            try:
                for question in episode.questions:
                    try:
                        outcomes.append(self.ask(store, candidate, modules, episode, question, graph=graph))
                    except LMError as exc:
                        self._stop_if_down(exc)
                        logger.warning("question %s failed under candidate %s: %s", question.id, candidate.origin,
                                       exc)
                        outcomes.append(self._failed(episode, question, str(exc)))
                    if progress:
                        progress(1)
            finally:
                if self.lm.accounting.totals(since=episode_mark).faults:
                    graphs.append(self._save_graph(graph, split, candidate, episode))
        usage = self.lm.accounting.totals(since=mark)
        return Evaluation(split=split, candidate=candidate.digest(), outcomes=outcomes, llm_calls=usage.calls,
                          model_calls=usage.model_calls, ingest_calls=ingest_calls, tokens=usage.tokens,
                          seconds=round(time.perf_counter() - started, 2), stores_reused=reused, stores_built=built,
                          lm_attempt_faults=usage.faults, lm_cured=usage.cured, lm_failed_calls=usage.errors,
                          fault_graphs=graphs)

    # --- LM faults ------------------------------------------------------------------------

    def check_endpoint(self) -> None:
        """Before new work: if the last LM call found the endpoint unreachable, ask it once more."""
        if self.lm.endpoint_down is None:
            return
        try:
            self.lm.text("ping", max_tokens=1, cache=False)
        except LMUnreachableError as exc:
            raise EndpointDownError(str(exc)) from exc
        except LMError:
            pass  # it answers (with an error of another kind): the questions will tell

    @staticmethod
    def _stop_if_down(exc: LMError) -> None:
        if isinstance(exc, LMUnreachableError):
            raise EndpointDownError(str(exc)) from exc

    def _save_graph(self, graph: ExecutionGraph, split: str, candidate: Candidate, episode: Episode) -> str:
        path = self.work / "graphs" / split / candidate.digest() / f"{episode.id}.json"
        graph.save(path)
        return str(path)

    @staticmethod
    def _failed(episode: Episode, question: Question, error: str) -> QuestionOutcome:
        return QuestionOutcome(episode_id=episode.id, question_id=question.id, task_type=question.task_type,
                               question=question.question, gold=question.gold, prediction="", score=0.0,
                               passed=False, error=error[:500])

    def close(self) -> None:
        for store in self._stores.values():
            getattr(store.system, "close", lambda: None)()
        self._stores.clear()
        getattr(self.template, "close", lambda: None)()
