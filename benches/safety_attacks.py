"""The attacks of `bench safety` that issue 23 added ("the robot side holds against any
client"); benches/safety.py runs them and reports their figures; the
shared client pieces are in benches/safety_probe.py.

Everything goes through the robot protocol over loopback, and every motion figure is judged on
the MEASURED state stream (`state` messages: joint_pos, joint_vel, ee_pos, mode, t), never on
what was commanded. Each attack survives the robot refusing, stopping or disconnecting it: a
DeviceError is recorded (`Tally`) and the bench goes on; a client the lab dropped reconnects.

- `box_attacks`: one target outside the workspace box streamed at 100 Hz (position,
  velocity and torque mode, and an uploaded policy re-run after every stop), re-acquiring
  control whenever the robot stops, from the ready pose and from poses near each face of the
  box the Panda can reach;
- `random_streams`: a new random target within the joint limits every 0.2 s at 100 Hz;
- `dragged_joints`: the big joints driven hard in velocity mode while the wrist is held at 0;
- `policy_swap`: a watcher's upload replacing the operator's policy;
- `slow_models`: a model that fails at its first inference, a slow one (~100 ms an
  inference) and a never-ending one against the 20 ms policy watchdog;
- `type_confusion`: every message type with fields of the wrong type, over a raw socket;
- `big_messages`: 60 MiB of small ints, ~20 MiB of empty maps and 100k nested arrays from
  a watch-only client while another presses the e-stop.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benches.safety_models import constant_model, failing_model, seconds_per_trip, slow_model
from benches.safety_probe import (
    POSES,
    Meter,
    SafeSet,
    Vec,
    back_to_safety,
    settle,
)
from devices.errors import DeviceError
from devices.robots.agent.launch import LabProcess
from devices.robots.client import RobotClient

Msg = dict[str, Any]
READY = np.asarray(POSES["ready"], float)
# From the ready pose, joint 4 at -0.1 rad stretches the arm up and back: the tool point goes
# to x = -0.36 m, 6 cm behind the box's back face (x = -0.3).
OUTSIDE = np.array([0.0, -0.785, 0.0, -0.1, 0.0, 1.571, 0.785])
# (start 3-5 cm inside a face, a target 8-14 cm beyond it), found offline by forward
# kinematics of the lab Panda over a grid of joints 1, 2, 4 (6 for the table) around the ready
# pose; the straight joint path from ready to each start stays 2 cm inside the box. The
# front (x = 1.0 m) and top (z = 1.3 m) faces are out of the arm's reach (40k random poses
# reach x 0.94 m, z 1.28 m at most). "z-" presses the hand into the table (its top is z = 0).
FACES: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "x-": ((-0.5, -1.6, 0.0, -1.4, 0.0, 1.571, 0.785), (-0.5, -1.6, 0.0, -0.9, 0.0, 1.571, 0.785)),
    "y-": ((-1.0, 0.7, 0.0, -0.9, 0.0, 1.571, 0.785), (-1.5, 0.7, 0.0, -0.9, 0.0, 1.571, 0.785)),
    "y+": ((1.0, 0.7, 0.0, -0.9, 0.0, 1.571, 0.785), (1.5, 0.7, 0.0, -0.9, 0.0, 1.571, 0.785)),
    "z-": ((0.0, 0.4, 0.0, -2.4, 0.0, 2.6, 0.785), (0.0, 0.7, 0.0, -2.4, 0.0, 2.6, 0.785)),
}
SPEC: Msg = {
    "observation": ["joint_pos", "joint_vel"],
    "action": {"mode": "position", "type": "absolute"},
}
RATE_HZ = 100.0  # how fast the hostile client streams
_CODE = re.compile(r"\[([a-z_]+)\]\s*$")


# -- bookkeeping: error codes, reconnecting client, busy processes -------------------------


def error_code(exc: BaseException) -> str | None:
    """The protocol error code a DeviceError names (`... [refused]`), if any."""
    m = _CODE.search(str(exc))
    return m.group(1) if m else None


@dataclass
class Tally:
    """Error codes the robot answered (each exception counted once) and attack failures."""

    codes: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    _seen: list[BaseException] = field(default_factory=list)

    def code(self, code: Any) -> None:
        if isinstance(code, str):
            self.codes[code] = self.codes.get(code, 0) + 1

    def note(self, exc: BaseException | None) -> str | None:
        if exc is None or any(e is exc for e in self._seen):
            return error_code(exc) if exc is not None else None
        self._seen.append(exc)
        code = error_code(exc)
        self.code(code)
        return code

    def drain(self, c: RobotClient) -> None:
        """Count the error codes of replies without an id (refused streamed commands) and
        the fatal error that ended the connection, if one did (counted once: it is also
        the exception every later call on that client raises)."""
        while c.events:
            ev = c.events.popleft()
            if ev.get("kind") == "error" and not ev.get("fatal"):
                self.code(ev.get("code"))
        self.note(c._lost)  # noqa: SLF001

    @property
    def internal(self) -> int:
        return self.codes.get("internal", 0)


class Ctx:
    """What the attacks share: the lab, the adversary client (reconnected when the lab
    dropped it), the meter of measured motion, the safe set and the stranding count."""

    def __init__(self, lab: LabProcess, quick: bool) -> None:
        self.lab, self.quick = lab, quick
        self.tally = Tally()
        self.reconnects = self.recoveries = 0
        self._c: RobotClient | None = None
        self.meter = Meter(self.c)
        self.safe = SafeSet(self.c, self.meter)
        self.episodes = self.edges = self.stranded = 0
        self.stranded_in: list[str] = []  # the attacks after which the robot stayed put
        self.seconds: dict[str, float] = {}  # wall time of each attack
        self._depth = 0

    def client(self, name: str, **kw: Any) -> RobotClient:
        """A new logged-in RobotClient (three tries: the lab may be busy dropping others)."""
        for attempt in range(3):
            c = RobotClient(self.lab.host, self.lab.port, self.lab.token, name=name, **kw)
            try:
                c.connect()
                return c
            except DeviceError:
                c.close()
                if attempt == 2:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    @property
    def c(self) -> RobotClient:
        """The adversary's client, connected again if the lab dropped it."""
        if self._c is not None and self._c.connected:
            return self._c
        if self._c is not None:
            self.tally.drain(self._c)  # and why the lab dropped it
            self._c.close()
            self.reconnects += 1
        self._c = self.client("adversary")
        return self._c

    def settle(self, pose: Vec) -> bool:
        """Drive to `pose` and hold still there. An arm stranded at an edge (the command
        straight back is refused; `stranded` counted that) is first brought back one joint
        at a time towards the ready pose (`recoveries`), so later attacks start where meant."""
        if settle(self.c, pose):
            return True
        self.recoveries += 1
        for j in range(len(READY)):
            c = self.c
            c.take_control()
            target = np.asarray((c._latest or {})["joint_pos"], float).copy()  # noqa: SLF001
            target[j] = READY[j]
            end = time.monotonic() + 1.0
            while time.monotonic() < end and abs(c.latest_state().joint_pos[j] - READY[j]) > 0.02:
                c.command_position(target)
                time.sleep(0.01)
        return settle(self.c, pose)

    def close(self) -> None:
        if self._c is not None:
            self.tally.drain(self._c)
            self._c.close()

    def attempt(self, name: str, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """fn(*args); a DeviceError or socket error is recorded and `default` returned."""
        t0, self._depth = time.monotonic(), self._depth + 1
        try:
            return fn(*args)
        except (DeviceError, OSError) as exc:
            self.tally.note(exc)
            self.tally.failures.append(f"{name}: {exc}")
            return default
        finally:
            if self._c is not None:
                self.tally.drain(self._c)
            self._depth -= 1
            if not self._depth:  # the bench's own attacks, not the parts of one
                self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - t0

    def after(self, name: str) -> None:
        """Command back towards the safe set; count the robot stranded if it does not go."""
        self.episodes += 1
        back = back_to_safety(self.c, self.safe, self.meter, READY)
        self.edges += back is not None
        if back is False:
            self.stranded += 1
            self.stranded_in.append(name)
            self.meter.worst.setdefault("stranded", name)


@contextmanager
def busy_processes(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`n` CPU-bound processes for the duration (the 'loaded machine' of the targets)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, n))]
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# -- the hostile stream and what it measured -------------------------------------------------


