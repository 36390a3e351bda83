"""The shape of the code: the longest modules and classes, the import cycles, the long lines.

    python -m experiments.structure                          # this checkout, a table on stdout
    python -m experiments.structure --root DIR --json out.json

Read from the source as text and syntax trees (nothing is imported or run):

* **modules**: the longest ``.py`` files of the product (``optloop/``, ``systems/``,
  ``signatures/``) and the studies (``experiments/``), in lines;
* **classes**: their longest classes, in lines, with how many methods each defines;
* **import cycles**: the strongly connected groups of the module import graph of ``optloop``,
  ``systems`` and ``signatures``, counting every import, those inside a function or under
  ``TYPE_CHECKING`` included (they keep a cycle alive just the same). ``from a import b`` is an
  edge to the module ``a.b`` when there is one, else to ``a``;
* **long lines**: lines over 99 columns in every ``.py`` file of the checkout (tests included).

Repeated logic is the ``duplicates`` command's (run beside this one; see ``duplicates --help``).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

PACKAGES = ("optloop", "systems", "signatures")
CODE = (*PACKAGES, "experiments")
SKIP = {".venv", ".git", "node_modules", "__pycache__"}
MAX_COLUMNS = 99


def python_files(root: Path, tops: Sequence[str] | None = None) -> Iterator[Path]:
    """The ``.py`` files under ``root`` (only under the folders ``tops`` when given), sorted."""
    bases = [root / top for top in tops] if tops else [root]
    for base in bases:
        for path in sorted(base.rglob("*.py")):
            if not SKIP & set(path.relative_to(root).parts):
                yield path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def longest_modules(root: Path, n: int = 10) -> list[dict[str, Any]]:
    sizes = [
        {"module": str(p.relative_to(root)), "lines": len(p.read_text().splitlines())}
        for p in python_files(root, CODE)
    ]
    return sorted(sizes, key=lambda row: (-row["lines"], row["module"]))[:n]


def longest_classes(root: Path, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for path in python_files(root, CODE):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                methods = sum(
                    isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body
                )
                rows.append(
                    {
                        "class": f"{path.relative_to(root)}:{node.name}",
                        "lines": node.end_lineno - node.lineno + 1,
                        "methods": methods,
                    }
                )
    return sorted(rows, key=lambda row: (-row["lines"], row["class"]))[:n]


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """The module names an import statement names (relative ones resolved against ``module``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parent = module.split(".") if is_package else module.split(".")[:-1]
        parent = parent[: len(parent) - (node.level - 1)]
        base = ".".join([*parent, base] if base else parent)
    yield base
    yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of :data:`PACKAGES` it imports, anywhere in the file."""
    paths = {module_name(root, p): p for p in python_files(root, PACKAGES)}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = list(_imported(node, module, is_package))
            if isinstance(node, ast.ImportFrom):
                base, members = names[0], names[1:]
                found = [m for m in members if m in paths]
                edges.update(found if found else [base] if base in paths else [])
                if found and len(found) < len(members) and base in paths:
                    edges.add(base)  # some names are the package's own, not submodules
            else:
                edges.update(name for name in names if name in paths)
        edges.discard(module)
        graph[module] = edges
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted, all sorted."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def long_lines(root: Path, limit: int = MAX_COLUMNS) -> dict[str, Any]:
    """How many lines of every ``.py`` file are longer than ``limit`` columns; where most are."""
    per_file = {}
    for path in python_files(root):
        count = sum(len(line) > limit for line in path.read_text().splitlines())
        if count:
            per_file[str(path.relative_to(root))] = count
    top = sorted(per_file.items(), key=lambda item: (-item[1], item[0]))[:5]
    return {
        "limit": limit,
        "lines": sum(per_file.values()),
        "files": len(per_file),
        "most": dict(top),
    }


def measure(root: Path) -> dict[str, Any]:
    return {
        "root": str(root),
        "modules": longest_modules(root),
        "classes": longest_classes(root),
        "import_cycles": import_cycles(root),
        "long_lines": long_lines(root),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.structure",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the checkout to measure (default: this one)",
    )
    parser.add_argument(
        "--json", type=Path, metavar="OUT", help="also write the figures as JSON here"
    )
    args = parser.parse_args(argv)
    if not (args.root / "optloop").is_dir():
        parser.error(f"{args.root} holds no optloop/ folder: give --root a checkout of optloop")
    figures = measure(args.root.resolve())
    print(
        "longest modules:",
        *(f"  {r['lines']:5d}  {r['module']}" for r in figures["modules"]),
        sep="\n",
    )
    print(
        "longest classes:",
        *(f"  {r['lines']:5d}  {r['class']} ({r['methods']} methods)" for r in figures["classes"]),
        sep="\n",
    )
    print(
        "import cycles:",
        *(f"  {' <-> '.join(c)}" for c in figures["import_cycles"]) or ["  none"],
        sep="\n",
    )
    lines = figures["long_lines"]
    print(f"lines over {lines['limit']} columns: {lines['lines']} in {lines['files']} files")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
