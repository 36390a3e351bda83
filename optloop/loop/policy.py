"""The loop's rules, as pure functions: split, targets, start program, promotion, held-out
statistics.

Each takes data and returns a decision; none logs, evaluates or writes state, so the
controller (:mod:`optloop.loop.controller`) and the tests call them alike. See
``docs/architecture.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from optloop.datasets import Dataset, split_episodes
from optloop.errors import ConfigError, DatasetError
from optloop.loop.candidate import Candidate
from optloop.loop.state import LoopConfig
from optloop.sites import ANSWER
from optloop.stats import Interval, bootstrap_mean, paired_bootstrap_delta
from optloop.text import start_text

if TYPE_CHECKING:
    from optloop.attribution import BlameEntry
    from optloop.loop.evaluate import Evaluation, Evaluator
    from systems.base import MemorySystem

FEW_QUESTIONS = 20  # fewer dev or test questions than this and a 95% CI spans more than about ±0.2


def held_out_intervals(
    before: Evaluation, after: Evaluation, *, seed: int
) -> tuple[Interval, Interval, Interval]:
    """(test accuracy before, after, delta), each with its bootstrap CI over the test questions;
    the delta pairs each question's pass before with its pass after by (episode, question)."""
    passed_after = {(o.episode_id, o.question_id): float(o.passed) for o in after.outcomes}
    pairs = [
        (float(o.passed), passed_after[key])
        for o in before.outcomes
        if (key := (o.episode_id, o.question_id)) in passed_after
    ]
    return (
        bootstrap_mean([float(o.passed) for o in before.outcomes], seed=seed),
        bootstrap_mean([float(o.passed) for o in after.outcomes], seed=seed),
        paired_bootstrap_delta([b for b, _ in pairs], [a for _, a in pairs], seed=seed),
    )


def promotion(rule: Literal["ci", "delta"], changed: bool, delta: Interval) -> tuple[bool, str]:
    """(move the ``champion`` alias?, why): with ``ci`` only when the held-out delta's CI lies
    above 0, with ``delta`` when its point value is above 0; a candidate that changed nothing never
    moves it."""
    if not changed:
        return False, "the baseline stayed best on dev: no new prompt to promote"
    level = f"{delta.confidence:.0%} CI"
    where = "is above 0" if delta.above_zero else "is below 0" if delta.high < 0 else "includes 0"
    if rule == "ci":
        moved, why = delta.above_zero, f"its {level} {where}"
    else:
        moved = delta.estimate > 0
        why = f"the point delta is {'above' if moved else 'not above'} 0 (its {level} {where})"
    return moved, (
        f"held-out delta {delta}: {why}, champion {'moved' if moved else 'not moved'} "
        f"(--promote-if {rule})"
    )


def small_split_warning(n_dev: int, n_test: int) -> str | None:
    """A warning when dev or test is too small for its accuracy to mean much (``None`` when both
    are fine)."""
    if min(n_dev, n_test) >= FEW_QUESTIONS:
        return None
    # a 95% CI's half-width at accuracy 0.5
    spread = 1.96 * 0.5 / math.sqrt(max(min(n_dev, n_test), 1))
    return (
        f"dev has {n_dev} questions, test {n_test}: a 95% CI this small spans about "
        f"\u00b1{spread:.1f}; use more episodes (?limit=) or --split"
    )


def detectable_gain(n: int, accuracy: float) -> float:
    """The smallest held-out gain ``n`` questions can show at ``accuracy``: the 95% CI half-width
    of an accuracy measured on ``n`` questions, its accuracy shrunk toward 0.5 by two passes and
    two failures (Agresti-Coull), so a baseline at 0 or 1 still has a width. A paired difference
    between two programs that agree on most questions is narrower; this is the width a change of
    unknown size must clear."""
    if n <= 0:
        return 1.0
    p = (accuracy * n + 2) / (n + 4)
    return 1.96 * math.sqrt(p * (1 - p) / n)


def questions_for(gain: float, accuracy: float) -> int:
    """The questions a split needs for :func:`detectable_gain` to reach ``gain`` at
    ``accuracy``."""
    p = min(max(accuracy, 0.05), 0.95)
    return math.ceil(1.96**2 * p * (1 - p) / gain**2)


