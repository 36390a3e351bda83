"""Stages 2 to 5 of the pipeline (answer, score, record, attribute) and the episode itself
(:func:`run_episode`, :func:`run_episodes`): see :mod:`optloop.pipeline`."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from optloop.attribution import Attribution, attribute
from optloop.datasets import Episode, Question, passed, score
from optloop.errors import EndpointDownError, LMError, LMUnreachableError
from optloop.lm.accounting import collect_calls
from optloop.pipeline._stores import EpisodeStores, Store
from optloop.pipeline._workers import Workers, concurrency
from optloop.tracing.graph import ExecutionGraph
from optloop.tracing.recorder import Recorder

if TYPE_CHECKING:
    from optloop.attribution.agent import AttributionAgent
    from optloop.attribution.judges import JudgeChain
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM
    from systems.base import MemorySystem

logger = logging.getLogger(__name__)


class QuestionOutcome(BaseModel):
    """One question of one episode: the prediction, its score, and why it failed."""

    episode_id: str
    question_id: str
    task_type: str
    question: str
    gold: str
    prediction: str
    score: float
    passed: bool
    attribution: Attribution | None = None
    error: str | None = Field(
        None, description="the LM fault that stopped this question (it counts as failed)"
    )


# --- stages 2 to 5: answer, score, attribute ----------------------------------------------


def answer(
    store: Store,
    question: Question,
    *,
    shared: bool,
    prepare: Callable[[MemorySystem], None] | None = None,
    into: ExecutionGraph | None = None,
) -> tuple[str, ExecutionGraph | None]:
    """Retrieve and answer ``question`` on ``store``: (prediction, the graph that recorded it).

    ``prepare(system)`` runs first (a candidate's modules and knobs). Recorded on a ``shared``
    store, the question records on its own copy of the store's graph, which is returned and, when
    ``into`` is given, folded into it (the failed call too, when an LM fault stops the question).
    On a private store it records on the store's recorder (the returned graph is the episode's,
    still growing). Not recorded:
    ``system.answer(question, system.retrieve(question))`` and no graph.
    """
    with store.lock:
        if prepare is not None:
            prepare(store.system)
        if store.recorder is not None and not shared:
            with store.recorder as recorder:
                return recorder.ask(question), recorder.graph
        asked = _ask(store, question)
        if into is not None and asked.graph is not None:
            assert store.graph is not None
            into.absorb(asked.graph, since=len(store.graph.operations))
        return asked.result()


@dataclass
class _Asked:
    """One question retrieved and answered (:func:`_ask`): its prediction or the exception that
    stopped it, the copy of the store's graph it recorded on (``None``: not recorded), and the LM
    calls it made."""

    question: Question
    prediction: str = ""
    graph: ExecutionGraph | None = None
    error: BaseException | None = None
    calls: int = 0

    def result(self) -> tuple[str, ExecutionGraph | None]:
        if self.error is not None:
            raise self.error
        return self.prediction, self.graph


def _ask(store: Store, question: Question) -> _Asked:
    """``question`` on ``store``, recorded on a copy of the store's graph (when recorded), which
    comes back with the failed call when a fault stops the question; the caller holds the store's
    lock. It never raises: the exception comes back in :class:`_Asked`, so a caller of several
    questions at once can fold them (and raise) in question order."""
    asked = _Asked(question)
    system = store.system
    with collect_calls() as calls:
        try:
            if store.recorder is None:
                asked.prediction = system.answer(
                    question.question, system.retrieve(question.question)
                )
            else:
                assert store.graph is not None
                with Recorder.resume(system, store.graph) as recorder:
                    asked.graph = recorder.graph
                    asked.prediction = recorder.ask(question)
        except BaseException as exc:  # noqa: BLE001 - handed back, re-raised by the caller
            asked.error = exc
    asked.calls = len(calls)
    return asked


@dataclass
class Attributor:
    """Stage 5: attributes a failure on its graph.

    ``select(question, prediction, graph)`` (optional) says which failures to attribute; ``agent``
    (optional) re-examines the ones the deterministic walk marks ambiguous.
    """

    judges: JudgeChain
    embedder: Embedder | None = None
    agent: AttributionAgent | None = None
    select: Callable[[Question, str, ExecutionGraph], bool] | None = None

    def wants(self, question: Question, prediction: str, graph: ExecutionGraph) -> bool:
        return self.select is None or self.select(question, prediction, graph)

    def __call__(self, graph: ExecutionGraph, question: Question, prediction: str) -> Attribution:
        return attribute(graph, question, prediction, self.judges, embedder=self.embedder)

    def refine(
        self, graph: ExecutionGraph, episode: Episode, attributions: list[Attribution]
    ) -> list[Attribution]:
        """``attributions`` with the ambiguous ones refined by the agent (unchanged without
        one)."""
        if self.agent is None:
            return attributions
        from optloop.attribution.agent import refine_ambiguous

        return refine_ambiguous(
            self.agent,
            graph,
            {q.id: q for q in episode.questions},
            attributions,
            embedder=self.embedder,
        )


def judge(episode: Episode, question: Question, prediction: str) -> QuestionOutcome:
    """Stage 3: the prediction scored by the question's own scorer (not yet attributed)."""
    return QuestionOutcome(
        episode_id=episode.id,
        question_id=question.id,
        task_type=question.task_type,
        question=question.question,
        gold=question.gold,
        prediction=prediction,
        score=score(question, prediction),
        passed=passed(question, prediction),
    )


