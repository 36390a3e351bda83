"""SIMBA's search on one program pool kept across the loop's rounds (and across a resume).

``dspy.SIMBA`` (Stochastic Introspective Mini-Batch Ascent) keeps its pool of programs and
their mini-batch scores only inside one ``compile``; the loop asks for candidates a round at a
time, so a fresh ``dspy.SIMBA`` per round started again from a single program every time. Here
one SIMBA step runs per round on a :class:`SimbaPool` that lives as long as the optimizer, and
on disk (``pool.json``), so a resumed run goes on with it. One step, as SIMBA's:

1. the next mini-batch of train examples (one seeded shuffle, walked across rounds);
2. trajectories: for each of ``num_candidates`` temperature-1 copies of the system LM and each
   example, a program drawn from the pool's top programs (softmax over their mean mini-batch
   scores; the loop's best program, the *anchor*, always among them) runs the example;
3. the examples sorted by how much their trajectories' scores differ (max-to-min gap, max
   score, max-to-mean gap);
4. for each in turn, a program drawn from the top programs loses some demos and gains either
   a demo (the best trajectory's calls, :func:`append_demo`) or a rule (the proposer's advice
   from the better and the worse trajectory, :func:`offer_advice`; advice that is not a
   well-formed instruction makes no program), until ``num_candidates + 1`` programs are made;
5. the new programs run the same mini-batch and join the pool with their scores.

The step's winner (the new program best on the mini-batch) is what the loop evaluates on dev.
Unlike ``dspy.SIMBA``, the winners are not scored again on the whole train split: the loop's dev
evaluation is that check.

This is optloop's own code over DSPy's public API (``dspy.Module``, ``dspy.Predict``,
``dspy.context``): no DSPy internals. The advice prompt (:func:`advice_signature`) is
optloop's own text. Programs run through :func:`run_example`, which returns what the metric said
(the attribution of a failure) beside the score.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import dspy
from pydantic import BaseModel, Field

from optloop.lm import prompt_site
from optloop.loop.candidate import Candidate
from optloop.loop.optimizers.base import PROPOSER_SITE
from optloop.loop.program import MemoryProgram, feedback_metric, site_name
from optloop.loop.proposals.gate import current_gate
from optloop.paths import write_atomic
from signatures._layout import jsonable

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# an input field longer than this is cut in a demo (dspy.SIMBA's default)
DEMO_INPUT_MAX_CHARS = 100_000


# --- running programs ------------------------------------------------------------------------


@dataclass
class Run:
    """One program on one example: its prediction, the tunable predictors' calls, the metric's
    verdict."""

    example: dspy.Example
    prediction: dspy.Prediction | None
    # (predictor name, inputs, outputs), in order
    steps: list[tuple[str, dict[str, Any], dict[str, Any]]]
    score: float
    # the metric's other fields: feedback, error_type, site
    info: dict[str, Any] = field(default_factory=dict)


def run_example(program: dspy.Module, example: dspy.Example) -> Run:
    """Run ``program`` on ``example`` with a trace of its own, and score it
    with :func:`feedback_metric`.

    A program that raises scores 0 (the metric says so); the error is logged."""
    names = {id(p): n for n, p in program.named_predictors()}
    with dspy.context(trace=[]):
        try:
            prediction = program(**example.inputs())
        except Exception as exc:  # noqa: BLE001 - a failed run is a trajectory with score 0
            logger.warning("program run failed on %s: %s", example.get("question_id"), exc)
            prediction = None
        trace = list(dspy.settings.trace)
    steps = [
        (names[id(p)], dict(inputs), dict(outputs))
        for p, inputs, outputs in trace
        if id(p) in names
    ]
    verdict = feedback_metric(example, prediction)
    return Run(
        example,
        prediction,
        steps,
        float(verdict.score),
        {k: v for k, v in verdict.items() if k != "score"},
    )


def parallel_map(fn: Callable[[T], R], items: Sequence[T], num_threads: int) -> list[R]:
    """``[fn(x) for x in items]``, on ``num_threads`` threads, each call in a copy of the caller's
    context (DSPy's settings, the running evaluator, optloop's prompt site travel with it)."""
    if num_threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    contexts = [contextvars.copy_context() for _ in items]
    with ThreadPoolExecutor(max_workers=min(num_threads, len(items))) as pool:
        return list(pool.map(lambda pair: pair[0].run(fn, pair[1]), zip(contexts, items)))


# --- the advice prompt -----------------------------------------------------------------------

ADVICE_INSTRUCTIONS = (
    "You coach the modules of an AI assistant's memory pipeline. You see how the pipeline ran "
    "on one input: a worse run and, when there is one, a better run. Each shows what every "
    "module received and produced, the reward the run earned, and why it earned it (for a wrong "
    "answer: which module the failure was traced to, and how). For each module named in the "
    "output, write advice that would make that module act like the better run, or avoid the "
    "worse run's mistake, the next time it gets similar inputs. Advise each module on its own "
    "step only. Make the advice concrete enough to change what the module does and general "
    "enough to help on other inputs: say which inputs it applies to and what to do with them. "
    "Leave a module's advice empty when it did nothing wrong."
)


def advice_signature(module_names: Sequence[str]) -> type[dspy.Signature]:
    """The advice prompt with one output field per module, so the answer has exactly those keys."""
    fields: dict[str, Any] = {
        "program_modules": (
            str,
            dspy.InputField(
                desc="each module of the pipeline: its inputs, outputs and instructions"
            ),
        ),
        "program_inputs": (str, dspy.InputField(desc="the input both runs received")),
        "expected": (
            str,
            dspy.InputField(desc="what a correct run returns (hidden from the modules)"),
        ),
        "worse_run": (
            str,
            dspy.InputField(
                desc="the worse run: each module's inputs and outputs, in order; [] when "
                "there is none"
            ),
        ),
        "worse_outputs": (str, dspy.InputField(desc="what the worse run returned")),
        "worse_reward": (str, dspy.InputField(desc="the worse run's reward (1.0 is correct)")),
        "worse_reward_info": (str, dspy.InputField(desc="why the worse run earned that reward")),
        "better_run": (str, dspy.InputField(desc="the better run, or [] when there is none")),
        "better_outputs": (str, dspy.InputField(desc="what the better run returned")),
        "better_reward": (str, dspy.InputField(desc="the better run's reward, or N/A")),
        "better_reward_info": (str, dspy.InputField(desc="why the better run earned that reward")),
        "discussion": (str, dspy.OutputField(desc="where each module went wrong, if it did")),
    }
    for name in module_names:
        fields[name] = (
            str,
            dspy.OutputField(
                desc=f"advice for module {name}: if it receives <such inputs>, it should <do this>"
            ),
        )
    return dspy.make_signature(fields, ADVICE_INSTRUCTIONS, signature_name="OfferAdvice")


def describe_modules(program: dspy.Module) -> str:
    """Each tunable module: its name, input and output fields, and current instructions."""
    parts = []
    for name, predictor in program.named_predictors():
        sig = predictor.signature
        inputs = ", ".join(sig.input_fields)
        outputs = ", ".join(sig.output_fields)
        parts.append(
            f"Module {name}\n  inputs: {inputs}\n  outputs: {outputs}\n  instructions: "
            f"{sig.instructions}"
        )
    return "\n\n".join(parts)


def _dump(value: Any) -> str:
    return (
        value
        if isinstance(value, str)
        else json.dumps(jsonable(value), ensure_ascii=False, indent=1)
    )


def _trajectory(run: Run | None) -> str:
    if run is None:
        return "[]"
    return _dump(
        [
            {"module": name, "inputs": inputs, "outputs": outputs}
            for name, inputs, outputs in run.steps
        ]
    )


def _side(run: Run | None) -> tuple[str, str, str, str]:
    """A run as the advice prompt shows it: trajectory, outputs, reward, reward info (N/A when
    absent)."""
    if run is None:
        return "[]", "{}", "N/A", "{}"
    return _trajectory(run), _dump(dict(run.prediction or {})), str(run.score), _dump(run.info)


def offer_advice(
    program: dspy.Module, proposer: dspy.BaseLM, *, worse: Run | None, better: Run | None
) -> dict[str, str]:
    """The proposer's advice per tunable module of ``program``, from a worse and a better run of
    one example (one of them may be missing)."""
    shown = worse or better
    if shown is None:
        raise ValueError("advice needs a run to learn from")
    names = [name for name, _ in program.named_predictors()]
    worse_run, worse_outputs, worse_reward, worse_info = _side(worse)
    better_run, better_outputs, better_reward, better_info = _side(better)
    with (
        prompt_site(PROPOSER_SITE),
        dspy.context(lm=proposer, adapter=dspy.JSONAdapter(), trace=[]),
    ):
        advice = dspy.Predict(advice_signature(names))(
            program_modules=describe_modules(program),
            program_inputs=_dump(dict(shown.example.inputs())),
            expected=_dump(dict(shown.example.labels())),
            worse_run=worse_run,
            worse_outputs=worse_outputs,
            worse_reward=worse_reward,
            worse_reward_info=worse_info,
            better_run=better_run,
            better_outputs=better_outputs,
            better_reward=better_reward,
            better_reward_info=better_info,
        )
    return {name: str(advice.get(name) or "").strip() for name in names}


def append_advice(program: dspy.Module, advice: dict[str, str]) -> list[str]:
    """Each module's advice appended to its instructions; the modules that got some.

    Advice that is not a well-formed instruction (:func:`~optloop.loop.proposals.units.problems`: a
    sentence cut short, an unmatched quote, an empty sentence) is left out and logged, as the
    edit optimizer leaves such candidates out: a prompt a person would not ship is not tried."""
    changed = []
    for name, predictor in program.named_predictors():
        text = advice.get(name, "").strip()
        if not text:
            continue
        if current_gate().refuses(site_name(name), text, who="SIMBA's advice", whole=False):
            continue
        predictor.signature = predictor.signature.with_instructions(
            f"{predictor.signature.instructions}\n\n{text}"
        )
        changed.append(name)
    return changed


def append_demo(
    program: dspy.Module, run: Run, max_chars: int = DEMO_INPUT_MAX_CHARS
) -> list[str]:
    """The run's last call of each tunable module, as a demo of that module in ``program``; the
    modules that got one."""
    predictors = dict(program.named_predictors())
    last: dict[str, dspy.Example] = {}
    for name, inputs, outputs in run.steps:
        if name in predictors:
            shown = {
                k: (
                    f"{str(v)[:max_chars]}\n\t\t... <TRUNCATED FOR BREVITY>"
                    if len(str(v)) > max_chars
                    else v
                )
                for k, v in inputs.items()
            }
            last[name] = dspy.Example(augmented=True, **shown, **outputs)
    for name, demo in last.items():
        predictors[name].demos.append(demo)
    return list(last)


# --- the pool --------------------------------------------------------------------------------


class PoolEntry(BaseModel):
    candidate: Candidate
    scores: list[float] = Field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0


class PoolState(BaseModel):
    """What ``pool.json`` holds: the programs and scores, the train order, the steps taken."""

    entries: list[PoolEntry] = Field(default_factory=list)
    order: list[int] = Field(default_factory=list)  # a shuffle of the train examples' indices
    position: int = 0  # the next mini-batch starts here
    steps: int = 0


@dataclass
class SimbaSettings:
    bsize: int = 6
    num_candidates: int = 2
    max_demos: int = 2
    temperature_for_sampling: float = 0.2
    temperature_for_candidates: float = 0.2
    num_threads: int = 1


class SimbaPool:
    """SIMBA's program pool, kept across rounds; ``path`` (a JSON file) keeps it across
    processes."""

    def __init__(self, path: Path | None, seed: int):
        self.path = path
        self.seed = seed
        self.state = PoolState()
        if path is not None and path.exists():
            self.state = PoolState.model_validate_json(path.read_text(encoding="utf-8"))
            logger.info("SIMBA pool of %d programs resumed from %s", len(self.state.entries), path)

    @property
    def entries(self) -> list[PoolEntry]:
        return self.state.entries

    def index(self, candidate: Candidate) -> int:
        """The pool index of ``candidate`` (added, with no scores, when new)."""
        digest = candidate.digest()
        for i, entry in enumerate(self.entries):
            if entry.candidate.digest() == digest:
                return i
        self.entries.append(PoolEntry(candidate=candidate))
        return len(self.entries) - 1

    def top(self, k: int, anchor: int) -> list[int]:
        """The ``k`` best programs by mean score, ``anchor`` always among them."""
        ranked = sorted(
            range(len(self.entries)), key=lambda i: self.entries[i].mean, reverse=True
        )[:k]
        if anchor not in ranked:
            ranked[-1:] = [anchor]
        return list(dict.fromkeys(ranked))

    def sample(self, rng: random.Random, indices: Sequence[int], temperature: float) -> int:
        """A softmax draw over the programs' mean scores."""
        weights = [math.exp(self.entries[i].mean / temperature) for i in indices]
        return rng.choices(list(indices), weights=weights, k=1)[0]

    def batch(self, n_examples: int, bsize: int, rng: random.Random) -> list[int]:
        """The next ``bsize`` example indices of the seeded shuffle (reshuffled when it runs
        out)."""
        state = self.state
        if len(state.order) != n_examples:
            # a new train split: shuffle below
            state.order, state.position = list(range(n_examples)), n_examples
        if state.position + bsize > n_examples:
            rng.shuffle(state.order)
            state.position = 0
        out = state.order[state.position : state.position + bsize]
        state.position += bsize
        return out

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, self.state.model_dump_json())


