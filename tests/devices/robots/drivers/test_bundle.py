"""The robot-description bundle an agent sends in get_info is enough for the workbench to
build the twin of whatever it is connected to: saved to a folder, the servo arm's URDF reads
as a twin robot with the agent's joint names and limits, and PyBullet loads it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.robot_check import save_bundle
from devices.robots.agent.drivers.arm_calibration import ArmCalibration, default_calibration
from devices.robots.agent.drivers.feetech import make_driver
from twins.kinematics import RobotKinematics
from twins.urdf import read_urdf


def test_servo_arm_bundle_builds_a_twin_robot(tmp_path: Path) -> None:
    cal = default_calibration("feetech")
    info = make_driver("/dev/null", cal).info()  # the bundle is made without opening the bus
    urdf = save_bundle(info, tmp_path / "robot")
    parsed = read_urdf(urdf)
    movable = parsed.movable
    assert [j.name for j in movable] == list(info.joint_names)
    np.testing.assert_allclose(np.array([j.lower for j in movable], float), info.limits.lower)
    np.testing.assert_allclose(np.array([j.upper for j in movable], float), info.limits.upper)
    saved = ArmCalibration.from_dict(
        json.loads((tmp_path / "robot" / "calibration.json").read_text())
    )
    assert saved.to_dict() == cal.to_dict()
    with RobotKinematics(urdf, info.joint_names) as kin:
        # stretched out: the chain's offsets add up (z 0.05 + 0.06, x 0.11 + 0.13 + 0.06 + 0.04)
        T = kin.link_pose("link6", np.zeros(6))
        np.testing.assert_allclose(T[:3, 3], [0.34, 0.0, 0.11], atol=1e-9)
        # shoulder pan a quarter turn: the arm points along +y
        T = kin.link_pose("link6", [np.pi / 2, 0, 0, 0, 0, 0])
        np.testing.assert_allclose(T[:3, 3], [0.0, 0.34, 0.11], atol=1e-9)
        np.testing.assert_allclose(
            kin.link_pose_pybullet("link6", [0.3, -0.4, 0.5, 0.2, 0.1, 0.0])[:3, 3],
            kin.link_pose("link6", [0.3, -0.4, 0.5, 0.2, 0.1, 0.0])[:3, 3],
            atol=1e-5,
        )


def test_a_cad_urdfs_zero_effort_and_speed_take_the_robots_limits(tmp_path: Path) -> None:
    """A CAD-exported URDF gives effort="0" velocity="0" (none given): the saved bundle
    takes the limits the agent enforces instead of keeping 0 as the 'tighter' of the two
    (a twin would then have assumed its default effort instead of the robot's)."""
    import re

    from devices.robots.agent.drivers.arm_description import servo_arm_urdf

    cal = default_calibration("feetech")
    cad = re.sub(r'(effort|velocity)="[^"]*"', r'\1="0"', servo_arm_urdf(cal))
    src = tmp_path / "cad.urdf"
    src.write_text(cad)
    info = make_driver("/dev/null", cal, urdf=src).info()
    urdf = save_bundle(info, tmp_path / "robot")
    movable = read_urdf(urdf).movable
    np.testing.assert_allclose([j.effort for j in movable], info.limits.effort)
    np.testing.assert_allclose([j.velocity for j in movable], info.limits.velocity)
