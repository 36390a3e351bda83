"""``experiments.structure`` on small trees written here, and the product's import graph itself."""

from __future__ import annotations

from pathlib import Path

from experiments.structure import (
    import_cycles,
    imports_up,
    long_lines,
    long_modules,
    longest_classes,
    longest_modules,
    loop_top,
    loose_modules,
    name_lists,
    optimizer_names,
    package_cycles,
    top_level,
    touches,
)

REPO = Path(__file__).resolve().parents[2]


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_an_import_inside_a_function_or_under_type_checking_still_makes_a_cycle(tmp_path):
    root = write(
        tmp_path,
        {
            "optloop/__init__.py": "",
            "optloop/a.py": "from optloop import b\n",
            "optloop/b.py": "def f():\n    from optloop.c import g\n",
            "optloop/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
            ),
            "optloop/d.py": "import optloop.a\n",
        },
    )
    assert import_cycles(root) == [["optloop.a", "optloop.b", "optloop.c"]]


def test_a_tree_without_cycles_has_none_and_its_sizes_are_counted(tmp_path):
    root = write(
        tmp_path,
        {
            "optloop/__init__.py": "",
            "optloop/a.py": (
                "from optloop.b import X\n\n\nclass Big:\n"
                "    def one(self):\n        pass\n\n"
                "    def two(self):\n        pass\n"
            ),
            "optloop/b.py": "X = 1  " + "#" * 100 + "\n",
        },
    )
    assert import_cycles(root) == []
    assert longest_modules(root)[0] == {"module": "optloop/a.py", "lines": 9}
    assert longest_classes(root) == [{"class": "optloop/a.py:Big", "lines": 6, "methods": 2}]
    assert long_lines(root)["lines"] == 1 and long_lines(root)["most"] == {"optloop/b.py": 1}


def test_optloop_systems_and_signatures_import_no_cycle():
    assert import_cycles(REPO) == []


def test_an_import_from_a_higher_layer_is_reported_with_where_it_stands(tmp_path):
    root = write(
        tmp_path,
        {
            "optloop/__init__.py": "",
            "optloop/errors.py": "def f():\n    from optloop.loop import runner\n",
            "optloop/loop/__init__.py": "",
            "optloop/loop/runner.py": (
                "from typing import TYPE_CHECKING\nfrom optloop import errors\n"
                "if TYPE_CHECKING:\n    from optloop import run\n"
            ),
            "optloop/run.py": "from optloop.loop import runner\n",
        },
    )
    up = [(r["importer"], r["imported"], r["where"]) for r in imports_up(root)]
    assert up == [
        ("optloop.errors", "optloop.loop.runner", "function"),
        ("optloop.loop.runner", "optloop.run", "typing"),
    ]
    [cycle] = package_cycles(root)
    assert cycle["parts"] == ["errors", "loop", "run"]
    assert "optloop.run -> optloop.loop.runner (top)" in cycle["imports"]
    assert [row["name"] for row in top_level(root)] == [
        "errors.py",
        "loop/",
        "__init__.py",
        "run.py",
    ]


def test_modules_over_600_lines_and_optimizer_names_spelled_in_code_are_listed(tmp_path):
    root = write(
        tmp_path,
        {
            "optloop/__init__.py": "",
            "optloop/long.py": "x = 1\n" * 601,
            "optloop/names.py": (
                '"""The edit optimizer."""\nDEFAULT = "edit"\nNAMES = ("simba", "gepa")\n'
                'TEXT = "simba rules"\n'
            ),
        },
    )
    assert long_modules(root) == [{"module": "optloop/long.py", "lines": 601}]
    assert [(r["line"], r["name"]) for r in optimizer_names(root)] == [
        (2, "edit"),
        (3, "gepa"),
        (3, "simba"),
    ]


def test_no_study_wires_a_loop_itself():
    """One way to run a loop from ``experiments/``: ``optloop.optimize``, ``python -m optloop.run``
    or :mod:`optloop.loop.runs.session`, never the wiring below them
    (``optloop.loop.runs.runner``'s ``Loop``, the controller)."""
    import ast

    wiring = {"optloop.loop.runs.runner", "optloop.loop.controller"}
    found = []
    for path in sorted((REPO / "experiments").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in wiring:
                found.append(f"{path.relative_to(REPO)}: from {node.module}")
            if isinstance(node, ast.ImportFrom) and node.module:
                found += [
                    f"{path.relative_to(REPO)}: {alias.name}"
                    for alias in node.names
                    if f"{node.module}.{alias.name}" in wiring
                ]
            if isinstance(node, ast.Import):
                found += [
                    f"{path.relative_to(REPO)}: import {alias.name}"
                    for alias in node.names
                    if alias.name in wiring
                ]
    assert found == []


def test_loose_modules_name_lists_and_the_files_naming_a_system_or_an_optimizer(tmp_path):
    root = write(
        tmp_path,
        {
            "optloop/__init__.py": "",
            "optloop/__main__.py": "",
            "optloop/errors.py": "",
            "optloop/loop/__init__.py": "",
            "optloop/loop/controller.py": "",
            "optloop/loop/runs/__init__.py": "",
            "optloop/loop/optimizers/registry.py": 'NAMES = ("simba", "gepa", "optuna", "edit")\n',
            "optloop/loop/optimizers/edit.py": "",
            "optloop/defaults.py": 'BY_SYSTEM = {"alpha": 1, "beta": 2}\n',
            "optloop/faults.py": 'FOR_ALPHA = ("alpha",)\n',
            "systems/__init__.py": 'SYSTEMS = {"alpha": "systems.a:A", "beta": "systems.b:B"}\n',
            "systems/a.py": "from signatures.a import Extract\n",
            "systems/b.py": "",
            "signatures/__init__.py": "",
            "signatures/a.py": "",
        },
    )
    assert loose_modules(root) == ["defaults.py", "errors.py", "faults.py"]
    assert loop_top(root) == {"modules": ["controller.py"], "folders": ["runs"]}
    # the registries define the names; only a list outside them that spells all is hand-kept
    assert name_lists(root) == [{"file": "optloop/defaults.py", "line": 1, "kind": "systems"}]
    named = touches(root)
    assert named["optimizers"]["edit"] == [
        "optloop/loop/optimizers/edit.py",
        "optloop/loop/optimizers/registry.py",
    ]
    assert named["systems"]["alpha"] == [
        "optloop/defaults.py",
        "optloop/faults.py",
        "signatures/a.py",
        "systems/__init__.py",
        "systems/a.py",
    ]
    assert named["systems"]["beta"] == [
        "optloop/defaults.py",
        "systems/__init__.py",
        "systems/b.py",
    ]
