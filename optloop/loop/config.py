"""What a run is asked for, typed, with every default written once: :class:`LoopConfig` (what the
run is), :class:`RunOptions` (how this process takes part in it), :class:`RunRequest` (both, with
the LMs), and the rules that fill what the caller left unset.

Both entry points build their run here: ``optloop run`` maps its flags onto these objects
(:mod:`optloop.run_args`), ``optloop.optimize`` its keyword arguments (:mod:`optloop._api`), and
:func:`optloop.run.prepare` starts from the :class:`RunRequest`. So a setting's default is a field
default of one of these models (the parser's default and the API's are read from it), and what
depends on other settings is decided by one function:

- the dataset: the one optloop generates for the system (:func:`default_dataset`);
- the optimizer: :func:`default_optimizer` of the LM that writes new instructions;
- the LM settings that are part of the run (:func:`answer_settings`);
- the LMs' settings: the caller's over the system's own decoding bounds (:func:`run_lms`).

The module imports only pydantic and optloop's spending limits when imported (the LM layer and the
systems when a function needs them), so the Python API reads its defaults from it without loading
DSPy, MLflow or a memory library.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from optloop.errors import ConfigError
from optloop.loop.spend import SpendingLimits

if TYPE_CHECKING:
    from optloop.lm import LMSettings

MAX_BUDGET = 500
MAX_BATCH = 64

OptimizerName = Literal["simba", "gepa", "optuna", "edit"]
OPTIMIZER_NAMES: tuple[str, ...] = get_args(OptimizerName)

# The LM settings that change what the model answers: part of a run's settings
# (LoopConfig.lm_settings), so the same command with another context window or decoding bound is
# another run. The endpoint's URL, timeout and retries are not (a server that moved still serves
# the same run).
ANSWER_SETTINGS = (
    "backend",
    "model",
    "schema_mode",
    "temperature",
    "max_tokens",
    "seed",
    "n_ctx",
    "max_string_chars",
    "max_array_items",
)


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
    dataset: str = "builtin:tiny"
    budget: int = Field(3, ge=1, le=MAX_BUDGET)
    optimizer: OptimizerName = "simba"
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
        )


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


class RunOptions(BaseModel):
    """How this process takes part in a run, beside what the run is (:class:`LoopConfig`): which
    run it works on, its spending limits, whether small splits are allowed. None of it is part of
    the run's digests, so the same run resumes under other options."""

    model_config = ConfigDict(frozen=True)

    run_name: str | None = Field(
        None,
        description="start or resume the run of this name (--run-name); None: the latest "
        "unfinished run of the same settings, else a new one",
    )
    new: bool = Field(
        False,
        description="start a new run even if an unfinished run of these settings exists (--new)",
    )
    allow_small_splits: bool = Field(
        False,
        description="run even when the dev or test split has too few questions for its CIs to "
        "show a change (--allow-small-splits)",
    )
    limits: SpendingLimits = Field(
        default_factory=SpendingLimits,
        description="--max-cost, --max-calls, --estimate, --max-failed-share",
    )

    @model_validator(mode="after")
    def _one_run(self) -> RunOptions:
        if self.new and self.run_name:
            raise ConfigError(
                "--new and --run-name exclude each other: --run-name names the run to start or "
                "resume"
            )
        return self


@dataclass(frozen=True)
class RunRequest:
    """A run as asked for, every setting typed and every default applied: what the run is
    (``config``), the LM that runs it (``lm``) and the one that writes new instructions
    (``proposer``; None: that same LM), and how this process takes part (``options``). Nothing is
    checked against the world yet (the dataset, the endpoint, the stores): that is
    :func:`optloop.run.prepare`'s."""

    config: LoopConfig
    lm: LMSettings
    proposer: LMSettings | None
    options: RunOptions


Model = TypeVar("Model", bound=BaseModel)


