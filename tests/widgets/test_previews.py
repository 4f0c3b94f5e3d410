"""Every page and shared widget opens standalone (`python -m widgets.<module>`), offscreen:
the process must still be running (not crashed) after a few seconds; then it is stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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


def test_previews_start(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        TWINBENCH_CONFIG_DIR=str(tmp_path / "cfg"),
        TWINBENCH_DATA_DIR=str(tmp_path / "d"),
    )
    procs = {
        m: subprocess.Popen(
            [sys.executable, "-m", f"widgets.{m}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for m in MODULES
    }
    try:
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline and all(p.poll() is None for p in procs.values()):
            time.sleep(0.2)
        crashed = {m: p.returncode for m, p in procs.items() if p.poll() is not None}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    errors = {m: procs[m].stderr.read()[-800:] for m in crashed}  # type: ignore[union-attr]
    for p in procs.values():
        p.stderr.close()  # type: ignore[union-attr]
    assert not crashed, errors
