from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.robots.agent.drivers.ideal import HOME, IdealDriver, panda_like_info
from devices.robots.agent.safety import LEAD_BRAKE, SOFT_SPEED, SafetyEnvelope
from devices.robots.agent.safety_config import SafetyConfig
from devices.robots.wire.robot_types import RobotState

INFO = panda_like_info(250.0)
FK = IdealDriver(INFO).forward_kinematics
LIM = INFO.limits
DT = 1 / 250


def _state(q=HOME, effort=None) -> RobotState:
    q = np.asarray(q, float)
    return RobotState(0.0, 0, q, np.zeros(7), np.zeros(7) if effort is None else effort)


def _env(**cfg) -> SafetyEnvelope:
    base: dict[str, Any] = dict(workspace_lower=(-0.6, -0.6, 0.0), workspace_upper=(0.6, 0.6, 0.9))
    base.update(cfg)
    return SafetyEnvelope(INFO, SafetyConfig(**base), fk=FK)


def test_position_limit_clamps_and_reports() -> None:
    env = _env()
    prev = np.asarray(LIM.upper) - 1e-3
    prev[3] = -0.5
    cmd = prev + 1.0
    res = env.apply("position", cmd, _state(prev), prev)
    assert res.stop is None and "position" in res.acted
    assert np.all(res.command <= LIM.upper + 1e-12)


def test_step_is_capped_at_the_soft_speed_times_dt() -> None:
    """Position targets move at most at SOFT_SPEED x the limit: the measured joint overshoots
    its target's speed (tracking lag, latency, the other joints' pull), so there is a margin."""
    env = _env(max_accel=1e9)  # the speed cap alone (acceleration: the next test)
    prev = np.asarray(HOME, float)
    cmd = prev.copy()
    cmd[0] += 0.5
    res = env.apply("position", cmd, _state(), prev)
    assert res.acted == ("velocity",)
    assert res.command[0] - prev[0] == pytest.approx(SOFT_SPEED * LIM.velocity[0] * DT, rel=1e-9)
    narrow = _env(max_step=tuple([0.001] * 7), max_accel=1e9).apply("position", cmd, _state(), prev)
    assert narrow.acted == ("max_step",) and narrow.command[0] - prev[0] == pytest.approx(0.001)


def test_position_target_accelerates_and_stops_at_its_limits() -> None:
    """Fed back tick by tick: speed up at <= max_accel, cruise at the velocity limit, slow
    down in time, and stop exactly on the goal."""
    env = _env(workspace_lower=None, workspace_upper=None)
    q = np.asarray(HOME, float)
    goal = q.copy()
    goal[0] += 1.0
    path = [q.copy()]
    for _ in range(400):
        res = env.apply("position", goal, _state(path[-1]), path[-1])
        path.append(res.command)
    x = np.array(path)[:, 0]
    v = np.diff(x) / DT
    a = np.diff(v) / DT
    soft = SOFT_SPEED * LIM.velocity[0]
    assert np.max(np.abs(v)) <= soft + 1e-9 and np.max(v) > 0.99 * soft
    # max_accel, give or take one tick's worth where braking starts and on landing
    assert np.max(np.abs(a)) <= 2 * 10.0 + 1e-6 and np.median(np.abs(a[np.abs(a) > 0])) <= 10.0
    assert x[-1] == pytest.approx(goal[0]) and np.all(x <= goal[0] + 1e-12)


def test_workspace_box_holds_previous_command() -> None:
    env = _env(workspace_upper=(0.6, 0.6, FK(np.asarray(HOME))[2] + 1e-4), max_accel=1e9)
    prev = np.asarray(HOME, float)
    cmd = prev.copy()
    cmd[3] += 0.005  # straightens the elbow: the end effector rises above the box
    assert FK(cmd)[2] > FK(prev)[2]
    res = env.apply("position", cmd, _state(), prev)
    assert "workspace" in res.acted and res.stop is None
    np.testing.assert_array_equal(res.command, prev)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_always_stops(bad: float) -> None:
    prev = np.asarray(HOME, float)
    cmd = prev.copy()
    cmd[5] = bad
    for mode in ("position", "velocity", "torque"):
        res = _env().apply(mode, cmd, _state(), prev)
        assert res.stop is not None and res.acted == ("nonfinite",) and "joint6" in res.stop


def test_stop_mode_stops_instead_of_clamping() -> None:
    prev = np.asarray(HOME, float)
    res = _env(on_violation="stop").apply("position", prev + 0.3, _state(), prev)
    assert res.stop is not None and "velocity" in res.stop