def failed_outcome(episode: Episode, question: Question, error: str) -> QuestionOutcome:
    """A question an LM fault stopped: failed, with the fault as its error."""
    return QuestionOutcome(
        episode_id=episode.id,
        question_id=question.id,
        task_type=question.task_type,
        question=question.question,
        gold=question.gold,
        prediction="",
        score=0.0,
        passed=False,
        error=error[:500],
    )


@dataclass
class EpisodeResult:
    """One episode through the pipeline.

    ``graph``: the episode graph (ingestion, then every question; the partial ingestion graph when
    ingestion failed; ``None`` when not recorded). ``store_reused``: ``None`` when ingestion
    failed. ``ingest_calls``: LLM calls of the ingestion (0 for a reused store). ``attribution_s``
    and ``attribution_calls``: per attributed question id, the seconds and LLM calls its
    attribution took (the agent's refinement not included).
    """

    episode: Episode
    outcomes: list[QuestionOutcome] = field(default_factory=list)
    graph: ExecutionGraph | None = None
    graph_path: str | None = None
    store_reused: bool | None = None
    ingest_calls: int = 0
    setup_s: float = 0.0
    ingest_s: float = 0.0
    answer_s: float = 0.0
    answer_calls: int = 0
    attribution_s: dict[str, float] = field(default_factory=dict)
    attribution_calls: dict[str, int] = field(default_factory=dict)

    @property
    def predictions(self) -> dict[str, str]:
        return {o.question_id: o.prediction for o in self.outcomes}

    def attributions(self) -> list[Attribution]:
        return [o.attribution for o in self.outcomes if o.attribution is not None]


def _stop_if_down(exc: LMError) -> None:
    if isinstance(exc, LMUnreachableError):
        raise EndpointDownError(str(exc)) from exc


def run_episode(
    episode: Episode,
    stores: EpisodeStores,
    *,
    lm: OptloopLM,
    attributor: Attributor | None = None,
    prepare: Callable[[MemorySystem], None] | None = None,
    questions: Sequence[Question] | None = None,
    on_lm_error: Literal["raise", "fail"] = "raise",
    save_graph: Callable[[ExecutionGraph], str] | None = None,
    keep: Literal["all", "faulted"] = "all",
    label: Mapping[str, Any] | None = None,
    where: str = "",
    on_question: Callable[[], None] | None = None,
    workers: Workers | None = None,
) -> EpisodeResult:
    """Run ``episode`` through every stage (see the module docstring); its questions, or
    ``questions``.

    ``on_lm_error="fail"``: an LM fault that outlasts the LM layer's retries fails the question it
    hit (during ingestion: every question of the episode) and the episode goes on; an unreachable
    endpoint raises :class:`~optloop.errors.EndpointDownError` instead. ``"raise"``: any fault
    propagates.

    ``save_graph(graph) -> path`` saves the episode graph: with ``keep="all"`` once the episode is
    done, with ``keep="faulted"`` only when an LM attempt failed during it (saved even when the
    fault then stops the episode; the partial graph when ingestion failed). ``label`` is written to
    the graph's ``meta["evaluation"]`` (with ``store_reused`` and ``first_op``) on a shared store.
    ``where`` ends the warnings about failed questions; ``on_question()`` runs after each question
    asked (on a worker thread at ``N > 1``).

    At ``N > 1`` (:func:`concurrency`) the questions, then the attributions, run at once on
    ``workers`` (:func:`run_episodes` lends its own; without, the episode makes its own); at
    ``N = 1`` one after another on this thread.
    """
    result = EpisodeResult(episode)
    asked = list(episode.questions if questions is None else questions)
    with contextlib.ExitStack() as stack:
        if workers is None and (n := concurrency(lm)) > 1:
            workers = stack.enter_context(Workers(n))
        # this episode's LM calls (did a fault hit it?)
        calls = stack.enter_context(collect_calls())
        try:
            store, reused = stores.open(episode)
        except LMError as exc:  # ingestion hit an LM fault
            if on_lm_error == "raise":
                raise
            return _ingestion_failed(result, exc, asked, save_graph, where)
        result.store_reused = reused
        result.ingest_calls = 0 if reused else store.llm_calls
        result.setup_s, result.ingest_s = (0.0, 0.0) if reused else (store.setup_s, store.ingest_s)
        result.graph = _episode_graph(store, shared=stores.shared, reused=reused, label=label)
        done = False
        try:
            try:
                how = (
                    result,
                    store,
                    asked,
                    stores.shared,
                    attributor,
                    prepare,
                    on_lm_error,
                    where,
                    on_question,
                )
                pending = _ask_all(*how) if workers is None else _ask_parallel(*how, workers)
            finally:
                stores.release(store)
            if pending:  # attributed on the episode graph, now final
                assert result.graph is not None
                _attribute(
                    result,
                    [(outcome, question, result.graph) for outcome, question in pending],
                    attributor,
                    workers,
                )
            if attributor is not None:
                _refine(result, attributor)
            done = True
        finally:
            faulted = any(record.faults for record in calls)
            if (
                save_graph is not None
                and result.graph is not None
                and ((done and keep == "all") or faulted)
            ):
                result.graph_path = save_graph(result.graph)
    return result


