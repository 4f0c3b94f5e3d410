"""`python main.py` without a usable display says so plainly and exits 1 (Qt would abort)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_main(tmp_path: Path, **env_over: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")
    }
    env.update(TWINBENCH_CONFIG_DIR=str(tmp_path / "cfg"), TWINBENCH_DATA_DIR=str(tmp_path / "d"))
    env.update(env_over)
    return subprocess.run(
        [sys.executable, "main.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_no_display_message(tmp_path: Path) -> None:
    res = run_main(tmp_path)
    assert res.returncode == 1
    assert "needs a display" in res.stderr and "python main.py --help" in res.stderr
    assert not (tmp_path / "d").exists()  # nothing created before the window could open


@pytest.mark.skipif(sys.platform != "linux", reason="X11 check is Linux-only")
def test_unreachable_display_message(tmp_path: Path) -> None:
    res = run_main(tmp_path, DISPLAY=":987654")
    assert res.returncode == 1
    assert "cannot connect to the display ':987654'" in res.stderr