def test_velocity_mode_limits() -> None:
    env = _env(velocity_ramp_s=0.1)
    prev = np.zeros(7)
    res = env.apply("velocity", np.full(7, 100.0), _state(), prev)
    assert "velocity" in res.acted and "max_step" in res.acted
    # speed changes are ramped over velocity_ramp_s, at most at max_accel (10 rad/s^2)
    np.testing.assert_allclose(res.command, np.minimum(LIM.velocity * DT / 0.1, 10.0 * DT))
    # at the upper limit a velocity pushing outwards becomes zero or less (a joint inside
    # its braking margin is driven back out of it), inwards passes
    q = np.asarray(LIM.upper) - 1e-4
    q[3] = -0.5
    v = np.where(np.arange(7) == 0, 0.03, 0.0)  # within one ramp step of zero
    res = env.apply("velocity", v, _state(q), v)
    assert "position" in res.acted and res.command[0] <= 0.0
    res = env.apply("velocity", -v, _state(q), -v)
    assert res.command[0] <= -0.03 + 1e-9  # at least as fast back in


def test_effort_limits() -> None:
    env = _env()
    res = env.apply("torque", np.full(7, 1e3), _state(), np.zeros(7))
    assert "effort" in res.acted and np.all(res.command <= LIM.effort)
    hot = np.zeros(7)
    hot[1] = 2.0 * LIM.effort[1]
    res = env.apply("position", np.asarray(HOME, float), _state(effort=hot), np.asarray(HOME))
    assert res.stop is not None and "joint2" in res.stop


def test_uploaded_config_only_tightens() -> None:
    base = SafetyConfig(workspace_lower=(-0.6, -0.6, 0.0), workspace_upper=(0.6, 0.6, 0.9))
    loose = SafetyConfig.from_dict(
        {
            "velocity_scale": 1.0,
            "workspace_lower": [-5, -5, -5],
            "workspace_upper": [5, 5, 5],
            "on_violation": "clamp",
            "measured_effort_factor": 10.0,
        }
    )
    t = base.tightened(loose)
    assert t.workspace_lower == (-0.6, -0.6, 0.0) and t.workspace_upper == (0.6, 0.6, 0.9)
    assert t.measured_effort_factor == 1.5
    tight = base.tightened(
        SafetyConfig.from_dict(
            {"velocity_scale": 0.2, "on_violation": "stop", "workspace_upper": [0.5, 0.7, 0.8]}
        )
    )
    assert tight.velocity_scale == 0.2 and tight.on_violation == "stop"
    assert tight.workspace_upper == (0.5, 0.6, 0.8)
    with pytest.raises(DeviceError, match="unknown"):
        SafetyConfig.from_dict({"velocty_scale": 0.5})
    with pytest.raises(DeviceError, match="velocity_scale"):
        SafetyConfig.from_dict({"velocity_scale": 2.0})


def test_fuzzed_position_commands_never_leave_the_envelope() -> None:
    """Independent check of every command the envelope lets through."""
    env = _env()
    rng = np.random.default_rng(42)
    prev = np.asarray(HOME, float)
    lo, hi = np.asarray(LIM.lower), np.asarray(LIM.upper)
    step = np.asarray(LIM.velocity) * DT
    passed = 0
    for _ in range(3000):
        kind = rng.integers(5)
        if kind == 0:
            cmd = prev + rng.normal(0, 0.005, 7)
        elif kind == 1:
            cmd = rng.uniform(lo - 1, hi + 1)
        elif kind == 2:
            cmd = rng.normal(0, 1e6, 7)
        elif kind == 3:
            cmd = prev.copy()
            cmd[rng.integers(7)] = rng.choice([np.nan, np.inf, -np.inf])
        else:
            cmd = prev + rng.normal(0, 0.05, 7)
        res = env.apply("position", cmd, _state(prev), prev)
        if res.stop is not None:
            continue
        out = res.command
        assert np.all(np.isfinite(out))
        assert np.all(out >= lo - 1e-12) and np.all(out <= hi + 1e-12)
        assert np.all(np.abs(out - prev) <= step + 1e-12)
        p = FK(out)
        assert env.box is not None
        assert np.all(p >= env.box[0]) and np.all(p <= env.box[1])
        prev = out
        passed += 1
    assert passed > 2000


# -- limits on the measured state (issue 10) ----------------------------------------------


def _moving(q, v) -> RobotState:
    return RobotState(0.0, 0, np.asarray(q, float), np.asarray(v, float), np.zeros(7))


def test_torque_is_limited_by_the_measured_velocity() -> None:
    """Full torque at rest; none that speeds a joint up near its speed limit; braking above."""
    env = _env(workspace_lower=None, workspace_upper=None)
    tau = np.zeros(7)
    tau[0] = 87.0
    prev = tau.copy()  # the torque was already applied (no slew in the way)
    v = np.zeros(7)
    at_rest = env.apply("torque", tau, _moving(HOME, v), prev)
    assert at_rest.stop is None and at_rest.command[0] > 30.0
    v[0] = 0.95 * LIM.velocity[0]
    near = env.apply("torque", tau, _moving(HOME, v), prev)
    assert near.stop is None and near.command[0] <= 0.0 and "velocity" in near.acted
    v[0] = 1.05 * LIM.velocity[0]
    over = env.apply("torque", tau, _moving(HOME, v), prev)
    assert over.stop is None and over.command[0] < -10.0  # damping injection: it brakes