def run_episodes(
    episodes: Sequence[Episode],
    stores: EpisodeStores,
    *,
    lm: OptloopLM,
    save_graph: Callable[[ExecutionGraph, Episode], str] | None = None,
    **options: Any,
) -> Iterator[EpisodeResult]:
    """:func:`run_episode` for each of ``episodes``: at ``N > 1`` (:func:`concurrency`) ``N`` at a
    time, their questions and attributions on shared :class:`Workers`. The results come in episode
    order, each as soon as it and those before it are done, so a caller reports and folds them as
    the serial run does. ``save_graph(graph, episode) -> path``; ``options``
    are :func:`run_episode`'s.
    """

    def one(episode: Episode, workers: Workers | None = None) -> EpisodeResult:
        saver = None if save_graph is None else (lambda graph: save_graph(graph, episode))
        return run_episode(episode, stores, lm=lm, save_graph=saver, workers=workers, **options)

    n = concurrency(lm)
    if n == 1:
        for episode in episodes:
            yield one(episode)
        return
    with Workers(n) as workers:
        yield from workers.episodes(functools.partial(one, workers=workers), episodes)


def _ingestion_failed(
    result: EpisodeResult,
    exc: LMError,
    asked: Sequence[Question],
    save_graph: Callable[[ExecutionGraph], str] | None,
    where: str,
) -> EpisodeResult:
    """An LM fault stopped the ingestion: its partial graph saved, then every question failed (or,
    when the endpoint is unreachable, :class:`EndpointDownError`)."""
    result.graph = getattr(exc, "partial_graph", None)
    if result.graph is not None and save_graph is not None:
        result.graph_path = save_graph(result.graph)
    _stop_if_down(exc)
    logger.warning("episode %s: ingestion failed%s: %s", result.episode.id, where, exc)
    result.outcomes = [failed_outcome(result.episode, q, f"ingestion: {exc}") for q in asked]
    return result


def _episode_graph(
    store: Store, *, shared: bool, reused: bool, label: Mapping[str, Any] | None
) -> ExecutionGraph | None:
    """The graph the episode's questions are folded into: the store's own for a private store, a
    labelled copy of it for a shared one."""
    ingestion = store.graph
    if ingestion is None or not shared:
        return ingestion
    graph = ingestion.model_copy(deep=True)
    if label is not None:
        graph.meta["evaluation"] = {
            **label,
            "store_reused": reused,
            "first_op": len(ingestion.operations) if reused else 0,
        }
    return graph


def _ask_all(
    result: EpisodeResult,
    store: Store,
    asked: Sequence[Question],
    shared: bool,
    attributor: Attributor | None,
    prepare: Callable[[MemorySystem], None] | None,
    on_lm_error: str,
    where: str,
    on_question: Callable[[], None] | None,
) -> list[tuple[QuestionOutcome, Question]]:
    """Stages 2 and 3 for every question, one after another, and 5 for those recorded on a graph of
    their own (final at once); returns the failures left to attribute on the episode graph.
    ``answer_s`` and ``answer_calls`` leave the attributions out."""
    started = time.perf_counter()
    pending: list[tuple[QuestionOutcome, Question]] = []
    with collect_calls() as calls:
        for question in asked:
            try:
                prediction, own = answer(
                    store, question, shared=shared, prepare=prepare, into=result.graph
                )
            except LMError as exc:
                if on_lm_error == "raise":
                    raise
                _fail_question(result, question, exc, where)
            else:
                outcome = judge(result.episode, question, prediction)
                result.outcomes.append(outcome)
                if own is not None and shared:
                    _attribute(result, [(outcome, question, own)], attributor)
                elif own is not None:
                    pending.append((outcome, question))
            if on_question is not None:
                on_question()
    result.answer_s = time.perf_counter() - started - sum(result.attribution_s.values())
    result.answer_calls = len(calls) - sum(result.attribution_calls.values())
    return pending


