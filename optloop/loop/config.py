"""What a run is: :class:`LoopConfig`, every setting that decides a run's results (logged as its
parent run's params, digested for resuming), each with its default written once, here.

``optloop run``'s parser and ``optloop.optimize``'s signature read their defaults from these
fields; what a default depends on (the dataset, the optimizer) is decided by the rules of
:mod:`optloop.loop.runs.request`, where both entry points build a run. The module imports only
pydantic, so the Python API reads it without loading DSPy, MLflow or a memory library (the
optimizers' names come from :mod:`optloop.loop.optimizers.registry`, which imports nothing of
optloop: a run takes any name registered there when its config is made).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from optloop.loop.optimizers import registry
from optloop.loop.optimizers.registry import DEFAULT, OptimizerName

MAX_BUDGET = 500
MAX_BATCH = 64
# The smallest held-out gain a run is meant to show unless --min-gain says otherwise.
MIN_GAIN = 0.05
# Trials in a row without a new best before the headroom is checked again, unless --stall says.
STALL = 2


def check_fractions(fractions: tuple[float, ...]) -> tuple[float, float, float]:
    """``fractions`` if they are three shares above 0 summing to 1 (within 1e-6), else a ValueError
    saying what to fix."""
    if len(fractions) != 3:
        raise ValueError(
            f"give three fractions TRAIN,DEV,TEST (e.g. 0.5,0.25,0.25), not {len(fractions)}"
        )
    if any(not f > 0 for f in fractions):
        raise ValueError("every fraction must be above 0: each split needs episodes")
    if abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"the fractions sum to {sum(fractions):g}; they must sum to 1")
    return fractions[0], fractions[1], fractions[2]


class LoopConfig(BaseModel):
    """Everything a run depends on (logged as the parent run's params)."""

    system: str = "mem0"
    # The defaults of dataset and optimizer serve a config built directly (tests, benchmarks):
    # optloop run and optloop.optimize decide both by a rule of the system and the LM instead
    # (optloop.loop.runs.request.loop_config).
    dataset: str = "builtin:tiny"
    budget: int = Field(3, ge=1, le=MAX_BUDGET)
    optimizer: OptimizerName = DEFAULT
    seed: int = 0
    untargeted: bool = False
    sites: list[str] | None = None
    run_name: str
    tracking_uri: str | None = None
    storage: str | None = None
    lm: str = "local"
    proposer_lm: str = "same"
    knobs: dict[str, Any] = Field(default_factory=dict)
    start: dict[str, str] = Field(
        default_factory=dict,
        description="site -> instruction the run starts from instead of the system's own "
        "('+TEXT': appended to it) (a product's current prompt, or a benchmark's sabotage)",
    )
    fractions: tuple[float, float, float] = (0.5, 0.25, 0.25)
    promote_if: Literal["ci", "delta"] = Field(
        "ci",
        description="the champion alias moves when the held-out "
        "delta's CI is above 0 (ci) or its point (delta)",
    )
    lm_settings: dict[str, Any] = Field(
        default_factory=dict,
        description="the LM settings that change answers (context window, decoding "
        "bounds, temperature, ...); not the endpoint's URL, timeout or "
        "retries",
    )
    query_rewrite: bool = Field(
        False,
        description="give the system its retrieve.query site: an LLM rewrite of "
        "the question before the search (--query-rewrite)",
    )
    batch: int = Field(
        1,
        ge=1,
        le=MAX_BATCH,
        description="candidates evaluated at once, one optimizer round's (--batch): which "
        "candidates a run tries depends on it",
    )
    control: bool = Field(
        True,
        description="evaluate the trivial-instruction control on dev and test beside the start "
        "program and the best (--no-control skips it: the report then cannot say what the "
        "loop's writing earned beyond a trivial instruction)",
    )

    race: bool = Field(
        True,
        description="race each candidate on dev against the best so far and stop it once it is "
        "significantly worse (optloop.loop.racing; --no-race evaluates every candidate on every "
        "dev question)",
    )

    min_gain: float = Field(
        MIN_GAIN,
        gt=0,
        lt=1,
        description="the smallest held-out gain the run is meant to show (--min-gain): the power "
        "line says when the splits are too small for it",
    )
    stall: int = Field(
        STALL,
        ge=0,
        description="trials in a row without a new best after which the loop checks again "
        "whether the prompt at the control's sites can matter, now with the best trial that "
        "rewrote them as a third arm, and moves the budget off them when all three agree "
        "(--stall; 0: never)",
    )

    @field_validator("optimizer")
    @classmethod
    def _optimizer(cls, value: str) -> str:
        return registry.check(value)

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        return check_fractions(value)

    def digest(self, *, shared: bool = False, legacy: bool = False) -> str:
        """What must match for a run name to be resumed (the tracking URI may move), or, with
        ``shared``, for a worker to join a study (reached by another URL on another machine,
        perhaps). ``legacy``: the digest of a checkpoint written before ``lm_settings`` existed."""
        exclude = {"tracking_uri", "storage"} if shared else {"tracking_uri"}
        return _digest(
            self.model_dump(
                exclude=exclude
                | self._unset_later_fields()
                | ({"lm_settings"} if legacy or not self.lm_settings else set())
            )
        )

    def resume_key(self) -> str:
        """What must match for ``optloop.run`` without ``--run-name`` to resume an unfinished run:
        everything that changes results (the run name and the tracking URI do not)."""
        return _digest(
            self.model_dump(exclude={"tracking_uri", "run_name"} | self._unset_later_fields())
        )

    def _unset_later_fields(self) -> set[str]:
        """Fields added after checkpoints were first written, left out of digests while they hold
        their default, so that a run started before they existed still resumes."""
        return (
            ({"query_rewrite"} if not self.query_rewrite else set())
            | ({"batch"} if self.batch == 1 else set())
            | ({"control"} if self.control else set())
            | ({"race"} if self.race else set())
            | ({"min_gain"} if self.min_gain == MIN_GAIN else set())
            | ({"stall"} if self.stall == STALL else set())
        )


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


__all__ = [
    "MAX_BATCH",
    "MAX_BUDGET",
    "LoopConfig",
    "OptimizerName",
    "check_fractions",
]