@dataclass
class Run:
    """One hostile stream: the states measured meanwhile and the stops among them."""

    states: list[Msg]
    stops: int


def count_stops(states: list[Msg]) -> int:
    moving, halted = ("command", "policy"), ("stopped", "estop")
    return sum(
        1
        for a, b in zip(states, states[1:], strict=False)
        if a.get("mode") in moving and b.get("mode") in halted
    )


def hostile(
    ctx: Ctx,
    episode: str,
    seconds: float,
    command: Callable[[float], Vec] | None = None,
    mode: str = "position",
    restart: Callable[[RobotClient], None] | None = None,
) -> Run:
    """Stream command(t) as `mode` at 100 Hz for `seconds`, recording the measured state
    stream (fed to the meter as `episode`). Whenever the robot is measured stopped, take
    control again (`restart`, default acquire), as a hostile client would; a refusal is
    counted and the stream goes on; a dropped client reconnects (up to 3 times)."""
    rec: list[Msg] = []
    clients = [ctx.c]
    clients[0]._recorders.append(rec)  # noqa: SLF001 - the raw measured stream
    ctx.meter.episode = episode
    again = restart or (lambda c: c.take_control())
    t0, k, last_restart = time.monotonic(), 0, -1.0
    try:
        while (t := time.monotonic() - t0) < seconds:
            c = clients[-1]
            try:
                c.check()
                if (c._latest or {}).get("mode") == "stopped" and t - last_restart > 0.05:  # noqa: SLF001
                    last_restart = t
                    again(c)
                if command is not None:
                    c.command(mode, command(t))
            except DeviceError as exc:
                ctx.tally.note(exc)
                if not c.connected:
                    if len(clients) > 3:
                        raise
                    clients.append(ctx.c)
                    clients[-1]._recorders.append(rec)  # noqa: SLF001
            k += 1
            time.sleep(max(0.0, t0 + k / RATE_HZ - time.monotonic()))
    finally:
        for c in clients:
            if rec in c._recorders:  # noqa: SLF001
                c._recorders.remove(rec)  # noqa: SLF001
        ctx.meter.add(rec)
    return Run(rec, count_stops(rec))


