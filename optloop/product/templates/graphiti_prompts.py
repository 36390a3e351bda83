"""Optimized prompts for a vanilla ``graphiti_core.Graphiti`` (graphiti-core 0.31.x), with no
optloop installed.

Use::

    from graphiti_core import Graphiti
    import graphiti_prompts                  # this file, as python -m optloop export wrote it

    graphiti = Graphiti(graph_driver=driver, llm_client=llm, embedder=embedder,
    cross_encoder=reranker,
                        prompt_library=graphiti_prompts.prompt_library())

or, on a Graphiti that already exists, ``graphiti_prompts.apply(graphiti)``.

Each optimized prompt overrides its builder through graphiti's own API,
``create_prompt_library(overrides)``: the override calls graphiti's default
builder for the call's context and replaces only the system text with the
optimized one. graphiti then adds its framing as always (the
do-not-escape-unicode note, the language instruction), and the user message
and response schema stay graphiti's, so the messages are the ones the
optimization run sent.

``PROMPTS`` holds every site the export carried: ``graphiti.<group>.<method>``
sites are applied; ``answer`` and ``retrieve.query`` are the prompts of
optloop's own answer and query-rewrite steps, there for your product's answer
step. ``KNOBS`` are the search settings the run used (``top_k`` is
``SearchConfig.limit``, ``search_recipe`` a name in
``graphiti_core.search.search_config_recipes``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

# --- exported data: python -m optloop export writes this block ---
PROMPTS: dict[str, str] = {}
LIBRARY_SHA256: dict[str, str] = {}
KNOBS: dict[str, Any] = {}
SOURCE: dict[str, Any] = {}
# --- end of exported data ---

SITE_PREFIX = "graphiti."


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def graphiti_prompts(prompts: Mapping[str, str] | None = None) -> dict[str, str]:
    """graphiti prompt name (``extract_edges.edge``) -> optimized system text, for the graphiti
    sites."""
    prompts = PROMPTS if prompts is None else prompts
    return {
        site.removeprefix(SITE_PREFIX): text
        for site, text in prompts.items()
        if site.startswith(SITE_PREFIX)
    }


def overrides(prompts: Mapping[str, str] | None = None) -> dict[str, dict[str, Callable]]:
    """``create_prompt_library`` overrides: each builder is graphiti's default one with new system
    text."""
    from graphiti_core.prompts.lib import DefaultChatPromptLibrary, get_prompt_builder

    base = DefaultChatPromptLibrary()
    by_name = graphiti_prompts(prompts)
    if not by_name:
        raise ValueError(
            f"no graphiti prompt to apply: got sites {sorted(prompts or PROMPTS)}; graphiti's are "
            f"named {SITE_PREFIX}<group>.<method>"
        )
    out: dict[str, dict[str, Callable]] = {}
    for name, text in by_name.items():
        # raises ValueError on a name graphiti does not have
        builder = get_prompt_builder(base, name)
        group, method = name.split(".", 1)
        out.setdefault(group, {})[method] = _override(name, builder, text)
    return out


def _override(name: str, builder: Callable, text: str) -> Callable:
    from graphiti_core.prompts.models import SystemMessage

    expected = LIBRARY_SHA256.get(SITE_PREFIX + name)
    checked = expected is None

    def override(context: dict[str, Any]) -> Any:
        nonlocal checked
        prompt = builder(context)
        if not checked:
            checked = True
            if sha256(prompt.system.content) != expected:
                logger.warning(
                    "the installed graphiti's own %s prompt differs from the one these prompts "
                    "were optimized from; they still replace it",
                    name,
                )
        return prompt.model_copy(update={"system": SystemMessage(content=text)})

    return override


def prompt_library(prompts: Mapping[str, str] | None = None) -> Any:
    """A prompt library for ``Graphiti(prompt_library=...)``: graphiti's defaults plus the
    optimized prompts."""
    from graphiti_core.prompts.lib import create_prompt_library

    return create_prompt_library(overrides(prompts))


def apply(graphiti: Any, prompts: Mapping[str, str] | None = None) -> list[str]:
    """Make a live ``Graphiti`` send the optimized prompts; returns the sites applied.

    A ``Graphiti`` reads its library at call time from ``graphiti.clients.prompt_library``
    (``GraphitiClients.complete_prompt`` and ``resolve_prompt_messages``), or from
    ``graphiti.llm_runtime.library`` when built with an ``llm_runtime``; both are
    set, and ``graphiti.prompt_library`` too. The library becomes graphiti's
    defaults plus these prompts (an earlier custom library is replaced).
    """
    from graphiti_core.prompts.lib import ensure_prompt_library_wrapped

    library = ensure_prompt_library_wrapped(prompt_library(prompts))
    runtime = getattr(graphiti, "llm_runtime", None)
    if runtime is not None:
        runtime.library = library
    graphiti.prompt_library = library
    graphiti.clients.prompt_library = library
    return [SITE_PREFIX + name for name in graphiti_prompts(prompts)]