def _dropped_demos(rng: random.Random, program: dspy.Module, max_demos: int) -> None:
    """SIMBA's demo drop: about ``demos / max_demos`` (Poisson), at least one when a module is
    full."""
    counts = [len(p.demos) for _, p in program.named_predictors()]
    most = max(counts, default=0)
    if not most:
        return
    cap = max_demos if max_demos > 0 else 3
    drop = min(max(_poisson(rng, most / cap), int(most >= cap)), most)
    gone = {rng.randrange(most) for _ in range(drop)}
    for _, predictor in program.named_predictors():
        predictor.demos = [d for i, d in enumerate(predictor.demos) if i not in gone]


def _poisson(rng: random.Random, lam: float) -> int:
    """A Poisson draw (Knuth's method; ``lam`` is small here)."""
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def simba_step(
    pool: SimbaPool,
    anchor: Candidate,
    train: Sequence[dspy.Example],
    *,
    build: Callable[[Candidate], MemoryProgram],
    lm: dspy.BaseLM,
    proposer: dspy.BaseLM,
    settings: SimbaSettings,
) -> list[Candidate]:
    """One SIMBA step from the pool (see the module docstring); the new programs that differ from
    their source, best mini-batch score first. ``build(candidate)`` makes a runnable program of a
    candidate."""
    step = pool.state.steps = pool.state.steps + 1
    rng = random.Random(pool.seed * 1000 + step)
    bsize = min(settings.bsize, len(train))
    batch = [train[i] for i in pool.batch(len(train), bsize, rng)]
    anchor_idx = pool.index(anchor)

    # 2. trajectories: every model x every example, on programs drawn from the pool's top
    models = [
        lm.copy(rollout_id=step * settings.num_candidates + i, temperature=1.0)
        for i in range(settings.num_candidates)
    ]
    top = pool.top(settings.num_candidates, anchor_idx)
    jobs = []
    for model in models:
        for example in batch:
            program = build(
                pool.entries[pool.sample(rng, top, settings.temperature_for_sampling)].candidate
            )
            program.set_lm(model)
            jobs.append((program, example))
    runs = parallel_map(lambda job: run_example(*job), jobs, settings.num_threads)

    # 3. the examples whose trajectories differ most first
    scores = [r.score for r in runs]
    p10, p90 = _percentile(scores, 10), _percentile(scores, 90)
    buckets = []
    for i in range(len(batch)):
        bucket = sorted(runs[i :: len(batch)], key=lambda r: r.score, reverse=True)
        best, worst, mean = (
            bucket[0].score,
            bucket[-1].score,
            sum(r.score for r in bucket) / len(bucket),
        )
        buckets.append(((best - worst, best, best - mean), bucket))
    buckets.sort(key=lambda b: b[0], reverse=True)

    # 4. new programs: a demo or a rule on a program drawn from the top
    made: list[tuple[MemoryProgram, Candidate]] = []
    for _, bucket in buckets:
        source = pool.entries[
            pool.sample(
                rng,
                pool.top(settings.num_candidates, anchor_idx),
                settings.temperature_for_candidates,
            )
        ].candidate
        program = build(source)
        _dropped_demos(rng, program, settings.max_demos)
        strategy = rng.choice(["demo", "rule"] if settings.max_demos > 0 else ["rule"])
        try:
            if strategy == "demo":
                _demo_strategy(program, bucket, p10)
            else:
                _rule_strategy(program, bucket, p10, p90, proposer)
        except Exception as exc:  # noqa: BLE001 - as SIMBA: a failed strategy makes no program
            logger.warning("SIMBA %s step failed: %s", strategy, exc)
            continue
        made.append((program, source))
        if len(made) >= settings.num_candidates + 1:
            break

    # 5. the new programs on the same mini-batch, into the pool
    jobs = [(program, example) for program, _ in made for example in batch]
    runs = parallel_map(lambda job: run_example(*job), jobs, settings.num_threads)
    scored: list[tuple[float, Candidate]] = []
    for k, (program, source) in enumerate(made):
        mine = [r.score for r in runs[k * len(batch) : (k + 1) * len(batch)]]
        candidate = program.candidate(f" (step {step})")
        known = any(e.candidate.digest() == candidate.digest() for e in pool.entries)
        # a program made again: more evidence for it
        pool.entries[pool.index(candidate)].scores += mine
        if not known and candidate.digest() != source.digest():
            scored.append((sum(mine) / len(mine), candidate))
    pool.save()
    scored.sort(key=lambda pair: pair[0], reverse=True)
    logger.info(
        "SIMBA step %d: %d new program(s), mini-batch scores %s",
        step,
        len(scored),
        ", ".join(f"{s:.2f}" for s, _ in scored) or "-",
    )
    return [c for _, c in scored]


