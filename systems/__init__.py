"""Memory systems behind one protocol (:class:`systems.base.MemorySystem`).

``get_system(name)`` returns the class; modules are imported lazily so using
one system never imports another's library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from optloop.errors import ConfigError

if TYPE_CHECKING:
    from systems.base import MemorySystem

SYSTEMS: dict[str, str] = {
    "mem0": "systems.mem0_system:Mem0System",
    "graphiti": "systems.graphiti_system:GraphitiSystem",
    "long_context": "systems.baselines:LongContextSystem",
    "rag_bm25": "systems.baselines:BM25RagSystem",
    "rag_embedding": "systems.baselines:EmbeddingRagSystem",
    "md_flat": "systems.baselines:MarkdownFlatSystem",
    "tiered": "systems.tiered:TieredSystem",
    "gated": "systems.gated:GatedSystem",
}


def get_system(name: str) -> type[MemorySystem]:
    """The system class registered under ``name``; a one-line error lists the choices."""
    if name not in SYSTEMS:
        raise ConfigError(f"unknown system {name!r}; choose one of: {', '.join(SYSTEMS)}")
    module, _, attr = SYSTEMS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
