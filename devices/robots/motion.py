"""A planned joint motion (`Motion`: joint targets over time, previewable before anything
moves) and the limits it must fit (`Limits`, from the robot's info and the agent's safety
settings): `check_motion` names the joint, time and limit a plan breaks; `require_fits`
refuses it. The excitation library (devices/robots/excitation.py) and the pushes
(twins/pushes.py) plan them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from devices.errors import DeviceError
from devices.robots.agent.safety_config import SafetyConfig
from devices.robots.wire.robot_types import RobotInfo
from devices.trajectory import Trajectory

Vec = NDArray[np.float64]

POSITION_MARGIN = 0.05  # rad kept clear of every joint limit
SOFT_SPEED = 0.9  # the envelope moves position targets at most at 0.9 x the speed limit
DEFAULT_MAX_ACCEL = SafetyConfig.max_accel  # rad/s^2: the agent envelope's default
ACCEL_USE = 0.8  # share of max_accel a plan may use


class MotionError(DeviceError):
    """A motion cannot be planned or does not fit the robot (message says which and why)."""


@dataclass(frozen=True)
class Limits:
    """What a plan must respect, per joint (SI units): position window, speed, acceleration
    of position targets, effort (torque-commanded motions)."""

    lower: Vec
    upper: Vec
    velocity: Vec
    accel: Vec
    effort: Vec


def limits_for(info: RobotInfo, safety: Mapping[str, Any] | None = None) -> Limits:
    """A robot's limits as a plan must see them: its own limits narrowed by the envelope
    settings it reports (`RobotClient.status()["safety"]`, when given) and kept
    `POSITION_MARGIN` clear of each position limit."""
    s = dict(safety or {})
    lim = info.limits
    span = np.asarray(lim.upper, float) - np.asarray(lim.lower, float)
    margin = np.minimum(POSITION_MARGIN, 0.05 * span) + float(s.get("position_margin") or 0.0)
    vscale = float(s.get("velocity_scale") or 1.0) * SOFT_SPEED
    accel = float(s.get("max_accel") or DEFAULT_MAX_ACCEL) * ACCEL_USE
    n = len(info.joint_names)
    return Limits(
        np.asarray(lim.lower, float) + margin,
        np.asarray(lim.upper, float) - margin,
        np.asarray(lim.velocity, float) * vscale,
        np.full(n, accel),
        np.asarray(lim.effort, float) * float(s.get("effort_scale") or 1.0),
    )


@dataclass(frozen=True)
class Motion:
    """A planned joint command: `command[k]` at `t[k]` seconds after the start, in `mode`
    ("position": rad or m; "torque": N*m or N), for `joint_names` in the robot's order.
    `name` is the library entry, `params` the parameters it was planned with."""

    name: str
    params: Mapping[str, Any]
    t: Vec
    command: Vec
    joint_names: tuple[str, ...]
    mode: str = "position"
    description: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def duration(self) -> float:
        return float(self.t[-1])

    @property
    def start(self) -> Vec:
        return np.asarray(self.command[0], float)

    def at(self, t: float | ArrayLike) -> Vec:
        """Joint command at time(s) `t` (linear between plan samples, held past the ends)."""
        tt = np.asarray(t, float)
        out = np.stack([np.interp(tt, self.t, self.command[:, j]) for j in range(self.n)], -1)
        return np.asarray(out, float)

    @property
    def n(self) -> int:
        return int(self.command.shape[1])

    def moved_joints(self, tol: float = 1e-9) -> list[str]:
        """Joints whose command changes during the motion."""
        span = np.ptp(self.command, axis=0)
        return [j for j, s in zip(self.joint_names, span, strict=True) if s > tol]

    def to_trajectory(self) -> Trajectory:
        """The plan as a sim-side Trajectory (`robot/command`), e.g. for a twin to replay."""
        unit = "rad" if self.mode == "position" else "N*m"
        return Trajectory(
            self.t,
            {"robot/command": self.command},
            {"robot/command": unit},
            "sim",
            {
                "motion": self.name,
                "motion_params": dict(self.params),
                "joint_names": list(self.joint_names),
                "command_joints": list(self.joint_names),
                "command_mode": self.mode,
            },
        )

    def summary(self) -> str:
        moved = self.moved_joints()
        return (
            f"{self.name}: {self.duration:.1f} s, {self.mode} commands, moves "
            f"{len(moved)} joint(s) {', '.join(moved) or '(none)'}"
        )


# -- checks ----------------------------------------------------------------------------------
def derivatives(t: Vec, q: Vec) -> tuple[Vec, Vec]:
    """Velocity and acceleration of sampled joint values (central differences)."""
    qd = np.gradient(q, t, axis=0)
    qdd = np.gradient(qd, t, axis=0)
    return np.asarray(qd), np.asarray(qdd)


def check_motion(motion: Motion, limits: Limits, tol: float = 1e-6) -> list[str]:
    """Every way the sampled plan leaves the limits, as sentences naming the joint, the time,
    the value and the limit; [] when it fits."""
    out: list[str] = []
    q, t = motion.command, motion.t
    if not np.all(np.isfinite(q)):
        return [f"motion '{motion.name}': the plan contains NaN/inf"]
    if motion.mode == "torque":
        checks = [("effort", np.abs(q), limits.effort, "N*m")]
    else:
        qd, qdd = derivatives(t, q)
        checks = [
            ("velocity", np.abs(qd), limits.velocity, "rad/s"),
            ("acceleration", np.abs(qdd), limits.accel, "rad/s^2"),
        ]
        for j, name in enumerate(motion.joint_names):
            lo, hi = limits.lower[j], limits.upper[j]
            # a joint that starts inside the margin may stay there or move back out of it
            out_by = np.maximum(lo - q[:, j], 0.0) + np.maximum(q[:, j] - hi, 0.0)
            bad = out_by > out_by[0] + tol
            if bad.any():
                k = int(np.argmax(bad))
                out.append(
                    f"motion '{motion.name}': joint {name} reaches {q[k, j]:.4f} rad at "
                    f"t={t[k]:.2f} s, outside its window [{lo:.4f}, {hi:.4f}] rad"
                )
    for what, val, lim, unit in checks:
        for j, name in enumerate(motion.joint_names):
            bad = val[:, j] > lim[j] * (1 + 1e-6) + tol
            if bad.any():
                k = int(np.argmax(val[:, j]))
                out.append(
                    f"motion '{motion.name}': joint {name} {what} {val[k, j]:.3f} {unit} at "
                    f"t={t[k]:.2f} s exceeds its limit {lim[j]:.3f} {unit}"
                )
    return out


def require_fits(motion: Motion, limits: Limits) -> None:
    """MotionError listing every violation when the plan leaves the limits."""
    problems = check_motion(motion, limits)
    if problems:
        raise MotionError("; ".join(problems[:6]) + ("" if len(problems) <= 6 else " …"))


# -- shapes ----------------------------------------------------------------------------------