def _demo_strategy(program: MemoryProgram, bucket: Sequence[Run], p10: float) -> None:
    good = bucket[0]
    if good.score <= p10:
        logger.info(
            "SIMBA: no demo, the best trajectory (%.2f) is at or below the 10th percentile",
            good.score,
        )
        return
    append_demo(program, good)


def _rule_strategy(
    program: MemoryProgram, bucket: Sequence[Run], p10: float, p90: float, proposer: dspy.BaseLM
) -> None:
    good, bad = bucket[0], bucket[-1]
    if good.score <= p10 or bad.score >= p90:
        logger.info(
            "SIMBA: no rule, the trajectories (%.2f, %.2f) show no contrast", good.score, bad.score
        )
        return
    worse: Run | None = bad
    better: Run | None = good
    if good.score <= bad.score:  # every trajectory alike: one side only, as SIMBA
        if good.score > p90:
            worse = None  # a success to learn from
        else:
            better = None
    if not append_advice(program, offer_advice(program, proposer, worse=worse, better=better)):
        raise ValueError("the proposer gave no well-formed advice: no program made")


__all__ = [
    "PoolEntry",
    "Run",
    "SimbaPool",
    "SimbaSettings",
    "advice_signature",
    "append_advice",
    "append_demo",
    "describe_modules",
    "offer_advice",
    "parallel_map",
    "run_example",
    "simba_step",
]
