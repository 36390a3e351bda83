"""Spending flows one way: the optimizers read :mod:`optloop.loop.spending` (a
:class:`~optloop.loop.spending.shape.RunShape`, an
:class:`~optloop.loop.spending.optimizer_work.OptimizerWork`) and the spending package imports
nothing of :mod:`optloop.loop.optimizers`, anywhere in a file (inside a function and under
``TYPE_CHECKING`` included). Read from the syntax trees; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
SPENDING = REPO / "optloop" / "loop" / "spending"
OPTIMIZERS = "optloop.loop.optimizers"


def imported(path: Path, root: Path) -> set[str]:
    """Every module name an import statement of ``path`` names (``from a import b``: ``a`` and
    ``a.b``), relative imports resolved against the file's package under ``root``."""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def from_optimizers(path: Path, root: Path) -> list[str]:
    return sorted(
        name
        for name in imported(path, root)
        if name == OPTIMIZERS or name.startswith(OPTIMIZERS + ".")
    )


def test_the_spending_package_imports_nothing_of_the_optimizers():
    files = sorted(SPENDING.rglob("*.py"))
    assert files, SPENDING
    found = {
        str(path.relative_to(REPO)): names
        for path in files
        if (names := from_optimizers(path, REPO))
    }
    assert found == {}


def test_an_import_of_the_optimizers_is_found_wherever_it_stands(tmp_path):
    """The check sees an import under ``TYPE_CHECKING``, one inside a function, a relative one and
    ``from optloop.loop import optimizers``."""
    spending = tmp_path / "optloop" / "loop" / "spending"
    spending.mkdir(parents=True)
    cases = {
        "typing.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from optloop.loop.optimizers.base import Optimizer\n"
        ),
        "inside.py": "def f():\n    import optloop.loop.optimizers.registry\n",
        "relative.py": "from ..optimizers import registry\n",
        "package.py": "from optloop.loop import optimizers\n",
        "clean.py": "from optloop.loop.spending import shape\nfrom . import eta\n",
    }
    for name, text in cases.items():
        (spending / name).write_text(text)
    found = {name: bool(from_optimizers(spending / name, tmp_path)) for name in cases}
    assert found == {
        "typing.py": True,
        "inside.py": True,
        "relative.py": True,
        "package.py": True,
        "clean.py": False,
    }
