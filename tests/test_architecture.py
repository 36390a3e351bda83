"""``docs/architecture.md``'s module table ("Where each stage lives") names the tree as it is.

Every backticked path in a row's file column exists (a bare name after the first path of a row,
``optloop/services/tracking.py``, ``tracking_store.py``, is in the first path's folder), and every
module and package under ``optloop/`` is named by a row: a folder row covers everything in it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
SECTION = "## Where each stage lives"

PATH = re.compile(r"`([\w./-]+)`")


def table_rows() -> list[tuple[str, ...]]:
    """The file column of each row of the table, as its backticked paths (folders end in ``/``)."""
    text = PAGE.read_text(encoding="utf-8")
    assert SECTION in text, f"{PAGE.name} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cell = line.split("|")[1].strip()
        if cell == "file":
            continue
        names = PATH.findall(cell)
        assert names, f"a row of the table names no path: {line[:80]!r}"
        folder = names[0] if names[0].endswith("/") else names[0].rsplit("/", 1)[0] + "/"
        first, rest = names[0], names[1:]
        rows.append((first, *(n if "/" in n.rstrip("/") else folder + n for n in rest)))
    return rows


def named_paths() -> list[str]:
    return [path for row in table_rows() for path in row]


def test_the_table_is_found():
    assert len(table_rows()) > 40


@pytest.mark.parametrize("path", named_paths())
def test_every_path_in_the_table_exists(path):
    target = ROOT / path
    assert target.is_dir() if path.endswith("/") else target.is_file(), (
        f"docs/architecture.md names {path}, which is not in the tree"
    )


def _covered(module: str, named: set[str]) -> bool:
    """``module`` is named by its own row, or by a row of its folder or of a folder above it (a
    package's ``__init__.py`` by its folder's row)."""
    if module in named:
        return True
    parts = module.split("/")
    return any("/".join(parts[:i]) + "/" in named for i in range(1, len(parts)))


def test_every_module_under_optloop_has_a_row():
    named = set(named_paths())
    modules = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "optloop").rglob("*.py")
        if "__pycache__" not in p.parts
    )
    missing = [m for m in modules if not _covered(m, named)]
    assert not missing, "modules docs/architecture.md's table does not name: " + ", ".join(missing)
