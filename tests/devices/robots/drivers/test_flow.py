"""The workbench's robot-side flow, unchanged, against real protocol peers instead of the lab:
`python -m devices.robots.agent.serve` in front of franky-sim and in front of an emulated Feetech
arm; record an excitation motion (app.workflows.record), upload an ONNX policy and run it on
the robot side inside the envelope, stop. No code path here knows which robot it is."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from app.workflows.record import plan_motion, play_motion
from devices.robots.agent.emulators.franky_peer import FrankySim, start_franky_sim
from devices.robots.agent.launch import LabProcess, start_agent_process
from devices.robots.client import RobotClient
from resources.jobs import run_to_end
from tests.devices.robots.helpers import constant_policy

pytestmark = pytest.mark.slow


@pytest.fixture(params=["feetech", "franka"])
def robot(request: pytest.FixtureRequest) -> Iterator[LabProcess]:
    sim: FrankySim | None = None
    if request.param == "franka":
        sim = start_franky_sim()
        args = ["--robot-ip", sim.host, "--rate", "100", "--dynamics-factor", "0.5"]
    else:
        args = ["--emulate", "--rate", "100"]
    try:
        with start_agent_process(request.param, args, timeout_s=60) as proc:
            yield proc
    finally:
        if sim is not None:
            sim.terminate()


def test_record_then_run_a_policy_on_any_agent(robot: LabProcess) -> None:
    with RobotClient(robot.host, robot.port, robot.token) as c:
        assert c.info is not None
        info = c.info
        n = len(info.joint_names)
        # Real: an excitation motion planned inside the limits the robot reports, recorded
        motion = plan_motion(c, "chirp", amplitude=0.05, duration=1.5)
        traj = run_to_end(play_motion(c, motion, pre_s=0.2, post_s=0.3))
        q = traj.channels["robot/joint_pos"]
        assert q.shape[1] == n and len(traj.t) > 50
        assert np.ptp(q, axis=0).max() > 0.01  # the robot did move
        assert np.all(q >= info.limits.lower - 0.01) and np.all(q <= info.limits.upper + 0.01)
        # Real again: a policy uploaded and run on the robot side, holding a nearby pose
        q0 = c.latest_state().joint_pos
        target = q0 + 0.05 * np.sign(0.5 * (info.limits.lower + info.limits.upper) - q0)
        c.upload_policy(constant_policy(n, target), {"observation": ["joint_pos", "joint_vel"]})
        c.take_control()
        c.run_policy(ramp_s=0.3)
        end = time.monotonic() + 20.0
        while time.monotonic() < end:
            if np.abs(c.latest_state().joint_pos - target).max() < 0.01:
                break
            time.sleep(0.05)
        assert c.status()["mode"] == "policy", c.status()["stop_reason"]
        np.testing.assert_allclose(c.latest_state().joint_pos, target, atol=0.01)
        c.stop("flow done")
        time.sleep(0.2)
        assert c.status()["mode"] == "stopped"
