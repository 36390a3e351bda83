"""Optimized prompts for a vanilla ``mem0.Memory`` (mem0ai 2.2.x), with no optloop installed.

Use::

    from mem0 import Memory
    import mem0_prompts                      # this file, as python -m optloop export wrote it

    memory = Memory(config)                  # your own config: LLM, vector store, embedder
    mem0_prompts.apply(memory)               # from now on mem0 sends the optimized prompts

mem0ai 2.2 has no setting for its extraction prompt (``custom_instructions``
only appends a section), so ``apply`` wraps the instance's LLM client: when
mem0 sends its own system prompt for a site (``ADDITIVE_EXTRACTION_PROMPT``,
read from the installed mem0, optionally + ``AGENT_CONTEXT_SUFFIX``; the LLM
reranker's ``_SYSTEM_PROMPT``), the system message becomes the optimized text,
``response_format`` becomes the site's JSON schema and the sampling settings
become the run's (``SAMPLING``: temperature, max_tokens, seed): exactly the
request the optimization run measured. Every other call passes through untouched.

A server that refuses OpenAI's ``json_schema`` form (llama.cpp's server answers
HTTP 500 naming ``response_format``) gets the same schema as ``{"type":
"json_object", "schema": ...}`` from then on, as optloop's ``--lm-schema-mode
auto`` does; export with ``--schema-mode json_object`` to send that form from
the start.

``PROMPTS`` holds every site the export carried: ``mem0.extract`` and
``mem0.rerank`` are applied; ``answer`` and ``retrieve.query`` are the
prompts of optloop's own answer and query-rewrite steps, there for your
product's answer step; ``apply`` leaves them alone. ``KNOBS`` are the search
settings the run used (``top_k``, ``threshold``, ``rerank``: pass them to
``Memory.search``). ``apply(memory, sampling={})`` keeps your LLM config's
sampling settings instead of the run's.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

# --- exported data: python -m optloop export writes this block ---
PROMPTS: dict[str, str] = {}
RESPONSE_FORMATS: dict[str, dict[str, Any]] = {}
LIBRARY_SHA256: dict[str, str] = {}
KNOBS: dict[str, Any] = {}
SOURCE: dict[str, Any] = {}
SAMPLING: dict[str, Any] = {}
# --- end of exported data ---

EXTRACT = "mem0.extract"
RERANK = "mem0.rerank"
SITES = (EXTRACT, RERANK)
"""The mem0 prompts this module can replace."""

_ROUTES_ATTR = "_exported_prompt_routes"


def library_prompts() -> dict[str, str]:
    """The installed mem0's own system prompt of each site (what the optimized text replaces)."""
    from mem0.configs.prompts import ADDITIVE_EXTRACTION_PROMPT
    from mem0.reranker.llm_reranker import LLMReranker

    return {EXTRACT: ADDITIVE_EXTRACTION_PROMPT, RERANK: LLMReranker._SYSTEM_PROMPT}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def rerank_score_text(answer: Any) -> Any:
    """The reranker site answers ``{"score": x}``; mem0 reads the first number of free text.

    Hand mem0 the number in fixed point, as optloop's run did (``1e-05`` would read as 1).
    """
    try:
        return f"{float(json.loads(answer)['score']):.4f}"
    except (TypeError, ValueError, KeyError):
        return answer


