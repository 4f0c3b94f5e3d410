"""Pushes: the planned tool path is the one asked for (height, direction, distance, tool
pointing down), the joint plan fits the robot, and replayed in the Panda twin it pushes
the box along the direction while the other objects stay put."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from devices.robots.motion import MotionError, check_motion, limits_for
from devices.robots.wire.robot_types import RobotInfo
from twins.fit.design import robot_info_for, simulate_motion, start_pose
from twins.kinematics import RobotKinematics
from twins.pushes import plan_push
from twins.spec import TwinSpec

TOOL = "panda_grasptarget"


def _panda(spec: TwinSpec) -> RobotInfo:
    info = robot_info_for(spec)
    return replace(info, description="franka_panda/panda.urdf", meta={"ee_link": TOOL})


def _object_xy(spec: TwinSpec, name: str) -> tuple[float, float]:
    pose = next(o.pose for o in spec.objects if o.name == name)
    return float(pose[0]), float(pose[1])


def test_the_tool_follows_the_asked_path(demo_twin: TwinSpec) -> None:
    info = _panda(demo_twin)
    q0 = start_pose(demo_twin, info)
    target = (0.55, 0.0)
    m = plan_push(info, q0, target_xy=target, direction=90.0, speed=0.08, distance=0.12)
    assert check_motion(m, limits_for(info)) == []
    np.testing.assert_allclose(m.command[[0, -1]], [q0, q0], atol=1e-9)
    with RobotKinematics.from_description(info.description, info.joint_names) as kin:
        T = np.stack([kin.link_pose(TOOL, q) for q in m.command[::5]])
    p, z = T[:, :3, 3], T[:, :3, 2]
    low = p[:, 2] < 0.03 + 0.002  # the push itself, at its height
    assert low.sum() > 10
    seg = p[low]
    assert np.all(np.abs(seg[:, 2] - 0.03) < 0.002)
    assert np.all(np.abs(seg[:, 0] - target[0]) < 0.003)  # along +y only
    assert seg[0, 1] == pytest.approx(target[1] - 0.10, abs=0.01)  # standoff before the centre
    assert seg[-1, 1] - seg[0, 1] == pytest.approx(0.12, abs=0.01)
    tilt = np.degrees(np.arccos(np.clip(-z[low][:, 2], -1, 1)))
    assert np.all(tilt < 2.0)
    # the push speed is the one asked for (mid-segment)
    t = m.t[::5][low]
    v = np.diff(seg[:, 1]) / np.diff(t)
    assert float(np.max(v)) == pytest.approx(0.08, rel=0.05)


def test_a_push_in_the_twin_moves_the_box_along_the_direction(demo_twin: TwinSpec) -> None:
    info = _panda(demo_twin)
    m = plan_push(info, start_pose(demo_twin, info), target_xy=_object_xy(demo_twin, "box"))
    sim = simulate_motion(demo_twin, {}, m)
    box = sim["objects/box/pose"]
    moved = box[-1, :3] - box[0, :3]
    # tool travels 0.16 m from 0.10 m before the centre: the box goes ~0.16 - 0.10 + its half depth
    assert 0.05 < moved[0] < 0.15 and abs(moved[1]) < 0.02 and abs(moved[2]) < 0.003
    for other in ("cylinder", "u_block"):
        P = sim[f"objects/{other}/pose"]
        assert np.linalg.norm(P[-1, :3] - P[0, :3]) < 2e-3


def test_unreachable_or_bad_pushes_are_named(demo_twin: TwinSpec) -> None:
    info = _panda(demo_twin)
    q0 = start_pose(demo_twin, info)
    with pytest.raises(MotionError, match="cannot reach"):
        plan_push(info, q0, target_xy=(2.5, 0.0))
    with pytest.raises(MotionError, match="give target_xy"):
        plan_push(info, q0)
    with pytest.raises(MotionError, match=r"unknown parameter\(s\) \['angle'\]"):
        plan_push(info, q0, target_xy=(0.5, 0.0), angle=math.pi)
    with pytest.raises(MotionError, match="no URDF|cannot"):
        plan_push(replace(info, description="nowhere/robot.urdf"), q0, target_xy=(0.5, 0.0))


@pytest.mark.slow
def test_only_pushing_the_box_teaches_about_the_box(demo_twin: TwinSpec) -> None:
    from devices.robots.excitation import plan
    from twins.fit.design import rank

    info = _panda(demo_twin)
    q0 = start_pose(demo_twin, info)
    cands = {
        "push box": plan_push(info, q0, target_xy=_object_xy(demo_twin, "box"), speed=0.15),
        "push cylinder": plan_push(info, q0, target_xy=_object_xy(demo_twin, "cylinder")),
        "chirp": plan("chirp", info, q0, amplitude=0.05, duration=2.0),
    }
    params = ("objects.box.friction", "objects.box.density")
    ranked = {s.name: s for s in rank(demo_twin, {}, params, cands)}
    assert list(ranked)[0] == "push box"
    # the object poses carry the information: the box's only when the box moves
    assert ranked["push box"].shrink["objects.box.friction"] > 0.5
    assert ranked["push box"].gain > 3.0
    for other in ("push cylinder", "chirp"):
        assert ranked[other].gain == pytest.approx(0.0, abs=1e-9)
