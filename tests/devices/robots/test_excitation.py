"""The excitation library: every motion fits the robot's limits by construction, uses the
amplitude it was asked for, starts and ends at rest at the start pose, and a plan that
leaves a limit is refused with the joint and limit named."""

from __future__ import annotations

import numpy as np
import pytest

from devices.robots.excitation import EXCITATIONS, plan
from devices.robots.motion import (
    ACCEL_USE,
    DEFAULT_MAX_ACCEL,
    SOFT_SPEED,
    Motion,
    MotionError,
    check_motion,
    derivatives,
    limits_for,
)
from devices.robots.wire.robot_types import JointLimits, RobotInfo

READY = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


def panda(extra: tuple[str, ...] = (), modes: tuple[str, ...] = ("position",)) -> RobotInfo:
    lo = [-2.9671, -1.8326, -2.9671, -3.1416, -2.9671, -0.0873, -2.9671] + [0.0] * len(extra)
    hi = [2.9671, 1.8326, 2.9671, 0.0, 2.9671, 3.8223, 2.9671] + [0.04] * len(extra)
    vel = [2.175] * 4 + [2.61] * 3 + [0.2] * len(extra)
    eff = [87.0] * 4 + [12.0] * 3 + [20.0] * len(extra)
    names = tuple(f"panda_joint{i}" for i in range(1, 8)) + extra
    return RobotInfo(
        "test/panda", names, JointLimits(*(np.array(v) for v in (lo, hi, vel, eff))), 250.0, modes
    )


JOINT_MOTIONS = [n for n in EXCITATIONS if n != "release"]


@pytest.mark.parametrize("name", JOINT_MOTIONS)
def test_every_joint_motion_fits_uses_its_amplitude_and_returns_to_rest(name: str) -> None:
    info = panda()
    kw = {"joints": "panda_joint2,panda_joint4"} if name == "steps" else {"duration": 6.0}
    m = plan(name, info, READY, amplitude=0.1, velocity=0.3, **kw)
    lim = limits_for(info)
    assert check_motion(m, lim) == []
    qd, qdd = derivatives(m.t, m.command)
    np.testing.assert_allclose(m.command[0], READY, atol=1e-12)
    np.testing.assert_allclose(m.command[-1], READY, atol=1e-9)
    assert np.max(np.abs(qd[[0, -1]])) < 0.02  # at rest at both ends (FD of a flat end)
    half = (info.limits.upper - info.limits.lower) / 2
    vmax = 0.3 * SOFT_SPEED * info.limits.velocity
    for j in [info.joint_names.index(n) for n in m.moved_joints()]:
        off = np.max(np.abs(m.command[:, j] - READY[j]))
        speed = np.max(np.abs(qd[:, j]))
        acc = np.max(np.abs(qdd[:, j]))
        assert off <= 0.1 * half[j] + 1e-9
        assert speed <= vmax[j] * (1 + 1e-6)
        assert acc <= DEFAULT_MAX_ACCEL * ACCEL_USE * (1 + 1e-6)
        # scaled up to the tightest cap, not timidly below all of them
        tight = max(off / (0.1 * half[j]), speed / vmax[j], acc / (DEFAULT_MAX_ACCEL * ACCEL_USE))
        assert tight > 0.97, (name, j, off, speed, acc)
    if name == "steps":
        assert m.moved_joints() == ["panda_joint2", "panda_joint4"]
    else:
        assert len(m.moved_joints()) == 7


def test_joint_selection_moves_only_those_joints_and_bad_names_are_named() -> None:
    m = plan("chirp", panda(), READY, joints="panda_joint3", duration=4.0)
    assert m.moved_joints() == ["panda_joint3"]
    m2 = plan("multisine", panda(), READY, joints="0,6", duration=4.0)
    assert m2.moved_joints() == ["panda_joint1", "panda_joint7"]
    with pytest.raises(MotionError, match="no joint 'elbow'"):
        plan("chirp", panda(), READY, joints="elbow")