def excursion_mm(safe: SafeSet, states: list[Msg]) -> float:
    """Largest distance (mm) of the measured tool point outside the workspace box."""
    if safe.box is None:
        return 0.0
    lo, hi = safe.box
    worst = 0.0
    for m in states:
        if m.get("ee_pos") is None:
            continue
        p = np.asarray(m["ee_pos"], float)
        out = np.maximum(lo - p, 0.0) + np.maximum(p - hi, 0.0)
        worst = max(worst, float(np.linalg.norm(out)) * 1e3)
    return worst


def motion_stats(meter: Meter, states: list[Msg]) -> tuple[float, float]:
    """(worst measured |v| / limit, worst overshoot past a joint limit in rad)."""
    if not states:
        return 0.0, 0.0
    q = np.array([m["joint_pos"] for m in states], float)
    v = np.array([m["joint_vel"] for m in states], float)
    over = np.maximum(q - meter.hi, meter.lo - q).max()
    return float((np.abs(v) / meter.vmax).max()), max(0.0, float(over))


# -- 1. the workspace box ----------------------------------------------------------------------


@dataclass
class BoxResult:
    excursion_mm: float = 0.0
    held_mm: float = 0.0
    stops: int = 0
    attacks: int = 0
    worst: str = ""
    unreached: list[str] = field(default_factory=list)  # starts the arm did not settle at

    def add(self, name: str, run: Run, held_mm: float, safe: SafeSet) -> None:
        exc = excursion_mm(safe, run.states)
        if exc > self.excursion_mm or not self.worst:
            self.excursion_mm, self.worst = max(exc, self.excursion_mm), name
        self.held_mm = max(self.held_mm, held_mm)
        self.stops += run.stops
        self.attacks += 1


