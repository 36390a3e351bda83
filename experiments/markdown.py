"""Markdown of the results files and of docs/benchmarks.md: tables and provenance lines."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A pipe table: ``header``, its rule, then one line a row (cells as ``str`` gives them)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance_lines(record: Mapping[str, str]) -> str:
    """A provenance header (:func:`experiments.provenance.provenance`) as the first lines of a
    markdown results file: ``- name: value`` each, the command as code."""
    return (
        "\n".join(
            f"- {name}: `{value}`" if name == "command" else f"- {name}: {value}"
            for name, value in record.items()
        )
        + "\n\n"
    )
