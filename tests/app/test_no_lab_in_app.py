"""The GUI and app process never load the virtual lab (MuJoCo): the lab is another process
(docs/ARCHITECTURE.md §5, §8). import-linter checks the import graph; this checks what really loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_BLOCK_LAB = """
import importlib, pkgutil, sys
class _NoLab:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "mujoco" or name.startswith("devices.lab"):
            raise ImportError(f"the lab is blocked in this test: {name}")
        return None
sys.meta_path.insert(0, _NoLab())
# nothing skipped: `lab serve` runs devices/robots/agent/serve.py from main.py, and the benchmarks
# (which read the lab's truth) are benches/, above app/
failed = []
for pkg in ("app", "widgets"):
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        if ".__main__" in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            if "lab is blocked" in str(exc):
                failed.append(f"{info.name}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_app_and_widgets_import_without_the_lab() -> None:
    res = subprocess.run(
        [sys.executable, "-c", _BLOCK_LAB],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "QT_QPA_PLATFORM": "offscreen"},
    )
    assert res.returncode == 0, (
        f"app/widgets modules loading the lab:\n{res.stdout}\n{res.stderr[-2000:]}"
    )
