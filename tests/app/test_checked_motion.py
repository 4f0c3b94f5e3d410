"""Every way the workbench streams a motion goes through one checked path
(devices/robots/motion_stream.py): record's library motions, the lab's demo motion, Add robot's
test motion and the guided scan's moves. Each refuses a motion outside the limits the robot
reports (or its agent's envelope settings) before anything moves, naming the robot and the
limit; judged on the robot: its driver received no command and its measured joints stayed
put. The robot is an ideal-driver agent over loopback, with Panda-like joints named as the
Panda URDF names them (the scan's kinematics read that URDF) and a wrist camera."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pytest

from app import demo, robot_check
from app.robot_link import AgentLink
from app.workflows.connected_arm import ConnectedArm
from app.workflows.record import play_motion
from app.workflows.scan_plan import RobotScanPlan
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.ideal import HOME, IdealDriver, panda_like_info
from devices.robots.agent.safety_config import SafetyConfig
from devices.robots.agent.server import RobotServer
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.client import RobotClient
from devices.robots.motion import Motion, MotionError, check_motion
from devices.robots.motion_stream import MotionStream, ramp_to, robot_limits
from devices.robots.wire.auth import new_token
from resources.jobs import run_to_end
from tests.app.flaky_link import FakeLab
from tests.devices.robots.helpers import synthetic_frames

pytestmark = pytest.mark.realtime

SLOW = 0.05  # the agent's velocity_scale in `slow_robot`: the test motion is too fast for it


@dataclass
class Robot:
    driver: IdealDriver
    token: str
    port: int

    def client(self) -> RobotClient:
        c = RobotClient("127.0.0.1", self.port, self.token, name="checked-motion-test")
        c.connect()
        c.latest_state(timeout_s=5.0)
        return c


def _robot(safety: SafetyConfig | None = None) -> Iterator[Robot]:
    base = panda_like_info(rate_hz=250.0)
    info = replace(
        base,
        name="ideal-panda",
        joint_names=tuple(f"panda_joint{i + 1}" for i in range(7)),
        cameras=("wrist",),
        description="franka_panda/panda.urdf",
        meta={
            **base.meta,
            "camera/wrist/nominal_T_mount_camera": [0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 1.0],
            "camera/wrist/mount_body": "panda_hand",
        },
    )
    driver = IdealDriver(info)
    driver.record_commands = True
    agent = Agent(driver, safety=safety, watchdog=WatchdogConfig(heartbeat_timeout_s=0.5))
    agent.start()
    token = new_token()
    server = RobotServer(agent, token, cameras={"wrist": synthetic_frames})
    server.start()
    try:
        yield Robot(driver, token, server.port)
    finally:
        try:
            server.close()
        finally:
            agent.close()


@pytest.fixture
def robot() -> Iterator[Robot]:
    yield from _robot()


@pytest.fixture
def slow_robot() -> Iterator[Robot]:
    """The same robot whose agent's envelope allows 5 % of its speed limits."""
    yield from _robot(SafetyConfig(velocity_scale=SLOW))


def _stays_put(robot: Robot, client: RobotClient, q0: np.ndarray) -> None:
    """Nothing reached the robot: its driver got no command and its joints did not move."""
    time.sleep(0.3)
    assert robot.driver.commands == []
    q = client.latest_state().joint_pos
    assert np.max(np.abs(q - q0)) < 1e-6
    assert client.latest_status()["mode"] == "idle"


def _over_the_top(client: RobotClient) -> Motion:
    """Joint 1 from where it is to 0.5 rad past its upper limit over 4 s."""
    info = client.info
    assert info is not None
    q0 = client.latest_state().joint_pos
    t = np.linspace(0.0, 4.0, 401)
    q = np.repeat(q0[None], len(t), axis=0)
    q[:, 0] += (info.limits.upper[0] + 0.5 - q0[0]) * (1 - np.cos(np.pi * t / 4.0)) / 2
    return Motion("over the top", {}, t, q, tuple(info.joint_names))


def test_the_stream_refuses_a_motion_past_a_joint_limit_before_moving(robot: Robot) -> None:
    with robot.client() as client:
        q0 = client.latest_state().joint_pos.copy()
        with pytest.raises(MotionError) as err:
            MotionStream(client, _over_the_top(client))
        msg = str(err.value)
        assert "robot ideal-panda at 127.0.0.1" in msg and "refused 'over the top'" in msg
        assert "joint panda_joint1 reaches" in msg and "outside its window" in msg
        _stays_put(robot, client, q0)


def test_the_stream_refuses_a_motion_out_of_the_workspace_box_before_moving(robot: Robot) -> None:
    """Inside every joint limit, but the tool dips below the box's floor: the robot's own
    kinematics and box say so (`check_poses`) before the first command."""
    with robot.client() as client:
        q0 = client.latest_state().joint_pos.copy()
        q1 = q0 - np.r_[np.zeros(5), 1.2, 0.0]  # joint 6: the toy chain's tool to z = -67 mm
        names = tuple(client.info.joint_names)  # type: ignore[union-attr]
        move = ramp_to("dip", names, q0, q1, robot_limits(client), 0.5)
        assert not check_motion(move, robot_limits(client))  # the joints alone allow it
        with pytest.raises(MotionError) as err:
            MotionStream(client, move)
        msg = str(err.value)
        assert "robot ideal-panda at 127.0.0.1" in msg and "refused 'dip'" in msg
        assert "out of the robot's workspace box" in msg and "by up to 67 mm" in msg, msg
        _stays_put(robot, client, q0)
        # the same joint half as far keeps the tool above the floor: taken
        half = ramp_to(
            "half", names, q0, q0 - np.r_[np.zeros(5), 0.4, 0.0], robot_limits(client), 0.5
        )
        assert MotionStream(client, half).sent == 0


