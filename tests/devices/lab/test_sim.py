"""Lab physics against analytic cases, and the unmodelled effects it promises."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from devices.lab.config import LabConfig, LabError, PendulumConfig
from devices.lab.scenes import SCENES
from devices.lab.sim import LabSim


def pendulum_inertia(p: PendulumConfig) -> float:
    """Moment of inertia about the pivot, kg*m^2 (bob sphere + parallel axis): the analytic
    truth the lab's pendulum is checked against."""
    return p.bob_mass * (p.length**2 + 0.4 * p.bob_radius**2)


def _quiet(cfg: LabConfig, **kw: object) -> LabConfig:
    """The config without noise, latency (unless given) and passive friction/damping."""
    j = cfg.joints
    zero = tuple(0.0 for _ in j.damping)
    base = dict(
        joint_pos_noise=0.0,
        joint_vel_noise=0.0,
        effort_noise=0.0,
        latency_s=0.0,
        joints=dataclasses.replace(j, damping=zero, frictionloss=zero),
    )
    base.update(kw)
    return dataclasses.replace(cfg, **base)


def _crossings(t: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Times of upward zero crossings (linear interpolation)."""
    i = np.nonzero((x[:-1] < 0) & (x[1:] >= 0))[0]
    return t[i] - x[i] * (t[i + 1] - t[i]) / (x[i + 1] - x[i])


def _swing(cfg: LabConfig, q0: float, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    cfg = dataclasses.replace(cfg, initial_joint_pos=(q0,))
    sim = LabSim("pendulum", cfg)
    sim.write_command("torque", np.zeros(1))
    ts, qs = [], []
    for _ in range(int(seconds / sim.dt)):
        sim.step()
        ts.append(sim.time)
        qs.append(sim.truth_joint_pos()[0])
    return np.array(ts), np.array(qs)


def test_pendulum_small_angle_period_matches_analytic() -> None:
    cfg = _quiet(SCENES["pendulum"].default_config())
    p = cfg.pendulum
    t, q = _swing(cfg, 0.05, 6.0)
    period = np.diff(_crossings(t, q)).mean()
    expected = 2 * math.pi * math.sqrt(pendulum_inertia(p) / (p.bob_mass * 9.81 * p.length))
    assert period == pytest.approx(expected, rel=0.005)


def test_pendulum_viscous_damping_decays_at_b_over_2i() -> None:
    b = 0.02
    cfg = _quiet(SCENES["pendulum"].default_config())
    cfg = dataclasses.replace(cfg, joints=dataclasses.replace(cfg.joints, damping=(b,)))
    t, q = _swing(cfg, 0.2, 8.0)
    peaks = np.nonzero((q[1:-1] > q[:-2]) & (q[1:-1] >= q[2:]) & (q[1:-1] > 0))[0] + 1
    rate = -np.polyfit(t[peaks], np.log(q[peaks]), 1)[0]
    assert rate == pytest.approx(b / (2 * pendulum_inertia(cfg.pendulum)), rel=0.05)


def test_command_latency_shows_up_as_delay() -> None:
    latency = 0.03
    cfg = _quiet(SCENES["pendulum"].default_config(), latency_s=latency)
    sim = LabSim("pendulum", cfg)
    sim.run_for(0.1)
    t_cmd = sim.time
    sim.write_command("torque", np.array([1.0]))
    while sim.read_state().joint_effort[0] < 0.5:
        sim.step()
        assert sim.time < t_cmd + 1.0
    # effort measured after step k reflects the command applied at the start of step k
    delay = sim.time - sim.dt - t_cmd
    assert delay == pytest.approx(latency, abs=1.5 * sim.dt)


def test_object_resting_on_table_stays_put() -> None:
    sim = LabSim("objects_table")
    start = sim.truth_object_poses()
    sim.run_for(2.0)
    for name, p in sim.truth_object_poses().items():
        assert np.linalg.norm(p[:3] - start[name][:3]) < 1e-3, name
        assert abs(abs(np.dot(p[3:], start[name][3:])) - 1) < 1e-4, name


def test_panda_tracks_position_and_force_limit_clamps() -> None:
    sim = LabSim("panda_table")
    q = np.array(sim.config.initial_joint_pos)
    target = q + np.array([0.3, 0.2, -0.2, 0.25, 0.3, -0.2, 0.4])
    sim.write_command("position", target)
    sim.run_for(3.0)
    assert np.abs(sim.truth_joint_pos() - target).max() < 0.02  # frictionloss leaves a bias
    sim.write_command("torque", np.full(7, 500.0))
    sim.run_for(0.05)
    lim = np.array(sim.config.actuators.force_limit)
    assert np.all(np.abs(sim._tau) <= lim + 1e-9)
    assert np.allclose(np.abs(sim._tau), lim)


def test_measured_state_has_configured_noise() -> None:
    cfg = SCENES["pendulum"].default_config()
    sim = LabSim("pendulum", cfg)
    sim.run_for(1.0)  # settled, held at 0
    err = []
    for _ in range(2000):
        sim.step()
        err.append(sim.read_state().joint_pos[0] - sim.truth_joint_pos()[0])
    assert np.std(err) == pytest.approx(cfg.joint_pos_noise, rel=0.1)


def test_bad_commands_raise_named_errors() -> None:
    sim = LabSim("panda_table")
    with pytest.raises(LabError, match="voltage"):
        sim.write_command("voltage", np.zeros(7))  # type: ignore[arg-type]
    with pytest.raises(LabError, match="7 finite"):
        sim.write_command("position", np.zeros(3))
    with pytest.raises(LabError, match="7 finite"):
        sim.write_command("position", np.full(7, np.nan))


def _numbers(obj: object) -> set[float]:
    return {round(float(x), 9) for x in re.findall(r"-?\d+\.?\d*(?:e-?\d+)?", json.dumps(obj))}


@pytest.mark.parametrize("name", ["panda_table", "pendulum"])
def test_truth_is_not_reachable_through_info_or_states(name: str) -> None:
    sim = LabSim(name)
    cfg = sim.config
    hidden = [
        cfg.latency_s,
        cfg.joint_pos_noise,
        cfg.joint_vel_noise,
        cfg.effort_noise,
        *cfg.actuators.kp,
        *cfg.actuators.kv,
        *cfg.actuators.force_limit,
        *cfg.joints.damping,
        *cfg.joints.frictionloss,
        *cfg.joints.armature,
    ]
    for o in cfg.objects:
        hidden += [o.mass, o.friction, o.restitution, *o.com_offset]
    for c in cfg.cameras:
        hidden += list(c.pose)
    hidden_set = {round(float(v), 9) for v in hidden if abs(v) not in (0.0, 1.0)}  # not telling
    info = sim.info().to_dict()
    assert not (_numbers(info) & hidden_set), _numbers(info) & hidden_set
    state = sim.read_state()
    fields = {"t", "seq", "joint_pos", "joint_vel", "joint_effort", "ee_pos", "command_time"}
    assert set(vars(state)) == fields
    # command_time is when a command arrived, not when it acts (that would tell the latency)
    if sim.n:
        sim.step(3)
        sim.write_command("position", sim.read_state().joint_pos)
        assert sim.read_state().command_time == pytest.approx(sim.time, abs=1e-12)
    text = json.dumps(info).lower()
    for word in ("kp", "damping", "friction", "latency", "mass", "restitution", "noise"):
        assert word not in text


def _bounce(e: float, drop: float = 0.15) -> float:
    """Drop the cylinder flat onto the table; return rebound / impact vertical speed."""
    cfg = SCENES["objects_table"].default_config()
    cyl = cfg.objects[1]
    obj = dataclasses.replace(
        cyl,
        restitution=e,
        com_offset=(0.0, 0.0, 0.0),
        pose=(0.4, 0.0, cyl.pose[2] + drop, 0.0, 0.0, 0.0, 1.0),
    )
    sim = LabSim("objects_table", dataclasses.replace(cfg, objects=(obj,)))
    dof = sim.model.jnt_dofadr[sim.model.joint(f"{obj.name}_free").id] + 2
    vz = []
    for _ in range(400):
        sim.step()
        vz.append(sim.data.qvel[dof])
    v = np.array(vz)
    up = int(np.argmax(v > 0))
    return float(v[up : up + 100].max() / -v[:up].min())


@pytest.mark.parametrize("e", [0.05, 0.3, 0.6])
def test_restitution_is_realised_by_drop_test(e: float) -> None:
    assert _bounce(e) == pytest.approx(e, abs=0.05)


def test_velocity_mode_and_hold() -> None:
    cfg = _quiet(SCENES["panda_table"].default_config())
    sim = LabSim("panda_table", cfg)
    v = np.array([0.2, 0, 0, 0, 0, 0, -0.3])
    sim.write_command("velocity", v)
    sim.run_for(1.0)
    np.testing.assert_allclose(sim.data.qvel[:7], v, atol=0.02)
    sim.hold()  # immediate: no latency on the brake
    held = sim.truth_joint_pos()
    sim.run_for(1.0)
    assert np.abs(sim.truth_joint_pos() - held).max() < 0.02
    assert np.abs(sim.data.qvel[:7]).max() < 1e-2


def test_thrown_object_flies_a_parabola_then_lands() -> None:
    sim = LabSim("objects_table")
    sim.run_for(3.0)  # resting objects fall asleep (MuJoCo sleep)
    assert sim.data.ntree_awake == 0
    start = np.array([0.3, 0.0, 0.3, 0.0, 0.0, 0.0, 1.0])
    t0 = sim.time
    sim.set_object("cylinder", start, lin_vel=np.array([0.5, 0.0, 1.0]))  # wakes it
    sim.run_for(0.1)
    p = sim.truth_object_poses()["cylinder"][:3]
    t = sim.time - t0
    np.testing.assert_allclose(p, [0.3 + 0.5 * t, 0.0, 0.3 + 1.0 * t - 9.81 * t * t / 2], atol=2e-3)
    sim.run_for(2.0)
    assert sim.truth_object_poses()["cylinder"][2] < 0.1  # back on the table
    with pytest.raises(LabError, match="no free object"):
        sim.set_object("ghost", start)


def test_reset_keeps_a_running_clock_monotonic() -> None:
    sim = LabSim("pendulum")
    sim.write_command("torque", np.array([1.0]))
    sim.run_for(0.5)
    t, seq = sim.time, sim.seq
    sim.reset(keep_clock=True)
    assert sim.time == t and sim.seq == seq
    assert sim.truth_joint_pos()[0] == 0.0
    sim.reset()
    assert sim.time == 0.0 and sim.seq == 0
