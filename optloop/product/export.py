"""Optimized prompts out of MLflow, as what a product on vanilla mem0 or graphiti loads: a run's
prompts or one registry prompt (:func:`from_run`, :func:`from_prompt`: a :class:`Bundle`),
rendered in one of :data:`FORMATS` (:func:`render`). The command that writes them to a file is
:mod:`optloop.cli.export` (``python -m optloop export``).
"""

from __future__ import annotations

import os

from optloop.offline import offline_defaults

# first: litellm, mem0 and Hugging Face read them when imported
os.environ.update(offline_defaults())

import ast
import json
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from optloop import artifacts
from optloop.errors import ConfigError
from optloop.product import (
    SchemaMode,
    library_of,
    load_registry_prompt,
    loop_sampling,
    response_format,
)

FORMATS = ("json", "mem0", "graphiti", "dspy", "pack")
PACK_FORMAT = "optloop.prompt-pack/1"


class Bundle(BaseModel):
    """What a source holds: the prompts by site and what else the formats need."""

    system: str | None
    prompts: dict[str, str]
    knobs: dict[str, Any] = Field(default_factory=dict)
    program: str | None = None
    source: dict[str, Any]
    label: str


# --- sources ---------------------------------------------------------------------------------


def from_run(run_id: str) -> Bundle:
    """The best candidate of a finished ``optloop.run`` parent run."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ConfigError(
            f"no MLflow run {run_id!r} in this store; pass the run id python -m optloop.run "
            "printed (or see `make ui`), and --tracking-uri if the run is in another store"
        ) from None
    tags, params = run.data.tags, run.data.params
    if parent := tags.get("mlflow.parentRunId"):
        raise ConfigError(
            f"run {run_id} is a trial (child run) of optloop run {parent}; export the parent run"
        )
    system = params.get("system") or tags.get("optloop.system")
    if not system:
        raise ConfigError(
            f"run {run_id} is not an optloop.run parent run (it has no 'system' parameter); "
            "pass the run id python -m optloop.run printed"
        )
    logged = {a.path for a in client.list_artifacts(run_id)}
    if artifacts.PROMPTS_AFTER not in logged:
        raise ConfigError(
            f"run {run_id} has no {artifacts.PROMPTS_AFTER}: it has not finished; resume it "
            "with the same python -m optloop.run command and --run-name"
        )
    prompts = json.loads(_artifact_text(run_id, artifacts.PROMPTS_AFTER))
    knobs = (
        json.loads(_artifact_text(run_id, artifacts.BEST_CANDIDATE)).get("knobs", {})
        if artifacts.BEST_CANDIDATE in logged
        else {}
    )
    program = _artifact_text(run_id, artifacts.PROGRAM) if artifacts.PROGRAM in logged else None
    source: dict[str, Any] = {"run_id": run_id, "run_name": run.info.run_name, "system": system}
    try:  # the run's LM settings (a param, written as a Python dict): its sampling is the export's
        settings = ast.literal_eval(params.get("lm_settings") or "{}")
    except (ValueError, SyntaxError):
        settings = {}
    if isinstance(settings, dict) and settings:
        source["lm_settings"] = {
            k: v for k, v in settings.items() if k in ("temperature", "max_tokens", "seed")
        }
    return Bundle(
        system=system,
        prompts=prompts,
        knobs=knobs,
        program=program,
        label=f"run {run_id}",
        source=source,
    )


def _artifact_text(run_id: str, path: str) -> str:
    import mlflow

    # stderr stays one line on success
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=path, dst_path=tmp
        )
        return Path(local).read_text(encoding="utf-8")


def from_prompt(ref: str) -> Bundle:
    """One registered prompt version."""
    found = load_registry_prompt(ref)
    source = {"prompt": found.name, "version": found.version, "system": found.system}
    if found.alias:
        source["alias"] = found.alias
    return Bundle(
        system=found.system,
        prompts={found.site: found.text},
        source=source,
        label=f"prompt {found.name} version {found.version}",
    )


# --- formats ---------------------------------------------------------------------------------


def render(
    bundle: Bundle, fmt: str, *, schema_mode: SchemaMode = "json_schema", command: str = ""
) -> str:
    """The file ``fmt`` makes of ``bundle``; a :class:`ConfigError` when the format does not fit
    the source."""
    if fmt == "json":
        return json.dumps(bundle.prompts, indent=1, ensure_ascii=False) + "\n"
    if fmt == "dspy":
        if bundle.program is None:
            raise ConfigError(
                f"--format dspy needs a run's DSPy program; {bundle.label} has none (export a "
                "run with --run, or use --format json)"
            )
        return bundle.program
    if fmt in ("mem0", "graphiti"):
        return _module(bundle, fmt, schema_mode=schema_mode, command=command)
    if fmt == "pack":
        return json.dumps(prompt_pack(bundle), indent=1, ensure_ascii=False) + "\n"
    raise ConfigError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")


def prompt_pack(bundle: Bundle) -> dict[str, Any]:
    """The ``pack`` format: prompts, knobs (and their value spaces) and provenance, plus each
    optloop-defined site's fields."""
    knob_values: dict[str, Any] = {}
    if bundle.system:
        from systems import SYSTEMS, get_system

        if bundle.system in SYSTEMS:
            knob_values = dict(getattr(get_system(bundle.system), "knob_values", {}))
    return {
        "format": PACK_FORMAT,
        "system": bundle.system,
        "prompts": dict(bundle.prompts),
        "knobs": dict(bundle.knobs),
        "knob_values": knob_values,
        "sites": {site: _site_fields(site) for site in bundle.prompts},
        "source": dict(bundle.source),
    }


