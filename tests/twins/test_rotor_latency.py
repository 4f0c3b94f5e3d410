"""Rotor inertia (armature) acts in joint space only, as a motor's rotor does (MuJoCo's
`armature`), not coupled into the ancestor joints as PyBullet makes it when the builder adds
it to the link inertia; a command latency takes effect within a physics step (the replay is
continuous in it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from twins.actuators import Actuators, step_commands
from twins.builder import TwinWorld
from twins.engine import pb
from twins.from_scan import PANDA, robot_into
from twins.make import assemble, sim_params

Q0 = (0.3, -0.5, 0.2, -2.0, 0.1, 1.6, 0.7, 0.02, 0.02)
ARM = [f"panda_joint{i}" for i in range(1, 8)]
ROTOR = 0.12  # kg m^2 on every arm joint
KP = 400.0


def _spec(tmp: Path):  # type: ignore[no-untyped-def]
    robot = robot_into(tmp, PANDA, actuator="pd", initial_joint_pos=Q0, time_step=0.001)[:2]
    spec = assemble("rotor", robot, ground=True, sim=sim_params(), base_dir=tmp)
    free = [  # free joints: gains down to zero
        replace(spec.params[f"robot.actuators.{j}.{k}"], low=1e-9)
        for j in ARM
        for k in ("kp", "kd")
    ]
    return replace(spec, params=spec.params.replace(*free))


def _accelerations(spec, base: dict[str, float], rotor: float) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Joint accelerations over the first 5 steps after joint 1's PD gets a 0.1 rad step
    (the other joints free, gravity compensated, from rest)."""
    vals = {**base, f"robot.actuators.{ARM[0]}.kp": KP}
    vals.update({f"robot.joints.{j}.armature": rotor for j in ARM})
    with TwinWorld(spec, vals) as world:
        bank = Actuators(world, ARM)
        u = np.asarray(Q0[:7])
        u[0] += 0.1
        bank.apply(u)
        qd = [np.zeros(7)]
        for _ in range(5):
            bank.before_step()
            pb.stepSimulation(physicsClientId=world.cid)
            qd.append(world.joint_state(ARM)[1])
        return np.diff(np.array(qd), axis=0) / world.dt


def test_armature_is_diagonal_in_joint_space(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    base = {f"robot.actuators.{j}.{k}": 1e-9 for j in ARM for k in ("kp", "kd")}
    base.update({f"robot.actuators.{j}.gravity_compensation": 1.0 for j in ARM})
    with TwinWorld(spec, base) as world:  # no armature: PyBullet's mass matrix works
        M = np.asarray(pb.calculateMassMatrix(world.robot_id, list(Q0), physicsClientId=world.cid))
    tau = np.zeros(M.shape[0])
    tau[0] = KP * 0.1
    A = np.diag([ROTOR] * 7 + [0.0] * (M.shape[0] - 7))
    want0 = np.linalg.solve(M, tau)[:7]
    want = np.linalg.solve(M + A, tau)[:7]  # a rotor: diagonal in joint space
    bare = _accelerations(spec, base, 0.0)
    assert bare[0] == pytest.approx(want0, rel=1e-3)  # the harness: qdd = M^-1 tau
    got = _accelerations(spec, base, ROTOR)
    # the first step is PyBullet's own armature (the correction lags a step): coupled
    assert np.abs(got[0] - want).max() > 0.1 * np.abs(want).max()
    # then joint-space: the same as (M + A)^-1 tau, relative to the bare arm's steps (the
    # arm's accelerations change as it moves, with or without rotors)
    ratio = got[1:4].mean(0) / bare[1:4].mean(0)
    assert ratio == pytest.approx(want / want0, rel=0.06)


def test_step_commands_continuous_in_latency() -> None:
    t = np.arange(0.0, 0.05, 0.004)
    U = np.vstack([[0.0], np.arange(1.0, len(t) + 1)[:, None]])
    ts, dt = np.arange(0.0, 0.06, 0.002), 0.002
    on_grid = step_commands(t, U, ts, dt, np.array([0.004]))[:, 0]
    sampled = U[np.searchsorted(t + 0.004, ts + 1e-9, side="right"), 0]
    assert on_grid == pytest.approx(sampled)  # switches on step boundaries: the sampled ones
    # between grid points each step's command is the held command averaged over it:
    # linear in the latency (one switch per step at most here)
    lo, hi = (step_commands(t, U, ts, dt, np.array([x]))[:, 0] for x in (0.004, 0.006))
    for frac in (0.25, 0.5, 0.8):
        mid = step_commands(t, U, ts, dt, np.array([0.004 + 0.002 * frac]))[:, 0]
        assert mid == pytest.approx(lo + frac * (hi - lo))
    assert np.abs(hi - lo).max() > 0.5  # the premise: the latencies differ
