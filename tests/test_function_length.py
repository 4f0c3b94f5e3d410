"""No function over 120 lines (issue 25): a function that long holds several concepts (the
stages of a benchmark, the areas of a page, the steps of a scan) that read and test better as
functions of their own. Counted from the source, decorators aside: `def` line to last line,
docstring and comments included, so the limit cannot be met by squeezing lines together."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.shared import PROJECT_PACKAGES, REPO

PACKAGES = PROJECT_PACKAGES
MAX_LINES = 120


def _long_functions(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            n = node.end_lineno - node.lineno + 1
            if n > MAX_LINES:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {n} lines")
    return found


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def test_the_packages_have_modules() -> None:
    # a wrong root would find nothing and pass
    for pkg in PACKAGES:
        assert any((REPO / pkg).rglob("*.py")), f"no modules under {pkg}/"


def test_no_function_is_over_120_lines() -> None:
    long = [f for path in _modules() for f in _long_functions(path)]
    assert not long, f"functions over {MAX_LINES} lines (split them by concept):\n" + "\n".join(
        long
    )


def test_a_long_function_is_named(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES - 1))
    path = tmp_path / "probe.py"
    path.write_text(
        f"def short():\n    pass\n\n\nclass C:\n    def at_limit(self):\n{body}\n\n"
        f"    def too_long(self):\n{body}\n        x = 0\n"
    )
    assert _long_functions(path, tmp_path) == [
        f"probe.py:{MAX_LINES + 7} too_long: {MAX_LINES + 1} lines"
    ]
