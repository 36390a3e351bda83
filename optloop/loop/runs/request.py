"""What a run is asked for, typed: :class:`RunOptions` (how this process takes part in it),
:class:`RunRequest` (the :class:`~optloop.loop.config.LoopConfig`, the LMs' settings and the
options), and the rules that fill what the caller left unset.

Both entry points build their run here: ``optloop run`` maps its flags onto these objects
(:mod:`optloop.cli.run_args`), ``optloop.optimize`` its keyword arguments (:mod:`optloop._api`),
and :func:`optloop.loop.runs.session.prepare` starts from the :class:`RunRequest`. A setting's
default is a field default of :class:`~optloop.loop.config.LoopConfig` or :class:`RunOptions`
(the parser's and the API's are read from it); what depends on other settings is decided by one
function:

- the dataset: the one optloop generates for the system
  (:func:`~optloop.datasets.defaults.default_dataset`);
- the optimizer: :func:`default_optimizer` of the LM that writes new instructions;
- the LM settings that are part of the run (:func:`answer_settings`);
- the LMs' settings: the caller's over the system's own decoding bounds (:func:`run_lms`).

Importing it loads pydantic and optloop's spending limits; the LM layer, the datasets and the
systems are imported when a function needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from optloop.errors import ConfigError
from optloop.loop.config import LoopConfig, OptimizerName
from optloop.loop.optimizers import registry
from optloop.loop.spending.limits import SpendingLimits

if TYPE_CHECKING:
    from optloop.lm import LMSettings
    from optloop.loop.optimizers.base import Optimizer
    from optloop.loop.optimizers.registry import OptimizerSpec

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


class RunOptions(BaseModel):
    """How this process takes part in a run, beside what the run is (:class:`LoopConfig`): which
    run it works on, where runs are kept, its spending limits, whether small splits are allowed.
    None of it is part of the run's digests, so the same run resumes under other options."""

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
    runs_dir: Path | None = Field(
        None,
        description="the folder that holds each run's directory (its checkpoint, run.log, work); "
        "None: <state dir>/runs. A benchmark keeps its runs in a folder of its own",
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
    :func:`optloop.loop.runs.session.prepare`'s."""

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
    return registry.WITHOUT_WRITER if proposer.backend == "local" else registry.DEFAULT


def optimizer_name(
    optimizer: OptimizerName | OptimizerSpec | type[Optimizer] | None,
) -> OptimizerName | None:
    """The name a run's config records for ``optimizer`` (``None`` when none is given): a spec or
    an :class:`~optloop.loop.optimizers.base.Optimizer` subclass is registered under its name
    (:func:`optloop.loop.optimizers.registry.resolve`); what cannot be is a
    :class:`ConfigError`."""
    if optimizer is None:
        return None
    try:
        return registry.resolve(optimizer)
    except ValueError as exc:
        raise ConfigError(f"invalid run setting optimizer: {exc}") from None


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
    optimizer: OptimizerName | OptimizerSpec | type[Optimizer] | None = None,
    **fields: Any,
) -> LoopConfig:
    """The config of a run on the LM ``settings`` (``proposer``: the LM that writes new
    instructions, when another), its other settings ``fields`` by :class:`LoopConfig`'s names. A
    field left out or given as None takes LoopConfig's default, except these, which follow a rule:

    - ``dataset``: the dataset optloop generates for the system
      (:func:`~optloop.datasets.defaults.default_dataset`);
    - ``optimizer``: :func:`default_optimizer` of the proposer, else of ``settings``; a spec or an
      :class:`~optloop.loop.optimizers.base.Optimizer` subclass is registered and the config
      records its name (:func:`optloop.loop.optimizers.registry.resolve`);
    - ``lm_settings``: :func:`answer_settings` of ``settings``;
    - ``run_name``: ``-`` until the run is chosen (:func:`optloop.loop.runs.resume.choose_run`).

    A value LoopConfig refuses is a :class:`ConfigError` naming the field.
    """
    from optloop.datasets.defaults import default_dataset

    given = {name: value for name, value in fields.items() if value is not None}
    system = given.get("system", LoopConfig.model_fields["system"].default)
    return checked(
        LoopConfig,
        **{"run_name": "-", **given},
        dataset=dataset or default_dataset(system),
        optimizer=optimizer_name(optimizer) or default_optimizer(proposer or settings),
        lm_settings=answer_settings(settings),
    )


__all__ = [
    "ANSWER_SETTINGS",
    "RunOptions",
    "RunRequest",
    "answer_settings",
    "checked",
    "default_optimizer",
    "loop_config",
    "optimizer_name",
    "run_lms",
]
