"""`python main.py bench drivers --json`: the real-robot drivers under the agent, against their
protocol peers: an emulated Dynamixel arm and an emulated Feetech arm (6 servos, 1 Mbps, on a
pseudo-terminal, the vendors' SDKs as clients) and franky-sim (libfranka's protocol).

Per driver: control rate achieved / requested (servo arms: goal sync writes counted on the
wire; Franka: libfranka's own control_command_success_rate at 1 kHz through franky's loop),
read latency p99, stop latency (stop request -> commanded velocity zero on the wire), faults
injected and stopped safely, and commands on the wire outside the envelope (servo arms: every
goal judged; Franka: the commanded joint positions sampled each tick).

Servo arms also report their speed against the joints' velocity limits while driven at and
past what the envelope allows: `max_velocity_ratio` is what the emulated servos actually did
(their physics: the fastest instant of any servo, whatever the driver read back), with
`max_velocity_joint`; `max_velocity_ratio_measured` is the fastest the agent saw in its state
stream (the servos' present-speed registers). Both must stay <= 1.0, also with `--load N` busy
processes beside (a loaded machine: late and bunched control ticks).
"""

from __future__ import annotations

import gc
import math
import sys
import time
from typing import Any

import numpy as np

from benches.safety_attacks import busy_processes
from devices.errors import DeviceError
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers import dynamixel, feetech
from devices.robots.agent.drivers.arm_calibration import ArmCalibration, JointCalibration
from devices.robots.agent.drivers.franka import FR3_LOWER, FR3_UPPER, FrankaDriver, attach_estop
from devices.robots.agent.emulators.dynamixel_bus import DynamixelBus
from devices.robots.agent.emulators.feetech_bus import FeetechBus
from devices.robots.agent.emulators.franky_peer import start_franky_sim
from devices.robots.agent.emulators.judge import unsafe_goals

DESCRIPTION = (
    "servo-arm (emulated Dynamixel/Feetech) and Franka (franky-sim) drivers under the agent"
)
SERVO_RATE_HZ = 100.0


def _calibration(bus: str) -> ArmCalibration:
    names = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
    joints = tuple(
        JointCalibration(n, i + 1, 2048.0 + 150 * (i - 2), 1 if i % 2 == 0 else -1, -1.2, 1.2)
        for i, n in enumerate(names)
    )
    return ArmCalibration(f"bench_{bus}", bus, joints)


def _timed_reads(driver: Any, samples: list[float]) -> None:
    read = driver.read_state

    def timed() -> Any:
        t0 = time.perf_counter()
        try:
            return read()
        finally:
            samples.append(time.perf_counter() - t0)

    driver.read_state = timed


class _SpeedMeter:
    """The fastest joint speed / velocity limit in the agent's state stream (what the driver
    read back from the servos), and which joint it was."""

    def __init__(self, cal: ArmCalibration) -> None:
        self.vmax = np.array([j.velocity for j in cal.joints])
        self.names = cal.names
        self.ratio, self.joint = 0.0, ""

    def __call__(self, seq: int, state: Any, sent: Any, mode: str, status: Any) -> None:
        r = np.abs(state.joint_vel) / self.vmax
        j = int(np.argmax(r))
        if r[j] > self.ratio:
            self.ratio, self.joint = float(r[j]), self.names[j]


def _true_speed(bus: Any, cal: ArmCalibration) -> tuple[float, str]:
    """The fastest any emulated servo moved (its own physics) / its joint's velocity limit,
    and the joint."""
    k = 2.0 * math.pi / cal.ticks_per_rev
    with bus.lock:
        ratios = [bus.servo(j.id).peak_speed * k / j.velocity for j in cal.joints]
    j = int(np.argmax(ratios))
    return float(ratios[j]), cal.names[j]


def _drive(agent: Agent, target_fn: Any, seconds: float, stop_when: Any = None) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        agent.heartbeat()
        try:
            agent.command("position", target_fn(time.monotonic() - t0))
        except DeviceError:
            pass
        if stop_when is not None and stop_when():
            return
        time.sleep(0.01)


