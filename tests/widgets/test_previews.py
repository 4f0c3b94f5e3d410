"""Every page and shared widget opens standalone (`python -m widgets.<module>`), offscreen,
and draws: each preview saves what it shows once idle ($TWINBENCH_PREVIEW_SHOT) and exits
0; the picture must be the preview's size and not one flat colour."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.gui, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
MODULES = [
    "scan_page",
    "twin_page",
    "calibrate_page",
    "policies_page",
    "deploy_page",
    "scene_view",
    "trajectory_plot",
    "jobs",
]
PARALLEL = 2
LIMIT_S = 150.0


def _pixels(path: Path) -> np.ndarray:
    from PySide6 import QtGui

    img = QtGui.QImage(str(path)).convertToFormat(QtGui.QImage.Format.Format_RGB32)
    assert not img.isNull(), f"{path}: not a readable PNG"
    ptr = img.constBits()
    arr = np.frombuffer(ptr, np.uint8, img.sizeInBytes()).reshape(img.height(), -1)
    return arr[:, : img.width() * 4].reshape(img.height(), img.width(), 4)[..., :3].copy()


def _stop_group(p: subprocess.Popen[bytes]) -> None:
    """Kill what a preview left behind (its own children too: a replay worker holding the
    preview's stderr kept a killed preview's pipe open, and the test waited on it)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=10)


def test_previews_draw(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        TWINBENCH_CONFIG_DIR=str(tmp_path / "cfg"),
        TWINBENCH_DATA_DIR=str(tmp_path / "d"),
        PYTHONFAULTHANDLER="1",  # SIGABRT on a preview past its limit prints every stack
    )
    pending = list(MODULES)
    running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    errors = {}
    # Two at a time (the machine's cores): eight at once starved each other for minutes.
    while pending or running:
        while pending and len(running) < PARALLEL:
            m = pending.pop(0)
            with open(tmp_path / f"{m}.log", "wb") as log:  # a file, not a pipe: never blocks
                running[m] = (
                    subprocess.Popen(
                        [sys.executable, "-m", f"widgets.{m}"],
                        cwd=REPO,
                        env={**env, "TWINBENCH_PREVIEW_SHOT": str(tmp_path / f"{m}.png")},
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                        start_new_session=True,
                    ),
                    time.monotonic(),
                )
        time.sleep(0.2)
        for m, (p, t0) in list(running.items()):
            rc = p.poll()
            if rc is None and time.monotonic() - t0 < LIMIT_S:
                continue
            if rc is None:
                p.send_signal(signal.SIGABRT)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
                errors[m] = f"did not finish drawing within {LIMIT_S:.0f} s"
            elif rc != 0:
                errors[m] = f"exit {rc}"
            _stop_group(p)
            if m in errors:
                errors[m] += ": " + (tmp_path / f"{m}.log").read_text(errors="replace")[-1500:]
            del running[m]
    assert not errors, errors
    for m in MODULES:
        px = _pixels(tmp_path / f"{m}.png")
        assert px.shape[0] >= 100 and px.shape[1] >= 200, (m, px.shape)
        colours = len(np.unique(px.reshape(-1, 3), axis=0))
        assert colours >= 8, f"{m}: the preview drew {colours} colours: nothing on it"