def _held_mm(ctx: Ctx) -> float:
    """After 0.5 s of no commands: how far outside the box the arm rests."""
    time.sleep(0.5)
    return excursion_mm(ctx.safe, [ctx.c._latest or {}])  # noqa: SLF001


def _box_attack(ctx: Ctx, res: BoxResult, name: str, start: Vec, out: Vec, mode: str) -> None:
    """From `start`, drive the tool towards `out` (outside the box) in `mode` for 4 s
    (--quick: 2.5 s)."""
    assert ctx.c.info is not None
    eff = np.asarray(ctx.c.info.limits.effort, float)
    if not ctx.settle(start):
        res.unreached.append(name)
    dq = out - start
    seconds = 2.5 if ctx.quick else 4.0
    if mode == "position":
        fn: Callable[[float], Vec] = lambda t: out  # noqa: E731
    elif mode == "velocity":  # the fastest joint at 0.6x its limit, the others in proportion
        v = dq / np.abs(dq).max() * 0.6 * float(ctx.meter.vmax[np.abs(dq).argmax()])
        fn = lambda t: v  # noqa: E731
    else:  # torque: half the effort limit on each joint that must move, nothing elsewhere
        tau = np.where(np.abs(dq) > 0.05, np.sign(dq) * 0.5 * eff, 0.0)
        fn = lambda t: tau  # noqa: E731
    run = hostile(ctx, f"box {mode} from {name}", seconds, fn, mode)
    res.add(f"{mode} from {name}", run, _held_mm(ctx), ctx.safe)
    ctx.after(f"box {mode} from {name}")


def _box_policy(ctx: Ctx, res: BoxResult) -> None:
    """A policy whose output is the outside target, uploaded once, re-run after each stop."""
    if not ctx.settle(READY):
        res.unreached.append("policy from ready")
    c = ctx.c
    onnx = constant_model(OUTSIDE, 2 * len(OUTSIDE))
    owner = [c]
    c.upload_policy(onnx, SPEC)

    def rerun(cl: RobotClient) -> None:
        if cl is not owner[0]:  # the lab dropped the uploader: upload again on the new link
            owner[0] = cl
            cl.take_control()
            cl.upload_policy(onnx, SPEC)
        cl.take_control()
        cl.run_policy(ramp_s=0.0)

    try:
        rerun(c)
    except DeviceError as exc:  # refused: the stream below tries again after each stop
        ctx.tally.note(exc)
    run = hostile(ctx, "box policy from ready", 2.5 if ctx.quick else 4.0, restart=rerun)
    try:
        ctx.c.stop()
    except DeviceError as exc:
        ctx.tally.note(exc)
    res.add("policy from ready", run, _held_mm(ctx), ctx.safe)
    ctx.after("box policy from ready")


