"""The planted-fault harness: faults with known ground truth, to measure attribution.

Each fault of the catalogue (:mod:`optloop.faults.catalogue`) breaks one operation of a system in a
known way and knows the site (or knob) and error type a correct attribution must name. Faults on
prompt sites are injected at the operation, as fault-injection studies do: the site's DSPy module
still makes its real LLM call, then its output (or input) is corrupted the way the fault's
description says. This makes the fault bite even on a 135M model that would not follow a written
instruction to misbehave, so every induced failure has one known cause. Knob faults set the knob.

The harness runs each system clean and with each of its faults over the same episodes. A question
that passes clean and fails under the fault is a failure the fault *caused*; every one is
attributed and scored: site accuracy (the blamed target is the planted one) and type accuracy (the
error type is). Among them, the *induced* failures are the ones with a sound baseline and a fault
that kept the evidence from the answer; the others are *set aside*, each with its reason
(:data:`SET_ASIDE_REASONS`), but attributed and reported all the same
(:mod:`optloop.faults.planted_report`), so the accuracy over every caused failure stands next
to the induced-only figure and the reader sees what the filter hides.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optloop.attribution.decisive import evidence_reaches_answer
from optloop.attribution.judges import default_judges
from optloop.attribution.taxonomy import Attribution, ErrorType
from optloop.datasets import passed
from optloop.faults.catalogue import faults_for
from optloop.faults.model import OperationFault
from optloop.pipeline import (
    Attributor,
    EpisodeResult,
    FreshStores,
    Workers,
    concurrency,
    run_episode,
)
from optloop.sites import ANSWER

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM
    from systems.base import MemorySystem

logger = logging.getLogger(__name__)

UNSOUND_CLEAN = "unsound_clean_pass"
EVIDENCE_REACHED = "evidence_reached_answer"
SET_ASIDE_REASONS: dict[str, str] = {
    UNSOUND_CLEAN: "the clean pass was unsound: the evidence did not reach the clean answer (a "
    "lucky guess)",
    EVIDENCE_REACHED: "the evidence still reached the answer under the fault: the answer "
    "changed only because "
    "its context did",
}
"""Why a failure a fault caused is set aside from the induced-only figure (it is attributed all the
same)."""


@dataclass
class Case:
    """One failure a fault caused (the question passed clean) and how its attribution scored.

    ``set_aside`` is ``None`` for an induced failure, else the key of :data:`SET_ASIDE_REASONS`
    that kept it out of the induced-only figure."""

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
        return {
            "system": self.system,
            "fault": self.fault,
            "dataset": self.dataset,
            "episode": self.episode,
            "question_id": self.question_id or self.attribution.question_id,
            "induced": self.induced,
            "set_aside": self.set_aside,
            "why_set_aside": SET_ASIDE_REASONS.get(self.set_aside or "", ""),
            "true_target": self.true_target,
            "true_type": self.true_type.value,
            "site_ok": self.site_ok,
            "type_ok": self.type_ok,
            "attribution": self.attribution.model_dump(mode="json"),
        }


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
    """One fault on one episode: how many clean passes it turned into failures (``caused``; each is
    a
    :class:`Case`), and how many questions failed clean and under the fault alike (not its
    doing)."""

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
    """Every failure the faults caused (``cases``: induced and set aside), the clean runs'
    denominators (``baselines``) and each fault's tally per episode (``tallies``)."""

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
        """The set-aside failures as (system, fault, question id), as this report first called
        them."""
        return [(c.system, c.fault, c.question_id) for c in self.set_aside]

    def __iadd__(self, other: PlantedRun) -> PlantedRun:
        self.cases += other.cases
        self.baselines += other.baselines
        self.tallies += other.tallies
        return self


def _run(
    system_factory: Callable[..., MemorySystem],
    run_dir: Path,
    episode: Any,
    fault: OperationFault | None,
    dataset_uri: str,
    lm: OptloopLM,
    attributor: Attributor | None = None,
    workers: Workers | None = None,
) -> EpisodeResult:
    """``episode`` through the one pipeline on a fresh system in ``run_dir``, with ``fault``
    planted."""

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

    return run_episode(
        episode,
        FreshStores(make, lm, dataset_uri=dataset_uri),
        lm=lm,
        attributor=attributor,
        workers=workers,
    )


class _Caused:
    """``Attributor.select`` of a fault run: every failure of a question that passed clean is
    attributed (the fault caused it); ``reasons`` records, per question id, why one is set aside
    from the induced-only figure (``None``: induced)."""

    def __init__(
        self, fault: OperationFault, passing: set[str], sound: set[str], judges: Any, embedder: Any
    ):
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
        elif (
            self.fault.site != ANSWER
            and self.fault.error_type is not ErrorType.CONTAMINATION
            and evidence_reaches_answer(graph, q, self.judges, embedder=self.embedder)
        ):
            # (a contamination fault leaves the evidence in reach by definition: a stale value
            # joins it) The fault did not keep the evidence from the answer; the answer changed
            # only because its context did.
            self.reasons[q.id] = EVIDENCE_REACHED
        else:
            self.reasons[q.id] = None
        return True


