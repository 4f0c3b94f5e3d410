"""The Franka driver (franky-control, libfranka underneath) against franky-sim, which speaks
libfranka's network protocol on a loopback address: connect, the arm's own URDF in the
bundle, position control under the agent, a stop that brings the commanded velocity to
zero, and the simulator dropping off the network mid-motion."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.franka import FR3_LOWER, FR3_UPPER, PANDA_VEL, FrankaDriver
from devices.robots.agent.emulators.franky_peer import FrankySim, start_franky_sim

# franky-sim runs libfranka's 1 kHz loop and the agent its 250 ms heartbeat watchdog: judged
# on the wall clock, so run alone (scripts/test.sh)
pytestmark = [pytest.mark.slow, pytest.mark.realtime]


@pytest.fixture(scope="module")
def sim() -> Iterator[FrankySim]:
    with start_franky_sim() as s:
        yield s


@pytest.fixture(autouse=True)
def _fast_gil() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    yield
    sys.setswitchinterval(old)


def test_position_control_and_stop_against_franky_sim(sim: FrankySim) -> None:
    drv = FrankaDriver(sim.host, rate_hz=100.0, dynamics_factor=0.5)
    bundle = drv.info().meta["bundle"]
    assert "<robot" in bundle["urdf"]
    for name in drv.info().joint_names:  # the arm's own URDF names the joints
        assert f'name="{name}"' in bundle["urdf"]
    # no faster than the slower arm allows: franky-sim (a Panda) refuses a waypoint above its
    # own limits, and the envelope and the servo work within what the driver reports
    assert np.all(drv.info().limits.velocity <= np.array(PANDA_VEL))
    assert np.all(drv._vmax <= 0.5 * np.array(PANDA_VEL) + 1e-12)
    agent = Agent(drv)
    agent.start()
    try:
        q0 = drv.read_state().joint_pos
        target = q0 + np.array([0.15, 0.0, 0.0, 0.0, 0.0, 0.0, -0.1])
        commanded = []
        end = time.monotonic() + 25.0
        while time.monotonic() < end:
            agent.heartbeat()
            agent.command("position", target)
            commanded.append(np.array(drv.robot.state.q_d))
            if np.abs(drv.read_state().joint_pos - target).max() < 0.01:
                break
            time.sleep(0.02)
        q = drv.read_state().joint_pos
        np.testing.assert_allclose(q, target, atol=0.01)
        qd = np.array(commanded)
        assert np.all(qd >= np.array(FR3_LOWER)) and np.all(qd <= np.array(FR3_UPPER))
        # a moving arm, then a stop: franky's stop motion brings the commanded velocity to 0.
        # Commanded back for at least 1 s and until it moves (franky-sim ran at ~0.3x real
        # time on a loaded CI machine: after 1 s the arm had barely started, 3e-4 rad/s)
        t0 = time.monotonic()
        while time.monotonic() < t0 + 1.0 or (
            np.abs(np.array(drv.robot.state.dq_d)).max() <= 1e-3 and time.monotonic() < t0 + 10
        ):
            agent.heartbeat()
            agent.command("position", q0)
            time.sleep(0.02)
        assert np.abs(np.array(drv.robot.state.dq_d)).max() > 1e-3
        agent.stop("test stop")
        t0 = time.monotonic()
        while np.abs(np.array(drv.robot.state.dq_d)).max() > 1e-4:
            assert time.monotonic() - t0 < 10.0
            time.sleep(0.005)
        assert agent.mode == "stopped" and drv.fault is None
    finally:
        agent.close()


def test_a_stream_of_position_targets_is_followed_like_a_servo(sim: FrankySim) -> None:
    """A delta-position policy at 100 Hz: each target 0.048 rad ahead of the joints. The arm
    follows it at speed and settles on the goal (a rest-to-rest JointMotion per tick crawled at
    ~0.25 rad/s and ended 0.25 rad short after 3 s)."""
    drv = FrankaDriver(sim.host, rate_hz=100.0, dynamics_factor=0.5)
    agent = Agent(drv)
    agent.start()
    try:
        q0 = drv.read_state().joint_pos
        goal = q0 + np.array([0.6, -0.4, 0.5, 0.0, 0.0, 0.0, 0.0])
        t0 = time.monotonic()
        errs, speed = [], 0.0
        for k in range(250):
            agent.heartbeat()
            s = drv.read_state()
            agent.command("position", s.joint_pos + np.clip(goal - s.joint_pos, -0.048, 0.048))
            errs.append(float(np.abs(goal - s.joint_pos).max()))
            speed = max(speed, float(np.abs(s.joint_vel).max()))
            time.sleep(max(0.0, t0 + (k + 1) * 0.01 - time.monotonic()))
        # joint 1: no faster than it can stop within the 0.048 rad lead, sqrt(2 a d) with
        # a = 15 x 0.5 rad/s^2: 0.85 rad/s (the twin's position actuators: several rad/s)
        assert speed > 0.6, speed
        assert errs[-1] < 0.005, errs[-1]
        reached = next(i for i, e in enumerate(errs) if e < 0.01)
        assert reached < 150, reached  # within 1.5 s
        # the agent's thread adds a tick of latency the stopping-distance cap does not know
        # of: measured 0.03 rad past the goal, settled (< 2 mrad) within 0.7 s
        assert max(errs[reached:]) < 0.045, max(errs[reached:])
        assert max(errs[reached + 100 :]) < 0.005, max(errs[reached + 100 :])
    finally:
        agent.close()


def test_simulator_dropping_off_the_network_stops_the_agent_naming_the_arm() -> None:
    with start_franky_sim() as own:
        drv = FrankaDriver(own.host, rate_hz=100.0, dynamics_factor=0.5)
        agent = Agent(drv)
        agent.start()
        try:
            q0 = drv.read_state().joint_pos
            target = q0 + np.array([0.3, 0, 0, 0, 0, 0, 0])
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                agent.heartbeat()
                agent.command("position", target)
                time.sleep(0.02)
            own.kill()
            end = time.monotonic() + 10.0
            while agent.stop_reason is None and time.monotonic() < end:
                agent.heartbeat()
                try:
                    agent.command("position", target)
                except DeviceError:
                    break
                time.sleep(0.02)
            assert agent.stop_reason is not None
            assert f"franka {own.host}" in agent.stop_reason
            # a client that keeps commanding cannot bring a lost arm back into motion
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                agent.heartbeat()
                agent.command("position", target)
                time.sleep(0.02)
            time.sleep(0.05)
            assert agent.mode == "stopped" and drv.fault is not None
        finally:
            agent.close()


def test_nobody_at_the_address_is_a_clear_error() -> None:
    with pytest.raises(DeviceError, match=r"franka 127\.77\.0\.9: cannot connect"):
        FrankaDriver("127.77.0.9")


def test_velocity_control_expires_when_the_agent_goes_quiet(sim: FrankySim) -> None:
    drv = FrankaDriver(sim.host, rate_hz=100.0, dynamics_factor=0.5)
    agent = Agent(drv)
    agent.start()
    try:
        q0 = drv.read_state().joint_pos
        v = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3])
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            agent.heartbeat()
            agent.command("velocity", v)
            time.sleep(0.02)
        assert agent.mode == "command", agent.stop_reason
        assert drv.read_state().joint_pos[6] - q0[6] > 0.02  # joint 7 turned forwards
        assert np.abs(drv.read_state().joint_pos[:6] - q0[:6]).max() < 0.01
    finally:
        agent.close()
    # closing let the arm's one connection go: a new driver connects at once. Alone, a
    # velocity command with nobody renewing it ends by itself (franky holds it for three
    # control periods, then brakes)
    t0 = time.monotonic()
    drv = FrankaDriver(sim.host, rate_hz=100.0, dynamics_factor=0.5)
    assert time.monotonic() - t0 < 5.0
    drv.write_command("velocity", v)
    time.sleep(0.2)
    t0 = time.monotonic()
    while np.abs(np.array(drv.robot.state.dq_d)).max() > 1e-4:
        assert time.monotonic() - t0 < 10.0
        time.sleep(0.01)
    drv.close()


def test_a_reflex_latches_the_e_stop_until_the_operator_resets_it(sim: FrankySim) -> None:
    from devices.robots.agent.drivers.franka import attach_estop

    drv = FrankaDriver(sim.host, rate_hz=100.0, dynamics_factor=0.5)
    agent = Agent(drv)
    attach_estop(drv, agent)
    agent.start()
    try:
        q0 = drv.read_state().joint_pos
        target = q0 + np.array([0.2, 0, 0, 0, 0, 0, 0])
        end = time.monotonic() + 0.8
        while time.monotonic() < end:
            agent.heartbeat()
            agent.command("position", target)
            time.sleep(0.02)
        sim.reflex()  # the arm aborts the motion with a joint reflex, as on a collision
        end = time.monotonic() + 5.0
        while agent.mode != "estop" and time.monotonic() < end:
            agent.heartbeat()
            try:
                agent.command("position", target)
            except DeviceError:
                break
            time.sleep(0.02)
        assert agent.mode == "estop"
        assert "joint_reflex" in (agent.stop_reason or "")
        assert f"franka {sim.host}" in (agent.stop_reason or "")
        with pytest.raises(DeviceError, match="e-stop is latched"):
            agent.command("position", target)
        assert drv.recoveries == 1 and drv.fault is None  # franky's error recovery ran
        agent.reset()
        q1 = drv.read_state().joint_pos
        back = q1 - np.array([0.1, 0, 0, 0, 0, 0, 0])
        end = time.monotonic() + 15.0
        while time.monotonic() < end and abs(drv.read_state().joint_pos[0] - back[0]) > 0.01:
            agent.heartbeat()
            agent.command("position", back)
            time.sleep(0.02)
        assert abs(drv.read_state().joint_pos[0] - back[0]) <= 0.01, agent.stop_reason
    finally:
        agent.close()


def test_an_arm_that_never_answers_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener that accepts libfranka's connection and says nothing (an FCI busy with
    another client): the driver gives up after its connect timeout, naming the host."""
    import socket

    import devices.robots.agent.drivers.franka as fr

    monkeypatch.setattr(fr, "CONNECT_TIMEOUT_S", 1.0)
    host = "127.77.0.11"
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, 1337))  # libfranka's command port
        srv.listen(1)
        t0 = time.monotonic()
        with pytest.raises(DeviceError, match=rf"franka {host}: cannot connect \(no answer"):
            FrankaDriver(host)
        assert time.monotonic() - t0 < 3.0