def box_attacks(ctx: Ctx) -> BoxResult:
    """Streams towards a target outside the box: position mode from the ready pose and near
    each reachable face (--quick: the back face only), velocity and torque mode from the
    ready pose (and the back face), and a policy from the ready pose."""
    res = BoxResult()
    starts = [("ready", READY, OUTSIDE)]
    faces = ["x-"] if ctx.quick else list(FACES)
    starts += [(f"face {f}", np.asarray(FACES[f][0]), np.asarray(FACES[f][1])) for f in faces]
    every_mode = ("position", "velocity", "torque")
    for name, start, out in starts:  # every mode from ready (and the back face: full run)
        full = name == "ready" or (name == "face x-" and not ctx.quick)
        for mode in every_mode if full else ("position",):
            ctx.attempt(f"box {mode} from {name}", _box_attack, ctx, res, name, start, out, mode)
    ctx.attempt("box policy", _box_policy, ctx, res)
    return res


# -- 2. random position streams, 3. dragged joints ----------------------------------------


@dataclass
class MotionResult:
    runs: int = 0
    velocity_ratio: float = 0.0
    overshoot_rad: float = 0.0
    stops: int = 0

    def add(self, meter: Meter, run: Run) -> None:
        r, o = motion_stats(meter, run.states)
        self.runs += 1
        self.velocity_ratio = max(self.velocity_ratio, r)
        self.overshoot_rad = max(self.overshoot_rad, o)
        self.stops += run.stops


def random_streams(ctx: Ctx, runs: int, seconds: float = 3.0) -> MotionResult:
    """`runs` streams of ~3 s: a new random target within the joint limits every 0.2 s,
    streamed at 100 Hz, one after another from wherever the last one ended (seed 12)."""
    res = MotionResult()
    rng = np.random.default_rng(12)
    m = ctx.meter
    ctx.settle(READY)
    for k in range(runs):
        targets = rng.uniform(m.lo, m.hi, size=(int(np.ceil(seconds / 0.2)), len(m.lo)))

        def fn(t: float, targets: Vec = targets) -> Vec:
            return targets[min(int(t / 0.2), len(targets) - 1)]

        res.add(m, hostile(ctx, f"random stream {k}", seconds, fn, "position"))
    ctx.after("random streams")
    return res


DRAG_PATTERNS = ((1, 1, 1, 1), (-1, -1, -1, -1), (1, -1, 1, -1), (-1, 1, -1, 1))


def dragged_joints(ctx: Ctx, patterns: int, seconds: float = 2.4) -> MotionResult:
    """Velocity mode: joints 1-4 at 1.5x their speed limit towards their limits (each
    direction pattern, reversed half-way), joints 5-7 commanded 0; re-acquire after stops."""
    res = MotionResult()
    m = ctx.meter
    for k, signs in enumerate(DRAG_PATTERNS[:patterns]):
        ctx.settle(READY)
        v = np.zeros(len(m.vmax))
        v[:4] = np.asarray(signs, float) * 1.5 * m.vmax[:4]

        def fn(t: float, v: Vec = v) -> Vec:
            return v if t < seconds / 2 else -v

        res.add(m, hostile(ctx, f"dragged joints {signs}", seconds, fn, "velocity"))
        ctx.after(f"dragged joints {k}")
    return res


# -- 6. policy swap ----------------------------------------------------------------------------


def _swap_once(ctx: Ctx, watcher: RobotClient, watcher_stops_first: bool) -> tuple[bool, float]:
    """The operator uploads a model that holds the current pose; the watcher uploads one
    that moves joint 1 by 0.6 rad (while the operator controls the robot, or, with
    `watcher_stops_first`, after stopping it: any client may stop); the operator runs its
    policy. (watcher's upload accepted while the operator controlled, measured motion)."""
    ctx.settle(READY)
    c = ctx.c
    q0 = c.latest_state().joint_pos.copy()
    c.take_control()
    c.upload_policy(constant_model(q0, 2 * len(q0)), SPEC)
    if watcher_stops_first:
        watcher.stop(reason="bench: the watcher stops the robot")
    move = q0.copy()
    move[0] += 0.6
    accepted = False
    try:
        watcher.upload_policy(constant_model(move, 2 * len(q0)), SPEC)
        accepted = not watcher_stops_first
    except DeviceError as exc:
        ctx.tally.note(exc)
    with c.recording() as rec:
        try:
            c.take_control()
            c.run_policy(ramp_s=0.3)
        except DeviceError as exc:
            ctx.tally.note(exc)
        time.sleep(1.5)
    ctx.meter.episode = "policy swap"
    ctx.meter.add(rec)
    c.stop()
    moved = max((float(np.abs(np.asarray(m["joint_pos"]) - q0).max()) for m in rec), default=0.0)
    return accepted, moved


