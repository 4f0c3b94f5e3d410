"""The stick figure the workbench draws of a connected arm comes from its URDF through
twins/kinematics (`RobotKinematics.figure_points`), for any robot. For the Panda it matches
the hand-typed modified-DH figure the devices panel drew before (Franka's documented
parameters, kept here only as the reference) within 1 mm over random poses."""

from __future__ import annotations

import numpy as np

from devices.robots.agent.drivers.ideal import PANDA_LOWER, PANDA_UPPER
from twins.kinematics import RobotKinematics

# Franka Panda, modified DH (Franka's documentation): joints 1-7, then the flange; the grasp
# point 0.105 m along the flange's z axis
_A = (0.0, 0.0, 0.0, 0.0825, -0.0825, 0.0, 0.088, 0.0)
_D = (0.333, 0.0, 0.316, 0.0, 0.384, 0.0, 0.0, 0.107)
_ALPHA = (0.0, -np.pi / 2, np.pi / 2, np.pi / 2, -np.pi / 2, np.pi / 2, np.pi / 2, 0.0)
_TOOL_M = 0.105


def _dh_figure(q: np.ndarray) -> np.ndarray:
    """Base, joint frames 1-7, flange, grasp point (10, 3)."""
    T = np.eye(4)
    pts = [T[:3, 3].copy()]
    for i in range(8):
        th = q[i] if i < 7 else 0.0
        ca, sa, ct, st = np.cos(_ALPHA[i]), np.sin(_ALPHA[i]), np.cos(th), np.sin(th)
        d, a = _D[i], _A[i]
        T = T @ np.array(
            [
                [ct, -st, 0, a],
                [st * ca, ct * ca, -sa, -sa * d],
                [st * sa, ct * sa, ca, ca * d],
                [0, 0, 0, 1],
            ]
        )
        pts.append(T[:3, 3].copy())
    pts.append(T[:3, 3] + _TOOL_M * T[:3, 2])
    return np.array(pts)


def test_the_panda_figure_from_its_urdf_matches_the_hand_typed_dh_within_1_mm() -> None:
    names = [f"panda_joint{i}" for i in range(1, 8)]
    kin = RobotKinematics.from_description("franka_panda/panda.urdf", names)
    assert kin.figure_links() == [
        *(f"panda_link{i}" for i in range(9)),
        "panda_grasptarget",
    ]
    rng = np.random.default_rng(7)
    for q in [np.zeros(7), *rng.uniform(PANDA_LOWER, PANDA_UPPER, size=(100, 7))]:
        got = kin.figure_points(q)
        assert got.shape == (10, 3)
        assert np.max(np.linalg.norm(got - _dh_figure(q), axis=1)) < 1e-3


def test_any_urdf_arm_gets_a_figure_from_base_to_tool() -> None:
    """Another arm (KUKA iiwa from pybullet_data): base, one point per joint, the tool; the
    last point is the last link's pose."""
    names = [f"lbr_iiwa_joint_{i}" for i in range(1, 8)]
    kin = RobotKinematics.from_description("kuka_iiwa/model.urdf", names)
    q = np.linspace(-0.5, 0.5, 7)
    pts = kin.figure_points(q)
    links = kin.figure_links()
    assert len(pts) == len(links) >= 8 and links[0] == kin.base_link
    assert np.allclose(pts[-1], kin.link_pose(links[-1], q)[:3, 3])
    assert np.allclose(pts[0], 0.0)
