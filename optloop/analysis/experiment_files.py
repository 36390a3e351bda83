"""Experiment files: which systems on which datasets.

An experiment file is TOML (see ``experiments/configs/``)::

    name = "memfail_baselines"
    systems = ["long_context", "rag_bm25"]
    datasets = ["memfail:coexisting?limit=3"]
    episodes = 3           # optional: at most this many episodes per dataset
    notes = "..."

``load_config(path)`` validates it into an :class:`ExperimentConfig`: unknown keys,
unknown system names, malformed dataset URIs and out-of-range values fail with a
one-line :class:`~optloop.errors.ConfigError` naming the file and the field. Dataset
files are not opened here (a URI whose data is absent still loads as a config).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from optloop.errors import ConfigError, DatasetError


class ExperimentConfig(BaseModel):
    """One experiment: systems x datasets (read by ``experiments.bench.baselines --config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    systems: list[str] = Field(min_length=1)
    datasets: list[str] = Field(min_length=1)
    episodes: int | None = Field(default=None, ge=1)
    notes: str = ""

    @field_validator("systems")
    @classmethod
    def _known_systems(cls, names: list[str]) -> list[str]:
        from systems import SYSTEMS  # the registry only; no system library is imported

        for i, name in enumerate(names):
            if name not in SYSTEMS:
                raise ValueError(f"[{i}] unknown system {name!r} (one of: {', '.join(SYSTEMS)})")
        return names

    @field_validator("datasets")
    @classmethod
    def _parseable_uris(cls, uris: list[str]) -> list[str]:
        from optloop.datasets import parse_uri

        for i, uri in enumerate(uris):
            try:
                parse_uri(uri)
            except DatasetError as exc:
                raise ValueError(f"[{i}] {exc}") from None
        return uris

    def dataset_uris(self) -> list[str]:
        """The dataset URIs with ``episodes`` applied as ``limit=`` where a URI sets none."""
        return [with_limit(uri, self.episodes) for uri in self.datasets]


def with_limit(uri: str, episodes: int | None) -> str:
    """``uri`` with ``limit=episodes`` added unless it already has a limit (or ``episodes`` is
    None)."""
    from optloop.datasets import parse_uri

    if episodes is None or "limit" in parse_uri(uri)[2]:
        return uri
    return f"{uri}{'&' if '?' in uri else '?'}limit={episodes}"


def _field_message(error: Mapping[str, Any]) -> str:
    """``field 'systems[1]': unknown system ...`` from one pydantic error."""
    where = ""
    for part in error.get("loc", ()):
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if message.startswith("[") and "] " in message:  # a validator's "[i] ..." names the item
        index, _, message = message.partition("] ")
        where += index + "]"
    if error.get("type") == "extra_forbidden":
        message = f"unknown field (fields: {', '.join(ExperimentConfig.model_fields)})"
    return f"field {where or '(top level)'!r}: {message}"


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a TOML experiment file; a one-line ConfigError naming file and field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: experiment file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_field_message(exc.errors()[0])}") from None
