"""PyBullet forward kinematics vs the lab's MuJoCo model of the same URDF (independent
engines, same description)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from twins.errors import TwinError
from twins.kinematics import RobotKinematics, description_path


def test_panda_hand_matches_lab_body_pose() -> None:
    from devices.lab import panda
    from devices.lab.sim import LabSim

    sim = LabSim("panda_table")
    lim = sim.info().limits
    rng = np.random.default_rng(3)
    qs = [np.array(panda.READY_POSE)] + [rng.uniform(lim.lower, lim.upper) for _ in range(5)]
    with RobotKinematics.from_description(sim.info().description, panda.JOINT_NAMES) as kin:
        for q in qs:
            for link in ("panda_hand", "panda_link7", "panda_link3"):
                Tm = sim.body_pose(link, q)
                Tp = kin.link_pose(link, q)
                assert np.linalg.norm(Tp[:3, 3] - Tm[:3, 3]) < 1e-3, (link, q)
                ang = np.degrees(
                    np.arccos(np.clip((np.trace(Tp[:3, :3].T @ Tm[:3, :3]) - 1) / 2, -1, 1))
                )
                assert ang < 0.1, (link, q, ang)
                assert np.allclose(kin.link_pose_pybullet(link, q), Tp, atol=1e-5)


def test_fk_is_smooth_for_numeric_jacobians() -> None:
    """A 1e-8 rad step of joint 1 moves the hand by r * 1e-8 (PyBullet's single-precision
    link states would round it away)."""
    names = tuple(f"panda_joint{i}" for i in range(1, 8))
    q = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    with RobotKinematics.from_description("franka_panda/panda.urdf", names) as k:
        a = k.link_pose("panda_hand", q)
        dq = np.zeros(7)
        dq[0] = 1e-8
        b = k.link_pose("panda_hand", q + dq)
    r = np.hypot(*a[:2, 3])
    assert np.isclose(np.linalg.norm(b[:3, 3] - a[:3, 3]), r * 1e-8, rtol=1e-3)


def test_ready_pose_hand_height_analytic() -> None:
    """Panda at q=0: the arm points straight up; the flange (link8) is at
    x = 0.088, z = 0.333 + 0.316 + 0.384 - 0.107 = 0.926 m (DH parameters)."""
    names = tuple(f"panda_joint{i}" for i in range(1, 8))
    with RobotKinematics.from_description("pybullet_data:franka_panda/panda.urdf", names) as k:
        T = k.link_pose("panda_link8", np.zeros(7))
    assert np.allclose(T[:3, 3], [0.088, 0.0, 0.926], atol=1e-4)


def test_errors_name_the_problem() -> None:
    with pytest.raises(TwinError, match="no URDF"):
        description_path("no_such_robot/robot.urdf")
    with pytest.raises(TwinError, match="no joint"):
        RobotKinematics.from_description("franka_panda/panda.urdf", ["elbow"])
    with RobotKinematics.from_description(
        "franka_panda/panda.urdf", [f"panda_joint{i}" for i in range(1, 8)]
    ) as k:
        with pytest.raises(TwinError, match="no link 'flange'"):
            k.link_pose("flange", np.zeros(7))


def test_a_worker_process_reads_the_same_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The desktop app reads URDFs in a spawned process (PyBullet holds the GIL): the chain
    it brings back gives the same poses, and a broken file is still refused by name."""
    import twins.kinematics as kinematics

    joints = [f"panda_joint{i}" for i in range(1, 8)]
    q = np.array([0.3, -0.4, 0.2, -2.0, 0.1, 1.8, 0.7])
    with RobotKinematics.from_description("franka_panda/panda.urdf", joints) as here:
        expected = here.link_pose("panda_hand", q)
    broken = tmp_path / "broken.urdf"
    broken.write_text("<robot name='x'><link name='a'>")
    monkeypatch.setattr(kinematics, "_IN_WORKER", True)
    monkeypatch.setattr(kinematics, "_LOADED", {})  # as in a fresh app
    import twins.engine

    def not_here() -> int:
        raise AssertionError("read in this process, not in a worker")

    monkeypatch.setattr(twins.engine, "connect_direct", not_here)  # (a worker has its own)
    with RobotKinematics.from_description("franka_panda/panda.urdf", joints) as there:
        np.testing.assert_allclose(there.link_pose("panda_hand", q), expected, atol=1e-12)
    with pytest.raises(TwinError, match="broken.urdf"):
        RobotKinematics(broken, joints)
