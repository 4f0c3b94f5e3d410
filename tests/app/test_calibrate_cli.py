"""`python main.py calibrate` end to end in a subprocess: the shared real capture, and the
errors a user sees for a bad board spec and an unreadable image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np

from tests.shared import real_data

REPO = Path(__file__).resolve().parents[2]
BOARD = "charuco:5x7:0.036195:0.018256:DICT_6X6_250"


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), "calibrate", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _shared_capture() -> Path:
    return real_data("handeye_abb_charuco", "images")


def test_calibrate_shared_capture_json(tmp_path: Path) -> None:
    folder = _shared_capture()
    proc = _calibrate(
        "--images", str(folder / "images"), "--poses", str(folder / "poses"),
        "--board", BOARD, "--eye-to-hand", "--json", "--out", str(tmp_path / "cal.json"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "cal.json").read_text()) == out
    assert out["mode"] == "eye_to_hand" and out["board"] == BOARD
    assert out["intrinsics_file"].endswith("camera_intr_calibrated.yaml")
    T = np.asarray(out["T_base_camera"])
    assert T.shape == (4, 4) and np.allclose(T[:3, :3] @ T[:3, :3].T, np.eye(3), atol=1e-9)
    assert out["views_used"] >= 13 and out["median_reproj_px"] <= 2.0
    assert out["uncertainty"]["spread_mm"] <= 3.0 and out["uncertainty"]["spread_deg"] <= 0.3
    glare = [r for r in out["rejected"] if r["index"] == 2]
    assert glare and glare[0]["reason"] == "glare" and "2.jpg" in glare[0]["detail"]
    assert "rejected view 2 (glare)" in proc.stdout and "suggestion:" in proc.stdout


def test_calibrate_errors_are_clear(tmp_path: Path) -> None:
    images, poses = tmp_path / "images", tmp_path / "poses"
    images.mkdir()
    poses.mkdir()
    (tmp_path / "intrinsics.json").write_text(
        json.dumps({"fx": 600, "fy": 600, "cx": 320, "cy": 240})
    )
    cv2.imwrite(str(images / "0.png"), np.full((480, 640), 200, np.uint8))
    (images / "1.png").write_bytes(b"\x89PNG truncated")
    for i in (0, 1):
        (poses / f"{i}.yaml").write_text("x: 0\ny: 0\nz: 0\nqx: 0\nqy: 0\nqz: 0\nqw: 1\n")
    args = ["--images", str(images), "--poses", str(poses)]
    proc = _calibrate(*args, "--board", BOARD)
    assert proc.returncode == 2 and "--eye-to-hand" in proc.stderr  # the set-up is not guessed
    args.append("--eye-to-hand")
    proc = _calibrate(*args, "--board", "charuco:5x7")
    assert proc.returncode == 2 and "board spec 'charuco:5x7'" in proc.stderr
    proc = _calibrate(*args, "--board", BOARD)
    assert proc.returncode == 2 and "1.png: cannot read the image" in proc.stderr
    (images / "1.png").unlink()
    proc = _calibrate(*args[:-1], "--board", BOARD, "--eye-in-hand")
    assert proc.returncode == 2 and "needs >= 3 board views" in proc.stderr
