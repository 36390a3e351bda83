"""Evaluate a candidate: ingest (or reuse the store), answer, score, attribute every failure.

One **evaluation** is one candidate run over one split: every episode's store
(ingested with the candidate's ingest-stage prompts, or reused), then each
question retrieved, answered and scored, and each wrong answer attributed to
its decisive operation. ``--budget N`` counts these on the dev split. Each
episode goes through the one episode pipeline (:func:`optloop.pipeline.run_episode`)
on stores this evaluator keeps; see ``docs/architecture.md``.

Ingestion reuse: the store after ingesting an episode is
kept, live, under the key (system, ingest sites' instructions and demos,
episode), enough for the largest split evaluated under two ingest keys. A candidate that
changes only retrieve or answer sites, or knobs, asks its questions against the same stores
and costs only its question calls; so do the held-out arms (the start program, the control,
the best) that share an ingest key.
Ingestion always runs on the system's own LM (an optimizer's temperature
variants apply to retrieve and answer sites), so a store is a pure function of
its key; the persistent LM cache makes rebuilding an evicted store cheap.

Racing: a dev evaluation given ``against`` (the current best's outcomes,
:class:`~optloop.loop.racing.Against`) answers its episodes in the run's seeded order and stops
after the episode where it is significantly worse than the best on the same questions
(:mod:`optloop.loop.racing`); its :attr:`Evaluation.stopped` says after how many questions. At
``--concurrency`` N > 1 it decides after each wave of N episodes. Outcomes always come back in
the split's order.

Concurrency: at ``--concurrency`` N > 1 an evaluation runs its episodes, their questions and
their attributions N at a time through :func:`optloop.pipeline.run_episodes`, and gives the
evaluation N = 1 gives: outcomes in episode and question order, the same LM calls and cache
keys, the same stores reused (their reuse is decided up front in episode order,
:meth:`~optloop.pipeline.StoreCache.plan`), the same fault graphs. The store cache is
thread-safe; a store in use by an episode is never closed under it.

LM faults: the LM layer retries transient faults. A fault that outlasts the
retries fails the question it hit (or every question of the episode whose
ingestion it hit): recorded on the outcome, and the evaluation goes on; at its
end, failed calls past :data:`optloop.failures.ALLOWED_SHARE` of its calls raise
:class:`~optloop.errors.CallsFailedError` (exit 4) instead of returning figures
that would score them as wrong answers (``lm_failed_calls`` counts the rest). An
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

import contextlib
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dspy
from pydantic import BaseModel, Field

from optloop import failures
from optloop.attribution import Attribution, blame, default_judges
from optloop.datasets import Dataset, Episode, Question
from optloop.errors import EndpointDownError, LMError, LMUnreachableError
from optloop.lm.accounting import Usage, collect_calls, usage_by_site
from optloop.loop.candidate import (
    Candidate,
    apply_state,
    candidate_from_modules,
    ingest_key,
    trivial_instruction,
)
from optloop.loop.cost import LMCost, evaluation_cost
from optloop.loop.racing import Against, RaceStop, race_order
from optloop.pipeline import (
    Attributor,
    CachedStores,
    EpisodeResult,
    QuestionOutcome,
    Store,
    StoreCache,
    StorePlan,
    Workers,
    answer,
    concurrency,
    ingest,
    judge,
    run_episodes,
)
from optloop.tracing.graph import ExecutionGraph
from systems import get_system

if TYPE_CHECKING:
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM
    from systems.base import MemorySystem

logger = logging.getLogger(__name__)

# The fewest and the most stores one batch slot keeps live (a split of more episodes than the
# most rebuilds some of them).
MIN_LIVE, MAX_LIVE = 8, 64


class Evaluation(BaseModel):
    """One candidate on one split."""

    split: str
    candidate: str = Field(description="the candidate's digest")
    outcomes: list[QuestionOutcome]
    llm_calls: int = Field(0, description="LLM requests made (cache hits included)")
    model_calls: int = Field(
        0, description="requests the model actually computed (not from the cache)"
    )
    ingest_calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    stores_reused: int = 0
    stores_built: int = 0
    lm_attempt_faults: int = Field(
        0, description="failed LM attempts during this evaluation, cured or not"
    )
    lm_cured: int = Field(0, description="of those, attempts whose call a retry then completed")
    lm_failed_calls: int = Field(
        0, description="LM calls that failed after their retries (their questions failed)"
    )
    fault_graphs: list[str] = Field(
        default_factory=list,
        description="saved execution graphs of the episodes whose LM calls hit a fault",
    )
    cost_usd: float | None = Field(
        None, description="dollars of its LM calls (None: the model has no price)"
    )
    lm_seconds: float | None = Field(
        None,
        description="seconds the model spent on its calls, waits for a slot or a "
        "limit left out (optloop.loop.cost.lm_seconds)",
    )
    sites: dict[str, LMCost] = Field(default_factory=dict, description="LM cost per prompt site")
    replayed_calls: int = Field(
        0, description="cache hits whose response kept the seconds the model took to compute it"
    )
    replayed_seconds: float = Field(0.0, description="those seconds, summed")
    replayed_tokens: int = Field(0, description="those responses' tokens")
    stopped: RaceStop | None = Field(
        None, description="raced and stopped before the end of the split (None: every question)"
    )

    @property
    def complete(self) -> bool:
        """Whether every question of the split was answered (not stopped by a race)."""
        return self.stopped is None

    @property
    def full_calls(self) -> int:
        """The LLM calls a full evaluation would have made: the calls made, scaled up by the
        questions left when a race stopped it (an estimate)."""
        if self.stopped is None or not self.stopped.questions:
            return self.llm_calls
        return round(self.llm_calls * self.stopped.of / self.stopped.questions)

    @property
    def errors(self) -> int:
        return sum(o.error is not None for o in self.outcomes)

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def passed(self) -> int:
        """How many questions passed."""
        return sum(o.passed for o in self.outcomes)

    @property
    def accuracy(self) -> float:
        return self.passed / self.n if self.n else 0.0

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
        """Its failures' targets, ranked by failure rate given a correct input
        (:func:`~optloop.attribution.blame`)."""
        return blame(self.attributions(), passed=self.passed)


class Evaluator:
    """Runs candidates of one system over episodes, reusing stores by ingest key."""

    def __init__(
        self,
        system_name: str,
        lm: OptloopLM,
        work: Path,
        *,
        embedder: Embedder | None = None,
        knobs: Mapping[str, Any] | None = None,
        dataset_uri: str = "",
        max_live: int | None = None,
        query_site: bool = False,
        allowed_failed_share: float = failures.ALLOWED_SHARE,
    ):
        from optloop.embed import CachedEmbedder, get_embedder

        self.system_name = system_name
        self.cls = get_system(system_name)
        self.lm = lm
        self.work = Path(work)
        # One cache of single texts (queries) for every evaluation of the run: trials ask the same
        # questions again.
        self.embedder = CachedEmbedder.around(
            embedder or get_embedder(), batches=False, max_texts=20_000
        )
        self.dataset_uri = dataset_uri
        # None: as many live stores as the largest split evaluated has episodes (_keep_live).
        self.max_live = max_live
        self.judges = default_judges(self.embedder)
        self.attributor = Attributor(self.judges, self.embedder)
        self.query_site = (
            query_site  # the system's retrieve.query site (optloop.run --query-rewrite)
        )
        # Failed LM calls an evaluation may have and still report its figures (optloop.failures).
        self.allowed_failed_share = allowed_failed_share
        self.template = self.cls(
            lm,
            self.work / "template",
            embedder=self.embedder,
            knobs=dict(knobs or {}),
            query_site=query_site,
        )
        self.sites = self.template.prompt_sites()
        self.stages = {name: site.stage for name, site in self.sites.items()}
        self._stores = StoreCache(max_live or MIN_LIVE)
        self._episodes: dict[str, tuple[Episode, dict[str, Question]]] = {}

    def register(self, *datasets: Dataset) -> None:
        """Make these datasets' episodes known to :meth:`lookup` (what a program's examples
        name)."""
        for dataset in datasets:
            for episode in dataset.episodes:
                self._episodes[episode.id] = (episode, {q.id: q for q in episode.questions})

    def lookup(self, episode_id: str, question_id: str) -> tuple[Episode, Question]:
        episode, questions = self._episodes[episode_id]
        return episode, questions[question_id]

    # --- candidates -----------------------------------------------------------------------

    def baseline(self) -> Candidate:
        return candidate_from_modules(
            {n: s.module for n, s in self.sites.items()}, self.template.knobs(), "baseline"
        )

    def trivial_instruction(self, site: str) -> str:
        """DSPy's default instruction for ``site``'s signature (the run's control gives it to each
        blamed site: :mod:`optloop.loop.trivial_control`)."""
        return trivial_instruction(self.sites[site].module.signature)

    def knob_choices(self, name: str, current: Any = None) -> list[Any]:
        """The values an optimizer may try for knob ``name``, ``current`` first (the system's value
        space)."""
        return self.cls.knob_choices(name, current)

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

    def store(
        self,
        candidate: Candidate,
        episode: Episode,
        modules: Mapping[str, dspy.Predict],
        *,
        pin: bool = False,
        plan: StorePlan | None = None,
        slot: int = 0,
    ) -> tuple[Store, bool]:
        """The episode ingested with ``candidate``'s ingest sites; ``True`` when it was reused.

        ``pin`` and ``plan``: see :meth:`StoreCache.open` (an evaluation pins its stores until each
        episode is done and, at ``--concurrency`` > 1, plans their reuse in episode order).
        ``slot``: whose stores (:meth:`evaluate_many` gives each candidate of a batch its own)."""
        key = ingest_key(self.system_name, candidate, self.stages)
        return self._stores.open(
            _store_key(key, episode, slot),
            lambda: self._build(key, candidate, episode, modules, slot),
            pin=pin,
            plan=plan,
        )

    def _build(
        self,
        key: str,
        candidate: Candidate,
        episode: Episode,
        modules: Mapping[str, dspy.Predict],
        slot: int = 0,
    ) -> Store:
        """A fresh system for ``episode`` under ``key``, ingested by the pipeline on the system's
        own LM."""
        run_dir = (
            self.work / "stores" / key / (episode.id if not slot else f"{episode.id}.slot{slot}")
        )
        shutil.rmtree(run_dir, ignore_errors=True)
        system = self.cls(
            self.lm,
            run_dir,
            embedder=self.embedder,
            knobs=candidate.knobs,
            query_site=self.query_site,
        )
        ingest_modules = {n: m for n, m in modules.items() if self.stages.get(n) == "ingest"}
        # (An evaluation's modules carry no LM, so episodes building at once put back the None they
        # found; a DSPy program's may carry one, see the module docstring.)
        saved_lms = {n: m.lm for n, m in ingest_modules.items()}
        try:
            for module in ingest_modules.values():
                module.lm = (
                    None  # ingestion runs on the system's own LM (see the module docstring)
                )
            try:
                system.use_modules(dict(modules))
            except BaseException:
                system.close()
                raise
            return ingest(system, episode, dataset_uri=self.dataset_uri)
        finally:
            for name, lm in saved_lms.items():
                ingest_modules[name].lm = lm

    def _keep_live(self, episodes: int, slots: int = 1) -> None:
        """Keep the stores of a split of ``episodes`` under two ingest keys live per batch slot
        (the start program's and a candidate's: a trial that changes an ingest site leaves the
        start program's stores for the next one, and the held-out arms share theirs), between
        :data:`MIN_LIVE` and :data:`MAX_LIVE`; or the ``max_live`` the evaluator was given."""
        per_slot = self.max_live or min(max(MIN_LIVE, 2 * episodes), MAX_LIVE)
        self._stores.max_live = max(self._stores.max_live, per_slot * slots)

    # --- questions ------------------------------------------------------------------------

    @staticmethod
    def _prepare(
        candidate: Candidate, modules: Mapping[str, dspy.Predict]
    ) -> Callable[[MemorySystem], None]:
        """What runs on a store's system before each of ``candidate``'s questions: its modules and
        knobs."""

        def prepare(system: MemorySystem) -> None:
            system.use_modules(dict(modules))
            for name, value in candidate.knobs.items():
                system.set_knob(name, value)

        return prepare

    def ask(
        self,
        store: Store,
        candidate: Candidate,
        modules: Mapping[str, dspy.Predict],
        episode: Episode,
        question: Question,
        *,
        attribute_failures: bool = True,
        graph: ExecutionGraph | None = None,
    ) -> QuestionOutcome:
        """Retrieve, answer, score and attribute one question against ``store`` (the pipeline's
        stages 2, 3 and 5 for one question, as :class:`~optloop.loop.program.MemoryProgram` needs
        them).

        ``graph`` (a copy of ``store.graph``) collects this question's operations, the
        failed one included when an LM fault stops it: one graph for an episode's questions.
        """
        prediction, own = answer(
            store, question, shared=True, prepare=self._prepare(candidate, modules), into=graph
        )
        outcome = judge(episode, question, prediction)
        if not outcome.passed and attribute_failures and own is not None:
            outcome.attribution = self.attributor(own, question, prediction)
        return outcome

    def evaluate_many(
        self,
        candidates: Sequence[Candidate],
        dataset: Dataset,
        *,
        split: str = "dev",
        against: Against | None = None,
    ) -> list[Evaluation]:
        """Each of ``candidates`` over ``dataset`` at once (``optloop.run --batch``), the
        evaluations in the candidates' order.

        Each candidate runs on its own thread and its own stores (slot ``i`` of the batch: a store
        serves one candidate at a time, so candidates sharing stores would take turns on them),
        under the LM's one ``--concurrency`` throttle. A candidate's outcomes are the
        ones :meth:`evaluate` gives it alone (a slot's store of a key is ingested with the same LM
        answers as any other's, the later ones from the LM cache). What differs is which stores
        were built or reused (and so the ingestion requests an evaluation counts) and which
        evaluation computed a request another one then read from the cache (``model_calls``,
        tokens, dollars). ``against``: each candidate raced against the same best."""
        if len(candidates) <= 1:
            return [self.evaluate(c, dataset, split=split, against=against) for c in candidates]
        self._keep_live(len(dataset.episodes), slots=len(candidates))
        slots = list(enumerate(candidates))
        # The threads are the pipeline's daemon workers: an interrupt does not wait for calls in
        # flight.
        with Workers(len(candidates)) as workers:
            return list(
                workers.episodes(
                    lambda item: self.evaluate(
                        item[1], dataset, split=split, slot=item[0], against=against
                    ),
                    slots,
                )
            )

    def evaluate(
        self,
        candidate: Candidate,
        dataset: Dataset,
        *,
        split: str = "dev",
        progress: Callable[[int], None] | None = None,
        on_episode: Callable[[EpisodeResult], None] | None = None,
        slot: int = 0,
        against: Against | None = None,
    ) -> Evaluation:
        """Run ``candidate`` over every episode of ``dataset``; ``progress(n)`` after each
        question, ``on_episode(result)`` with each episode's pipeline result, in episode order (a
        benchmark's look at what each episode did).

        At ``--concurrency`` N > 1 the episodes, their questions and their attributions run N at a
        time (:func:`~optloop.pipeline.run_episodes`), the stores' reuse decided up front in
        episode order (:meth:`StoreCache.plan`): the evaluation is the one N = 1 gives (outcomes in
        episode and question order, the same calls, stores reused and graphs), only sooner.

        ``against``: race the candidate against the best's outcomes (the module docstring); a
        stopped evaluation holds the questions answered, in the split's order.

        Raises :class:`EndpointDownError` when the LM endpoint is unreachable (see the module
        docstring).
        """
        self.check_endpoint()
        modules = self.modules(candidate)
        started = time.perf_counter()
        outcomes: list[QuestionOutcome] = []
        ingest_calls, reused, built, graphs = 0, 0, 0, []
        stopped: RaceStop | None = None
        key = ingest_key(self.system_name, candidate, self.stages)
        episodes = list(dataset.episodes)
        # The split's stores stay live after it: the next candidate with the same ingest key (one
        # that changes only retrieval or answer sites, a held-out arm) reuses them all. Fewer live
        # stores than the split's episodes, opened in the same order, would reuse none.
        if not slot:
            self._keep_live(len(episodes))
        race = None
        if against is not None:
            race = against.race()
            episodes = race_order(episodes, against.seed, split)
        n = concurrency(self.lm)
        # Raced, the episodes go in waves of N (one at a time on the embedded model), the race
        # consulted after each episode and the next wave started only while it runs on.
        waves = [episodes[i : i + n] for i in range(0, len(episodes), n)] if race else [episodes]
        planning = (
            self._stores.plan([_store_key(key, e, slot) for e in episodes])
            if n > 1
            else contextlib.nullcontext()
        )
        with collect_calls() as calls, planning as plan:
            stores = CachedStores(
                lambda episode: self.store(
                    candidate, episode, modules, pin=True, plan=plan, slot=slot
                ),
                self._stores.release,
            )
            for wave in waves:
                for result in run_episodes(
                    wave,
                    stores,
                    lm=self.lm,
                    attributor=self.attributor,
                    prepare=self._prepare(candidate, modules),
                    on_lm_error="fail",
                    keep="faulted",
                    save_graph=lambda graph, episode: self._save_graph(
                        graph, split, candidate, episode
                    ),
                    label={
                        "split": split,
                        "candidate": candidate.digest(),
                        "origin": candidate.origin,
                    },
                    where=f" under candidate {candidate.origin}",
                    on_question=(lambda: progress(1)) if progress else None,
                ):
                    outcomes += result.outcomes
                    if on_episode is not None:
                        on_episode(result)
                    if result.graph_path is not None:
                        graphs.append(result.graph_path)
                    if result.store_reused is True:
                        reused += 1
                    elif result.store_reused is False:
                        built += 1
                        ingest_calls += result.ingest_calls
                    if race is not None and stopped is None:
                        stopped = race.observe(result.outcomes)
                if stopped is not None:
                    break
        if race is not None:
            outcomes = _in_split_order(outcomes, dataset)
            if stopped is not None:
                stopped = stopped.model_copy(update={"questions": len(outcomes)})
        usage = Usage.of(calls)
        # A failed call is not a measured answer: past the threshold the evaluation is not recorded
        # at all.
        failures.check(
            usage.errors,
            usage.calls,
            what=f"the {split} evaluation of candidate {candidate.origin}",
            first=failures.first_error(calls),
            allowed=self.allowed_failed_share,
        )
        return Evaluation(
            split=split,
            candidate=candidate.digest(),
            outcomes=outcomes,
            llm_calls=usage.calls,
            model_calls=usage.model_calls,
            ingest_calls=ingest_calls,
            tokens=usage.tokens,
            seconds=round(time.perf_counter() - started, 2),
            stores_reused=reused,
            stores_built=built,
            lm_attempt_faults=usage.faults,
            lm_cured=usage.cured,
            lm_failed_calls=usage.errors,
            fault_graphs=graphs,
            replayed_calls=usage.replayed_calls,
            replayed_seconds=round(usage.replayed_seconds, 3),
            replayed_tokens=usage.replayed_tokens,
            stopped=stopped,
            **evaluation_cost(usage, usage_by_site(calls)),
        )

    # --- LM faults ------------------------------------------------------------------------

    def check_endpoint(self) -> None:
        """Before new work: if the last LM call found the endpoint unreachable, ask it once
        more."""
        if self.lm.endpoint_down is None:
            return
        try:
            self.lm.text("ping", max_tokens=1, cache=False)
        except LMUnreachableError as exc:
            raise EndpointDownError(str(exc)) from exc
        except LMError:
            pass  # it answers (with an error of another kind): the questions will tell

    def _save_graph(
        self, graph: ExecutionGraph, split: str, candidate: Candidate, episode: Episode
    ) -> str:
        path = self.work / "graphs" / split / candidate.digest() / f"{episode.id}.json"
        graph.save(path)
        return str(path)

    def close(self) -> None:
        self._stores.close()
        self.template.close()


def _in_split_order(
    outcomes: Sequence[QuestionOutcome], dataset: Dataset
) -> list[QuestionOutcome]:
    """``outcomes`` (answered in a race's order) in ``dataset``'s episode and question order."""
    position = {
        (e.id, q.id): i
        for i, (e, q) in enumerate((e, q) for e in dataset.episodes for q in e.questions)
    }
    return sorted(
        outcomes, key=lambda o: position.get((o.episode_id, o.question_id), len(position))
    )


def _store_key(key: str, episode: Episode, slot: int) -> tuple[str, ...]:
    """The store cache's key of ``episode`` ingested under ``key`` for batch slot ``slot`` (0: the
    one every evaluation alone uses)."""
    return (key, episode.id) if not slot else (key, episode.id, f"slot{slot}")
