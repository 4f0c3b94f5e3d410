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
    assert got == pytest.approx(np.asarray(ref[:7]), rel=1e-6, abs=1e-5)