def power_line(
    n_dev: int,
    n_test: int,
    accuracy: float | None,
    min_gain: float,
    test_accuracy: float | None = None,
) -> str:
    """What the run's splits can show: ``power: dev 20 and test 20 questions at the baseline's 0.30
    show gains of ±0.21 and ±0.21 (95% CI half-widths)``, then whether the held-out one is within
    ``min_gain`` and, when it is not, what to change. ``accuracy`` ``None``: before the baseline,
    at 0.5 (the widest). ``test_accuracy``: the held-out split's own (the start program's on test,
    once measured: the summary's), else ``accuracy``."""
    at = 0.5 if accuracy is None else accuracy
    at_test = at if test_accuracy is None else test_accuracy
    dev, test = detectable_gain(n_dev, at), detectable_gain(n_test, at_test)
    if accuracy is None:
        where = f"dev {n_dev} and test {n_test} questions at 0.50 (before the baseline)"
    elif test_accuracy is None:
        where = f"dev {n_dev} and test {n_test} questions at the baseline's {at:.2f}"
    else:
        where = (
            f"dev {n_dev} questions at the baseline's {at:.2f} and test {n_test} at its "
            f"{at_test:.2f}"
        )
    line = (
        f"power: {where} show gains of \u00b1{dev:.2f} and \u00b1{test:.2f} (95% CI half-widths)"
    )
    if test <= min_gain:
        return f"{line}, within --min-gain {min_gain:g}"
    return (
        f"{line}; a held-out gain under {test:.2f} reads 'no measurable change', wider than "
        f"--min-gain {min_gain:g}: about {questions_for(min_gain, at_test)} test questions would "
        f"show {min_gain:g} (a --dataset with more questions, or a larger test share with --split)"
    )


def floor_warning(train_passed: int, n_train: int, dev_passed: int, n_dev: int) -> str | None:
    """A warning when the baseline answered no dev question (``None`` when it answered some).

    A candidate wins only by beating the baseline on dev, so from 0 it must make a question pass
    that no prompt of the baseline's made pass; on a model or dataset the system cannot answer
    at all, the budget buys nothing, and the user is told before it is spent.
    """
    if dev_passed or not n_dev:
        return None
    return (
        f"the baseline answered none of the {n_dev} dev questions ({train_passed} of {n_train} "
        "train): a candidate wins only by making some pass, so the budget may buy nothing; "
        "check the model (optloop doctor, --lm) and that --dataset suits --system"
    )


def check_split_sizes(dataset: str, n_dev: int, n_test: int) -> None:
    """Refuse a run whose dev or test split has fewer than :data:`FEW_QUESTIONS` questions: on so
    few, the candidates are chosen and the held-out delta measured on noise
    (``optloop.run --allow-small-splits`` runs it anyway). A :class:`ConfigError` (exit 2) naming
    ``--dataset`` and ``--split``."""
    if min(n_dev, n_test) >= FEW_QUESTIONS:
        return
    spread = 1.96 * 0.5 / math.sqrt(max(min(n_dev, n_test), 1))
    raise ConfigError(
        f"{dataset} splits into {n_dev} dev and {n_test} test questions, fewer than "
        f"{FEW_QUESTIONS} (a 95% CI of \u00b1{spread:.1f}): give a larger --dataset (more "
        "episodes) or a --split with larger dev and test shares, or --allow-small-splits to "
        "run anyway"
    )


def split_dataset(dataset: Dataset, config: LoopConfig) -> tuple[Dataset, Dataset, Dataset]:
    if len(dataset.episodes) < 3:
        raise DatasetError(
            f"{dataset.uri}: the loop splits train/dev/test by episode and needs at least 3 "
            f"episodes; this dataset has {len(dataset.episodes)}"
        )
    train, dev, test = split_episodes(dataset, config.fractions, seed=config.seed)
    for part in (train, dev, test):
        if not any(e.questions for e in part.episodes):
            raise DatasetError(f"{part.name} has no question; use a dataset with more episodes")
    return train, dev, test