def run_planted(
    systems: Sequence[str],
    dataset: Dataset,
    lm: OptloopLM,
    work: Path,
    *,
    embedder: Embedder | None = None,
    fault_names: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> PlantedRun:
    """Run every system clean and under each of its faults; attribute every failure a fault caused.

    Every run goes through the one episode pipeline (:func:`optloop.pipeline.run_episode`): the
    clean run unattributed, each fault run attributing the failures of the questions that passed
    clean (each marked induced or set aside, with the reason). At ``--concurrency`` N > 1 the
    episodes of a system go N at a time (each its clean run, then its fault runs), their results
    and ``progress`` lines taken in episode order.
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

        def plant(
            episode: Any,
            workers: Workers | None = None,
            report: Callable[[str], None] = say,
            _system: str = system_name,
            _factory: Any = factory,
            _faults: Any = faults,
        ) -> PlantedRun:
            return _plant_episode(
                _system,
                _factory,
                _faults,
                episode,
                dataset.uri,
                lm,
                work,
                embedder,
                workers,
                report,
            )

        n = concurrency(lm)
        if n == 1:
            for episode in dataset.episodes:
                planted += plant(episode)
            continue
        with Workers(n) as workers:
            for piece, lines in workers.episodes(
                lambda episode: _with_lines(plant, episode, workers), dataset.episodes
            ):
                planted += piece
                for line in lines:
                    say(line)
    return planted


def _with_lines(
    plant: Callable[..., PlantedRun], episode: Any, workers: Workers
) -> tuple[PlantedRun, list[str]]:
    """``plant(episode)`` with its progress lines kept, to be said in episode order."""
    lines: list[str] = []
    return plant(episode, workers, lines.append), lines


def _plant_episode(
    system_name: str,
    factory: Callable[..., MemorySystem],
    faults: Sequence[OperationFault],
    episode: Any,
    dataset_uri: str,
    lm: OptloopLM,
    work: Path,
    embedder: Embedder,
    workers: Workers | None,
    say: Callable[[str], None],
) -> PlantedRun:
    """One episode of :func:`run_planted`: its clean run, then each fault's run, attributed."""
    planted = PlantedRun([])
    clean_run = _run(
        factory,
        work / system_name / "clean" / episode.id,
        episode,
        None,
        dataset_uri,
        lm,
        workers=workers,
    )
    clean_graph, clean = clean_run.graph, clean_run.predictions
    assert clean_graph is not None  # fresh stores record every run
    passing = {q.id for q in episode.questions if passed(q, clean[q.id])}
    judges = default_judges(embedder)
    # A clean pass is a sound baseline only if the evidence reached the answer (not a lucky guess).
    sound = {
        q.id
        for q in episode.questions
        if q.id in passing and evidence_reaches_answer(clean_graph, q, judges, embedder=embedder)
    }
    planted.baselines.append(
        CleanBaseline(
            system_name, dataset_uri, episode.id, len(episode.questions), len(passing), len(sound)
        )
    )
    say(f"{system_name} {episode.id}: {len(passing)}/{len(episode.questions)} pass clean")
    for fault in faults:
        tally = FaultTally(
            system_name,
            dataset_uri,
            episode.id,
            fault.name,
            fault.target.format(system=system_name),
            fault.error_type.value,
            fault.added,
            len(episode.questions),
            len(passing),
            ran=bool(passing),
        )
        planted.tallies.append(tally)
        if not passing:
            continue
        caused = _Caused(fault, passing, sound, judges, embedder)
        run = _run(
            factory,
            work / system_name / fault.name / episode.id,
            episode,
            fault,
            dataset_uri,
            lm,
            Attributor(judges, embedder, select=caused),
            workers=workers,
        )
        for outcome in run.outcomes:
            if outcome.passed:
                continue
            if outcome.question_id not in passing:
                tally.failed_both += 1
            elif outcome.attribution is not None:
                tally.caused += 1
                planted.cases.append(
                    Case(
                        system_name,
                        fault.name,
                        episode.id,
                        outcome.attribution,
                        tally.true_target,
                        fault.error_type,
                        run.attribution_s[outcome.question_id],
                        run.attribution_calls[outcome.question_id],
                        dataset=dataset_uri,
                        question_id=outcome.question_id,
                        set_aside=caused.reasons.get(outcome.question_id),
                    )
                )
        say(
            f"{system_name} {episode.id} {fault.name}: {tally.caused} failure(s) caused "
            f"({sum(c.fault == fault.name and c.induced for c in planted.cases)} induced)"
        )
    return planted