def apply(
    memory: Any,
    prompts: Mapping[str, str] | None = None,
    response_formats: Mapping[str, dict[str, Any]] | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> list[str]:
    """Make ``memory`` (a ``mem0.Memory`` or ``AsyncMemory``) send the optimized prompts.

    ``prompts`` / ``response_formats`` / ``sampling`` default to this module's ``PROMPTS`` /
    ``RESPONSE_FORMATS`` / ``SAMPLING``. Applying again replaces what an earlier call set.
    Returns the sites applied. Raises ``ValueError`` when no mem0 site is given.
    """
    prompts = dict(PROMPTS if prompts is None else prompts)
    formats = dict(RESPONSE_FORMATS if response_formats is None else response_formats)
    options = dict(SAMPLING if sampling is None else sampling)
    sites = [s for s in SITES if s in prompts]
    if not sites:
        raise ValueError(
            f"no mem0 prompt to apply: got sites {sorted(prompts)}, mem0's are {', '.join(SITES)}"
        )
    from mem0.configs.prompts import AGENT_CONTEXT_SUFFIX

    own = library_prompts()
    for site in sites:
        if site in LIBRARY_SHA256 and LIBRARY_SHA256[site] != sha256(own[site]):
            logger.warning(
                "the installed mem0's own %s prompt differs from the one these prompts were "
                "optimized from; they still replace it",
                site,
            )
    applied = []
    if EXTRACT in prompts:
        text, fmt = prompts[EXTRACT], formats.get(EXTRACT)
        _route(
            memory.llm,
            {
                own[EXTRACT]: (text, fmt, None),
                # agent-scoped add (agent_id, no user_id): mem0 appends the suffix to its prompt
                own[EXTRACT] + AGENT_CONTEXT_SUFFIX: (text + AGENT_CONTEXT_SUFFIX, fmt, None),
            },
            options,
        )
        applied.append(EXTRACT)
    if RERANK in prompts:
        reranker = getattr(memory, "reranker", None)
        if reranker is None or not hasattr(reranker, "llm"):
            logger.warning(
                "%s not applied: this Memory has no LLM reranker (config reranker provider "
                "'llm_reranker')",
                RERANK,
            )
        else:
            fmt = formats.get(RERANK)
            _route(
                reranker.llm,
                {own[RERANK]: (prompts[RERANK], fmt, rerank_score_text if fmt else None)},
                options,
            )
            applied.append(RERANK)
    return applied


def _route(
    llm: Any,
    routes: dict[str, tuple[str, dict[str, Any] | None, Callable[[Any], Any] | None]],
    sampling: Mapping[str, Any] | None = None,
) -> None:
    """Wrap ``llm.generate_response`` once; ``routes``: mem0's system text -> (new text,
    response_format, post); ``sampling``: keyword arguments the routed calls send (mem0's LLM
    clients add them to the request)."""
    table: dict[str, Any] | None = getattr(llm, _ROUTES_ATTR, None)
    entries = {system: (*route, dict(sampling or {})) for system, route in routes.items()}
    if table is not None:  # already wrapped (applied before, or the reranker shares this client)
        table.update(entries)
        return
    table = dict(entries)
    original = llm.generate_response

    def generate_response(messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        first = messages[0] if messages else {}
        route = table.get(str(first.get("content"))) if first.get("role") == "system" else None
        if route is None:
            return original(messages, *args, **kwargs)
        text, fmt, post, options = route
        kwargs.update(options)
        sent = [{**first, "content": text}, *messages[1:]]
        # mem0 passes response_format by keyword (its LLMBase has no such parameter)
        if fmt is not None:
            kwargs["response_format"] = fmt
        try:
            answer = original(sent, *args, **kwargs)
        except Exception as exc:
            fallback = _json_object_form(fmt, exc)
            if fallback is None:
                raise
            logger.warning(
                "the LLM server refused response_format json_schema; sending the same schema as "
                "json_object from now on (%s)",
                " ".join(str(exc).split())[:160],
            )
            for other, (o_text, o_fmt, o_post, o_options) in list(table.items()):
                if o_fmt == fmt:
                    table[other] = (o_text, fallback, o_post, o_options)
            kwargs["response_format"] = fallback
            answer = original(sent, *args, **kwargs)
        return post(answer) if post is not None else answer

    llm.generate_response = generate_response
    setattr(llm, _ROUTES_ATTR, table)


def _json_object_form(fmt: dict[str, Any] | None, exc: BaseException) -> dict[str, Any] | None:
    """``fmt`` (OpenAI's json_schema form) as llama.cpp's ``{"type": "json_object", "schema":
    ...}`` when ``exc`` is a server's refusal of it; None otherwise."""
    if not fmt or fmt.get("type") != "json_schema" or "response_format" not in str(exc):
        return None
    if getattr(exc, "status_code", None) not in (400, 422, 500):
        return None
    return {"type": "json_object", "schema": (fmt.get("json_schema") or {}).get("schema", {})}