def choose_targets(
    entries: Sequence[BlameEntry], config: LoopConfig, all_sites: list[str]
) -> tuple[list[str], list[str], str]:
    """(sites, knobs, note): what the optimizer may change, from the blame (most blamed first).

    ``--sites`` wins; ``--untargeted`` gives every site; otherwise the blamed prompt sites of this
    system, or the answer site when none is blamed (the note says why). Knobs are the blamed knobs.
    """
    if config.sites:
        unknown = sorted(set(config.sites) - set(all_sites))
        if unknown:
            raise ConfigError(
                f"--sites {','.join(unknown)}: no such site on {config.system}; its sites are "
                f"{', '.join(all_sites)}"
            )
        left = [e.target for e in entries if e.blamed.name not in config.sites]
        return (
            list(config.sites),
            [],
            f"--sites {','.join(config.sites)}: the optimizer rewrites only "
            + ("these" if len(config.sites) > 1 else "this site")
            + (f"; the blame also names {', '.join(left)}, left as they are" if left else ""),
        )
    targets = [e.blamed for e in entries]
    knobs = [t.name for t in targets if t.kind == "knob"]
    if config.untargeted:
        return list(all_sites), knobs, "untargeted: every prompt site"
    sites = [t.name for t in targets if t.is_prompt_site and t.name in all_sites]
    if sites:
        return sites, knobs, ""
    note = (
        "no prompt site is to blame"
        + (
            f" (blame: {', '.join(str(t) for t in targets)})"
            if targets
            else " (no failure was attributed to a site)"
        )
        + "; the optimizer targets the answer site"
        + ("; --optimizer optuna also tunes the blamed knobs" if knobs else "")
    )
    return [ANSWER], knobs, note


NO_CONTROL = (
    "not evaluated (--no-control): the report cannot say what the loop's writing earned beyond "
    "a trivial instruction"
)


def control_sites(
    entries: Sequence[BlameEntry], config: LoopConfig, all_sites: list[str]
) -> tuple[list[str], str]:
    """(sites, note): the prompt sites the trivial-instruction control rewrites
    (:mod:`optloop.loop.trivial_control`), and why there are none.

    They are the sites of the first targeting (:func:`choose_targets`): the blamed prompt sites,
    or ``--sites``, or every site with ``--untargeted``. When no prompt site is blamed (only knobs,
    or no failure at all) the optimizer falls back to the answer site, but nothing blamed is there
    to compare with: no control. ``--no-control``: none either."""
    if not config.control:
        return [], NO_CONTROL
    sites, _, _ = choose_targets(entries, config, all_sites)
    if config.sites or config.untargeted:
        return sites, ""
    blamed = {e.blamed.name for e in entries if e.blamed.is_prompt_site}
    if chosen := [s for s in sites if s in blamed]:
        return chosen, ""
    why = (
        f"the blame names no prompt site (only {', '.join(e.target for e in entries)})"
        if entries
        else "no failure was blamed on a prompt site"
    )
    return [], f"none: {why}, so there is no prompt to replace with the trivial instruction"


def start_candidate(evaluator: Evaluator, config: LoopConfig) -> Candidate:
    """The program the run starts from: the system's own prompts, with ``config.start``'s
    instructions."""
    base = evaluator.baseline()
    check_start(config, list(base.sites))
    if not config.start:
        return base
    sites = {
        name: state.model_copy(
            update={"instructions": start_text(state.instructions, config.start[name])}
        )
        if name in config.start
        else state
        for name, state in base.sites.items()
    }
    return Candidate(sites=sites, knobs=base.knobs, origin="baseline (start instructions)")


def check_knobs(config: LoopConfig, system: type[MemorySystem]) -> None:
    """``--knob`` names knobs of ``system``, each with a value of its default's type (a whole
    number for ``top_k``): a :class:`ConfigError` naming the knob otherwise, before anything is
    written."""
    defaults = system.default_knobs
    unknown = sorted(set(config.knobs) - set(defaults))
    if unknown:
        raise ConfigError(
            f"{config.system} has no knob(s) {unknown}; its knobs are {sorted(defaults)}"
        )
    for name, value in config.knobs.items():
        default = defaults[name]
        kind = type(default)
        fits = (
            default is None
            or value is None  # None: the knob off, where a system allows it
            or (isinstance(value, kind) and isinstance(value, bool) == (kind is bool))
            or (kind is float and isinstance(value, int) and not isinstance(value, bool))
        )
        if not fits:
            what = {
                bool: "true or false",
                int: "a whole number",
                float: "a number",
                str: "a text",
            }.get(kind, kind.__name__)
            raise ConfigError(
                f"--knob {name}={value!r}: {config.system}'s {name} takes {what}, "
                f"e.g. --knob {name}={json.dumps(default)}"
            )


def check_start(config: LoopConfig, sites: list[str]) -> None:
    unknown = sorted(set(config.start) - set(sites))
    if unknown:
        raise ConfigError(
            f"--start {', '.join(unknown)}: no such site on {config.system}; its sites are "
            f"{', '.join(sites)}"
        )


def questions(dataset: Dataset) -> int:
    """How many questions ``dataset`` holds over all its episodes."""
    return sum(len(e.questions) for e in dataset.episodes)
