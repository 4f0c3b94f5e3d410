"""The adversarial client's pieces shared by `bench safety` (benches/safety.py) and
its issue-23 attacks (benches/safety_attacks.py): the measured-motion meter, streaming,
settling, the safe set and the way back to it, the scripted worst cases, fuzzing, the
watchdog trial, raw handshakes (replay, slowloris, claimers) and the lab's memory."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.agent.launch import LabProcess
from devices.robots.client import RobotClient
from devices.robots.wire import protocol as P
from devices.robots.wire.auth import client_proof, new_nonce

SCENE = "panda_table"
Vec = NDArray[np.float64]
POSES = {
    "ready": (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785),
    "twisted": (2.0, 0.5, -2.0, -1.0, 2.2, 3.0, -2.0),
    "twisted2": (-2.5, -1.0, 2.5, -2.8, -2.5, 0.5, 2.5),
    "side": (-1.5, 0.2, -0.5, -1.8, 1.0, 1.2, -1.0),
}


class Meter:
    """Worst measured |velocity| / limit and position overshoot over every state seen."""

    def __init__(self, c: RobotClient) -> None:
        assert c.info is not None
        lim = c.info.limits
        self.vmax, self.lo, self.hi = (
            np.asarray(x, float) for x in (lim.velocity, lim.lower, lim.upper)
        )
        self.ratio = 0.0
        self.overshoot = 0.0
        self.states = 0
        self.worst: dict[str, Any] = {}
        self.episode = ""

    def add(self, msgs: list[dict[str, Any]]) -> None:
        if not msgs:
            return
        q = np.array([m["joint_pos"] for m in msgs], dtype=float)
        v = np.array([m["joint_vel"] for m in msgs], dtype=float)
        r = np.abs(v) / self.vmax
        o = np.maximum(q - self.hi, self.lo - q)
        self.states += len(msgs)
        if r.max() > self.ratio:
            self.ratio = float(r.max())
            self.worst["velocity"] = f"{self.episode}, joint {int(r.max(axis=0).argmax()) + 1}"
        if o.max() > self.overshoot:
            self.overshoot = float(o.max())
            self.worst["position"] = f"{self.episode}, joint {int(o.max(axis=0).argmax()) + 1}"


@contextmanager
def recording(c: RobotClient, meter: Meter, episode: str) -> Iterator[list[dict[str, Any]]]:
    """Record the state stream during the block and feed it to `meter`."""
    rec: list[dict[str, Any]] = []
    c._recorders.append(rec)  # noqa: SLF001 - the bench reads the raw stream like bench lab
    meter.episode = episode
    try:
        yield rec
    finally:
        c._recorders.remove(rec)  # noqa: SLF001
        meter.add(rec)


def _stream(c: RobotClient, mode: str, fn: Callable[[float], Vec], seconds: float) -> None:
    """Send fn(t) as `mode` commands at ~200 Hz for `seconds` (refusals are ignored: the
    adversary does not care)."""
    t0 = time.monotonic()
    while (t := time.monotonic() - t0) < seconds:
        c.check()
        c.command(mode, fn(t))
        time.sleep(0.005)


def _hold(x: Vec) -> Callable[[float], Vec]:
    """The same command at every time."""
    return lambda t: x


def _sway(q0: Vec, axis: Vec) -> Callable[[float], Vec]:
    """A slow sine about q0 along `axis` (0.3 rad, 3 rad/s)."""
    return lambda t: q0 + 0.3 * math.sin(3 * t) * axis


def settle(c: RobotClient, pose: Vec, timeout_s: float = 6.0) -> bool:
    """Drive to `pose` in position mode until measured there and still (taking control
    again when the robot stops on the way: a stop may stick until then)."""
    c.take_control()
    end = time.monotonic() + timeout_s
    acquired = time.monotonic()
    while time.monotonic() < end:
        if (c._latest or {}).get("mode") == "stopped" and time.monotonic() - acquired > 0.1:  # noqa: SLF001
            c.take_control()
            acquired = time.monotonic()
        c.command_position(pose)
        s = c.latest_state()
        if np.abs(s.joint_pos - pose).max() < 0.02 and np.abs(s.joint_vel).max() < 0.05:
            return True
        time.sleep(0.01)
    return False


class SafeSet:
    """Distance of a measured state from the safe set: joint limits and the workspace box."""

    def __init__(self, c: RobotClient, meter: Meter) -> None:
        st = c.status()["safety"]
        self.box = (
            (np.asarray(st["workspace_lower"]), np.asarray(st["workspace_upper"]))
            if st.get("workspace_lower") is not None
            else None
        )
        self.meter = meter

    def distance(self, msg: dict[str, Any]) -> float:
        q = np.asarray(msg["joint_pos"], float)
        d = float(np.maximum(np.maximum(q - self.meter.hi, self.meter.lo - q), 0.0).sum())
        ee = msg.get("ee_pos")
        if self.box is not None and ee is not None:
            p = np.asarray(ee, float)
            out = np.maximum(self.box[0] - p, 0.0) + np.maximum(p - self.box[1], 0.0)
            d += float(np.linalg.norm(out))
        return d


def _at_edge(safe: SafeSet, msg: dict[str, Any]) -> bool:
    """At or past an edge of the safe set: within 0.05 rad of a joint limit, or within
    0.02 m of a face of the workspace box (inside or out)."""
    q = np.asarray(msg["joint_pos"], float)
    m = safe.meter
    if float(np.min(np.minimum(m.hi - q, q - m.lo))) < 0.05:
        return True
    ee = msg.get("ee_pos")
    if safe.box is not None and ee is not None:
        p = np.asarray(ee, float)
        return float(np.min(np.minimum(p - safe.box[0], safe.box[1] - p))) < 0.02
    return False


def back_to_safety(c: RobotClient, safe: SafeSet, meter: Meter, home: Vec) -> bool | None:
    """After an episode that ended at an edge of the safe set: command back towards it
    (the ready pose, inside the limits and the box) and check on the measured stream that
    the robot goes (its distance outside the safe set shrinks, or it was inside and moves
    towards the target). None when the episode did not end at an edge."""
    c.take_control()
    start = c._latest or {}  # noqa: SLF001
    if not start or not _at_edge(safe, start):
        return None
    d0 = safe.distance(start)
    q0 = np.asarray(start["joint_pos"], float)
    target = np.clip(home, meter.lo + 0.05, meter.hi - 0.05)
    with recording(c, meter, "back towards the safe set") as rec:
        _stream(c, "position", _hold(target), 1.5)
    if not rec:
        return False
    d1 = min(safe.distance(m) for m in rec[-20:])
    q1 = np.asarray(rec[-1]["joint_pos"], float)
    moved = bool(np.linalg.norm(q1 - target) < np.linalg.norm(q0 - target) - 0.01)
    return bool(d1 < d0 - 1e-4 or (d0 <= 1e-4 and moved))


def scripted(c: RobotClient, meter: Meter, quick: bool) -> dict[str, Any]:
    assert c.info is not None
    eff = np.asarray(c.info.limits.effort, float)
    n = eff.size
    safe = SafeSet(c, meter)
    home = np.asarray(POSES["ready"])
    episodes = edges = stranded = 0
    rng = np.random.default_rng(10)

    def after(name: str) -> None:
        nonlocal episodes, edges, stranded
        episodes += 1
        back = back_to_safety(c, safe, meter, home)
        edges += back is not None
        if back is False:
            stranded += 1
            meter.worst.setdefault("stranded", name)

    torque_s = 0.6 if quick else 1.5
    for j in range(n):
        for sgn in (1.0, -1.0):
            settle(c, home)
            tau = np.zeros(n)
            tau[j] = sgn * eff[j] * 10  # far past the limit: the envelope clips it
            with recording(c, meter, f"torque {sgn:+.0f} joint {j + 1}"):
                _stream(c, "torque", _hold(tau), torque_s)
            after(f"torque joint {j + 1}")
    poses = ["twisted"] if quick else list(POSES)
    for name in poses:
        pose = np.asarray(POSES[name])
        for j in range(n):
            settle(c, pose)
            for lim in (meter.lo, meter.hi):  # limit to limit, the others held
                target = pose.copy()
                target[j] = lim[j]
                with recording(c, meter, f"jump joint {j + 1} from {name}"):
                    _stream(c, "position", _hold(target), 1.0 if quick else 2.0)
            after(f"jump from {name}")
    for k in range(3 if quick else 12):  # random sequences in every mode
        mode = ("position", "velocity", "torque")[k % 3]
        with recording(c, meter, f"random {mode} sequence {k}"):
            for _ in range(6):
                if mode == "position":
                    x = rng.uniform(meter.lo - 0.3, meter.hi + 0.3)
                elif mode == "velocity":
                    x = rng.uniform(-2, 2, n) * meter.vmax
                else:
                    x = rng.uniform(-1, 1, n) * eff
                _stream(c, mode, _hold(x), 0.3)
        after(f"random {mode}")
    return {"episodes": episodes, "edge_episodes": edges, "stranded": stranded}


def fuzz_commands(c: RobotClient, meter: Meter, count: int) -> dict[str, Any]:
    """`count` fuzzed commands streamed at ~500/s (under the flood limit)."""
    assert c.info is not None
    n = len(c.info.joint_names)
    eff = np.asarray(c.info.limits.effort, float)
    rng = np.random.default_rng(11)
    specials = [np.nan, np.inf, -np.inf, 1e300, -1e300, 0.0]
    sent = 0
    c.take_control()
    with recording(c, meter, "fuzz"):
        t0 = time.monotonic()
        while sent < count:
            k = rng.integers(12)
            mode = ("position", "velocity", "torque")[int(rng.integers(3))]
            if k < 4:
                q = c.latest_state().joint_pos
                x = q + rng.normal(0, 0.2, n)
            elif k < 7:
                x = rng.uniform(meter.lo - 1.0, meter.hi + 1.0)
            elif k < 9:
                x = rng.normal(0, 1e4, n)
            elif k < 10:
                x = rng.uniform(-1, 1, n) * eff * 3
            else:
                x = rng.uniform(-1, 1, n)
                x[rng.integers(n)] = specials[int(rng.integers(len(specials)))]
            c.command(mode, x)
            sent += 1
            due = t0 + sent / 500.0
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
    return {"fuzzed_commands": sent}


def watchdog_trial(c: RobotClient, meter: Meter, trials: int) -> dict[str, Any]:
    """Heartbeats stop, commands go on: count ticks of motion after the watchdog stop."""
    resumes = stops = 0
    for k in range(trials):
        settle(c, np.asarray(POSES["ready"]))
        c.events.clear()
        q0 = c.latest_state().joint_pos.copy()
        axis = np.eye(len(q0))[k % len(q0)]
        c.heartbeat_enabled = False
        with recording(c, meter, "watchdog") as rec:
            _stream(c, "position", _sway(q0, axis), 1.5)
        c.heartbeat_enabled = True
        modes = [str(m.get("mode")) for m in rec]
        if "stopped" in modes:
            stops += 1
            after = modes[modes.index("stopped") :]
            resumes += sum(
                1
                for a, b in zip(after, after[1:], strict=False)
                if a == "stopped" and b == "command"
            )
    return {"watchdog_stops": stops, "watchdog_resumes": resumes}


def raw_hello(host: str, port: int, token: str) -> tuple[socket.socket, bytes]:
    s = socket.create_connection((host, port), timeout=5.0)
    nonce = P.recv_message(s, P.MAX_HELLO_BYTES)["nonce"]
    cn = new_nonce()
    hello = {
        "type": "hello",
        "protocol": P.PROTOCOL_NAME,
        "version": P.PROTOCOL_VERSION,
        "nonce": cn,
        "proof": client_proof(token, nonce, cn, P.PROTOCOL_VERSION),
        "client": "bench-safety",
    }
    return s, P.pack(hello)


def answer(s: socket.socket) -> str:
    s.settimeout(5.0)
    try:
        while True:
            m = P.recv_message(s)
            if m["type"] in ("welcome", "error"):
                return str(m["type"])
    except (OSError, DeviceError):
        return "closed"


def replay(lab: LabProcess) -> int:
    s, hello = raw_hello(lab.host, lab.port, lab.token)
    s.sendall(hello)
    assert answer(s) == "welcome", "a valid hello must be welcomed"
    s.close()
    accepted = 0
    replays = [socket.create_connection((lab.host, lab.port), timeout=5.0) for _ in range(3)]
    for r in replays:  # concurrently: all three connections hold a handshake at once
        r.sendall(hello)
    for r in replays:
        accepted += answer(r) == "welcome"
        r.close()
    return accepted


def _trickle(socks: list[socket.socket], stop: threading.Event, period_s: float) -> None:
    while not stop.wait(period_s):
        for s in socks:
            try:
                s.send(b"\x00")
            except OSError:
                pass


def slowloris(lab: LabProcess, seconds: float) -> float:
    """15 peers trickle a hello at 1 byte/s (reconnecting when dropped) while a real client
    connects again and again; the longest time it was kept out, in seconds."""
    stop = threading.Event()
    peers: list[socket.socket] = []

    def keep_peers() -> None:
        while not stop.is_set():
            alive = []
            for s in peers:
                try:
                    s.send(b"\x00")
                    alive.append(s)
                except OSError:
                    s.close()
            while len(alive) < 15 and not stop.is_set():
                try:
                    alive.append(socket.create_connection((lab.host, lab.port), timeout=2.0))
                except OSError:
                    break
            peers[:] = alive
            stop.wait(1.0)

    t = threading.Thread(target=keep_peers, daemon=True)
    t.start()
    time.sleep(1.5)
    worst = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        while True:
            try:
                with RobotClient(
                    lab.host,
                    lab.port,
                    lab.token,
                    name="real",
                    connect_timeout_s=5.0,
                    subscribe_state=False,
                ):
                    break
            except DeviceError:
                if time.monotonic() - t0 > 30.0:
                    break
                time.sleep(0.1)
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.2)
    stop.set()
    t.join(timeout=5.0)
    for s in peers:
        s.close()
    return worst


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def claimers(lab: LabProcess, seconds: float) -> dict[str, float]:
    """15 logged-in clients each announce a 64 MiB message and trickle its body."""
    base = rss_mb(lab.proc.pid)
    socks = []
    for _ in range(15):
        s, hello = raw_hello(lab.host, lab.port, lab.token)
        s.sendall(hello)
        if answer(s) == "welcome":
            s.sendall(P.HEADER.pack(P.MAX_MESSAGE_BYTES))
            socks.append(s)
        else:
            s.close()
    stop = threading.Event()
    t = threading.Thread(target=_trickle, args=(socks, stop, 0.5), daemon=True)
    t.start()
    peak = base
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, rss_mb(lab.proc.pid))
        time.sleep(0.2)
    stop.set()
    t.join(timeout=5.0)
    for s in socks:
        s.close()
    return {"claimers": float(len(socks)), "rss_before_mb": base, "rss_peak_mb": peak}
