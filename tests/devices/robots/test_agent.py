from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.robots.agent.agent_log import MODES
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.ideal import HOME, IdealDriver
from devices.robots.agent.safety import LIMIT_NAMES, SOFT_SPEED
from devices.robots.agent.safety_config import SafetyConfig
from devices.robots.agent.watchdog import WatchdogConfig
from tests.devices.robots.helpers import constant_policy, linear_policy, wait_for

DT = 1 / 250


@pytest.fixture
def agent() -> Iterator[Agent]:
    drv = IdealDriver()
    drv.record_commands = True
    # deadlines lenient enough for a loaded CI machine; bench lab measures the real timing
    ag = Agent(
        drv,
        watchdog=WatchdogConfig(
            heartbeat_timeout_s=0.3, command_timeout_s=0.1, policy_timeout_s=0.1
        ),
    )
    ag.start()
    yield ag
    ag.close()


def _keep_alive(ag: Agent, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ag.heartbeat()
        time.sleep(0.02)


def test_position_command_is_tracked_at_the_velocity_limit(agent: Agent) -> None:
    q0 = agent.driver.read_state().joint_pos
    target = q0.copy()
    target[6] += 1.0  # long enough to reach full speed at the 10 rad/s^2 target acceleration
    agent.command("position", target)
    end = time.monotonic() + 20.0  # hang guard: until there, however loaded the machine
    while (
        time.monotonic() < end and np.abs(agent.driver.read_state().joint_pos - target).max() > 2e-3
    ):
        _keep_alive(agent, 0.05)
    q = agent.driver.read_state().joint_pos
    np.testing.assert_allclose(q, target, atol=2e-3)
    log = agent.log.snapshot()
    sent = log["sent"][~np.isnan(log["sent"][:, 6])]
    steps = np.abs(np.diff(sent[:, 6]))
    assert steps.max() <= 2.61 * DT + 1e-9  # rate limited by the envelope
    # and actually moving at the soft speed (0.9 x the limit: a margin for tracking overshoot)
    assert steps.max() > 0.99 * SOFT_SPEED * 2.61 * DT
    assert agent.mode == "command"


def test_onnx_policy_ramps_from_current_pose_then_reaches_target(agent: Agent) -> None:
    q0 = agent.driver.read_state().joint_pos.copy()
    target = q0 + np.array([0.2, -0.1, 0.1, 0.1, 0.0, 0.1, -0.1])
    summary = agent.upload_policy(
        constant_policy(7, target), {"observation": ["joint_pos", "joint_vel"]}
    )
    assert summary["action_mode"] == "position"
    agent.run_policy(ramp_s=0.3)
    _keep_alive(agent, 0.8)
    assert agent.mode == "policy", agent.stop_reason
    np.testing.assert_allclose(agent.driver.read_state().joint_pos, target, atol=3e-3)
    log = agent.log.snapshot()
    running = log["mode"] == MODES.index("policy")
    sent = log["sent"][running]
    sent = sent[~np.isnan(sent[:, 0])]  # ticks that waited for the policy: NaN
    assert np.abs(sent[0] - q0).max() < 0.02  # ramp starts at the current pose
    raw = log["raw"][running]
    np.testing.assert_allclose(raw[~np.isnan(raw[:, 0])][-1], target, atol=1e-6)  # raw logged
    agent.stop()
    assert agent.mode == "stopped"


def test_policy_observes_joint_state_and_target(agent: Agent) -> None:
    """delta = 0.5 * (target - joint_pos): needs the observation assembled correctly."""
    n = 7
    q0 = agent.driver.read_state().joint_pos.copy()
    target = q0 + 0.15
    W = np.zeros((3 * n, n))
    W[:n] = -0.5 * np.eye(n)  # joint_pos
    W[2 * n :] = 0.5 * np.eye(n)  # target
    spec = {
        "observation": ["joint_pos", "joint_vel", "target"],
        "target": target.tolist(),
        "action": {"mode": "position", "type": "delta"},
    }
    agent.upload_policy(linear_policy(W, np.zeros(n), batched=False), spec)
    agent.run_policy(ramp_s=0.0)
    _keep_alive(agent, 1.2)
    np.testing.assert_allclose(agent.driver.read_state().joint_pos, target, atol=0.01)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_policy_nonfinite_output_stops_the_robot(agent: Agent, value: float) -> None:
    drv: IdealDriver = agent.driver  # type: ignore[assignment]
    agent.upload_policy(constant_policy(7, value), {})
    agent.run_policy(ramp_s=0.0)
    assert wait_for(lambda: agent.mode == "stopped", 1.0)
    assert "NaN/inf" in (agent.stop_reason or "")
    assert all(np.all(np.isfinite(v)) for _, v in drv.commands)
    log = agent.log.snapshot()
    assert np.any(log["acted"] & (1 << LIMIT_NAMES.index("nonfinite")))


def test_policy_far_outside_limits_is_clamped_or_stopped(agent: Agent) -> None:
    drv: IdealDriver = agent.driver  # type: ignore[assignment]
    lim = agent.info.limits
    agent.upload_policy(constant_policy(7, 100.0), {})
    agent.run_policy(ramp_s=0.0)
    _keep_alive(agent, 0.3)
    assert agent.mode == "policy", agent.stop_reason
    sent = np.array([v for _, v in drv.commands])
    assert np.all(sent <= lim.upper + 1e-9) and np.all(sent >= lim.lower - 1e-9)
    assert np.all(np.abs(np.diff(sent, axis=0)) <= lim.velocity * DT + 1e-9)
    agent.stop()
    agent.upload_policy(constant_policy(7, 100.0), {}, safety={"on_violation": "stop"})
    agent.run_policy(ramp_s=0.0)
    assert wait_for(lambda: agent.mode == "stopped", 1.0)
    assert "limit exceeded" in (agent.stop_reason or "")


def test_late_policy_output_trips_the_watchdog(agent: Agent) -> None:
    def slow(state):  # a policy that takes 0.3 s (75 control periods) to answer
        time.sleep(0.3)
        return state.joint_pos

    agent.load_policy(slow)
    agent.run_policy(ramp_s=0.0)
    assert wait_for(lambda: agent.mode == "stopped", 1.0)
    assert "policy output late" in (agent.stop_reason or "")


def test_one_slow_policy_output_does_not_stop(agent: Agent) -> None:
    calls = [0]

    def hiccup(state):  # the second inference takes 2 control periods, the others are fast
        calls[0] += 1
        if calls[0] == 2:
            time.sleep(2 * DT)
        return state.joint_pos

    agent.load_policy(hiccup)
    agent.run_policy(ramp_s=0.0)
    _keep_alive(agent, 0.2)
    assert agent.mode == "policy" and calls[0] > 20, agent.stop_reason


def test_policy_exception_stops(agent: Agent) -> None:
    def broken(state):
        raise RuntimeError("boom")

    agent.load_policy(broken)
    agent.run_policy(ramp_s=0.0)
    assert wait_for(lambda: agent.mode == "stopped", 1.0)
    assert "boom" in (agent.stop_reason or "")


def test_missing_heartbeat_stops_within_a_few_periods(agent: Agent) -> None:
    q = agent.driver.read_state().joint_pos.copy()
    agent.command("position", q)
    agent.heartbeat()
    assert wait_for(lambda: agent.mode == "stopped", 1.0)
    assert "no heartbeat" in (agent.stop_reason or "")
    stop = agent.watchdog_stops[-1]
    assert 0 <= stop["latency_s"] < 0.1  # normally < 1 period (bench lab); CI load varies


def test_estop_latches_until_reset(agent: Agent) -> None:
    q = agent.driver.read_state().joint_pos.copy()
    agent.command("position", q)
    agent.estop("test")
    assert agent.mode == "estop"
    with pytest.raises(DeviceError, match="e-stop is latched"):
        agent.command("position", q)
    agent.stop()  # a plain stop does not clear it
    assert agent.mode == "estop"
    agent.reset()
    assert agent.mode == "idle"
    agent.command("position", q)
    assert agent.mode == "command"


def test_bad_policy_uploads_are_refused(agent: Agent) -> None:
    with pytest.raises(DeviceError, match="ONNX"):
        agent.upload_policy(b"not an onnx model", {})
    with pytest.raises(DeviceError, match="expects 14"):
        agent.upload_policy(constant_policy(7, 0.0), {"observation": ["joint_pos"]})
    with pytest.raises(DeviceError, match="unknown observation"):
        agent.upload_policy(constant_policy(7, 0.0), {"observation": ["camera"]})


def test_loop_jitter_is_measured(agent: Agent) -> None:
    time.sleep(0.3)
    j = agent.status()["jitter_ms"]
    assert j["ticks"] >= 50 and 0 <= j["p50"] <= j["p99"] <= j["max"]


def test_start_pose_is_home() -> None:
    drv = IdealDriver()
    np.testing.assert_allclose(drv.read_state().joint_pos, HOME)
    assert SafetyConfig().on_violation == "clamp"


def test_velocity_stream_moves_and_stops_when_it_goes_stale(agent: Agent) -> None:
    q0 = agent.driver.read_state().joint_pos.copy()
    v = np.zeros(7)
    v[2] = 0.5
    end = time.monotonic() + 0.4
    while time.monotonic() < end:  # a client streaming 0.5 rad/s on joint 3
        agent.command("velocity", v)
        agent.heartbeat()
        time.sleep(0.01)
    moved = agent.driver.read_state().joint_pos[2] - q0[2]
    assert 0.12 < moved < 0.22  # 0.4 s at 0.5 rad/s, less the 0.1 s envelope ramp
    assert wait_for(lambda: agent.mode == "stopped", 0.5)  # stream stopped: watchdog
    assert "streamed command" in (agent.stop_reason or "")
    log = agent.log.snapshot()
    sent = log["sent"][log["mode"] == MODES.index("command")]
    assert np.all(np.abs(np.diff(sent[:, 2])) <= 2.175 * DT / 0.1 + 1e-9)  # ramped, not a jump


def test_policy_safety_config_applies_only_while_it_runs(agent: Agent) -> None:
    q0 = agent.driver.read_state().joint_pos.copy()
    agent.upload_policy(constant_policy(7, q0 + 0.3), {}, safety={"velocity_scale": 0.25})
    agent.run_policy(ramp_s=0.0)
    _keep_alive(agent, 0.2)
    assert agent.envelope.config.velocity_scale == 0.25
    log = agent.log.snapshot()
    sent = log["sent"][log["mode"] == MODES.index("policy")]
    sent = sent[~np.isnan(sent[:, 0])]
    assert np.abs(np.diff(sent[:, 0])).max() <= 0.25 * 2.175 * DT + 1e-9
    agent.stop()
    agent.command("position", agent.driver.read_state().joint_pos)
    assert agent.envelope.config.velocity_scale == 1.0
