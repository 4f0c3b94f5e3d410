"""napari-style check: every core package imports with Qt made unimportable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_BLOCK_QT = """
import importlib, pkgutil, sys
class _NoQt:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("PySide6", "pyqtgraph", "shiboken6", "PyQt5", "PyQt6"):
            raise ImportError(f"Qt is blocked in this test: {name}")
        return None
sys.meta_path.insert(0, _NoQt())
failed = []
for pkg in ("resources", "devices", "reconstruction", "twins", "policies", "app"):
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        if ".__main__" in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            if "Qt is blocked" in str(exc):
                failed.append(f"{info.name}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_core_packages_import_without_qt() -> None:
    res = subprocess.run(
        [sys.executable, "-c", _BLOCK_QT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert res.returncode == 0, (
        f"modules needing Qt below widgets/:\n{res.stdout}\n{res.stderr[-2000:]}"
    )
