"""The pose convention: round trips and quaternion order conversions."""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from devices.poses import (
    invert,
    matrix_to_pose,
    pose_to_matrix,
    quat_wxyz_to_xyzw,
    quat_xyzw_to_wxyz,
    rotation_angle_deg,
)


def test_pose_matrix_round_trip() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = Rotation.random(random_state=rng).as_quat()
        pose = np.concatenate([rng.normal(size=3), q if q[3] >= 0 else -q])
        np.testing.assert_allclose(matrix_to_pose(pose_to_matrix(pose)), pose, atol=1e-12)


def test_invert_is_inverse() -> None:
    T = pose_to_matrix(
        [0.1, -0.2, 0.3, *Rotation.from_euler("xyz", [10, 20, 30], degrees=True).as_quat()]
    )
    np.testing.assert_allclose(invert(T) @ T, np.eye(4), atol=1e-12)


def test_quaternion_orders() -> None:
    q_xyzw = np.array([0.1, 0.2, 0.3, 0.9])
    np.testing.assert_array_equal(quat_wxyz_to_xyzw(quat_xyzw_to_wxyz(q_xyzw)), q_xyzw)
    assert quat_xyzw_to_wxyz(q_xyzw)[0] == 0.9


def test_rotation_angle() -> None:
    R = Rotation.from_euler("z", 7.5, degrees=True).as_matrix()
    assert abs(rotation_angle_deg(R, np.eye(3)) - 7.5) < 1e-9