def _servo_setup(vendor: str, start_q: list[float] | None = None) -> tuple[Any, Any, Any]:
    cal = _calibration(vendor)
    Bus = DynamixelBus if vendor == "dynamixel" else FeetechBus
    make = dynamixel.make_driver if vendor == "dynamixel" else feetech.make_driver
    q = np.array(start_q if start_q is not None else [0.0] * 6)
    bus = Bus(cal.ids, positions=[float(t) for t in cal.to_ticks(q)]).start()
    return cal, bus, make(bus.port, cal, rate_hz=SERVO_RATE_HZ)


_why: dict[str, str] = {}  # what a fault run ended in (reported for the failed ones)


def _servo_fault(vendor: str, fault: str) -> tuple[bool, int]:
    """Inject one fault mid-motion; (handled safely, unsafe goals on the wire)."""

    if fault == "out_of_range_start":
        cal, bus, drv = _servo_setup(vendor, [0.0, 0.0, 1.5, 0.0, 0.0, 0.0])
        try:
            drv.start()
            ok = False
        except DeviceError as exc:
            time.sleep(0.05)
            ok = "elbow_flex" in str(exc) and not bus.goals
            ok = ok and not any(s.torque_on for s in bus.servos.values())
        finally:
            bus.close()
        return ok, 0
    cal, bus, drv = _servo_setup(vendor)
    agent = Agent(drv)
    agent.start()
    start = {i: int(t) for i, t in zip(cal.ids, cal.to_ticks(np.zeros(6)), strict=True)}
    try:
        wave = lambda t: np.full(6, 0.8 * np.sin(2.0 * t))  # noqa: E731
        _drive(agent, wave, 0.5)
        expect = {
            "corrupt_burst": None,  # absorbed by the retries: motion goes on
            "corrupt_stream": "corrupt status packets",
            "silent_servo": "joint 'wrist_flex' (servo id 4) stopped answering",
            "bus_timeout": "no servo answers",
        }[fault]
        if fault == "corrupt_burst":
            bus.corrupt_replies(2)
        elif fault == "corrupt_stream":
            bus.corrupt_replies(1_000_000)
        elif fault == "silent_servo":
            bus.silence([4])
        else:
            bus.silence()
        _drive(agent, wave, 1.5, stop_when=lambda: agent.stop_reason is not None)
        if expect is None:
            ok = agent.mode == "command" and drv.bus_retries >= 1
            _why[fault] = f"mode {agent.mode}, {drv.bus_retries} retried reads, {agent.stop_reason}"
        else:
            n = len(bus.goals)
            time.sleep(0.2)
            still = len({raw for _, _, raw in bus.goals[n:]}) <= len(cal.ids)
            ok = expect in (agent.stop_reason or "") and agent.mode != "command" and still
            _why[fault] = f"mode {agent.mode}, still {still}, {agent.stop_reason}"
    finally:
        agent.close()
        bus.close()
    return ok, len(unsafe_goals(bus.goals, cal, SERVO_RATE_HZ, start))


