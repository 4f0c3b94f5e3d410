"""The project's modules import each other without cycles (docs/ARCHITECTURE.md §2).

The graph is built from the source, not from what happens to be loaded: every `import` and
`from … import` of a project module, at module level or inside a function (a function-scope
import is still a dependency; it only hides the cycle from a first import). Two kinds of
block are left out because they never run when the module is imported: `if TYPE_CHECKING:`
(annotations only) and `if __name__ == "__main__":` (a module's own preview or script entry).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.shared import PROJECT_PACKAGES, REPO

ROOT = REPO
PACKAGES = PROJECT_PACKAGES


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _skipped(node: ast.If) -> bool:
    t = node.test
    if isinstance(t, ast.Name) and t.id == "TYPE_CHECKING":
        return True
    if isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING":
        return True
    return (
        isinstance(t, ast.Compare)
        and isinstance(t.left, ast.Name)
        and t.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in t.comparators)
    )


def _imported(tree: ast.AST) -> Iterator[str]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _skipped(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for name in _imported(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            while name and name not in mods:  # `from pkg.mod import func` -> pkg.mod
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):
                graph[mod].add(name)  # (a module importing its own package is not a cycle)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_finder_sees_a_cycle_hidden_in_a_function() -> None:
    src = "def f():\n    from b import x\n"
    names = set(_imported(ast.parse(src)))
    assert "b" in names
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from b import X\n"
    assert "b" not in set(_imported(ast.parse(typed)))
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 200  # every package was read
    found = cycles(graph)
    assert not found, "import cycles (each list imports itself round):\n" + "\n".join(
        " -> ".join(c) for c in found
    )
