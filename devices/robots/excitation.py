"""Excitation motions: what a robot is asked to do so a recording teaches the twin something.

    motion = plan("chirp", info, start_q, amplitude=0.2, duration=8.0)
    problems = check_motion(motion, limits_for(info, safety))   # [] when it fits
    motion.at(t)                                                # joint targets at t (s)

Every motion is a planned joint-command trajectory (`Motion`), previewable before anything
moves, that starts and ends at rest at the start pose. Amplitudes are chosen so the plan
stays inside the robot's limits by construction: `amplitude` is a fraction of each joint's
half range (capped by the room left around the start pose), `velocity` a fraction of its
speed limit, and accelerations stay under the envelope's `max_accel` (position targets
that accelerate faster are reshaped robot-side, so the recorded command would differ from
the plan). `check_motion` then verifies the sampled plan, so a motion that does not fit is
refused with the joint, time and limit named.

The registry `EXCITATIONS` (one entry per motion family, each with `defaults` and a
planner) holds joint-space motions; end-effector pushes need the robot's kinematics and
live in twins/pushes.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from devices.robots.motion import (
    Limits,
    Motion,
    MotionError,
    derivatives,
    limits_for,
    require_fits,
)
from devices.robots.wire.robot_types import RobotInfo

Vec = NDArray[np.float64]
PLAN_RATE_HZ = 250.0
GRIPPER_WORDS = ("finger", "gripper")


def _taper(t: Vec, duration: float, ramp_s: float) -> Vec:
    """1 in the middle, raised-cosine ramps of `ramp_s` at both ends (0 and flat at the ends)."""
    r = max(min(ramp_s, duration / 2), 1e-6)
    w = np.ones_like(t)
    a, b = t < r, t > duration - r
    w[a] = 0.5 - 0.5 * np.cos(np.pi * t[a] / r)
    w[b] = 0.5 - 0.5 * np.cos(np.pi * (duration - t[b]) / r)
    return w


def _scale_to_limits(
    t: Vec,
    shape: Vec,
    start: Vec,
    sel: Sequence[int],
    names: Sequence[str],
    amps: tuple[Vec, Vec, Vec],
) -> tuple[Vec, list[str]]:
    """start + a_j * shape_j with the largest a_j whose peak offset, speed and acceleration
    stay within `pos_amp`, `vel_amp` and `acc` (the shape's own peaks, measured on the grid)."""
    q = np.repeat(start[None, :], len(t), axis=0)
    notes = []
    qd, qdd = derivatives(t, shape)
    for j in sel:
        peaks = (
            float(np.max(np.abs(shape[:, j]))),
            float(np.max(np.abs(qd[:, j]))),
            float(np.max(np.abs(qdd[:, j]))),
        )
        caps = [float(c[j]) / p for c, p in zip(amps, peaks, strict=True) if p > 0]
        a = max(min(caps), 0.0) if caps else 0.0
        if a <= 0:
            notes.append(f"joint {names[j]} has no room to move around its start pose")
        q[:, j] = start[j] + a * shape[:, j]
    return q, notes


def _selected(info: RobotInfo, joints: Any) -> list[int]:
    names = list(info.joint_names)
    if joints in (None, "", "all", ()):
        return [i for i, n in enumerate(names) if not _is_gripper(n)] or list(range(len(names)))
    items = joints.split(",") if isinstance(joints, str) else list(joints)
    out = []
    for it in items:
        s = str(it).strip()
        if s in names:
            out.append(names.index(s))
        elif s.isdigit() and 0 <= int(s) < len(names):
            out.append(int(s))
        else:
            raise MotionError(
                f"robot {info.name}: no joint '{s}' (joints: {', '.join(names)}, or 0-based "
                "indices)"
            )
    return sorted(set(out))


def _is_gripper(name: str) -> bool:
    return any(w in name.lower() for w in GRIPPER_WORDS)


def _amplitudes(
    info: RobotInfo, limits: Limits, start: Vec, amplitude: float, velocity: float
) -> tuple[Vec, Vec]:
    if not 0 < amplitude <= 1:
        raise MotionError(f"amplitude must be in (0, 1] (fraction of joint range), got {amplitude}")
    if not 0 < velocity <= 1:
        raise MotionError(f"velocity must be in (0, 1] (fraction of speed limit), got {velocity}")
    half = (np.asarray(info.limits.upper, float) - np.asarray(info.limits.lower, float)) / 2
    room = np.maximum(np.minimum(start - limits.lower, limits.upper - start), 0.0)
    return np.minimum(amplitude * half, room), velocity * limits.velocity


def _grid(duration: float, rate_hz: float = PLAN_RATE_HZ) -> Vec:
    if not (0.5 <= duration <= 55.0):
        raise MotionError(f"duration must be within 0.5-55 s, got {duration:g} s")
    return np.arange(int(round(duration * rate_hz)) + 1) / rate_hz


def _torque_ok(info: RobotInfo) -> bool:
    return "position" not in info.command_modes and "torque" in info.command_modes


def _finish(
    name: str,
    params: Mapping[str, Any],
    info: RobotInfo,
    limits: Limits,
    t: Vec,
    shape: Vec,
    start: Vec,
    sel: Sequence[int],
    description: str,
) -> Motion:
    if _torque_ok(info):  # torque-driven robots (pendulums): the shape scaled to the effort
        amp = float(params["amplitude"]) * limits.effort
        u = np.zeros_like(shape)
        for j in sel:
            peak = float(np.max(np.abs(shape[:, j]))) or 1.0
            u[:, j] = amp[j] * shape[:, j] / peak
        return Motion(name, dict(params), t, u, tuple(info.joint_names), "torque", description)
    if "position" not in info.command_modes:
        raise MotionError(
            f"robot {info.name} accepts {list(info.command_modes)} commands; excitation "
            "motions need position (or torque) commands"
        )
    pos, vel = _amplitudes(info, limits, start, params["amplitude"], params["velocity"])
    names = tuple(info.joint_names)
    q, notes = _scale_to_limits(t, shape, start, sel, names, (pos, vel, limits.accel))
    m = Motion(name, dict(params), t, q, names, "position", description, tuple(notes))
    require_fits(m, limits)
    return m


# -- the motion families -----------------------------------------------------------------------
def chirp(info: RobotInfo, start: Vec, limits: Limits, **p: Any) -> Motion:
    """Sine sweeps from f0 to f1 (Hz, logarithmic), all selected joints at once, each joint
    phase-shifted so their responses can be told apart."""
    t = _grid(float(p["duration"]))
    dur = float(t[-1])
    f0, f1 = float(p["f0"]), float(p["f1"])
    if not 0 < f0 < f1:
        raise MotionError(f"chirp: need 0 < f0 < f1, got f0={f0:g} Hz, f1={f1:g} Hz")
    k = math.log(f1 / f0) / dur
    phase = 2 * np.pi * f0 * (np.exp(k * t) - 1) / k
    sel = _selected(info, p.get("joints"))
    shape = np.zeros((len(t), len(info.joint_names)))
    w = _taper(t, dur, float(p["ramp_s"]))
    for i, j in enumerate(sel):
        shape[:, j] = w * np.sin(phase + 2 * np.pi * i / max(len(sel), 1))
    return _finish("chirp", p, info, limits, t, shape, start, sel, chirp.__doc__ or "")


def multisine(info: RobotInfo, start: Vec, limits: Limits, **p: Any) -> Motion:
    """Sums of sines (Schroeder phases, low crest factor) on harmonics of 1/duration up to
    fmax; each selected joint gets its own interleaved set of harmonics, so the joints'
    contributions separate in frequency."""
    t = _grid(float(p["duration"]))
    dur = float(t[-1])
    sel = _selected(info, p.get("joints"))
    base = 1.0 / dur
    kmax = max(int(float(p["fmax"]) / base), len(sel))
    rng = np.random.default_rng(int(p["seed"]))
    shape = np.zeros((len(t), len(info.joint_names)))
    w = _taper(t, dur, float(p["ramp_s"]))
    for i, j in enumerate(sel):
        ks = np.arange(1 + i, kmax + 1, len(sel))
        m = len(ks)
        ph = -np.pi * np.arange(m) * (np.arange(m) + 1) / m + rng.uniform(0, 0.1)
        shape[:, j] = w * np.sum(np.sin(2 * np.pi * base * np.outer(t, ks) + ph), axis=1)
    return _finish("multisine", p, info, limits, t, shape, start, sel, multisine.__doc__ or "")


def _trapezoid(t: Vec, t0: float, dist: float, vmax: float, amax: float) -> tuple[Vec, float]:
    """Minimum-time rest-to-rest profile over `dist` (sign kept) starting at t0; returns the
    offset at times t and the move's duration."""
    d = abs(dist)
    if d == 0:
        return np.zeros_like(t), 0.0
    ta = vmax / amax
    if amax * ta * ta >= d:  # triangular
        ta = math.sqrt(d / amax)
        vmax = amax * ta
    tc = (d - amax * ta * ta) / vmax
    T = 2 * ta + tc
    s = np.clip(t - t0, 0.0, T)
    x = np.where(
        s < ta,
        0.5 * amax * s * s,
        np.where(
            s < ta + tc,
            0.5 * amax * ta * ta + vmax * (s - ta),
            d - 0.5 * amax * (T - s) ** 2,
        ),
    )
    return np.sign(dist) * x, T


def steps(info: RobotInfo, start: Vec, limits: Limits, **p: Any) -> Motion:
    """Fast rest-to-rest moves (+A, back, -A, back) that stop hard at the speed and
    acceleration limits, one joint after another, with holds in between: the joint rings as
    it stops, which shows damping, servo bandwidth and latency."""
    if _torque_ok(info):
        raise MotionError(f"steps: robot {info.name} takes torque commands; use chirp or multisine")
    sel = _selected(info, p.get("joints"))
    hold = float(p["hold_s"])
    pos, vel = _amplitudes(info, limits, start, float(p["amplitude"]), float(p["velocity"]))
    segs: list[tuple[int, float, float, float]] = []  # joint, t0, dist, vmax
    t_now = hold
    for j in sel:
        a = pos[j]
        for dist in (a, -a, -a, a):
            _, T = _trapezoid(np.zeros(1), 0.0, dist, vel[j], limits.accel[j] * 0.999)
            segs.append((j, t_now, dist, vel[j]))
            t_now += T + hold
    t = _grid(max(t_now, 0.5))
    q = np.repeat(start[None, :], len(t), axis=0)
    for j, t0, dist, vmax in segs:
        x, _ = _trapezoid(t, t0, dist, vmax, limits.accel[j] * 0.999)
        q[:, j] += x
    params = {**p, "duration": float(t[-1])}
    m = Motion("steps", params, t, q, tuple(info.joint_names), "position", steps.__doc__ or "")
    require_fits(m, limits)
    return m


def release(info: RobotInfo, start: Vec, limits: Limits, **p: Any) -> Motion:
    """Drop: the arm holds still and the gripper opens (fast, to `amplitude` of its
    opening), releasing what it holds; needs a gripper joint (name with finger/gripper)."""
    grip = [i for i, n in enumerate(info.joint_names) if _is_gripper(n)]
    if not grip:
        raise MotionError(
            f"release: robot {info.name} reports no gripper joint (joints: "
            f"{', '.join(info.joint_names)}); drops need a gripper it can open"
        )
    hold = float(p["hold_s"])
    pos, vel = _amplitudes(info, limits, start, 1.0, float(p["velocity"]))
    segs = []
    t_end = hold
    for j in grip:
        target = start[j] + float(p["amplitude"]) * (limits.upper[j] - start[j])
        _, T = _trapezoid(np.zeros(1), 0.0, target - start[j], vel[j], limits.accel[j] * 0.999)
        segs.append((j, target - start[j]))
        t_end = max(t_end, hold + T)
    t = _grid(max(t_end + float(p["after_s"]), 0.5))
    q = np.repeat(start[None, :], len(t), axis=0)
    for j, dist in segs:
        q[:, j] += _trapezoid(t, hold, dist, vel[j], limits.accel[j] * 0.999)[0]
    params = {**p, "duration": float(t[-1])}
    m = Motion("release", params, t, q, tuple(info.joint_names), "position", release.__doc__ or "")
    require_fits(m, limits)
    return m


Planner = Callable[..., Motion]


@dataclass(frozen=True)
class Excitation:
    """One motion family: a name, what it is for, its default parameters and its planner."""

    name: str
    description: str
    defaults: Mapping[str, Any]
    planner: Planner


_COMMON = {"amplitude": 0.15, "velocity": 0.3, "joints": "all"}
EXCITATIONS: dict[str, Excitation] = {
    "chirp": Excitation(
        "chirp",
        "log sine sweep on every selected joint (f0 to f1 Hz)",
        {**_COMMON, "duration": 8.0, "f0": 0.2, "f1": 1.5, "ramp_s": 1.0},
        chirp,
    ),
    "multisine": Excitation(
        "multisine",
        "sum of sines, interleaved harmonics per joint, up to fmax Hz",
        {**_COMMON, "duration": 8.0, "fmax": 1.2, "seed": 0, "ramp_s": 1.0},
        multisine,
    ),
    "steps": Excitation(
        "steps",
        "fast rest-to-rest moves that stop hard, one joint after another",
        {**_COMMON, "amplitude": 0.05, "velocity": 0.4, "hold_s": 0.6},
        steps,
    ),
    "release": Excitation(
        "release",
        "drop: hold still, open the gripper (robots with a gripper joint)",
        {"amplitude": 1.0, "velocity": 0.5, "hold_s": 0.5, "after_s": 1.5},
        release,
    ),
}


def plan(
    name: str,
    info: RobotInfo,
    start: ArrayLike,
    safety: Mapping[str, Any] | None = None,
    **params: Any,
) -> Motion:
    """Plan library motion `name` for the robot `info` from joint positions `start`, inside
    its limits (and the envelope settings `safety` it reports). Unknown parameters and
    motions are MotionErrors naming what is known."""
    try:
        ex = EXCITATIONS[name]
    except KeyError:
        raise MotionError(
            f"unknown motion '{name}' (library: {', '.join(EXCITATIONS)}; pushes: 'push')"
        ) from None
    unknown = set(params) - set(ex.defaults)
    if unknown:
        raise MotionError(
            f"motion '{name}': unknown parameter(s) {sorted(unknown)} (known: "
            f"{', '.join(ex.defaults)})"
        )
    q0 = np.asarray(start, float).reshape(-1)
    if q0.shape != (len(info.joint_names),) or not np.all(np.isfinite(q0)):
        raise MotionError(
            f"motion '{name}': start pose {q0.tolist()} does not match robot {info.name}'s "
            f"{len(info.joint_names)} joints"
        )
    merged = {**ex.defaults, **{k: v for k, v in params.items() if v is not None}}
    limits = limits_for(info, safety)
    lo, hi = np.asarray(info.limits.lower, float), np.asarray(info.limits.upper, float)
    outside = (q0 < lo - 1e-3) | (q0 > hi + 1e-3)
    if outside.any() and not _torque_ok(info):
        j = int(np.argmax(outside))
        raise MotionError(
            f"motion '{name}': joint {info.joint_names[j]} starts at {q0[j]:.4f}, outside its "
            f"limits [{lo[j]:.4f}, {hi[j]:.4f}]; bring it back inside first"
        )
    return ex.planner(info, q0, limits, **merged)