def servo_arm(vendor: str, quick: bool) -> dict[str, Any]:
    seconds = 2.0 if quick else 6.0
    cal, bus, drv = _servo_setup(vendor)
    reads: list[float] = []
    _timed_reads(drv, reads)
    agent = Agent(drv)
    meter = _SpeedMeter(cal)
    agent.add_state_listener(meter)
    agent.start()
    start = {i: int(t) for i, t in zip(cal.ids, cal.to_ticks(np.zeros(6)), strict=True)}
    try:
        # a wave that reaches past the calibrated range (the envelope must clamp it)
        _drive(agent, lambda t: np.full(6, 1.5 * np.sin(1.5 * t)), 0.3)
        # one asking twice the joints' speed limit: the envelope drives them at its soft speed
        fast = lambda t: np.full(6, 1.5 * np.sin(1.5 * 0.3 + 4.0 * t))  # noqa: E731
        _drive(agent, fast, 1.0 if quick else 3.0)
        n0, t0 = len(bus.goals), time.monotonic()
        _drive(agent, lambda t: np.full(6, 1.5 * np.sin(1.5 * t)), seconds)
        writes = [g for g in bus.goals[n0:] if g[1] == cal.ids[0]]
        span = writes[-1][0] - writes[0][0] if len(writes) > 1 else float("nan")
        hz = (len(writes) - 1) / span if span > 0 else 0.0
        del t0
        # stop: time until the goals on the wire stop changing (commanded velocity 0)
        n1 = len(bus.goals)
        # a loaded machine can stop the arm before the bench does (say so: no stop to time)
        early = (agent.stop_reason or "") if agent.mode != "command" else ""
        t_stop = time.monotonic()
        agent.stop("bench stop")
        time.sleep(0.3)
        after = bus.goals[n1:]
        last = {sid: raw for _, sid, raw in after}
        settled = [t for t, sid, raw in after if raw == last[sid]]
        stop_ms = (min(settled) - t_stop) * 1e3 if settled else None
        unsafe = len(unsafe_goals(bus.goals, cal, SERVO_RATE_HZ, start))
        true_ratio, true_joint = _true_speed(bus, cal)
    finally:
        agent.close()
        bus.close()
    faults = [
        "corrupt_burst",
        "corrupt_stream",
        "silent_servo",
        "bus_timeout",
        "out_of_range_start",
    ]
    outcomes = {f: _servo_fault(vendor, f) for f in faults}
    return {
        "control_hz_requested": SERVO_RATE_HZ,
        "control_hz_achieved": round(hz, 2),
        "control_hz_ratio": round(hz / SERVO_RATE_HZ, 4),
        "read_latency_ms_p99": round(float(np.percentile(reads, 99)) * 1e3, 3),
        "read_latency_ms_p50": round(float(np.percentile(reads, 50)) * 1e3, 3),
        "stop_latency_ms": None if stop_ms is None else round(stop_ms, 2),
        "stopped_before_bench_stop": early,
        "faults_injected": len(faults),
        "faults_stopped_safely": sum(ok for ok, _ in outcomes.values()),
        "faults_failed": {f: _why.get(f, "") for f, (ok, _) in outcomes.items() if not ok},
        "unsafe_commands_on_wire": unsafe + sum(u for _, u in outcomes.values()),
        "goals_judged": len(bus.goals),
        "max_velocity_ratio": round(true_ratio, 4),
        "max_velocity_joint": true_joint,
        "max_velocity_ratio_measured": round(meter.ratio, 4),
        "max_velocity_joint_measured": meter.joint,
    }


def _franka_reflex(sim: Any) -> bool:
    """A joint reflex mid-motion (franky_reflex.py): the agent must latch its e-stop naming
    the arm and the reflex, and refuse motion until the operator resets it."""

    drv = FrankaDriver(sim.host, rate_hz=100.0, dynamics_factor=0.5)
    agent = Agent(drv)
    attach_estop(drv, agent)
    agent.start()
    try:
        q0 = drv.read_state().joint_pos.copy()
        tgt = q0 + np.array([0.2, 0, 0, 0, 0, 0, 0])
        _drive(agent, lambda t: tgt, 0.5)
        sim.reflex()
        _drive(agent, lambda t: tgt, 5.0, stop_when=lambda: agent.mode == "estop")
        reason = agent.stop_reason or ""
        refused = False
        try:
            agent.command("position", tgt)
        except DeviceError:
            refused = True
        return agent.mode == "estop" and "joint_reflex" in reason and refused
    finally:
        agent.close()