def _ask_parallel(
    result: EpisodeResult,
    store: Store,
    asked: Sequence[Question],
    shared: bool,
    attributor: Attributor | None,
    prepare: Callable[[MemorySystem], None] | None,
    on_lm_error: str,
    where: str,
    on_question: Callable[[], None] | None,
    workers: Workers,
) -> list[tuple[QuestionOutcome, Question]]:
    """:func:`_ask_all` at ``N > 1``: every question at once on ``workers``, each recorded on its
    own copy of the store's graph, then put together in question order (graph, outcomes, the first
    fault raised) as the serial run leaves them; then stage 5, at once, for those final on their
    own graph. The store's lock is held throughout and ``prepare`` runs once: every question asks
    the same candidate."""
    started = time.perf_counter()
    since = len(store.graph.operations) if store.graph is not None else 0

    def ask(question: Question) -> _Asked:
        done = _ask(store, question)
        if on_question is not None:
            on_question()
        return done

    with store.lock:
        if prepare is not None:
            prepare(store.system)
        answered = workers.tasks(ask, asked)
    result.answer_s = time.perf_counter() - started
    result.answer_calls = sum(done.calls for done in answered)
    own: list[tuple[QuestionOutcome, Question, ExecutionGraph]] = []
    pending: list[tuple[QuestionOutcome, Question]] = []
    for done in answered:
        if done.graph is not None and result.graph is not None:
            # a private store's graph is result.graph: folded in order
            result.graph.absorb(done.graph, since=since)
        if done.error is not None:
            if on_lm_error == "raise" or not isinstance(done.error, LMError):
                raise done.error
            _fail_question(result, done.question, done.error, where)
            continue
        outcome = judge(result.episode, done.question, done.prediction)
        result.outcomes.append(outcome)
        if done.graph is not None and shared:
            own.append((outcome, done.question, done.graph))
        elif done.graph is not None:
            pending.append((outcome, done.question))
    _attribute(result, own, attributor, workers)
    return pending


def _fail_question(result: EpisodeResult, question: Question, exc: LMError, where: str) -> None:
    """An LM fault stopped ``question``: failed (or, when the endpoint is
    unreachable, :class:`EndpointDownError`)."""
    _stop_if_down(exc)
    logger.warning("question %s failed%s: %s", question.id, where, exc)
    result.outcomes.append(failed_outcome(result.episode, question, str(exc)))


def _attribute(
    result: EpisodeResult,
    scored: Sequence[tuple[QuestionOutcome, Question, ExecutionGraph]],
    attributor: Attributor | None,
    workers: Workers | None = None,
) -> None:
    """Stage 5 for scored questions, each on its final graph: the failures the attributor wants
    (asked in question order) attributed, timed and counted; at once on ``workers`` when given."""
    if attributor is None:
        return
    chosen = [
        (outcome, question, graph)
        for outcome, question, graph in scored
        if not outcome.passed and attributor.wants(question, outcome.prediction, graph)
    ]

    def one(
        item: tuple[QuestionOutcome, Question, ExecutionGraph],
    ) -> tuple[Attribution, float, int]:
        outcome, question, graph = item
        started = time.perf_counter()
        with collect_calls() as calls:
            attribution = attributor(graph, question, outcome.prediction)
        return attribution, time.perf_counter() - started, len(calls)

    done = [one(item) for item in chosen] if workers is None else workers.tasks(one, chosen)
    for (outcome, question, _), (attribution, seconds, calls) in zip(chosen, done, strict=True):
        outcome.attribution = attribution
        result.attribution_s[question.id] = seconds
        result.attribution_calls[question.id] = calls


def _refine(result: EpisodeResult, attributor: Attributor) -> None:
    """The agent's second look at the episode's ambiguous attributions (on the episode graph)."""
    attributed = [o for o in result.outcomes if o.attribution is not None]
    if attributor.agent is None or not attributed or result.graph is None:
        return
    refined = attributor.refine(
        result.graph,
        result.episode,
        [o.attribution for o in attributed],  # type: ignore[misc]
    )
    for outcome, attribution in zip(attributed, refined):
        outcome.attribution = attribution
