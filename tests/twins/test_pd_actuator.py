"""PD actuators with gravity compensation (a Franka's controller): the gravity torques the
twin adds equal PyBullet's own inverse dynamics at rest (computed by hand in the twin
because PyBullet's inverse dynamics refuses the inertia tensors an armature makes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from twins.actuators import Actuators
from twins.builder import TwinWorld
from twins.engine import pb
from twins.from_scan import PANDA, robot_into
from twins.make import assemble, sim_params

Q0 = (0.3, -0.5, 0.2, -2.0, 0.1, 1.6, 0.7, 0.02, 0.02)
ARM = [f"panda_joint{i}" for i in range(1, 8)]


def _spec(tmp: Path):  # type: ignore[no-untyped-def]
    robot = robot_into(tmp, PANDA, actuator="pd", initial_joint_pos=Q0, time_step=0.002)[:2]
    return assemble("pd", robot, ground=True, sim=sim_params(), base_dir=tmp)


def test_gravity_torques_match_pybullet_inverse_dynamics(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    on = {f"robot.actuators.{j}.gravity_compensation": 1.0 for j in ARM}
    with TwinWorld(spec, on) as world:
        bank = Actuators(world, ARM)
        got = bank._gravity()
        dofs = [
            i
            for i in range(pb.getNumJoints(world.robot_id, physicsClientId=world.cid))
            if pb.getJointInfo(world.robot_id, i, physicsClientId=world.cid)[2] != pb.JOINT_FIXED
        ]
        zero = [0.0] * len(dofs)
        ref = pb.calculateInverseDynamics(
            world.robot_id, list(Q0), zero, zero, physicsClientId=world.cid
        )
    assert np.abs(ref[:7]).max() > 5.0  # the premise: gravity loads the arm
    # the arm's 7 joints, then the two fingers the bank holds (not commanded)
    assert bank.held == ["panda_finger_joint1", "panda_finger_joint2"]
    assert got == pytest.approx(np.asarray(ref[:9]), rel=1e-6, abs=1e-5)


def test_pd_effort_is_the_torque_applied_over_the_last_step(tmp_path: Path) -> None:
    # a robot reports the torque its controller applied; sampled every physics step, the
    # effort at sample k is the PD law on the state and command at sample k - 1
    from devices.trajectory import Trajectory
    from twins.simulate import replay

    spec = _spec(tmp_path)
    dt = 0.002
    t = np.arange(0.0, 0.3, dt)
    U = np.asarray(Q0[:7]) + 0.1 * np.sin(2 * np.pi * 2 * t)[:, None]
    cmd = Trajectory(
        t,
        {"robot/command": U, "robot/joint_pos": U.copy()},
        {"robot/command": "rad", "robot/joint_pos": "rad"},
        meta={"joint_names": ARM, "command_joints": ARM},
    )
    on = {f"robot.actuators.{j}.gravity_compensation": 1.0 for j in ARM}
    sim = replay(spec, {**on, "sim.time_step": dt}, cmd)
    q, qd, eff = (
        sim[c][:, :7] for c in ("robot/joint_pos", "robot/joint_vel", "robot/joint_effort")
    )
    kp = np.array([spec.params[f"robot.actuators.{j}.kp"].nominal for j in ARM])
    kd = np.array([spec.params[f"robot.actuators.{j}.kd"].nominal for j in ARM])
    lim = np.array([spec.params[f"robot.actuators.{j}.effort_limit"].nominal for j in ARM])
    law = np.clip(kp * (U[:-1] - q[:-1]) - kd * qd[:-1], -lim, lim)
    assert np.abs(law).max() > 1.0  # the premise: the arm is being driven
    assert eff[1:] == pytest.approx(law, abs=1e-6 * np.abs(law).max())
