"""Optimized prompts into a live memory library: ``optloop.product.apply``.

::

    from mem0 import Memory
    from optloop.product import apply

    memory = Memory(config)
    # from the MLflow Prompt Registry: an alias or a version, one prompt or several
    apply(memory, "prompts:/optloop.mem0.extract@champion")
    apply(graphiti, "optloop.graphiti.extract_edges.edge@champion", "optloop.graphiti.x.y/3")
    # site -> text, or a file of ``python -m optloop export --format json``
    apply(memory, {"mem0.extract": text})
    apply(memory, "exported.json")

A source is a registry reference (``prompts:/NAME@ALIAS``, ``prompts:/NAME/VERSION``,
``NAME@ALIAS``, ``NAME/VERSION``), a mapping or JSON file of site -> prompt text, or a list of
those; later sources win for the same site. Registry prompts are read from ``tracking_uri``, else
``MLFLOW_TRACKING_URI``, else optloop's store. The target decides what is applied, by the same
code an export writes into a standalone module (:mod:`optloop.product.templates`): on a
``mem0.Memory`` the ``mem0.*`` sites replace mem0's system prompts, with the site's response
schema (:func:`response_format`), so mem0 sends what the optimization run sent; on a
``graphiti_core.Graphiti`` the ``graphiti.*`` sites override graphiti's builders where graphiti
reads them at call time. ``answer`` and ``retrieve.query`` are optloop's own steps, not the
library's: they are skipped (logged); a prompt of the other library is an error.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from optloop import sites
from optloop.errors import ConfigError

logger = logging.getLogger(__name__)

SchemaMode = Literal["json_schema", "json_object"]
LIBRARY_SYSTEMS = ("mem0", "graphiti")
SHARED_SITES = sites.SHARED_SITES
"""Sites every system has (``systems.base.MemorySystem``): optloop's steps, not a library's
prompts."""

_REF = re.compile(r"^(?:prompts:/)?(?P<name>[^@/\s]+)(?:@(?P<alias>[^@/\s]+)|/(?P<version>\d+))$")


class RegistryPrompt(BaseModel):
    """One prompt version read from the MLflow Prompt Registry."""

    name: str
    version: int
    alias: str | None = None
    system: str | None
    site: str
    text: str


def registry_uri(ref: str) -> tuple[str, str | None]:
    """``prompts:/NAME@ALIAS`` for any accepted spelling of a reference, and the alias (if any)."""
    match = _REF.match(ref.strip())
    if match is None:
        raise ConfigError(
            f"prompt reference {ref!r}: write NAME@ALIAS or NAME/VERSION (optionally with "
            "prompts:/ in front), e.g. optloop.mem0.extract@champion"
        )
    name, alias, version = match["name"], match["alias"], match["version"]
    return (f"prompts:/{name}@{alias}" if alias else f"prompts:/{name}/{version}"), alias


def site_of(name: str, tags: Mapping[str, str]) -> tuple[str | None, str]:
    """(system, site) of a registered prompt: its ``system``/``site`` tags, else read from the
    name.

    ``optloop.mem0.extract`` -> (mem0, mem0.extract); ``optloop.mem0.answer`` -> (mem0, answer).
    """
    if tags.get("site"):
        return tags.get("system") or None, tags["site"]
    rest = name.removeprefix("optloop.")
    system, _, tail = rest.partition(".")
    if not tail:
        return None, rest
    return system, (tail if tail in SHARED_SITES else rest)


def load_registry_prompt(ref: str) -> RegistryPrompt:
    """One prompt from the registry MLflow is pointed at; a one-line error when it is not there."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri, alias = registry_uri(ref)
    try:
        found = mlflow.genai.load_prompt(uri)
    except MlflowException as exc:
        reason = " ".join(str(exc.message).split())
        raise ConfigError(
            f"prompt {ref}: {reason} in the MLflow Prompt Registry at this tracking URI; "
            "`make ui` lists registered prompts (optloop.<site>, alias champion)"
        ) from None
    if not isinstance(found.template, str):
        raise ConfigError(
            f"prompt {ref} is a chat prompt; optloop registers (and exports) text prompts only"
        )
    system, site = site_of(found.name, found.tags or {})
    return RegistryPrompt(
        name=found.name,
        version=int(found.version),
        alias=alias,
        system=system,
        site=site,
        text=found.template,
    )


def library_of(site: str) -> str | None:
    """The library a site's prompt belongs to (``mem0``, ``graphiti``), or None for optloop's own
    steps."""
    head = site.partition(".")[0]
    return head if head in LIBRARY_SYSTEMS else None


def response_format(site: str, schema_mode: SchemaMode = "json_schema") -> dict[str, Any]:
    """The ``response_format`` optloop's OpenAI-compatible backend sends for a mem0 site.

    Built by the same code as the run's requests: the site signature's output
    model (``signatures._layout.output_model``) through ``optloop.lm``'s request
    normalization and ``OpenAICompatibleBackend``'s encoding for ``schema_mode``
    (``json_schema``: OpenAI, vLLM; ``json_object`` + schema: a llama.cpp server).
    """
    from optloop.lm import LMSettings, OpenAICompatibleBackend, Request, response_format_to_schema
    from signatures._layout import output_model
    from signatures.mem0 import Mem0Extract, Mem0Rerank

    signatures = {"mem0.extract": Mem0Extract, "mem0.rerank": Mem0Rerank}
    if site not in signatures:
        raise ConfigError(
            f"no response schema for site {site!r}; mem0's sites are {', '.join(signatures)}"
        )
    schema, json_mode = response_format_to_schema(output_model(signatures[site]))
    request = Request(
        messages=[], schema=schema, json_mode=json_mode, temperature=0.0, max_tokens=1, seed=0
    )
    # No request is sent: the backend only encodes the format (its client never connects).
    backend = OpenAICompatibleBackend(
        LMSettings(
            backend="openai",
            model="export",
            base_url="http://127.0.0.1:9/v1",
            schema_mode=schema_mode,
        )
    )
    fmt = backend._response_format(request)
    assert fmt is not None
    return fmt


