"""The window's heap: the libraries the steps import are loaded before its freeze."""

from __future__ import annotations

import sys

WINDOW_HEAP = r"""
import gc, sys, tempfile
from pathlib import Path
from PySide6 import QtWidgets
app = QtWidgets.QApplication([])
from app.controller import AppController
from widgets.main_window import MainWindow
c = AppController(config=Path(tempfile.mkdtemp()) / "config")
w = MainWindow(c)
before = set(sys.modules)
import cma, pandas, pyarrow.parquet  # what the fit and the recorder import when they run
print(len(set(sys.modules) - before), len(gc.get_objects()), gc.get_freeze_count())
w.shutdown(); c.shutdown()
"""


def test_the_window_freezes_its_heap_with_the_steps_libraries_in_it() -> None:
    """A fit or a recording started from the window imports nothing new (its libraries are
    loaded before the heap freeze), and what a full collection walks is a small fraction of
    the heap (it walked ~180k objects, 330-380 ms on a loaded machine, before the freeze)."""
    import os
    import subprocess

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run(
        [sys.executable, "-c", WINDOW_HEAP], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    new_modules, walked, frozen = (int(x) for x in out.stdout.split()[-3:])
    assert new_modules == 0
    assert frozen > 150_000 and walked < 0.1 * frozen, (walked, frozen)
