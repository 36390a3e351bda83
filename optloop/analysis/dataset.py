"""Attribution over a whole dataset: every episode run through the one pipeline with every memory
operation recorded, each wrong answer traced to its decisive operation, error type and prompt site
(or knob), the blame summed per target. :func:`attribute` is ``optloop.attribute(...)``;
:func:`attribute_dataset` is what it and ``optloop attribute`` (:mod:`optloop.cli.attribute`)
run. Nothing here prints: progress reaches the caller through a callback (:class:`EpisodeDone`).
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from optloop import failures
from optloop.attribution import blame, default_judges
from optloop.datasets import load_dataset
from optloop.pipeline import Attributor, FreshStores, run_episodes
from optloop.progress import episode_line
from systems import get_system

# What the command and attribute() attribute when not told: written here once, read by both.
DEFAULT_SYSTEM = "rag_bm25"
DEFAULT_DATASET = "builtin:tiny"


class EpisodeDone(BaseModel):
    """One episode run, traced and attributed, as :func:`attribute_dataset` reports it to its
    ``progress`` callback: this episode, and the counts of every episode done so far."""

    episode: str = Field(description="the episode's id")
    done: int = Field(description="episodes done, this one included")
    total: int = Field(description="episodes in the dataset")
    questions: int = Field(description="questions asked so far")
    correct: int = Field(description="questions answered right so far")
    failures: int = Field(description="wrong answers attributed so far")
    seconds: float = Field(description="wall time since the first episode started")

    @property
    def eta_s(self) -> float | None:
        """Seconds the episodes left should take at the pace so far (``None`` once done)."""
        left = self.total - self.done
        return self.seconds / self.done * left if left and self.done else None

    def text(self) -> str:
        """``episode 3/40 recall-2: 4/6 correct so far, 2 failures attributed, ETA 2 min``"""
        return episode_line(
            self.done,
            self.total,
            self.episode,
            self.questions,
            self.correct,
            self.failures,
            self.eta_s,
        )


def attribute_dataset(
    system_name: str,
    dataset_uri: str,
    lm: Any,
    work: Path,
    *,
    embedder: Any = None,
    traces: bool = False,
    llm_judge: bool = False,
    agent: bool = False,
    progress: Callable[[EpisodeDone], None] | None = None,
) -> dict[str, Any]:
    """Run, trace and attribute every episode through the one pipeline
    (:func:`optloop.pipeline.run_episodes`:
    ``--concurrency`` at a time, reported in episode order); returns the report (graphs saved under
    ``work/graphs``).

    With ``agent`` the LLM agent (:mod:`optloop.attribution.agent`) re-examines the cases the
    deterministic walk marks ambiguous. ``progress`` is called once per episode, in episode order,
    as soon as it is attributed (:class:`EpisodeDone`); nothing is printed here.
    """
    from optloop.attribution.agent import AttributionAgent
    from optloop.embed import get_embedder

    dataset = load_dataset(dataset_uri)
    cls = get_system(system_name)
    embedder = embedder or get_embedder()
    judges = default_judges(embedder, lm if llm_judge else None)
    explorer = AttributionAgent(lm) if agent else None
    attributor = Attributor(judges, embedder, agent=explorer)
    stores = FreshStores(
        lambda episode: cls(lm, work / "runs" / episode.id, embedder=embedder),
        lm,
        dataset_uri=dataset.uri,
    )
    attributions, questions, correct, timings = [], 0, 0, []
    mark = lm.accounting.mark()
    started = time.perf_counter()
    for done, result in enumerate(
        run_episodes(
            dataset.episodes,
            stores,
            lm=lm,
            attributor=attributor,
            keep="all",
            save_graph=lambda graph, episode: _save(graph, work, episode.id),
        ),
        start=1,
    ):
        questions += len(result.outcomes)
        correct += sum(o.passed for o in result.outcomes)
        timings += [
            result.attribution_s[o.question_id]
            for o in result.outcomes
            if o.attribution is not None
        ]
        failed = result.attributions()
        attributions += failed
        if traces and failed:
            from optloop.services import tracking
            from optloop.tracing.mlflow_traces import log_graph_traces

            tracking.configure()
            tracking.experiment(f"optloop-attribution-{system_name}")

            assert result.graph is not None
            log_graph_traces(
                result.graph,
                [a.question_id for a in failed],
                {a.question_id: a.to_annotation() for a in failed},
            )
        if progress is not None:
            progress(
                EpisodeDone(
                    episode=result.episode.id,
                    done=done,
                    total=len(dataset.episodes),
                    questions=questions,
                    correct=correct,
                    failures=len(attributions),
                    seconds=time.perf_counter() - started,
                )
            )
    usage = lm.accounting.totals(since=mark)
    failures.check(
        usage.errors,
        usage.calls,
        what=f"optloop.attribute of {system_name} on {dataset.uri}",
        first=failures.first_error(lm.accounting.since(mark)),
    )
    entries = blame(attributions, passed=correct)
    return {
        "system": system_name,
        "dataset": dataset.uri,
        "questions": questions,
        "correct": correct,
        "accuracy": correct / questions if questions else None,
        "failures": len(attributions),
        "blame": [e.model_dump() for e in entries],
        "by_type_and_site": [
            {"type": t, "target": s, "n": n}
            for (t, s), n in Counter(
                (a.error_type.value, a.target or "-") for a in attributions
            ).most_common()
        ],
        "attributions": [a.model_dump(mode="json") for a in attributions],
        "median_attribution_ms": sorted(timings)[len(timings) // 2] * 1000 if timings else None,
        "judge_calls": dict(judges.calls),
        "ambiguous": sum(a.ambiguous for a in attributions),
        "agent_calls": explorer.calls if explorer else 0,
        "cost": {
            "llm_calls": usage.calls,
            "tokens": usage.tokens,
            "seconds": round(time.perf_counter() - started, 1),
        },
        "failed_calls": usage.errors,
    }


def _save(graph: Any, work: Path, episode_id: str) -> str:
    path = work / "graphs" / f"{episode_id}.json"
    graph.save(path)
    return str(path)


class AttributionReport(BaseModel):
    """What :func:`attribute` found: the same report ``optloop attribute`` writes to
    ``report.json``."""

    model_config = ConfigDict(extra="allow")

    system: str
    dataset: str
    questions: int = Field(description="questions asked")
    correct: int = Field(description="questions answered right")
    accuracy: float | None = Field(description="correct / questions (None without questions)")
    failures: int = Field(description="wrong answers, each attributed")
    blame: list[dict[str, Any]] = Field(
        description="per target (prompt site or knob:<name>), ranked by failure "
        "rate: failures, share, rate with its 95% CI"
    )
    by_type_and_site: list[dict[str, Any]] = Field(
        description="failures per error type and target"
    )
    attributions: list[dict[str, Any]] = Field(
        description="one per wrong answer: decisive operation, error type, target, explanation"
    )
    graphs: Path | None = Field(
        None, description="the folder of execution graphs, one per episode"
    )


def attribute(
    system: str = DEFAULT_SYSTEM,
    dataset: str = DEFAULT_DATASET,
    lm: str | None = None,
    *,
    lm_base_url: str | None = None,
    concurrency: int | None = None,
    out: str | Path | None = None,
    traces: bool = False,
    llm_judge: bool = False,
    agent: bool = False,
    progress: Callable[[EpisodeDone], None] | None = None,
) -> AttributionReport:
    """Run a memory system over a dataset and attribute every wrong answer to its cause.

    The same attribution as ``optloop attribute``: the system runs with every memory operation
    recorded, and each failed question is traced to its decisive operation (the first one that lost
    the evidence), its error type, and the prompt site or knob to fix; blame is summed per target.

    Example:

        .. code-block:: python

            import optloop

            report = optloop.attribute(system="rag_bm25", dataset="builtin:tiny")
            for entry in report.blame:
                print(entry["target"], entry["failures"])

    Args:
        system:
            A memory system of ``systems.SYSTEMS``.
        dataset:
            A dataset URI (see ``docs/systems.md``).
        lm:
            The LM spec (``local``, ``local:<name>``, ``local:/path/model.gguf``,
            ``openai:<model>``); :obj:`None` reads ``OPTLOOP_LM``, else ``local``.
        lm_base_url:
            Base URL of an OpenAI-compatible endpoint (else ``OPENAI_BASE_URL``).
        concurrency:
            LM requests in flight at once.
        out:
            A folder to keep the execution graphs in (``<out>/graphs``); :obj:`None` keeps none.
        traces:
            Also log one MLflow trace per failed question.
        llm_judge:
            Let an LLM judge settle the cases the lexical and embedding judges cannot.
        agent:
            Let an LLM agent re-examine the cases the deterministic walk leaves ambiguous.
        progress:
            Called once per episode as soon as it is attributed, in episode order, with an
            :class:`EpisodeDone` (``print(done.text())`` prints the line ``optloop attribute``
            prints); :obj:`None` says nothing.

    Returns:
        The :class:`AttributionReport`: accuracy, blame per target, failures per error type and
        target, and every attribution.

    Raises:
        optloop.errors.OptloopError:
            An unknown system, a malformed dataset, or an LM that cannot be reached.
    """
    from optloop.datasets import load_dataset
    from optloop.lm import LMSettings, OptloopLM
    from systems import get_system

    cls = get_system(system)
    load_dataset(dataset)  # a malformed dataset fails here, before any LLM call
    settings = LMSettings.from_spec(
        lm, defaults=cls.local_decoding, base_url=lm_base_url, concurrency=concurrency
    )
    model = OptloopLM(settings)
    with tempfile.TemporaryDirectory(prefix="optloop-attr-") as tmp:
        report = attribute_dataset(
            system,
            dataset,
            model,
            Path(tmp),
            traces=traces,
            llm_judge=llm_judge,
            agent=agent,
            progress=progress,
        )
        graphs = None
        if out is not None and (Path(tmp) / "graphs").exists():
            graphs = Path(out) / "graphs"
            shutil.rmtree(graphs, ignore_errors=True)
            shutil.copytree(Path(tmp) / "graphs", graphs)
    return AttributionReport.model_validate({**report, "graphs": graphs})