def franka(quick: bool) -> dict[str, Any]:
    seconds = 3.0 if quick else 8.0
    lo, hi = np.array(FR3_LOWER), np.array(FR3_UPPER)
    with start_franky_sim() as sim:
        drv = FrankaDriver(sim.host, rate_hz=100.0, dynamics_factor=0.5)
        reads: list[float] = []
        _timed_reads(drv, reads)
        agent = Agent(drv)
        agent.start()
        rates, qd = [], []
        early = ""  # a loaded machine can stop the arm before the bench does
        try:
            q0 = drv.read_state().joint_pos.copy()
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                t = time.monotonic() - t0
                agent.heartbeat()
                target = q0 + np.array([0.25, 0, 0, 0, 0, 0, -0.25]) * np.sin(1.0 * t)
                target[0] = q0[0] + 4.0 * np.sin(1.0 * t)  # asks past joint 1's limits
                try:
                    agent.command("position", target)
                except DeviceError:
                    early = agent.stop_reason or "refused"
                    break
                s = drv.robot.state
                rates.append(float(s.control_command_success_rate))
                qd.append(np.array(s.q_d))
                time.sleep(0.01)
            t_stop = time.monotonic()
            agent.stop("bench stop")
            while np.abs(np.array(drv.robot.state.dq_d)).max() > 1e-3:
                if time.monotonic() - t_stop > 10:
                    break
                time.sleep(0.001)
            stop_ms = (time.monotonic() - t_stop) * 1e3
        finally:
            agent.close()
        q = np.array(qd, dtype=float).reshape(-1, len(lo))
        unsafe = int(np.sum(np.any((q < lo) | (q > hi), axis=1)))
        success = float(np.median(rates[len(rates) // 3 :])) if rates else 0.0
        # franky-sim serves one client at a time: drop this connection first (franky closes
        # it when its Robot is freed)
        del agent, drv
        gc.collect()
        reflex_ok = _franka_reflex(sim)
    # the fault franky-sim can show: the arm dropping off the network mid-motion
    with start_franky_sim() as own:
        drv2 = FrankaDriver(own.host, rate_hz=100.0, dynamics_factor=0.5)
        agent = Agent(drv2)
        agent.start()
        try:
            q0 = drv2.read_state().joint_pos.copy()
            tgt = q0 + np.array([0.3, 0, 0, 0, 0, 0, 0])
            _drive(agent, lambda t: tgt, 0.5)
            own.kill()
            _drive(agent, lambda t: tgt, 5.0, stop_when=lambda: agent.stop_reason is not None)
            reason = agent.stop_reason or ""
            ok = f"franka {own.host}" in reason
        finally:
            agent.close()
    return {
        "control_hz_requested": 1000.0,
        "control_hz_achieved": round(1000.0 * success, 1),
        "control_hz_ratio": round(success, 4),
        "agent_rate_hz": 100.0,
        "read_latency_ms_p99": round(float(np.percentile(reads, 99)) * 1e3, 3),
        "stop_latency_ms": round(stop_ms, 1),
        "faults_injected": 2,  # the arm lost on the network; a joint reflex
        "faults_stopped_safely": int(ok) + int(reflex_ok),
        "fault_stop_reason": reason,
        "stopped_before_bench_stop": early,
        "unsafe_commands_on_wire": unsafe,
        "commands_judged": int(len(q)),
    }


def run(quick: bool = False, load: int | None = None) -> dict[str, Any]:
    """`load`: that many CPU-bound processes run beside the bench (a loaded machine)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    out: dict[str, Any] = {}
    try:
        with busy_processes(load or 0):
            for vendor in ("dynamixel", "feetech"):
                for k, v in servo_arm(vendor, quick).items():
                    out[f"{vendor}_{k}"] = v
            for k, v in franka(quick).items():
                out[f"franka_{k}"] = v
    finally:
        sys.setswitchinterval(old)
    out["unsafe_commands_on_wire"] = sum(
        out[f"{d}_unsafe_commands_on_wire"] for d in ("dynamixel", "feetech", "franka")
    )
    out["faults_injected"] = sum(
        out[f"{d}_faults_injected"] for d in ("dynamixel", "feetech", "franka")
    )
    out["faults_stopped_safely"] = sum(
        out[f"{d}_faults_stopped_safely"] for d in ("dynamixel", "feetech", "franka")
    )
    out["servo_max_velocity_ratio"] = max(
        out[f"{d}_max_velocity_ratio{m}"]
        for d in ("dynamixel", "feetech")
        for m in ("", "_measured")
    )
    out["load_processes"] = load or 0
    return out
