"""Trajectory: validation, resampling against analytic signals, file round trip, bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.transform import Rotation

from devices.errors import DataFileError
from devices.poses import POSE_UNIT
from devices.trajectory import Trajectory


def _traj(n: int = 200) -> Trajectory:
    t = np.linspace(0.0, 2.0, n)
    q = np.stack([np.sin(2 * np.pi * t), np.cos(t)], 1)
    rot = Rotation.from_rotvec(np.outer(t, [0, 0, 1.0])).as_quat()
    pose = np.concatenate([np.stack([t, 0 * t, 0 * t + 0.1], 1), rot], 1)
    return Trajectory(
        t,
        {"robot/joint_pos": q, "objects/puck/pose": pose, "robot/command": q[:, 0]},
        {"robot/joint_pos": "rad", "objects/puck/pose": POSE_UNIT, "robot/command": "rad"},
        "real",
        {"robot": "pendulum", "rate_hz": 100.0},
    )


def test_validation_messages() -> None:
    with pytest.raises(DataFileError, match="strictly increasing"):
        Trajectory(np.array([0.0, 0.1, 0.1]), {})
    with pytest.raises(DataFileError, match="'robot/joint_pos' has 2 samples"):
        Trajectory(np.array([0.0, 0.1, 0.2]), {"robot/joint_pos": np.zeros((2, 7))})
    tr = Trajectory(np.array([0.0, 0.1]), {"a/b": np.array([1.0, np.nan])})
    with pytest.raises(DataFileError, match=r"'a/b' has NaN/inf at sample 1 \(t=0.1000 s\)"):
        tr.check_finite()


def test_arrays_are_read_only_copies() -> None:
    q = np.zeros((3, 2))
    tr = Trajectory(np.arange(3.0), {"robot/joint_pos": q})
    q[0, 0] = 5.0
    assert tr["robot/joint_pos"][0, 0] == 0.0
    with pytest.raises(ValueError):
        tr["robot/joint_pos"][0, 0] = 1.0


def test_resample_matches_analytic_signal() -> None:
    tr = _traj(2000)
    t_new = np.linspace(0.1, 1.9, 37)
    rs = tr.resample(t_new)
    np.testing.assert_allclose(rs["robot/joint_pos"][:, 0], np.sin(2 * np.pi * t_new), atol=2e-4)
    yaw = Rotation.from_quat(rs["objects/puck/pose"][:, 3:]).as_rotvec()[:, 2]
    np.testing.assert_allclose(yaw, t_new, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(rs["objects/puck/pose"][:, 3:], axis=1), 1.0)


def test_save_load_round_trip_and_pandas_readable(tmp_path: Path) -> None:
    tr = _traj()
    tr.save(tmp_path / "traj")
    back = Trajectory.load(tmp_path / "traj")
    np.testing.assert_array_equal(back.t, tr.t)
    for k in tr.channels:
        np.testing.assert_array_equal(back[k], tr[k])
    assert back.units == tr.units and back.source == "real" and back.meta["robot"] == "pendulum"
    df = pd.read_parquet(tmp_path / "traj" / "data.parquet")
    assert "robot/joint_pos[1]" in df.columns and len(df) == len(tr)


def test_corrupt_files_are_named(tmp_path: Path) -> None:
    tr = _traj()
    folder = tmp_path / "traj"
    tr.save(folder)
    data = (folder / "data.parquet").read_bytes()
    (folder / "data.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFileError, match=r"data\.parquet: corrupt parquet"):
        Trajectory.load(folder)
    (folder / "meta.json").write_text('{"format_version": 7}')
    with pytest.raises(DataFileError, match="format version 7"):
        Trajectory.load(folder)
    with pytest.raises(DataFileError, match="missing"):
        Trajectory.load(tmp_path / "nowhere")
