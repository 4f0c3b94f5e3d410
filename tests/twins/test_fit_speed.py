"""What makes the lab fit fast stays exact: a worker's kept twin world, retuned in place
between candidates, scores every candidate exactly as a freshly built one; and the latency
scan's grid follows the recordings' command period (truth: the 250 Hz command stream)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from devices.trajectory import Trajectory
from twins import world_cache
from twins.fit.latency import command_period, latency_candidates
from twins.fit.objective import Problem, Space, evaluate, windows
from twins.from_scan import PANDA, robot_into
from twins.make import assemble, sim_params

pytestmark = pytest.mark.slow

DT = 0.002
RATE = 250.0
ARM = [f"panda_joint{i}" for i in range(1, 8)]
Q0 = (0.0, -0.6, 0.0, -2.2, 0.0, 1.6, 0.8, 0.02, 0.02)
PARAMS = (
    "robot.joints.panda_joint1.damping",
    "robot.joints.panda_joint2.friction",
    "robot.actuators.panda_joint1.latency",
)


@pytest.fixture(scope="module")
def problem(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    tmp = Path(tmp_path_factory.mktemp("speed"))
    robot = robot_into(tmp, PANDA, actuator="pd", initial_joint_pos=Q0, time_step=DT)[:2]
    s = assemble("speed", robot, ground=True, sim=sim_params(), base_dir=tmp)
    gains = {f"robot.actuators.{j}.{k}": v for j in ARM for k, v in (("kp", 600.0), ("kd", 40.0))}
    gains.update({f"robot.actuators.{j}.gravity_compensation": 1.0 for j in ARM})
    spec = s.with_values({**gains, "sim.time_step": DT})
    t = np.arange(0.0, 0.6, 1.0 / RATE)
    U = np.tile(np.asarray(Q0[:7]), (len(t), 1))
    U[:, 0] += 0.1 * np.sin(2 * np.pi * 1.5 * t)
    U[:, 1] += 0.1 * np.sin(2 * np.pi * 0.9 * t)
    rec = Trajectory(
        t,
        {"robot/command": U, "robot/joint_pos": U.copy()},
        {"robot/command": "rad", "robot/joint_pos": "rad"},
        "real",
        {"joint_names": ARM, "command_joints": ARM},
    )
    ws = windows(rec, 0.3, 0.03)
    return Problem(spec, Space.of(spec, PARAMS), tuple(ws), (("robot/joint_pos", 1.0, 0.1),))


def _res(problem: Problem, u: np.ndarray) -> np.ndarray:
    r = evaluate((problem, u)).residuals
    assert r is not None
    return r


def test_kept_world_scores_like_a_fresh_build(problem: Problem) -> None:
    us = [np.array([0.1, 0.2, 0.3]), np.array([0.6, 0.05, 0.0]), np.array([0.3, 0.9, 0.7])]
    world_cache.clear()
    kept = [_res(problem, u) for u in us]  # built once, then retuned
    assert len(world_cache._kept) == 2  # the twin and its zero-latency copy
    fresh = []
    for u in us:
        world_cache.clear()
        fresh.append(_res(problem, u))
    for a, b in zip(kept, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    assert float(np.abs(kept[0] - kept[1]).max()) > 1e-6  # the candidates differ
    world_cache.clear()


def test_latency_grid_is_half_the_command_period(problem: Problem) -> None:
    assert command_period(problem.windows) == pytest.approx(1.0 / RATE, rel=1e-6)
    u = np.array([0.3, 0.4, 0.55])
    cands = latency_candidates(problem.space, problem.windows, u)
    lat = np.array([problem.space.to_x(c)[2] for c in cands])
    hi = float(problem.space.high[2])
    n = min(16, int(np.floor(hi / (0.5 / RATE) + 1e-9)) + 1)
    assert len(cands) == n
    if n < 16:
        np.testing.assert_allclose(np.diff(lat), 0.5 / RATE, rtol=1e-9)
    for c in cands:  # the other parameters stay where they were
        np.testing.assert_allclose(c[:2], u[:2], rtol=0, atol=1e-12)
