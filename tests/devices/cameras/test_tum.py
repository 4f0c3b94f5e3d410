"""The TUM RGB-D folder source: the shared real keyframes (depth in 1/5000 m, intrinsics,
ground truth), rgb.txt + depth.txt association, and errors that name the file."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from devices.cameras.tum import (
    TumFolderSource,
    format_tum_trajectory,
    is_tum_folder,
    read_tum_trajectory,
)
from devices.errors import DataFileError
from tests.shared import real_data

REPO = Path(__file__).resolve().parents[3]


def _shared() -> Path:
    return real_data("rgbd_tum_fr3_cabinet", "")


def test_shared_keyframes_read_in_metres_with_truth() -> None:
    src = TumFolderSource(_shared(), max_frames=3)
    with src:
        frames = list(src.frames())
    assert len(frames) == 3 and src.frames_read == 3
    f = frames[0]
    assert f.depth_scale == pytest.approx(1 / 5000) and f.T_world_camera is None
    assert f.intrinsics.fx == pytest.approx(535.4) and f.color.shape == (480, 640, 3)
    z = f.depth_m[f.depth > 0]
    assert 0.8 < float(np.median(z)) < 2.0  # README: median ~1.3 m
    gt = src.groundtruth()
    assert gt is not None and np.isfinite(gt[1]).all()
    step = np.linalg.norm(gt[1][1][:3, 3] - gt[1][0][:3, 3])
    assert 0.05 < step < 0.25


def test_rgb_depth_lists_are_associated_and_trajectories_round_trip(tmp_path: Path) -> None:
    (tmp_path / "rgb").mkdir()
    (tmp_path / "depth").mkdir()
    rgb, dep = [], []
    for i in range(3):
        cv2.imwrite(str(tmp_path / "rgb" / f"{i}.png"), np.zeros((480, 640, 3), np.uint8))
        cv2.imwrite(str(tmp_path / "depth" / f"{i}.png"), np.full((480, 640), 5000, np.uint16))
        rgb.append(f"{i:.3f} rgb/{i}.png")
        dep.append(f"{i + 0.01:.3f} depth/{i}.png")  # 10 ms apart: associated
    (tmp_path / "rgb.txt").write_text("# rgb\n" + "\n".join(rgb) + "\n")
    (tmp_path / "depth.txt").write_text("\n".join(dep) + "\n")
    assert is_tum_folder(tmp_path)
    frames = list(TumFolderSource(tmp_path).frames())
    assert len(frames) == 3 and float(frames[0].depth_m[0, 0]) == pytest.approx(1.0)
    T = np.stack([np.eye(4)] * 2)
    T[1, :3, 3] = [0.1, 0.2, 0.3]
    (tmp_path / "traj.txt").write_text(format_tum_trajectory(np.array([1.0, 2.0]), T))
    t2, T2 = read_tum_trajectory(tmp_path / "traj.txt")
    assert np.allclose(t2, [1, 2]) and np.allclose(T2, T)


def test_errors_name_the_folder_and_file(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="not a TUM RGB-D folder"):
        TumFolderSource(tmp_path)
    (tmp_path / "associations.txt").write_text("0.0 rgb/a.png 0.0 depth/a.png\n")
    with pytest.raises(DataFileError, match="a.png"):
        list(TumFolderSource(tmp_path).frames())