def checked(model: type[Model], **fields: Any) -> Model:
    """``model(**fields)``, a value it refuses a :class:`ConfigError` naming the field (bad input,
    exit 2 on the command line), as a flag's parser would say it."""
    try:
        return model(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = " " + ".".join(map(str, err["loc"])) if err["loc"] else ""
        raise ConfigError(
            f"invalid run setting{where}: {err['msg'].removeprefix('Value error, ')}"
        ) from None


def default_optimizer(proposer: LMSettings) -> OptimizerName:
    """The optimizer a run gets when none is named: ``edit`` when ``proposer`` (the LM that would
    write new instructions) is the embedded model, ``simba`` when it is an endpoint.

    SIMBA, GEPA and Optuna ask the proposer for new instruction text; the embedded 135M model
    writes text such as "I don't know" as an answer instruction. The edit optimizer only cuts,
    swaps and restores units of the library's own instructions, so its candidates read as
    prompts a person could ship whatever the proposer.
    """
    return "edit" if proposer.backend == "local" else "simba"


def answer_settings(settings: LMSettings) -> dict[str, object]:
    """:data:`ANSWER_SETTINGS` of ``settings``. The embedded model decodes every schema in-process,
    whatever the schema mode: its runs keep the mode they were started under (json_schema), so they
    still resume."""
    out = settings.model_dump(mode="json", include=set(ANSWER_SETTINGS))
    if settings.backend == "local":
        out["schema_mode"] = "json_schema"
    return out


def run_lms(
    system: str, lm: str | None, proposer_lm: str | None = None, **overrides: Any
) -> tuple[LMSettings, LMSettings | None]:
    """The settings of the LM a run of ``system`` answers with (spec ``lm``; None:
    ``$OPTLOOP_LM``, else the embedded model) and of the LM that writes its new instructions
    (``proposer_lm``; None: the same LM, no settings of its own). Both take ``overrides``
    (:class:`~optloop.lm.LMSettings` fields; None leaves a field alone) over the system's own
    decoding bounds (``local_decoding``: mem0's longer context, graphiti's shorter strings) over
    the settings' defaults. An unknown system or a bad spec is a :class:`ConfigError`."""
    from optloop.lm import LMSettings
    from systems import get_system

    decoding = get_system(system).local_decoding
    settings = LMSettings.from_spec(lm, defaults=decoding, **overrides)
    proposer = (
        LMSettings.from_spec(proposer_lm, defaults=decoding, **overrides) if proposer_lm else None
    )
    return settings, proposer


def loop_config(
    settings: LMSettings,
    proposer: LMSettings | None = None,
    *,
    dataset: str | None = None,
    optimizer: OptimizerName | None = None,
    **fields: Any,
) -> LoopConfig:
    """The config of a run on the LM ``settings`` (``proposer``: the LM that writes new
    instructions, when another), its other settings ``fields`` by :class:`LoopConfig`'s names. A
    field left out or given as None takes LoopConfig's default, except these, which follow a rule:

    - ``dataset``: the dataset optloop generates for the system
      (:func:`~optloop.datasets.defaults.default_dataset`);
    - ``optimizer``: :func:`default_optimizer` of the proposer, else of ``settings``;
    - ``lm_settings``: :func:`answer_settings` of ``settings``;
    - ``run_name``: ``-`` until the run is chosen (:func:`optloop.run_resume.choose_run`).

    A value LoopConfig refuses is a :class:`ConfigError` naming the field.
    """
    from optloop.datasets.defaults import default_dataset

    given = {name: value for name, value in fields.items() if value is not None}
    system = given.get("system", LoopConfig.model_fields["system"].default)
    return checked(
        LoopConfig,
        **{"run_name": "-", **given},
        dataset=dataset or default_dataset(system).uri,
        optimizer=optimizer or default_optimizer(proposer or settings),
        lm_settings=answer_settings(settings),
    )


__all__ = [
    "ANSWER_SETTINGS",
    "MAX_BATCH",
    "MAX_BUDGET",
    "OPTIMIZER_NAMES",
    "LoopConfig",
    "OptimizerName",
    "RunOptions",
    "RunRequest",
    "answer_settings",
    "check_fractions",
    "checked",
    "default_optimizer",
    "loop_config",
    "run_lms",
]