def test_the_stream_plays_a_motion_that_fits_and_stops_the_arm(robot: Robot) -> None:
    with robot.client() as client:
        q0 = client.latest_state().joint_pos.copy()
        q1 = q0 + np.r_[0.2, np.zeros(6)]
        move = ramp_to("fits", tuple(client.info.joint_names), q0, q1, robot_limits(client), 1.0)  # type: ignore[union-attr]
        # post_s: the end is held 0.5 s before the stop, so the arm (which follows its
        # command with a lag, longer on a loaded machine) arrives; a stop holds where it is
        stream = MotionStream(client, move, post_s=0.5)
        steps = list(stream.play())
        assert steps[-1].fraction == 1.0 and stream.sent > 0.9 * 250 * (move.duration + 0.5)
        deadline = time.monotonic() + 2.0
        while client.latest_status()["mode"] != "stopped" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.latest_status()["mode"] == "stopped"  # held at its end
        assert client.latest_state().joint_pos[0] == pytest.approx(q1[0], abs=0.01)


def test_record_refuses_an_over_limit_motion_before_anything_moves(robot: Robot) -> None:
    with robot.client() as client:
        q0 = client.latest_state().joint_pos.copy()
        with pytest.raises(MotionError, match="refused 'over the top' before moving"):
            run_to_end(play_motion(client, _over_the_top(client)))
        _stays_put(robot, client, q0)


def test_the_demo_motion_refuses_an_amplitude_past_the_limits(robot: Robot) -> None:
    client = robot.client()
    lab = FakeLab(robot.port, robot.token)
    link = AgentLink(client, f"{lab.host}:{lab.port}", process=lab, is_lab=True)
    try:
        q0 = client.latest_state().joint_pos.copy()
        with pytest.raises(MotionError, match="refused 'demo motion' before moving.*panda_joint"):
            run_to_end(demo.motion_job(link, duration_s=6.0, amplitude_rad=3.0))
        _stays_put(robot, client, q0)
    finally:
        client.close()


def test_the_robot_check_refuses_a_test_motion_faster_than_the_agent_allows(
    slow_robot: Robot,
) -> None:
    """The agent reports a 5 % speed envelope; the test motion (0.24 rad/s) breaks it."""
    client = slow_robot.client()
    link = AgentLink(client, f"127.0.0.1:{slow_robot.port}")
    try:
        q0 = client.latest_state().joint_pos.copy()
        motion = robot_check.TestMotion(link, seconds=4.0)
        with pytest.raises(MotionError, match="refused 'test motion'.*velocity .* exceeds"):
            motion.start()
        assert not motion.running
        _stays_put(slow_robot, client, q0)
    finally:
        client.close()


def test_the_robot_check_test_motion_runs_inside_the_limits(robot: Robot) -> None:
    client = robot.client()
    link = AgentLink(client, f"127.0.0.1:{robot.port}")
    try:
        q0 = client.latest_state().joint_pos.copy()
        motion = robot_check.TestMotion(link, seconds=2.0)
        motion.start()
        deadline = time.monotonic() + 5.0
        while motion.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not motion.running and motion.error is None and motion.sent > 80
        assert robot.driver.commands  # it moved
        assert np.max(np.abs(client.latest_state().joint_pos - q0)) < 0.2
    finally:
        client.close()


def test_the_scan_move_refuses_a_target_past_a_joint_limit(robot: Robot) -> None:
    with robot.client() as client:
        client.take_control()  # as the scan job does when it starts
        arm = ConnectedArm(client)
        try:
            q0 = client.latest_state().joint_pos.copy()
            target = q0.copy()
            target[3] = client.info.limits.upper[3] + 0.3  # type: ignore[union-attr]
            with pytest.raises(MotionError, match="refused 'scan move' before moving"):
                arm.move(target, RobotScanPlan())
            _stays_put(robot, client, q0)
        finally:
            arm.stop()


def test_the_scan_move_reaches_a_target_inside_the_limits(robot: Robot) -> None:
    with robot.client() as client:
        client.take_control()
        arm = ConnectedArm(client)
        try:
            target = np.asarray(HOME, float) + 0.1
            _, settled = arm.move(target, RobotScanPlan())
            assert settled
            assert np.allclose(client.latest_state().joint_pos, target, atol=5e-3)
        finally:
            arm.stop()


def test_a_stop_event_ends_the_stream_and_holds_the_arm(robot: Robot) -> None:
    from devices.robots.motion_stream import MotionStopped

    with robot.client() as client:
        q0 = client.latest_state().joint_pos.copy()
        q1 = q0 + np.r_[0.5, np.zeros(6)]
        move = ramp_to("long", tuple(client.info.joint_names), q0, q1, robot_limits(client), 0.1)  # type: ignore[union-attr]
        halt = threading.Event()
        stream = MotionStream(client, move, stop_event=halt)
        plays = stream.play()
        next(plays)
        next(plays)
        halt.set()
        with pytest.raises(MotionStopped, match="stopped by the operator"):
            list(plays)
        deadline = time.monotonic() + 2.0
        while client.latest_status()["mode"] != "stopped" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.latest_status()["mode"] == "stopped"
