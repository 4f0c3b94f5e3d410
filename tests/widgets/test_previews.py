"""Every page and shared widget opens standalone (`python -m widgets.<module>`), offscreen,
and draws: each preview saves what it shows once idle ($TWINBENCH_PREVIEW_SHOT) and exits
0; the picture must be the preview's size and not one flat colour."""

from __future__ import annotations

import os
import subprocess
import sys
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


def _pixels(path: Path) -> np.ndarray:
    from PySide6 import QtGui

    img = QtGui.QImage(str(path)).convertToFormat(QtGui.QImage.Format.Format_RGB32)
    assert not img.isNull(), f"{path}: not a readable PNG"
    ptr = img.constBits()
    arr = np.frombuffer(ptr, np.uint8, img.sizeInBytes()).reshape(img.height(), -1)
    return arr[:, : img.width() * 4].reshape(img.height(), img.width(), 4)[..., :3].copy()


def test_previews_draw(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        TWINBENCH_CONFIG_DIR=str(tmp_path / "cfg"),
        TWINBENCH_DATA_DIR=str(tmp_path / "d"),
    )
    procs = {}
    for m in MODULES:
        procs[m] = subprocess.Popen(
            [sys.executable, "-m", f"widgets.{m}"],
            cwd=REPO,
            env={**env, "TWINBENCH_PREVIEW_SHOT": str(tmp_path / f"{m}.png")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    errors = {}
    for m, p in procs.items():
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            errors[m] = "did not finish drawing within 120 s"
            continue
        if p.returncode != 0:
            errors[m] = f"exit {p.returncode}: {err[-800:]}"
    assert not errors, errors
    for m in MODULES:
        px = _pixels(tmp_path / f"{m}.png")
        assert px.shape[0] >= 100 and px.shape[1] >= 200, (m, px.shape)
        colours = len(np.unique(px.reshape(-1, 3), axis=0))
        assert colours >= 8, f"{m}: the preview drew {colours} colours: nothing on it"
