"""`python main.py scan --source DIR` end to end on real data: the shared TUM cabinet keyframes
(tracked ratio and ATE against motion capture, a mesh of plausible size, the recording kept by
reference), and the honest failures a user sees (empty scan, bad depth range)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.shared import real_data

REPO = Path(__file__).resolve().parents[2]


def _main(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _tum_folder() -> Path:
    return real_data("rgbd_tum_fr3_cabinet", "associations.txt")


def _project(tmp_path: Path) -> Path:
    from resources.project import Project

    Project.create(tmp_path / "proj")
    return tmp_path / "proj"


@pytest.mark.slow
def test_scan_real_tum_keyframes(tmp_path: Path) -> None:
    from devices.cameras.tum import TumFolderSource, read_tum_trajectory
    from reconstruction.metrics import absolute_trajectory_error

    folder = _tum_folder()
    n = 10  # ~1.4 m of the 8.3 m path, 14.5 cm / 7 deg between frames
    proj = _project(tmp_path)
    proc = _main("scan", "--source", str(folder), "--project", str(proj), "--max-frames", str(n),
                 "--quiet")  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (scan,) = (proj / "scans").iterdir()
    d = json.loads((scan / "scan.json").read_text())
    frames = d["camera_path"]["frames"]
    assert len(frames) == n and all(f["tracked"] for f in frames)
    t, T = read_tum_trajectory(scan / "camera_path.txt")
    gt = TumFolderSource(folder, max_frames=n).groundtruth()
    assert gt is not None and np.allclose(t, gt[0], atol=1e-6)
    ate, _ = absolute_trajectory_error(T, gt[1])
    assert ate < 0.04  # measured 1.1-1.7 cm; mocap vs depth disagree by ~1 cm per keyframe
    # the mesh: the cabinet and the floor around it, metres across, not a sliver or a room
    import trimesh

    mesh = trimesh.load(scan / "mesh.ply", force="mesh", process=False)
    assert len(mesh.faces) > 20000
    assert 1.0 < float(np.linalg.norm(mesh.extents)) < 8.0
    # recorded by reference, not copied
    rec = d["capture"]["recording"]
    assert rec["path"] == str(folder.resolve()) and rec["copied"] is False
    assert rec["bytes"] > 1_000_000 and len(rec["sha256"]) == 64
    assert not (scan / "recording").exists()
    assert d["capture"]["depth_range_from"] == "data"
    assert "\x1b" not in json.dumps(d)
    assert "tracked 10/10 frames" in proc.stdout


def _write_tum(folder: Path, depth: np.ndarray, n: int = 3) -> None:
    (folder / "rgb").mkdir(parents=True)
    (folder / "depth").mkdir()
    lines = []
    for i in range(n):
        cv2.imwrite(str(folder / "rgb" / f"{i}.png"), np.full((480, 640, 3), 120, np.uint8))
        cv2.imwrite(str(folder / "depth" / f"{i}.png"), depth)
        lines.append(f"{i * 0.033:.3f} rgb/{i}.png {i * 0.033:.3f} depth/{i}.png")
    (folder / "associations.txt").write_text("\n".join(lines) + "\n")


def test_empty_scan_is_an_error_and_saves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "frames"
    _write_tum(src, np.zeros((480, 640), np.uint16))
    proj = _project(tmp_path)
    proc = _main("scan", "--source", str(src), "--project", str(proj), "--quiet")
    assert proc.returncode != 0
    assert "Nothing was saved" in proc.stderr and "depth" in proc.stderr
    assert "\x1b" not in proc.stderr
    assert not (proj / "scans").exists() or not any((proj / "scans").iterdir())


def test_bad_depth_range_and_folder_are_named(tmp_path: Path) -> None:
    proj = _project(tmp_path)
    proc = _main("scan", "--source", str(tmp_path), "--project", str(proj), "--depth-range", "3:1")
    assert proc.returncode == 2 and "--depth-range '3:1'" in proc.stderr
    proc = _main("scan", "--source", str(tmp_path), "--project", str(proj))
    assert proc.returncode == 2 and "TUM RGB-D layout" in proc.stderr
