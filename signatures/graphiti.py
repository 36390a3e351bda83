"""graphiti's prompt sites: one DSPy signature per prompt ``Graphiti.add_episode`` sends.

Everything here is read from the installed ``graphiti-core`` at import time; no
prompt text is copied into this repository:

- ``instructions`` = the system message the library's own prompt builder returns
  (``DefaultChatPromptLibrary().<group>.<method>(context).system.content``);
- the one input, ``user_content``, is the user message graphiti builds, verbatim;
- the output fields are the fields of the prompt's fixed response model
  (``graphiti_core.prompts.lib.BUILTIN_PROMPT_SPECS``).

What graphiti appends to the system message *after* the builder (its
do-not-escape-unicode note, the multilingual instruction, the attribute
extraction preamble) is not part of the instructions: it is the library's
framing, re-applied at call time by ``systems.graphiti_system`` exactly where
vanilla graphiti adds it. So an optimized ``instructions`` string, returned as
``ChatPrompt.system`` from a ``create_prompt_library`` override, makes vanilla
graphiti send the same messages.

The system messages of these prompts do not depend on the prompt's context;
:func:`library_system_prompt` checks that by rendering each builder with two
different contexts, and the graphiti client re-checks every call.

Which prompts: ``add_episode`` on a message episode (no custom entity or edge
types, no communities) calls exactly the six in :data:`PROMPT_NAMES`, as
recorded against a loopback server (see ``tests/systems/test_graphiti_system.py``).
``extract_nodes.extract_text`` / ``extract_json`` serve text and JSON episodes,
the ``*.extract_attributes`` prompts only custom types, ``summarize_nodes.*``
only communities; optloop sends none of those.
"""

from __future__ import annotations

from typing import Any

import dspy
from dspy.signatures.signature import make_signature
from graphiti_core.prompts.lib import (
    BUILTIN_PROMPT_SPECS,
    DefaultChatPromptLibrary,
    get_prompt_builder,
)

SITE_PREFIX = "graphiti."

PROMPT_NAMES: tuple[str, ...] = (
    "extract_nodes.extract_message",
    "dedupe_nodes.nodes",
    "extract_edges.edge",
    "extract_edges.extract_timestamps",
    "dedupe_edges.resolve_edge",
    "extract_nodes.extract_summaries_batch",
)
"""The graphiti prompts ``add_episode`` sends for a message episode, in pipeline order."""


class _ProbeContext(dict):
    """A prompt context in which every key the builder reads exists, holding ``fill``."""

    def __init__(self, fill: Any):
        super().__init__()
        self.fill = fill

    def __missing__(self, key: str) -> Any:
        return list(self.fill)


def library_system_prompt(prompt_name: str) -> str:
    """The system message graphiti's default builder returns for ``prompt_name``.

    Raises ``ValueError`` if that text changes with the prompt's context: such a
    prompt cannot be one fixed instruction string.
    """
    builder = get_prompt_builder(DefaultChatPromptLibrary(), prompt_name)
    first = builder(_ProbeContext([])).system.content
    second = builder(_ProbeContext(["probe"])).system.content
    if first != second:
        raise ValueError(
            f"graphiti's system prompt for {prompt_name} depends on its context; "
            "it cannot be seeded as one instruction string"
        )
    return first


def site_name(prompt_name: str) -> str:
    """The optloop prompt-site name of a graphiti prompt (``graphiti.<group>.<method>``)."""
    return SITE_PREFIX + prompt_name


def _class_name(prompt_name: str) -> str:
    return "".join(part.title() for part in prompt_name.replace(".", "_").split("_"))


def library_signature(prompt_name: str) -> type[dspy.Signature]:
    """A signature for one graphiti prompt: its system prompt, user content in, its schema out."""
    response_model = BUILTIN_PROMPT_SPECS[prompt_name].response_model
    if response_model is None:
        raise ValueError(
            f"graphiti prompt {prompt_name} has no fixed response model to seed output fields from"
        )
    fields: dict[str, Any] = {
        "user_content": (
            str,
            dspy.InputField(desc=f"the user message graphiti builds for {prompt_name}, verbatim"),
        ),
    }
    for name, field in response_model.model_fields.items():
        fields[name] = (field.annotation, dspy.OutputField(desc=field.description or ""))
    instructions = library_system_prompt(prompt_name)
    signature = make_signature(fields, instructions, signature_name=_class_name(prompt_name))
    if signature.instructions != instructions:  # DSPy normalizes docstrings (inspect.cleandoc)
        raise ValueError(
            f"graphiti's system prompt for {prompt_name} does not survive as DSPy "
            "instructions unchanged"
        )
    return signature


ExtractNodesExtractMessage = library_signature("extract_nodes.extract_message")
DedupeNodesNodes = library_signature("dedupe_nodes.nodes")
ExtractEdgesEdge = library_signature("extract_edges.edge")
ExtractEdgesExtractTimestamps = library_signature("extract_edges.extract_timestamps")
DedupeEdgesResolveEdge = library_signature("dedupe_edges.resolve_edge")
ExtractNodesExtractSummariesBatch = library_signature("extract_nodes.extract_summaries_batch")

SIGNATURES: dict[str, type[dspy.Signature]] = {
    site_name("extract_nodes.extract_message"): ExtractNodesExtractMessage,
    site_name("dedupe_nodes.nodes"): DedupeNodesNodes,
    site_name("extract_edges.edge"): ExtractEdgesEdge,
    site_name("extract_edges.extract_timestamps"): ExtractEdgesExtractTimestamps,
    site_name("dedupe_edges.resolve_edge"): DedupeEdgesResolveEdge,
    site_name("extract_nodes.extract_summaries_batch"): ExtractNodesExtractSummariesBatch,
}
"""Site name -> signature, one per entry of :data:`PROMPT_NAMES`."""

OP_KINDS: dict[str, tuple[str, ...]] = {
    site_name("extract_nodes.extract_message"): ("extract",),
    site_name("dedupe_nodes.nodes"): ("update",),
    site_name("extract_edges.edge"): ("extract", "store"),  # its facts are the edges stored
    site_name("extract_edges.extract_timestamps"): ("extract",),
    site_name("dedupe_edges.resolve_edge"): ("update", "delete"),
    site_name("extract_nodes.extract_summaries_batch"): ("update",),
}
"""The memory operations each site's output decides (the operation names of
docs/graph-schema.md)."""
