"""Function-scope imports of project modules only where loading late buys something, each
with its reason (issue 25).

An `import` of a project module (benches, widgets, app, policies, twins, reconstruction,
devices, resources) inside a function hides a dependency from whoever reads the module's top
and can hide an import cycle (tests/test_import_graph.py). Where one is lazy on purpose (it
would load a heavy library, or load it before a check that must come first), a `#` comment
says why, with the cost measured (`python -X importtime`): on the import's own line, on the
line directly above it, or directly above the run of import statements (no blank line
between) that it belongs to.

Covered: the packages in COVERED (every project package), less the paths in NOT_COVERED
(none). Imports of libraries (torch, open3d, ...) are not counted here: the import-linter
contracts say where those live.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.shared import PROJECT_PACKAGES, REPO

ROOT = REPO
PROJECT = PROJECT_PACKAGES
COVERED = PROJECT
NOT_COVERED: tuple[str, ...] = ()


def _function_scope_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Imports of project modules anywhere inside a function or method body."""
    found: list[ast.Import | ast.ImportFrom] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(n.split(".")[0] in PROJECT for n in names):
                found.append(node)
    return list({id(n): n for n in found}.values())  # nested functions walk a node twice


def unexplained(source: str) -> list[tuple[int, str]]:
    """(line, text) of each function-scope project import in `source` with no reason comment."""
    tree = ast.parse(source)
    lines = source.splitlines()
    ends = {
        n.end_lineno: n
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom)) and n.end_lineno is not None
    }

    def said(node: ast.Import | ast.ImportFrom) -> bool:
        end = node.end_lineno or node.lineno
        if any("#" in lines[i - 1] for i in range(node.lineno, end + 1)):
            return True  # (a `#` in an import statement can only start a comment)
        above = node.lineno - 1
        while above >= 1:
            if lines[above - 1].strip().startswith("#"):
                return True
            prev = ends.get(above)  # the import statement ending on the line above
            if prev is None:
                return False
            above = prev.lineno - 1
        return False

    return [
        (n.lineno, lines[n.lineno - 1].strip())
        for n in sorted(_function_scope_imports(tree), key=lambda n: n.lineno)
        if not said(n)
    ]


def _covered_files() -> list[Path]:
    out = []
    for pkg in COVERED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel == p or rel.startswith(p + "/") for p in NOT_COVERED):
                out.append(path)
    return out


def test_the_check_finds_an_unexplained_import() -> None:
    src = """\
import numpy as np
from twins.spec import TwinSpec


def bare():
    from twins.builder import TwinWorld
    import torch

    return TwinWorld, torch


def trailing():
    from twins.builder import TwinWorld  # pybullet: only when a world is built
    return TwinWorld


def above():
    # 0.5 s of trimesh
    from twins.from_scan import resolve_robot_ref
    return resolve_robot_ref


def run():
    import faulthandler

    # after the display check
    from app import demo
    from app.controller import (
        AppController,
    )
    from widgets.main_window import MainWindow
    return demo, AppController, MainWindow


def too_far():
    # a comment with a blank line under it says nothing about the import
    x = 1

    from twins import contacts
    return contacts, x


class C:
    def method(self):
        def inner():
            import reconstruction.tracking
            return reconstruction.tracking
        return inner
"""
    found = unexplained(src)
    assert [text for _, text in found] == [
        "from twins.builder import TwinWorld",
        "from twins import contacts",
        "import reconstruction.tracking",
    ]
    assert found[0][0] == 6  # the line of the import
    assert unexplained("def f():\n    import os\n    import numpy\n") == []


def test_function_scope_project_imports_say_why_they_are_lazy() -> None:
    files = _covered_files()
    assert len(files) > 100  # every covered package was read
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for path in files
        for line, text in unexplained(path.read_text(encoding="utf-8"))
    ]
    assert not missing, (
        "function-scope imports of project modules with no reason comment (move the import "
        "to the module's top, or say on its line or the line above why it is lazy, with "
        "the cost measured):\n" + "\n".join(missing)
    )