def policy_swap(ctx: Ctx) -> dict[str, Any]:
    """`policy_swap_accepted` 1 if a watcher's upload was accepted while the operator held
    the robot, or if the operator's run moved the arm over 0.05 rad (its model holds still)."""
    watcher = ctx.client("watcher")
    accepted, moved = False, 0.0
    try:
        for stops_first in (False, True):
            a, m = ctx.attempt("policy swap", _swap_once, ctx, watcher, stops_first, default=(0, 0))
            accepted, moved = accepted or bool(a), max(moved, m)
    finally:
        ctx.tally.drain(watcher)
        watcher.close()
    ctx.attempt("policy swap back", ctx.after, "policy swap")
    return {"policy_swap_accepted": int(accepted or moved > 0.05), "policy_swap_moved_rad": moved}


# -- 4. slow, never-ending and failing models against the policy watchdog --------------------


@dataclass
class PolicyTiming:
    """Policy watchdog figures on the measured stream (t and mode of the states)."""

    late_ms: float | None = None  # worst (stop's t) - (first policy state's t + timeout)
    tick_gap_ms: float = 0.0  # longest gap between consecutive states during the attacks
    runs: int = 0  # runs measured
    missed: int = 0  # runs with no stop within the watch window (late_ms counts the window)
    upload_hangs: int = 0  # uploads without an answer within 5 s
    upload_answers: list[str] = field(default_factory=list)  # "ok" or the error code
    first_inference_error: str = ""  # code for a model that fails at its first inference
    per_trip_s: float = 0.0  # one Loop step of the slow models, measured here


def tick_gap_ms(states: list[Msg]) -> float:
    """Longest gap (ms) between the `t` of consecutive control ticks (consecutive seq)."""
    gaps = [
        b["t"] - a["t"]
        for a, b in zip(states, states[1:], strict=False)
        if b.get("seq") == a.get("seq", -9) + 1
    ]
    return max(gaps, default=0.0) * 1e3


def _policy_timeout_s(c: RobotClient) -> float:
    """The agent's policy watchdog deadline (None in its config: 5 control periods)."""
    assert c.info is not None
    pt = c.status()["watchdog"].get("policy_timeout_s")
    return float(pt) if pt is not None else 5.0 / c.info.control_rate_hz


def _upload(ctx: Ctx, onnx: bytes, timeout_s: float = 5.0) -> str:
    """Upload with a deadline: "ok", the error code, or "hang" (no answer: the client is
    closed, since its session may be stuck in the model)."""
    c = ctx.c
    old, c.request_timeout_s = c.request_timeout_s, timeout_s
    try:
        c.take_control()
        c.upload_policy(onnx, SPEC)
        return "ok"
    except DeviceError as exc:
        code = ctx.tally.note(exc)
        if code is None and "no reply" in str(exc):
            c.close()
            return "hang"
        return code or "error"
    finally:
        c.request_timeout_s = old