def _site_fields(site: str) -> dict[str, Any] | None:
    """A site's input fields (name -> description) and output fields (type, description, JSON
    schema), when optloop defines its signature; ``None`` for a library's own site (mem0, graphiti:
    see their formats)."""
    import pydantic

    from optloop.sites import ANSWER, MD_FLAT_CURATE, QUERY_REWRITE
    from signatures.baselines import CurateMarkdownMemory
    from signatures.common import AnswerFromMemories, RewriteQuery
    from signatures.gated import SITE_SIGNATURES as GATED_SIGNATURES
    from signatures.tiered import SITE_SIGNATURES as TIERED_SIGNATURES

    signatures = {
        **TIERED_SIGNATURES,
        **GATED_SIGNATURES,
        ANSWER: AnswerFromMemories,
        QUERY_REWRITE: RewriteQuery,
        MD_FLAT_CURATE: CurateMarkdownMemory,
    }
    signature: Any = signatures.get(site)
    if signature is None:
        return None

    def desc(field: Any) -> str:
        text = (field.json_schema_extra or {}).get("desc", "")
        return "" if text.startswith("${") else text  # DSPy's placeholder for "no description"

    def type_name(annotation: Any) -> str:
        return str(annotation) if getattr(annotation, "__origin__", None) else annotation.__name__

    return {
        "inputs": {name: desc(field) for name, field in signature.input_fields.items()},
        "outputs": {
            name: {
                "type": type_name(field.annotation),
                "desc": desc(field),
                "schema": pydantic.TypeAdapter(field.annotation).json_schema(),
            }
            for name, field in signature.output_fields.items()
        },
    }


def _module(bundle: Bundle, library: str, *, schema_mode: SchemaMode, command: str) -> str:
    from optloop.product.templates import fill, template_source

    sites = [s for s in bundle.prompts if library_of(s) == library]
    if bundle.system not in (None, library):
        other = (
            f"--format {bundle.system} or json"
            if library_of(f"{bundle.system}.")
            else "--format json"
        )
        raise ConfigError(
            f"--format {library} needs {library} prompts; {bundle.label} holds {bundle.system} "
            f"prompts (use {other})"
        )
    if not sites:
        raise ConfigError(
            f"--format {library} needs {library} prompts; {bundle.label} holds only "
            f"{', '.join(sorted(bundle.prompts))}, optloop's own step (use --format json)"
        )
    own = _library_texts(library, sites)
    data: dict[str, tuple[str, Any]] = {"PROMPTS": ("dict[str, str]", bundle.prompts)}
    if library == "mem0":
        data["RESPONSE_FORMATS"] = (
            "dict[str, dict[str, Any]]",
            {s: response_format(s, schema_mode) for s in sites},
        )
        data["SAMPLING"] = ("dict[str, Any]", loop_sampling(bundle.source.get("lm_settings")))
    module = _template(library)
    data |= {
        "LIBRARY_SHA256": ("dict[str, str]", {s: module.sha256(t) for s, t in own.items()}),
        "KNOBS": ("dict[str, Any]", bundle.knobs),
        "SOURCE": ("dict[str, Any]", bundle.source),
    }
    written_by = " ".join((command or "python -m optloop export").split())  # a comment: one line
    header = (
        f"# Written by `{written_by}` ({' '.join(bundle.label.split())}).\n"
        "# Standalone: needs only the memory library. Export again rather than edit PROMPTS "
        "by hand.\n"
    )
    text = fill(template_source(f"{library}_prompts"), data, header)
    # a template or data bug fails here, not in the product
    compile(text, f"{library}_prompts.py", "exec")
    return text


def _template(library: str) -> Any:
    from optloop.product.templates import graphiti_prompts, mem0_prompts

    return mem0_prompts if library == "mem0" else graphiti_prompts


def _library_texts(library: str, sites: list[str]) -> dict[str, str]:
    """The installed library's own prompt of each site (what the optimized text was tuned from)."""
    if library == "mem0":
        from optloop.product.templates.mem0_prompts import library_prompts

        own = library_prompts()
        unknown = sorted(set(sites) - set(own))
        if unknown:
            raise ConfigError(
                f"{', '.join(unknown)}: mem0 has no such prompt; its sites are {', '.join(own)}"
            )
        return {s: own[s] for s in sites}
    from signatures.graphiti import library_system_prompt

    try:
        return {s: library_system_prompt(s.removeprefix("graphiti.")) for s in sites}
    except ValueError as exc:
        raise ConfigError(f"graphiti sites {', '.join(sites)}: {exc}") from None