SAMPLED = ("temperature", "max_tokens", "seed")
"""The sampling settings of optloop's requests that a product's LLM config would otherwise set
differently (mem0's own defaults: temperature 0.1, max_tokens 2000, no seed)."""


def loop_sampling(lm_settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The sampling settings a run's requests carried: ``lm_settings`` (a run's
    ``LoopConfig.lm_settings``) where it has them, else optloop's defaults (``LMSettings``)."""
    from optloop.lm import LMSettings

    defaults = LMSettings.model_fields
    given = dict(lm_settings or {})
    return {name: given.get(name, defaults[name].default) for name in SAMPLED}


def is_registry_ref(source: str) -> bool:
    """A string source names a registry prompt unless it is a ``.json`` file path."""
    return source.startswith("prompts:/") or not source.endswith(".json")


def load_prompts(*sources: Any) -> dict[str, str]:
    """site -> prompt text from registry references, mappings and JSON exports (later sources
    win)."""
    prompts: dict[str, str] = {}
    for source in sources:
        if isinstance(source, Mapping):
            bad = [
                k for k, v in source.items() if not isinstance(k, str) or not isinstance(v, str)
            ]
            if bad:
                raise ConfigError(
                    f"prompts must map site names to prompt text; {bad[0]!r} does not"
                )
            prompts.update(source)
        elif isinstance(source, Path) or (isinstance(source, str) and not is_registry_ref(source)):
            prompts.update(load_prompts(_read_json_export(Path(source))))
        elif isinstance(source, str):
            found = load_registry_prompt(source)
            prompts[found.site] = found.text
        elif isinstance(source, Sequence):
            prompts.update(load_prompts(*source))
        else:
            raise ConfigError(
                f"unsupported prompt source {type(source).__name__}; pass a registry reference "
                "(prompts:/NAME@ALIAS), a dict of site -> text, or a JSON export's path"
            )
    return prompts


def _read_json_export(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such file; write one with python -m optloop export --format json"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a JSON export ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a JSON export is an object of site -> prompt text")
    return data


def target_library(memory: Any) -> str:
    """``mem0`` or ``graphiti``: which library ``memory`` is an instance of."""
    module = type(memory).__module__
    if module.startswith("mem0.") and hasattr(memory, "llm"):
        return "mem0"
    if module.startswith("graphiti_core.") and hasattr(memory, "clients"):
        return "graphiti"
    raise ConfigError(
        f"apply() takes a live mem0.Memory or graphiti_core.Graphiti; got {module}."
        f"{type(memory).__name__}"
    )


def apply(
    memory: Any,
    *sources: Any,
    tracking_uri: str | None = None,
    schema_mode: SchemaMode = "json_schema",
) -> list[str]:
    """Load prompts from ``sources`` (see the module docstring) and apply them to ``memory``;
    returns the sites applied."""
    library = target_library(memory)
    if not sources:
        raise ConfigError(
            "apply() needs a prompt source, e.g. 'prompts:/optloop.mem0.extract@champion'"
        )
    if any(isinstance(s, str) and is_registry_ref(s) for s in _flat(sources)):
        from optloop.services import tracking

        tracking.open_existing(tracking_uri)
    prompts = load_prompts(*sources)
    foreign = sorted(s for s in prompts if library_of(s) not in (None, library))
    if foreign:
        raise ConfigError(
            f"{', '.join(foreign)} are not {library} prompts; apply them to a "
            f"{library_of(foreign[0])} instance"
        )
    skipped = sorted(s for s in prompts if library_of(s) is None)
    if skipped:
        logger.info(
            "not applied (optloop's own steps, for your answer code): %s", ", ".join(skipped)
        )
    ours = {s: t for s, t in prompts.items() if library_of(s) == library}
    if not ours:
        raise ConfigError(
            f"none of the prompts ({', '.join(sorted(prompts)) or 'none'}) is a {library} prompt"
        )
    if library == "mem0":
        from optloop.product.templates import mem0_prompts

        unknown = sorted(set(ours) - set(mem0_prompts.SITES))
        if unknown:
            raise ConfigError(
                f"{', '.join(unknown)}: mem0 has no such prompt; its sites are "
                f"{', '.join(mem0_prompts.SITES)}"
            )
        return mem0_prompts.apply(
            memory, ours, {s: response_format(s, schema_mode) for s in ours}, loop_sampling()
        )
    from optloop.product.templates import graphiti_prompts

    try:
        return graphiti_prompts.apply(memory, ours)
    except ValueError as exc:  # a name graphiti's prompt library does not have
        raise ConfigError(f"graphiti prompts {', '.join(sorted(ours))}: {exc}") from None


def _flat(sources: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for source in sources:
        if isinstance(source, (list, tuple)):
            out += _flat(source)
        else:
            out.append(source)
    return out