def _watch_run(ctx: Ctx, res: PolicyTiming, timeout_s: float, rec: list[Msg]) -> None:
    """Run the uploaded policy and time the watchdog stop on the measured stream: the last
    state in `policy` mode with a command sent (the policy's last output) starts the clock,
    the first `stopped` after it ends it."""
    c = ctx.c
    start = len(rec)
    try:
        c.take_control()
        c.run_policy(ramp_s=0.0)
    except DeviceError as exc:  # refused to run it: nothing to time
        ctx.tally.note(exc)
        res.upload_answers.append(f"run {error_code(exc) or 'error'}")
        return
    time.sleep(0.6)
    states = rec[start:]
    modes = [m.get("mode") for m in states]
    if "policy" not in modes:
        return
    i = modes.index("policy")
    j = next((k for k in range(i, len(states)) if modes[k] in ("stopped", "estop")), None)
    res.missed += j is None
    end = j if j is not None else len(states) - 1
    # the deadline runs from the policy's last output: the last tick in `policy` mode whose
    # state carries a command sent to the actuators (a late output sends none)
    fed = [k for k in range(i, end) if modes[k] == "policy" and states[k].get("command")]
    t_last = states[fed[-1] if fed else i]["t"]
    late = (states[end]["t"] - t_last - timeout_s) * 1e3
    res.late_ms = late if res.late_ms is None else max(res.late_ms, late)
    res.runs += 1
    if j is None:
        c.stop()


def _model_runs(ctx: Ctx, res: PolicyTiming, onnx: bytes, runs: int = 2) -> None:
    """Upload `onnx` and run it, `runs` times (uploaded again before each run), while a
    watch-only client records the stream (it outlives an uploader stuck in the model)."""
    timeout_s = _policy_timeout_s(ctx.c)
    watch = ctx.client("policy-watch")
    try:
        with watch.recording() as rec:
            for _ in range(runs):
                ctx.settle(READY)  # back where the model is fast, as at its first upload
                answer_ = _upload(ctx, onnx)
                res.upload_answers.append(answer_)
                if answer_ == "hang":
                    res.upload_hangs += 1
                    time.sleep(0.5)  # the loop's gaps meanwhile still count
                    break
                if answer_ == "ok":
                    _watch_run(ctx, res, timeout_s, rec)
        res.tick_gap_ms = max(res.tick_gap_ms, tick_gap_ms(rec))
    finally:
        ctx.tally.drain(watch)
        watch.close()


def slow_models(ctx: Ctx, res: PolicyTiming) -> None:
    """A model failing at its first inference, then one fast at the upload's probe and
    ~100 ms per inference once it has moved the arm, run twice."""
    ctx.settle(READY)
    c = ctx.c
    q0 = c.latest_state().joint_pos.copy()
    dim = 2 * len(q0)
    answer_ = _upload(ctx, failing_model(len(q0), dim))
    res.first_inference_error = "accepted" if answer_ == "ok" else answer_
    res.per_trip_s = seconds_per_trip(dim)
    ctx.settle(READY)
    trips = int(0.1 / res.per_trip_s)
    _model_runs(ctx, res, slow_model(_moved(READY), dim, trips, gate_at=READY, gate_rad=GATE))
    ctx.c.stop()


def never_ending(ctx: Ctx, res: PolicyTiming) -> None:
    """A model fast at the upload's probe whose inference takes ~3 minutes once it has
    moved the arm, uploaded and run twice (the agent must kill it)."""
    ctx.settle(READY)
    c = ctx.c
    q0 = c.latest_state().joint_pos.copy()
    per_trip = res.per_trip_s or seconds_per_trip(2 * len(q0))
    dim, trips = 2 * len(q0), int(180.0 / per_trip)
    _model_runs(ctx, res, slow_model(_moved(READY), dim, trips, gate_at=READY, gate_rad=GATE))


GATE = 0.15  # rad, summed over the joints: more than `settle` leaves (0.02 rad per joint)


def _moved(q0: Vec) -> Vec:
    """A target 0.4 rad from q0 on the first joint: the policy moves the arm (and so turns
    its own gated loop on, GATE from where it was uploaded)."""
    q = np.asarray(q0, float).copy()
    q[0] += 0.4 if q[0] < 0 else -0.4
    return q