def test_the_envelope_settings_the_robot_reports_tighten_the_plan() -> None:
    info = panda()
    loose = plan("chirp", info, READY, amplitude=0.5, velocity=1.0, duration=6.0)
    tight = plan(
        "chirp",
        info,
        READY,
        {"velocity_scale": 0.5, "max_accel": 4.0},
        amplitude=0.5,
        velocity=1.0,
        duration=6.0,
    )
    v_loose = np.max(np.abs(derivatives(loose.t, loose.command)[0]), axis=0)
    v_tight = np.max(np.abs(derivatives(tight.t, tight.command)[0]), axis=0)
    a_tight = np.max(np.abs(derivatives(tight.t, tight.command)[1]), axis=0)
    assert np.all(v_tight <= 0.5 * SOFT_SPEED * info.limits.velocity * (1 + 1e-6))
    assert np.all(a_tight <= 4.0 * ACCEL_USE * (1 + 1e-6))
    assert np.all(v_tight < v_loose)


def test_a_plan_outside_the_limits_is_refused_with_joint_time_and_limit() -> None:
    info = panda()
    t = np.arange(0, 2.0, 0.004)
    q = np.repeat(READY[None, :], len(t), 0)
    q[:, 1] += 0.5 * np.sin(2 * np.pi * 1.5 * t)  # 4.7 rad/s on joint 2
    q[:, 3] = np.linspace(-2.356, 0.2, len(t))  # joint 4 past its upper limit (0 rad)
    bad = Motion("hand-made", {}, t, q, info.joint_names)
    problems = check_motion(bad, limits_for(info))
    text = " | ".join(problems)
    assert "panda_joint2 velocity" in text and "exceeds its limit" in text
    assert "panda_joint4 reaches" in text and "outside its window" in text
    assert not any("panda_joint1" in p for p in problems)


def test_bad_requests_are_named() -> None:
    info = panda()
    with pytest.raises(MotionError, match="unknown motion 'wiggle'"):
        plan("wiggle", info, READY)
    with pytest.raises(MotionError, match=r"unknown parameter\(s\) \['speed'\]"):
        plan("chirp", info, READY, speed=1.0)
    with pytest.raises(MotionError, match="amplitude must be in"):
        plan("chirp", info, READY, amplitude=1.5)
    near = READY.copy()
    near[3] = -0.01  # joint 4 within the margin of its upper limit (0 rad): it stays put
    m = plan("chirp", info, near, duration=3.0)
    assert "panda_joint4" not in m.moved_joints() and len(m.moved_joints()) == 6
    assert any("panda_joint4 has no room" in n for n in m.notes)
    near[3] = 0.01  # outside its limits
    with pytest.raises(MotionError, match="panda_joint4 starts at 0.0100, outside its limits"):
        plan("chirp", info, near)
    with pytest.raises(MotionError, match="7 joints"):
        plan("chirp", info, READY[:6])


def test_release_opens_the_gripper_and_needs_one() -> None:
    with pytest.raises(MotionError, match="no gripper joint"):
        plan("release", panda(), READY)
    info = panda(extra=("panda_finger_joint1",))
    start = np.append(READY, 0.0)
    m = plan("release", info, start)
    assert m.moved_joints() == ["panda_finger_joint1"]
    assert m.command[-1, 7] == pytest.approx(limits_for(info).upper[7], abs=1e-9)
    assert check_motion(m, limits_for(info)) == []
    # a chirp leaves the gripper alone
    assert "panda_finger_joint1" not in plan("chirp", info, start, duration=3.0).moved_joints()


def test_torque_robots_get_torque_excitation_within_their_effort() -> None:
    info = RobotInfo(
        "test/pendulum",
        ("hinge",),
        JointLimits(np.array([-1e3]), np.array([1e3]), np.array([30.0]), np.array([2.5])),
        500.0,
        ("torque",),
    )
    m = plan("multisine", info, np.zeros(1), amplitude=0.4, duration=4.0)
    assert m.mode == "torque"
    assert np.max(np.abs(m.command)) == pytest.approx(0.4 * 2.5, rel=1e-9)
    assert check_motion(m, limits_for(info)) == []
    with pytest.raises(MotionError, match="torque commands"):
        plan("steps", info, np.zeros(1))
