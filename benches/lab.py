"""`python main.py bench lab --json`: the virtual lab served as a robot.

Measures, against a `lab serve` subprocess reached only through the robot protocol:
state stream rate at the robot's control rate, agent loop jitter, lab real-time factor
(physics + agent + state stream while the fixed camera streams 424x240 at 15 fps), and
watchdog stop latency after the heartbeat deadline. Then fuzzes the safety envelope
in-process: >= 10,000 fuzzed policy outputs and client commands go through the same agent
code in front of the lab robot, and an independent audit of every command that reached the
actuator counts those outside the envelope.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.lab.driver import make_driver
from devices.robots.agent.control import Agent
from devices.robots.agent.drivers.interface import RobotDriver
from devices.robots.agent.drivers.lab import LAB_WORKSPACE
from devices.robots.agent.launch import start_lab_process
from devices.robots.agent.safety_config import SafetyConfig
from devices.robots.client import RobotClient
from devices.robots.wire.robot_types import CommandMode, RobotInfo, RobotState

DESCRIPTION = (
    "virtual lab as a robot: state stream rate, agent jitter, real-time factor with "
    "camera, watchdog latency, safety envelope fuzz"
)
SCENE = "panda_table"


class _Stamped(list):  # type: ignore[type-arg]
    """A state recorder that notes when each message arrived (perf_counter, s)."""

    def append(self, msg: dict[str, Any]) -> None:
        msg["recv"] = time.perf_counter()
        super().append(msg)


def _stream_phase(c: RobotClient, cam: RobotClient | None, seconds: float) -> dict[str, Any]:
    """Move the arm gently while recording the state stream and counting camera frames."""
    frames = [0]
    errors: list[str] = []
    stop = threading.Event()

    def camera_loop() -> None:
        assert cam is not None
        it = cam.camera_frames("fixed", timeout_s=60.0)  # the renderer starts on demand
        try:
            for _ in it:
                frames[0] += 1
                if stop.is_set():
                    break
        except DeviceError as exc:
            errors.append(str(exc))
        finally:
            it.close()

    cam_thread = threading.Thread(target=camera_loop, daemon=True) if cam else None
    if cam_thread:
        cam_thread.start()
        end = time.monotonic() + 60.0  # renderer start-up (GL context)
        while frames[0] < 3 and not errors and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)
    q0 = c.latest_state().joint_pos.copy()
    rec = _Stamped()
    c._recorders.append(rec)
    f0, w0 = frames[0], time.perf_counter()
    while (now := time.perf_counter()) - w0 < seconds:
        q = q0.copy()
        q[0] += 0.15 * math.sin(2 * math.pi * 0.5 * (now - w0))
        c.command_position(q)
        time.sleep(0.01)
    wall = time.perf_counter() - w0
    c._recorders.remove(rec)
    cam_fps = (frames[0] - f0) / wall
    stop.set()
    if cam_thread:
        cam_thread.join(timeout=5.0)
    c.stop()
    traj = c.states_to_trajectory(rec)
    recv = np.array([m["recv"] for m in rec])
    span = recv[-1] - recv[0]
    # real-time factor: slope of lab time over arrival time (robust to delivery jitter)
    rtf = float(np.polyfit(recv - recv[0], [m["t"] for m in rec], 1)[0])
    return {
        "states": len(traj),
        "wall_s": span,
        "realtime_factor": rtf,
        "achieved_hz": (len(traj) - 1) / span,
        "dropped": traj.meta["dropped_states"],
        "camera_fps": cam_fps,
        "camera_error": "; ".join(errors),
    }


def _watchdog_phase(c: RobotClient, trials: int) -> list[float]:
    """Stop heartbeats while commanding; returns the agent's stop latencies after deadline (s)."""
    lat = []
    for _ in range(trials):
        c.events.clear()
        c.heartbeat_enabled = True
        c.take_control()  # a watchdog stop holds until control is taken again
        c.command_position(c.latest_state().joint_pos)
        time.sleep(0.15)
        c.heartbeat_enabled = False
        end = time.monotonic() + 2.0
        ev = None
        while ev is None and time.monotonic() < end:
            ev = next((e for e in list(c.events) if e.get("kind") == "watchdog"), None)
            time.sleep(0.01)
        if ev is None:
            raise DeviceError("bench lab: the watchdog did not stop the robot within 2 s")
        lat.append(float(ev["data"]["latency_s"]))
        c.heartbeat_enabled = True
        time.sleep(0.1)
    return lat


class AuditedDriver:
    """Passes everything to `inner` and independently audits every command it is sent."""

    def __init__(
        self, inner: RobotDriver, box: tuple[NDArray[np.float64], NDArray[np.float64]]
    ) -> None:
        self.inner, self.box = inner, box
        lim = inner.info().limits
        self.lo, self.hi = np.asarray(lim.lower), np.asarray(lim.upper)
        self.step = np.asarray(lim.velocity) / inner.info().control_rate_hz
        self.written = self.unsafe = 0
        self._ref: NDArray[np.float64] | None = None
        self._activation_q: NDArray[np.float64] | None = None
        self._fresh = True

    def info(self) -> RobotInfo:
        return self.inner.info()

    def start(self) -> None:
        pass  # the fuzz steps the lab physics by hand

    def wait_state(self, after_seq: int, timeout: float) -> RobotState:
        return self.inner.wait_state(after_seq, timeout)  # type: ignore[attr-defined,no-any-return]

    def close(self) -> None:
        self.inner.close()

    def read_state(self) -> RobotState:
        s = self.inner.read_state()
        self._activation_q = s.joint_pos.copy()
        return s

    def hold(self) -> None:
        self._fresh = True
        self.inner.hold()

    def forward_kinematics(self, q: NDArray[np.float64]) -> NDArray[np.float64] | None:
        return self.inner.forward_kinematics(q)

    def write_command(self, mode: CommandMode, values: NDArray[np.float64]) -> None:
        v = np.asarray(values, dtype=float)
        ref = self._activation_q if self._fresh else self._ref
        ok = bool(
            np.all(np.isfinite(v)) and np.all(v >= self.lo - 1e-9) and np.all(v <= self.hi + 1e-9)
        )
        if ok and ref is not None:
            ok = bool(np.all(np.abs(v - ref) <= self.step + 1e-9))
        p = self.inner.forward_kinematics(v) if ok else None
        if ok and p is not None:
            ok = bool(np.all(p >= self.box[0] - 1e-9) and np.all(p <= self.box[1] + 1e-9))
        self.written += 1
        self.unsafe += 0 if ok else 1
        self._ref, self._fresh = v.copy(), False
        self.inner.write_command(mode, v)


