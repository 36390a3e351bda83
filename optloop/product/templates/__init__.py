"""Standalone modules that put optimized prompts into a vanilla memory library.

Each module here is valid Python on its own: it imports only the standard
library and the memory library it targets, never optloop. ``python -m
optloop export --format mem0|graphiti`` writes a copy of one of them with its
data block (``PROMPTS`` ...) filled in, for a product to import with no
optloop installed; :mod:`optloop.product` imports the very same code to apply
prompts loaded from the MLflow Prompt Registry. One implementation, two ways in.

- :mod:`~optloop.product.templates.mem0_prompts`: ``apply(memory)`` on a ``mem0.Memory``;
- :mod:`~optloop.product.templates.graphiti_prompts`: ``prompt_library()`` for
  ``Graphiti(prompt_library=...)``, ``apply(graphiti)`` on a live one.
"""

from __future__ import annotations

import pprint
import re
from pathlib import Path
from typing import Any

DATA_BEGIN = "# --- exported data: python -m optloop export writes this block ---"
DATA_END = "# --- end of exported data ---"
_BLOCK = re.compile(re.escape(DATA_BEGIN) + r"\n.*?" + re.escape(DATA_END), re.S)


def template_source(name: str) -> str:
    """The source text of template module ``name`` (``mem0_prompts`` or ``graphiti_prompts``)."""
    return (Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8")


def fill(source: str, data: dict[str, tuple[str, Any]], header: str = "") -> str:
    """``source`` with its data block replaced by ``NAME: annotation = <literal>`` lines.

    ``data`` maps each name to (annotation, value); values are written as Python
    literals (``pprint``), so the module needs no parser to read them back.
    ``header`` (comment lines) goes in front of the module.
    """
    if len(_BLOCK.findall(source)) != 1:
        raise ValueError("template has no single exported-data block")
    lines = [DATA_BEGIN]
    lines += [
        f"{name}: {annotation} = {_literal(value)}" for name, (annotation, value) in data.items()
    ]
    lines.append(DATA_END)
    filled = _BLOCK.sub(lambda _: "\n".join(lines), source)
    return header + filled


def _literal(value: Any, width: int = 110) -> str:
    """A Python literal of ``value``: a non-empty dict one entry per line, long text wrapped, data
    (a JSON schema) on one line."""
    if not isinstance(value, dict) or not value:
        return repr(value)
    lines = ["{"]
    for key, item in value.items():
        head = f"    {key!r}: "
        body = (
            pprint.pformat(item, width=max(40, width - len(head)))
            if isinstance(item, str)
            else repr(item)
        )
        lines.append(head + body.replace("\n", "\n" + " " * len(head)) + ",")
    return "\n".join(lines + ["}"])
