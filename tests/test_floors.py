"""Product code never loads a benchmark (docs/ARCHITECTURE.md §2): benches/ is the top floor,
above widgets/ and app/. import-linter checks the import graph it can see; this imports every
product module for real (function-scope imports run only when called, but a module-level or
`importlib` import of a bench shows up here) and checks that nothing from `benches` loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PRODUCT = ("app", "widgets", "policies", "twins", "reconstruction", "devices")
# the lab's own process (the lab and `agent serve` / `lab serve`'s entry point), not product
# code the app loads; they load no bench either, but they are not what this guards
NOT_PRODUCT = ("devices.lab", "devices.robots.agent.serve")

_IMPORT_ALL = """
import importlib, pkgutil, sys
packages, skip = sys.argv[1].split(","), tuple(sys.argv[2].split(","))
current = ["?"]
loaded = []
class _SeeBenches:
    def find_spec(self, name, path=None, target=None):
        if name == "benches" or name.startswith("benches."):
            loaded.append(f"{current[0]} -> {name}")
        return None  # the import goes on: a module that catches an ImportError is still seen
sys.meta_path.insert(0, _SeeBenches())
broken = []
for pkg in packages:
    current[0] = pkg
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + ".", onerror=lambda name: None):
        if info.name.startswith(skip) or ".__main__" in info.name:
            continue
        current[0] = info.name
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # an optional vendor library missing here: not this check
            broken.append(f"{info.name}: {type(exc).__name__}")
in_modules = sorted(m for m in sys.modules if m == "benches" or m.startswith("benches."))
print("benches loaded by:", *loaded, sep="\\n  ")
print("benches in sys.modules:", in_modules)
print("not importable here:", broken)
print("imported:", sum(m.split(".")[0] in packages for m in sys.modules))
sys.exit(1 if loaded or in_modules else 0)
"""


def _import_all(packages: tuple[str, ...], pythonpath: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, ",".join(packages), ",".join(NOT_PRODUCT)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": pythonpath,
            "QT_QPA_PLATFORM": "offscreen",
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"),
        },
    )


def test_no_product_module_loads_a_bench() -> None:
    res = _import_all(PRODUCT, str(REPO))
    assert res.returncode == 0, f"product modules loading benches/:\n{res.stdout}\n{res.stderr}"
    imported = int(res.stdout.rsplit("imported:", 1)[1])
    assert imported > 150, res.stdout  # the walk really went through the product packages


def test_the_check_sees_a_product_module_that_loads_a_bench(tmp_path: Path) -> None:
    """The same check fails for a package whose module imports a bench (here one that even
    catches the ImportError a missing bench would raise)."""
    pkg = tmp_path / "floorprobe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "quiet.py").write_text(
        "try:\n    import benches.cli  # noqa: F401\nexcept ImportError:\n    pass\n"
    )
    res = _import_all(("floorprobe",), os.pathsep.join([str(tmp_path), str(REPO)]))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "floorprobe.quiet -> benches" in res.stdout