def test_torque_brakes_before_a_position_limit() -> None:
    env = _env(workspace_lower=None, workspace_upper=None)
    q = np.asarray(HOME, float)
    q[0] = LIM.upper[0] - 0.05  # 5 cm... rad from the limit, moving towards it at 1.5 rad/s
    v = np.zeros(7)
    v[0] = 1.5
    tau = np.zeros(7)
    tau[0] = 87.0
    res = env.apply("torque", tau, _moving(q, v), tau.copy())
    assert res.command[0] < 0.0  # sqrt(2 * 5 rad/s^2 * 0.03 rad) < 1.5 rad/s: brake


def test_measured_overspeed_stops() -> None:
    env = _env()
    v = np.zeros(7)
    v[4] = 1.2 * LIM.velocity[4]
    res = env.apply("position", np.asarray(HOME, float), _moving(HOME, v), np.asarray(HOME, float))
    assert res.stop is not None and "measured velocity" in res.stop and "joint5" in res.stop


def test_joint_past_its_limit_stops_only_while_moving_further_out() -> None:
    env = _env(workspace_lower=None, workspace_upper=None)
    q = np.asarray(HOME, float)
    q[1] = LIM.upper[1] + 0.01
    out_v, in_v = np.zeros(7), np.zeros(7)
    out_v[1], in_v[1] = 0.3, -0.3
    res = env.apply("position", q, _moving(q, out_v), q)
    assert res.stop is not None and "further past its limit" in res.stop
    # a command back inside is let through (never stranded), and pulls the target in
    back = q.copy()
    back[1] = LIM.upper[1] - 0.2
    res = env.apply("position", back, _moving(q, in_v), q)
    assert res.stop is None and res.command[1] < q[1]
    res = env.apply("position", back, _moving(q, np.zeros(7)), q)
    assert res.stop is None and res.command[1] < q[1]  # one step back in, per tick


def test_position_target_leads_the_measured_joint_by_a_bounded_amount() -> None:
    """A robot lagging its target gets no target further ahead: the lead is bounded."""
    env = _env(workspace_lower=None, workspace_upper=None)
    q = np.asarray(HOME, float)
    prev = q.copy()
    prev[0] += 0.5  # the previous target ran far ahead of the measured joint
    res = env.apply("position", prev + 1.0, _moving(q, np.zeros(7)), prev)
    assert res.command[0] < prev[0]  # pulled back towards the robot, at most one step
    assert prev[0] - res.command[0] <= LIM.velocity[0] * DT + 1e-9


def test_outside_the_box_a_command_back_is_allowed_and_further_out_is_not() -> None:
    env = _env()
    q = np.zeros(7)  # toy arm straight up: 1.2 m, above the 0.9 m box
    assert not env.in_workspace(q)
    env.start(_state(q))  # motion starts here: judged from here on
    home = np.asarray(HOME, float)
    res = env.apply("position", home, _state(q), q)
    assert res.stop is None and not np.allclose(res.command, q)
    assert env.box_distance(res.command) < env.box_distance(q)
    v = np.zeros(7)
    v[1] = 1.0  # velocity that tips the arm: is it further out? compare, don't assume
    res_v = env.apply("velocity", v, _state(q), np.zeros(7))
    further = env.box_distance(q + v * 0.25) > env.box_distance(q)
    assert (np.all(res_v.command == 0.0)) == further


def test_lead_governor_slows_a_target_down_at_a_bounded_rate() -> None:
    """A joint at its speed limit gets no lead in its direction of motion, but its target is
    not snapped back onto it in one tick: that braked the big joints so hard that the wrist,
    dragged along, reached 1.1x its own limit. The target's speed falls by at most
    LEAD_BRAKE x max_accel per second, tick by tick, until the lead is gone."""
    env = _env(workspace_lower=None, workspace_upper=None)
    q = np.asarray(HOME, float)
    v = np.zeros(7)
    v[0] = 1.02 * LIM.velocity[0]  # at the limit: no lead allowed
    prev = q.copy()
    prev[0] += 0.15  # the target runs 0.15 rad ahead of the joint ...
    env._last_step[0] = SOFT_SPEED * LIM.velocity[0] * DT  # ... at the soft speed
    goal = q + 1.0
    kd = LEAD_BRAKE * 10.0 * DT * DT
    steps = []
    for _ in range(100):
        res = env.apply("position", goal, _moving(q, v), prev)
        assert res.stop is None and "velocity" in res.acted
        steps.append(res.command[0] - prev[0])
        prev = res.command
    d = np.diff([SOFT_SPEED * LIM.velocity[0] * DT, *steps])
    assert np.all(d >= -kd - 1e-12)  # bounded deceleration of the target
    assert steps[0] < SOFT_SPEED * LIM.velocity[0] * DT  # but it does slow down at once
    assert prev[0] <= q[0] + 1e-9  # and the lead is gone in the end
