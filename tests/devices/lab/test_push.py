"""The Panda's closed gripper works as a pusher: it slides the box along the table."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from devices.lab.sim import LabSim


def _ik(sim: LabSim, target: NDArray[np.float64], q: NDArray[np.float64]) -> NDArray[np.float64]:
    """Position-only damped least squares on the lab's forward kinematics."""
    q = q.copy()
    for _ in range(100):
        p = sim.forward_kinematics(q)
        err = target - p
        if np.linalg.norm(err) < 1e-4:
            break
        J = np.stack([(sim.forward_kinematics(q + d) - p) / 1e-6 for d in np.eye(7) * 1e-6], 1)
        q += J.T @ np.linalg.solve(J @ J.T + 1e-4 * np.eye(3), err)
    return q


def _move(sim: LabSim, target: tuple[float, float, float], seconds: float = 1.0) -> None:
    q0 = sim.truth_joint_pos()
    q1 = _ik(sim, np.array(target), q0)
    n = int(seconds / 0.004)
    for k in range(1, n + 1):  # 250 Hz position stream, like the agent
        sim.write_command("position", q0 + (q1 - q0) * k / n)
        sim.run_for(0.004)
    sim.run_for(0.3)


def test_tool_pushes_box_and_leaves_other_objects() -> None:
    sim = LabSim("panda_table")
    before = sim.truth_object_poses()
    y = before["box"][1]
    for tgt in [(0.44, y, 0.15), (0.44, y, 0.03), (0.62, y, 0.03), (0.62, y, 0.15)]:
        _move(sim, tgt)
        tool = sim.forward_kinematics(sim.truth_joint_pos())
        assert np.linalg.norm(tool - tgt) < 0.015  # PD + friction: mm-level error
    after = sim.truth_object_poses()
    assert after["box"][0] - before["box"][0] > 0.05  # pushed along +x
    assert abs(after["box"][2] - before["box"][2]) < 2e-3  # still on the table
    for name in ("cylinder", "u_block"):
        assert np.linalg.norm(after[name][:3] - before[name][:3]) < 1e-3