def _fuzz(n_commands: int) -> dict[str, Any]:
    """Fuzzed policy outputs and client commands through the agent in front of the lab
    robot (stepped by hand, so 10,000 ticks take seconds, not 40 s of real time)."""

    lab = make_driver(SCENE, start=False)
    box = (np.asarray(LAB_WORKSPACE["lower"]), np.asarray(LAB_WORKSPACE["upper"]))
    drv = AuditedDriver(lab, box)

    agent = Agent(
        drv,
        safety=SafetyConfig(
            workspace_lower=LAB_WORKSPACE["lower"], workspace_upper=LAB_WORKSPACE["upper"]
        ),
    )
    info = agent.info
    lo, hi = np.asarray(info.limits.lower), np.asarray(info.limits.upper)
    rng = np.random.default_rng(7)

    def fuzzed(state: RobotState) -> NDArray[np.float64]:
        k = rng.integers(10)
        if k < 3:
            return state.joint_pos + rng.normal(0, 0.05, lo.size)
        if k < 6:
            return rng.uniform(lo - 1.0, hi + 1.0)
        if k < 8:
            return rng.normal(0, 1e4, lo.size)
        out = state.joint_pos.copy()
        out[rng.integers(lo.size)] = rng.choice([np.nan, np.inf, -np.inf, 1e300])
        return out

    agent.load_policy(fuzzed)
    agent.start(thread=False)
    steps_per_tick = max(1, round(1.0 / info.control_rate_hz / lab.sim.dt))
    fuzzed_count = restarts = 0
    try:
        while fuzzed_count < n_commands:
            if agent.mode not in ("policy", "command"):
                restarts += 1
                if restarts % 2:
                    agent.run_policy(ramp_s=0.0)
                else:
                    agent.command("position", rng.uniform(lo - 0.5, hi + 0.5))
            agent.heartbeat()
            if agent.mode == "command" and rng.random() < 0.5:
                agent.command("position", fuzzed(lab.read_state()))
            with lab._lock:
                lab.sim.step(steps_per_tick)
            agent.tick()
            fuzzed_count += 1
    finally:
        agent.close()
    return {
        "fuzz_robot": f"{info.name} in-process, stepped by hand",
        "fuzzed_commands": fuzzed_count,
        "unsafe_commands_passed": drv.unsafe,
        "fuzz_commands_reaching_actuator": drv.written,
        "fuzz_stops": restarts,
    }


def run(quick: bool = False) -> dict[str, Any]:
    seconds = 3.0 if quick else 8.0
    out: dict[str, Any] = {"robot": f"lab/{SCENE}"}
    with start_lab_process(SCENE, camera_size="424x240", camera_fps=15) as lab:
        with (
            RobotClient(lab.host, lab.port, lab.token, name="bench") as c,
            RobotClient(
                lab.host, lab.port, lab.token, name="bench-camera", subscribe_state=False
            ) as cam,
        ):
            assert c.info is not None
            rate = c.info.control_rate_hz
            time.sleep(1.0)
            s = _stream_phase(c, cam, seconds)
            status = c.status(jitter_window_s=seconds)
            jitter = status["jitter_ms"]
            lat = _watchdog_phase(c, 3 if quick else 10)
    dt = 1.0 / rate
    out.update(
        {
            "stream_hz_requested": rate,
            "stream_hz_achieved": round(s["achieved_hz"], 2),
            "stream_hz_ratio": round(s["achieved_hz"] / rate, 4),
            "stream_dropped_states": s["dropped"],
            "agent_jitter_p50_ms": round(jitter["p50"], 3),
            "agent_jitter_p99_ms": round(jitter["p99"], 3),
            "agent_jitter_max_ms": round(jitter["max"], 3),
            "agent_skipped_ticks": int(jitter.get("skipped", 0)),
            "agent_scheduling": "SCHED_FIFO" if status.get("realtime") else "normal",
            "watchdog_stop_ms": round(max(lat) * 1e3, 3),
            "watchdog_stop_ms_mean": round(float(np.mean(lat)) * 1e3, 3),
            "watchdog_stop_periods": round(max(lat) / dt, 3),
            "lab_realtime_factor": round(s["realtime_factor"], 4),
            "camera": "fixed 424x240",
            "camera_fps_requested": 15,
            "camera_fps_achieved": round(s["camera_fps"], 2),
        }
    )
    if s["camera_error"]:
        out["camera_error"] = s["camera_error"]
    out.update(_fuzz(2000 if quick else 10000))
    return out
