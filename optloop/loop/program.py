"""A memory system as a DSPy program whose only tunable predictors are the blamed sites.

``MemoryProgram(question)`` answers one question of an episode: it reuses (or
builds) the episode's store for the program's ingest prompts, then retrieves and
answers with the program's own predictors, so DSPy's trace sees exactly the
calls the optimizer can change.

The program is data: its tunable sites' ``dspy.Predict`` modules (what
``named_predictors()`` returns, so SIMBA and GEPA can change nothing else), the
other sites' states and the knobs. It holds no live object, so DSPy deep-copies
it like any program. What runs it is the evaluator of the optimization (the
stores, the system, the attribution), which the optimizer lends for the length
of a round with :func:`running`: it travels in ``dspy.context``, which DSPy
carries into the worker threads of its own parallel executor.

:func:`feedback_metric` scores a prediction and returns the attribution beside
the score (error type, site, explanation), which is what SIMBA's rule step
(the ``worse_reward_info``) and GEPA's reflection (``feedback``) read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import dspy

from optloop.loop.candidate import Candidate, SiteState, site_state

if TYPE_CHECKING:
    from optloop.datasets import Dataset
    from optloop.loop.evaluate import Evaluator

# the dspy.context key the running evaluator travels under
RUNNER_SETTING = "optloop_program_runner"


@contextmanager
def running(evaluator: Evaluator) -> Iterator[None]:
    """Let :class:`MemoryProgram` s run on ``evaluator`` inside this block (and in the threads DSPy
    starts from it)."""
    with dspy.context(**{RUNNER_SETTING: evaluator}):
        yield


def runner() -> Evaluator:
    """The evaluator a program runs on (see :func:`running`)."""
    evaluator = dspy.settings.get(RUNNER_SETTING)
    if evaluator is None:
        raise RuntimeError(
            "a MemoryProgram runs only inside optloop.loop.program.running(evaluator)"
        )
    return evaluator


def attr_name(site: str) -> str:
    """A site name as a Python attribute (``mem0.extract`` -> ``mem0__extract``)."""
    return site.replace(".", "__")


def site_name(predictor_name: str) -> str:
    return predictor_name.split(".")[0].replace("__", ".")


class MemoryProgram(dspy.Module):
    """``candidate`` as a program whose predictors are the ``tunable`` sites' ``modules``.

    ``modules`` are fresh modules of every site carrying ``candidate``'s state
    (``Evaluator.modules(candidate)``); the program keeps the tunable ones, the others as plain
    state, which ``named_predictors()`` does not see.
    """

    def __init__(
        self, candidate: Candidate, tunable: Iterable[str], modules: Mapping[str, dspy.Predict]
    ):
        super().__init__()
        self.knobs = dict(candidate.knobs)
        self.tunable = [s for s in tunable if s in modules]
        for site in self.tunable:
            setattr(self, attr_name(site), modules[site])
        self.frozen: dict[str, SiteState] = {
            n: site_state(m) for n, m in modules.items() if n not in self.tunable
        }

    def tunable_modules(self) -> dict[str, dspy.Predict]:
        return {s: getattr(self, attr_name(s)) for s in self.tunable}

    def candidate(self, origin: str) -> Candidate:
        sites = {**self.frozen, **{s: site_state(m) for s, m in self.tunable_modules().items()}}
        return Candidate(sites=sites, knobs=dict(self.knobs), origin=origin)

    def forward(self, episode_id: str, question_id: str, question: str = "") -> dspy.Prediction:
        evaluator = runner()
        episode, q = evaluator.lookup(episode_id, question_id)
        candidate = self.candidate("program")
        modules = {**evaluator.modules(candidate), **self.tunable_modules()}
        store, _ = evaluator.store(candidate, episode, modules)
        outcome = evaluator.ask(store, candidate, modules, episode, q)
        attribution = outcome.attribution.model_dump(mode="json") if outcome.attribution else None
        return dspy.Prediction(
            answer=outcome.prediction,
            passed=outcome.passed,
            score=outcome.score,
            attribution=attribution,
        )


def examples(dataset: Dataset) -> list[dspy.Example]:
    """One DSPy example per question (the program looks the episode up by id)."""
    return [
        dspy.Example(
            episode_id=e.id, question_id=q.id, question=q.question, gold=q.gold
        ).with_inputs("episode_id", "question_id", "question")
        for e in dataset.episodes
        for q in e.questions
    ]


def feedback_metric(
    gold: dspy.Example,
    pred: dspy.Prediction | None,
    trace: Any = None,
    pred_name: str | None = None,
    pred_trace: Any = None,
) -> dspy.Prediction:
    """Score plus the attribution: the why that SIMBA's and GEPA's reflection steps read."""
    if pred is None:
        return dspy.Prediction(
            score=0.0, feedback="The program raised before answering.", error_type=None, site=None
        )
    if pred.passed:
        return dspy.Prediction(
            score=float(pred.score),
            feedback=f"Correct: {pred.answer!r} matches {gold.gold!r}.",
            error_type=None,
            site=None,
        )
    a = pred.attribution or {}
    target, error = a.get("target"), a.get("error_type")
    feedback = (
        f"Wrong: answered {pred.answer!r}, expected {gold.gold!r}. Attribution: {error} at "
        f"{target or 'no single site'}. {a.get('explanation', '')}"
    )
    if pred_name is not None and target and site_name(pred_name) != target:
        feedback += f" (This failure is blamed on {target}, not on {site_name(pred_name)}.)"
    return dspy.Prediction(
        score=float(pred.score), feedback=feedback, error_type=error, site=target
    )


class AllSites(dspy.Module):
    """Every site's module under its attribute name: what ``program.json`` (DSPy's ``save``)
    holds."""

    def __init__(self, modules: dict[str, dspy.Predict]):
        super().__init__()
        for site, module in modules.items():
            setattr(self, attr_name(site), module)

    def forward(self, **kwargs: Any) -> dspy.Prediction:
        raise NotImplementedError(
            "AllSites only carries prompt state; run it through a MemoryProgram"
        )
