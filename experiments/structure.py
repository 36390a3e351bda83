"""The shape of the code: its layers, the longest modules and classes, the import cycles, the long
lines, and where an optimizer's name is spelled.

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
* **long lines**: lines over 99 columns in every ``.py`` file of the checkout (tests included);
* **top level**: the modules and folders directly under ``optloop/``, each with its layer
  (:data:`LAYERS`) and its lines;
* **imports up a layer**: :data:`LAYERS` orders the parts of the product from the foundations
  (errors, paths, sites, ...) to the commands (``cli/``) and the entry points (the Python API,
  ``python -m optloop`` and ``python -m optloop.run``); a module may import from
  its own layer and the layers below it. An import *up a layer* is one
  from a module of a lower layer of a module of a higher one (``optloop.loop.runs.runner``
  importing ``optloop.cli.run`` would be one: the loop would then depend on its command). Every
  import counts, each shown with where it stands: ``top`` (run on import), ``function`` (inside a
  function) or ``typing`` (under ``TYPE_CHECKING``, never run);
* **package cycles**: the import cycles between the parts of :data:`LAYERS` (each package and
  top-level module under ``optloop/``, and the packages ``systems`` and ``signatures``), with the
  imports that close each one;
* **modules over 600 lines** of ``optloop/``, ``systems/`` and ``signatures/``;
* **loose modules**: the ``.py`` modules directly under ``optloop/`` (``__init__`` and
  ``__main__`` aside), and **loop's top folder**: the modules and folders directly under
  ``optloop/loop/`` (``__init__`` aside);
* **hand-kept name lists**: a literal collection in the product's code (a tuple, list, set,
  dict's keys or ``Literal[...]``) that spells every registered optimizer's name, or every
  registered system's (the keys of ``systems.SYSTEMS``), outside the registry that defines them:
  each is a list a new optimizer or system has to be added to by hand;
* **what a new one touches**: per registered optimizer and system, the product's files that
  name it (its name as a string literal, or an import of its module or, for a system, of the
  ``signatures`` module its module imports); the fewest over them is what a new one must touch;
* **optimizer names**: every string literal that is exactly an optimizer's name (``simba``,
  ``gepa``, ``optuna``, ``edit``) in the code of ``optloop/``, ``systems/`` and ``signatures/``
  (tests and studies aside): each is a place a new optimizer or a renamed one has to be found.

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
MAX_LINES = 600
OPTIMIZER_NAMES = ("simba", "gepa", "optuna", "edit")

# The product's layers, lowest first: a part is a package or module under optloop/ (by its name
# there) or a top-level package of the checkout. A part named nowhere falls in "unplaced", shown
# as such, so that a new module is placed on purpose. The top layer, "entry points", is the Python
# API, ``python -m optloop`` and ``python -m optloop.run``, a shim over cli/.
LAYERS: dict[str, tuple[str, ...]] = {
    "foundations": (
        "errors",
        "paths",
        "sites",
        "text",
        "stats",
        "offline",
        "output",
        "interrupt",
        "artifacts",
        "failures",
        "progress",
        "_version",
    ),
    "lm": ("lm", "embed"),
    "services": ("services",),
    "datasets": ("datasets",),
    "systems": ("signatures", "systems"),
    "tracing": ("tracing",),
    "attribution": ("attribution",),
    "pipeline": ("pipeline",),
    "faults": ("faults",),
    "analysis": ("analysis",),
    "loop": ("loop",),
    "product": ("product",),
    "commands": ("cli", "testing"),
    "entry points": ("_api", "__init__", "__main__", "run"),
}
UNPLACED = "unplaced"


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


def _import_nodes(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of ``tree`` with where it stands: ``top`` (run when the module is
    imported), ``function`` (inside a function) or ``typing`` (under ``if TYPE_CHECKING:``)."""

    def visit(node: ast.AST, where: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, where
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, "typing" if where == "typing" else "function")
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (item for stmt in child.body for item in visit_one(stmt, "typing"))
                yield from (item for stmt in child.orelse for item in visit_one(stmt, where))
            else:
                yield from visit(child, where)

    def visit_one(node: ast.AST, where: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, where
        else:
            yield from visit(node, where)

    yield from visit(tree, "top")


def import_edges(root: Path) -> list[tuple[str, str, str]]:
    """Every import between modules of :data:`PACKAGES`: ``(importer, imported, where)``, where
    ``where`` is as :func:`_import_nodes` says; one row per pair and place, sorted."""
    paths = {module_name(root, p): p for p in python_files(root, PACKAGES)}
    rows: set[tuple[str, str, str]] = set()
    for module, path in paths.items():
        is_package = path.name == "__init__.py"
        for node, where in _import_nodes(ast.parse(path.read_text())):
            names = list(_imported(node, module, is_package))
            edges: set[str] = set()
            if isinstance(node, ast.ImportFrom):
                base, members = names[0], names[1:]
                found = [m for m in members if m in paths]
                edges.update(found if found else [base] if base in paths else [])
                if found and len(found) < len(members) and base in paths:
                    edges.add(base)  # some names are the package's own, not submodules
            else:
                edges.update(name for name in names if name in paths)
            rows.update((module, edge, where) for edge in edges if edge != module)
    return sorted(rows)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of :data:`PACKAGES` it imports, anywhere in the file."""
    graph: dict[str, set[str]] = {
        module_name(root, p): set() for p in python_files(root, PACKAGES)
    }
    for importer, imported, _ in import_edges(root):
        graph[importer].add(imported)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted, all sorted."""
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


def import_cycles(root: Path) -> list[list[str]]:
    """The strongly connected groups of more than one module, each sorted, all sorted."""
    return strongly_connected(import_graph(root))


def part_of(module: str) -> str:
    """The part of :data:`LAYERS` a module belongs to: ``optloop.loop.runs.runner`` -> ``loop``,
    ``optloop.run`` -> ``run``, ``optloop`` -> ``__init__``, ``systems.mem0_system`` ->
    ``systems``."""
    names = module.split(".")
    if names[0] != "optloop":
        return names[0]
    return names[1] if len(names) > 1 else "__init__"


def layer_of(part: str) -> str:
    return next((layer for layer, parts in LAYERS.items() if part in parts), UNPLACED)


def _rank(layer: str) -> int:
    order = list(LAYERS)
    return order.index(layer) if layer in order else len(order)


def top_level(root: Path) -> list[dict[str, Any]]:
    """The modules and folders directly under ``optloop/``: name, kind, layer, ``.py`` lines
    (a folder's summed) and, for a folder, its ``.py`` files."""
    rows = []
    for path in sorted((root / "optloop").iterdir()):
        if path.name in SKIP or path.name.startswith("."):
            continue
        if path.is_dir():
            files = list(python_files(root, [str(path.relative_to(root))]))
            lines = sum(len(f.read_text().splitlines()) for f in files)
            rows.append(
                {
                    "name": f"{path.name}/",
                    "layer": layer_of(path.name),
                    "lines": lines,
                    "modules": len(files),
                }
            )
        elif path.suffix == ".py":
            rows.append(
                {
                    "name": path.name,
                    "layer": layer_of(path.stem),
                    "lines": len(path.read_text().splitlines()),
                    "modules": 1,
                }
            )
    return sorted(rows, key=lambda row: (_rank(row["layer"]), row["name"]))


def imports_up(root: Path) -> list[dict[str, str]]:
    """Every import of a module of a higher layer by one of a lower layer (see the module
    docstring), sorted by the importing layer."""
    rows = []
    for importer, imported, where in import_edges(root):
        low, high = layer_of(part_of(importer)), layer_of(part_of(imported))
        if _rank(high) > _rank(low) and UNPLACED not in (low, high):
            rows.append(
                {
                    "importer": importer,
                    "layer": low,
                    "imported": imported,
                    "imported_layer": high,
                    "where": where,
                }
            )
    return sorted(rows, key=lambda r: (_rank(r["layer"]), r["importer"], r["imported"]))


def package_cycles(root: Path) -> list[dict[str, Any]]:
    """The import cycles between parts (:func:`part_of`): each cycle's parts, and the imports
    between them that close it (``importer -> imported (where)``)."""
    edges = [(part_of(a), part_of(b), a, b, w) for a, b, w in import_edges(root)]
    graph: dict[str, set[str]] = {}
    for pa, pb, *_ in edges:
        graph.setdefault(pa, set())
        graph.setdefault(pb, set())
        if pa != pb:
            graph[pa].add(pb)
    cycles = []
    for group in strongly_connected(graph):
        inside = set(group)
        imports = sorted(
            f"{a} -> {b} ({w})" for pa, pb, a, b, w in edges if pa != pb and {pa, pb} <= inside
        )
        cycles.append({"parts": group, "imports": imports})
    return cycles


def long_modules(root: Path, limit: int = MAX_LINES) -> list[dict[str, Any]]:
    """The product's modules (``optloop/``, ``systems/``, ``signatures/``) over ``limit``
    lines, longest first."""
    sizes = [
        (len(p.read_text().splitlines()), str(p.relative_to(root)))
        for p in python_files(root, PACKAGES)
    ]
    return [
        {"module": module, "lines": lines}
        for lines, module in sorted(sizes, key=lambda size: (-size[0], size[1]))
        if lines > limit
    ]


def optimizer_names(root: Path) -> list[dict[str, Any]]:
    """Every string literal that is exactly one of :data:`OPTIMIZER_NAMES` in the product's
    code: file, line, name."""
    rows = []
    for path in python_files(root, PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in OPTIMIZER_NAMES
            ):
                rows.append(
                    {"file": str(path.relative_to(root)), "line": node.lineno, "name": node.value}
                )
    return sorted(rows, key=lambda row: (row["file"], row["line"], row["name"]))


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


def loose_modules(root: Path) -> list[str]:
    """The ``.py`` modules directly under ``optloop/``, ``__init__`` and ``__main__`` aside."""
    return sorted(
        p.name for p in (root / "optloop").glob("*.py") if p.stem not in {"__init__", "__main__"}
    )


def loop_top(root: Path) -> dict[str, list[str]]:
    """The modules (``__init__`` aside) and folders directly under ``optloop/loop/``."""
    loop = root / "optloop" / "loop"
    return {
        "modules": sorted(p.name for p in loop.glob("*.py") if p.stem != "__init__"),
        "folders": sorted(
            p.name
            for p in loop.iterdir()
            if p.is_dir() and p.name not in SKIP and (p / "__init__.py").is_file()
        ),
    }


def system_names(root: Path) -> dict[str, str]:
    """``systems.SYSTEMS`` as written in ``systems/__init__.py``: name -> ``module:Class``."""
    tree = ast.parse((root / "systems" / "__init__.py").read_text())
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == "SYSTEMS" and isinstance(value, ast.Dict):
            return {
                k.value: v.value
                for k, v in zip(value.keys, value.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
    return {}


REGISTRIES = ("systems/__init__.py", "optloop/loop/optimizers/registry.py")


def _spelled(node: ast.AST) -> set[str]:
    """The string literals a collection literal spells (a dict: its keys)."""
    if isinstance(node, ast.Dict):
        items: list[ast.AST | None] = list(node.keys)
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = list(node.elts)
    else:
        return set()
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}


def name_lists(root: Path) -> list[dict[str, Any]]:
    """Literal collections outside :data:`REGISTRIES` spelling every optimizer's or every
    system's name: file, line, kind."""
    kinds = {"optimizers": set(OPTIMIZER_NAMES), "systems": set(system_names(root))}
    rows = []
    for path in python_files(root, PACKAGES):
        file = str(path.relative_to(root))
        if file in REGISTRIES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple):
                spelled = _spelled(node.slice)  # Literal["simba", "gepa", ...]
            else:
                spelled = _spelled(node)
            for kind, names in kinds.items():
                if names and names <= spelled:
                    rows.append({"file": file, "line": node.lineno, "kind": kind})
    return sorted(rows, key=lambda row: (row["file"], row["line"]))


def _imports_of(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def _literals_of(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def touches(root: Path) -> dict[str, dict[str, list[str]]]:
    """Per registered optimizer and system, the product's files that name it: its name as a
    string literal (``optloop/loop/optimizers/registry.py`` and ``systems/__init__.py``, the
    registries, among them), its module, the files importing its module, and for a system the
    ``signatures`` modules its module imports."""
    files = {str(p.relative_to(root)): p for p in python_files(root, PACKAGES)}
    literals = {file: _literals_of(path) for file, path in files.items()}
    imports = {file: _imports_of(path) for file, path in files.items()}

    def module_file(module: str) -> str | None:
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in files:
                return candidate
        return None

    def naming(name: str, module: str) -> list[str]:
        found = {file for file in files if name in literals[file]}
        own = module_file(module)
        if own is not None:
            found.add(own)
            found.update(file for file in files if module in imports[file])
            if own.endswith("/__init__.py"):  # a package: its modules are its own
                found.update(file for file in files if file.startswith(own[: -len("__init__.py")]))
        return sorted(found)

    optimizers = {
        name: naming(name, f"optloop.loop.optimizers.{name}") for name in OPTIMIZER_NAMES
    }
    systems = {}
    for name, target in system_names(root).items():
        module = target.partition(":")[0]
        found = set(naming(name, module))
        own = module_file(module)
        if own is not None:
            for imported in imports[own]:
                if imported.startswith("signatures.") and module_file(imported):
                    found.add(str(module_file(imported)))
        systems[name] = sorted(found)
    return {"optimizers": optimizers, "systems": systems}


def measure(root: Path) -> dict[str, Any]:
    return {
        "root": str(root),
        "modules": longest_modules(root),
        "classes": longest_classes(root),
        "import_cycles": import_cycles(root),
        "long_lines": long_lines(root),
        "top_level": top_level(root),
        "imports_up": imports_up(root),
        "package_cycles": package_cycles(root),
        "long_modules": long_modules(root),
        "optimizer_names": optimizer_names(root),
        "loose_modules": loose_modules(root),
        "loop_top": loop_top(root),
        "name_lists": name_lists(root),
        "touches": touches(root),
    }


def report_lines(figures: dict[str, Any]) -> list[str]:
    """The layers' part of the report: the top level, the imports up a layer, the package
    cycles, the modules over :data:`MAX_LINES` lines and the optimizer names."""
    out = ["top level of optloop/ (layer, lines):"]
    out += [
        f"  {r['layer']:12s} {r['name']:22s} {r['lines']:6d}"
        + (f"  ({r['modules']} modules)" if r["name"].endswith("/") else "")
        for r in figures["top_level"]
    ]
    up = figures["imports_up"]
    out.append(f"imports up a layer: {len(up)}")
    out += [
        f"  {r['layer']} -> {r['imported_layer']}: {r['importer']} -> {r['imported']} "
        f"({r['where']})"
        for r in up
    ]
    cycles = figures["package_cycles"]
    out.append(f"package cycles: {len(cycles)}")
    for cycle in cycles:
        out.append(f"  {' <-> '.join(cycle['parts'])}")
        out += [f"    {line}" for line in cycle["imports"]]
    long = figures["long_modules"]
    out.append(f"modules over {MAX_LINES} lines: {len(long)}")
    out += [f"  {r['lines']:5d}  {r['module']}" for r in long]
    names = figures["optimizer_names"]
    files: dict[str, list[str]] = {}
    for r in names:
        files.setdefault(r["file"], []).append(f"{r['name']}:{r['line']}")
    out.append(f"optimizer names spelled as literals: {len(names)} in {len(files)} files")
    out += [f"  {file}: {', '.join(places)}" for file, places in files.items()]
    loose = figures["loose_modules"]
    out.append(f"loose modules under optloop/: {len(loose)}: {', '.join(loose)}")
    top = figures["loop_top"]
    out.append(
        f"loop/'s top folder: {len(top['modules'])} modules, {len(top['folders'])} folders "
        f"({', '.join(top['folders'])})"
    )
    lists = figures["name_lists"]
    out.append(f"hand-kept name lists: {len(lists)}")
    out += [f"  {r['file']}:{r['line']} ({r['kind']})" for r in lists]
    for kind, named in figures["touches"].items():
        fewest = min((len(f) for f in named.values()), default=0)
        out.append(f"files naming each of the {kind} (fewest: {fewest}):")
        out += [f"  {name} {len(f)}: {', '.join(f)}" for name, f in named.items()]
    return out


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
    print(*report_lines(figures), sep="\n")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
