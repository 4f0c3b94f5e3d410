"""The safety envelope: every command passes through it, whatever its source.

Checks, in order: NaN/inf (always stops), joint position limits, joint velocity limits,
maximum change per control tick, joint effort limits (torque commands, and measured effort),
and the end-effector workspace box (via the driver's forward kinematics). On a violation the
envelope either clamps the command to the nearest safe value or asks for a stop, as
configured, and always reports which limits acted.

Limits default to the robot's own (`RobotInfo.limits`; workspace box from
`RobotInfo.meta["workspace"] = {"lower": [x, y, z], "upper": [x, y, z]}` when present). A
configuration sent with a policy may only tighten them (`SafetyConfig.tightened`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.driver import RobotInfo, RobotState

Vec = NDArray[np.float64]
OnViolation = Literal["clamp", "stop"]
LIMIT_NAMES = ("nonfinite", "position", "velocity", "max_step", "effort", "workspace")


@dataclass(frozen=True)
class SafetyConfig:
    """How strict the envelope is. Scales are fractions of the robot's limits (<= 1)."""

    on_violation: OnViolation = "clamp"
    position_margin: float = 0.0  # rad kept clear of each joint limit
    velocity_scale: float = 1.0
    effort_scale: float = 1.0
    max_step: tuple[float, ...] | None = (
        None  # per joint, per tick (rad or rad/s); None: from limits
    )
    velocity_ramp_s: float = 0.1  # velocity commands reach full speed no faster than this
    workspace_lower: tuple[float, float, float] | None = None  # m, robot base frame
    workspace_upper: tuple[float, float, float] | None = None
    measured_effort_factor: float | None = 1.5  # stop when |measured effort| > factor * limit

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
            for f in fields(self)
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "safety config") -> SafetyConfig:
        """Build from a dict (unknown keys are an error, so typos cannot disable a limit)."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise DeviceError(
                f"{where}: unknown safety setting(s) {sorted(unknown)} (known: {sorted(known)})"
            )
        kw: dict[str, Any] = {}
        try:
            for k, v in d.items():
                if v is None:
                    kw[k] = None
                elif k in ("max_step", "workspace_lower", "workspace_upper"):
                    kw[k] = tuple(float(x) for x in v)
                elif k == "on_violation":
                    if v not in ("clamp", "stop"):
                        raise ValueError(f"on_violation must be 'clamp' or 'stop', not {v!r}")
                    kw[k] = v
                else:
                    kw[k] = float(v)
        except (TypeError, ValueError) as exc:
            raise DeviceError(f"{where}: {exc}") from None
        cfg = cls(**kw)
        for name in ("velocity_scale", "effort_scale"):
            if not 0 < getattr(cfg, name) <= 1:
                raise DeviceError(f"{where}: {name} must be in (0, 1], got {getattr(cfg, name)}")
        if cfg.position_margin < 0 or cfg.velocity_ramp_s < 0:
            raise DeviceError(f"{where}: position_margin and velocity_ramp_s must be >= 0")
        return cfg

    def tightened(self, other: SafetyConfig) -> SafetyConfig:
        """`other` combined with self so that no limit gets looser than self's."""

        def tighter_box(a: Any, b: Any, fn: Callable[..., Any]) -> Any:
            if a is None or b is None:
                return a if b is None else b
            return tuple(float(x) for x in fn(a, b))

        step = (
            self.max_step
            if other.max_step is None
            else (
                other.max_step
                if self.max_step is None
                else tuple(float(x) for x in np.minimum(self.max_step, other.max_step))
            )
        )
        mef = [f for f in (self.measured_effort_factor, other.measured_effort_factor) if f]
        return replace(
            self,
            on_violation="stop" if "stop" in (self.on_violation, other.on_violation) else "clamp",
            position_margin=max(self.position_margin, other.position_margin),
            velocity_scale=min(self.velocity_scale, other.velocity_scale),
            effort_scale=min(self.effort_scale, other.effort_scale),
            max_step=step,
            velocity_ramp_s=max(self.velocity_ramp_s, other.velocity_ramp_s),
            workspace_lower=tighter_box(self.workspace_lower, other.workspace_lower, np.maximum),
            workspace_upper=tighter_box(self.workspace_upper, other.workspace_upper, np.minimum),
            measured_effort_factor=min(mef) if mef else None,
        )


def default_config(info: RobotInfo) -> SafetyConfig:
    """The envelope the agent starts with: the robot's limits and workspace box."""
    ws = info.meta.get("workspace") if isinstance(info.meta, dict) else None
    if isinstance(ws, dict) and "lower" in ws and "upper" in ws:
        return SafetyConfig(
            workspace_lower=tuple(float(x) for x in ws["lower"]),  # type: ignore[arg-type]
            workspace_upper=tuple(float(x) for x in ws["upper"]),
        )  # type: ignore[arg-type]
    return SafetyConfig()


@dataclass(frozen=True)
class SafetyResult:
    """What the envelope decided for one command."""

    command: Vec  # the command to send (valid only when stop is None)
    acted: tuple[str, ...]  # names of the limits that changed or refused the command
    stop: str | None  # a human-readable reason when the robot must stop instead


class SafetyEnvelope:
    """Applies `SafetyConfig` for one robot at control period `dt` (s)."""

    def __init__(
        self,
        info: RobotInfo,
        config: SafetyConfig | None = None,
        fk: Callable[[Vec], Vec | None] | None = None,
    ) -> None:
        self.info = info
        self.dt = 1.0 / float(info.control_rate_hz)
        self.fk = fk
        self.configure(config or default_config(info))

    def configure(self, config: SafetyConfig) -> None:
        lim = self.info.limits
        n = len(self.info.joint_names)
        self.config = config
        self.lower = np.asarray(lim.lower, float) + config.position_margin
        self.upper = np.asarray(lim.upper, float) - config.position_margin
        if np.any(self.lower > self.upper):
            raise DeviceError(
                f"safety config: position_margin {config.position_margin} rad "
                "leaves no room between the joint limits"
            )
        self.vmax = np.asarray(lim.velocity, float) * config.velocity_scale
        self.effmax = np.asarray(lim.effort, float) * config.effort_scale
        self.step_pos = self.vmax * self.dt
        self.step_vel = self.vmax * self.dt / max(config.velocity_ramp_s, self.dt)
        self.step_is_config = False
        if config.max_step is not None:
            ms = np.asarray(config.max_step, float)
            if ms.shape != (n,) or np.any(ms <= 0):
                raise DeviceError(f"safety config: max_step must be {n} positive values")
            self.step_is_config = bool(np.any(ms < self.step_pos))
            self.step_pos = np.minimum(self.step_pos, ms)
            self.step_vel = np.minimum(self.step_vel, ms)
        self.box: tuple[Vec, Vec] | None = None
        if config.workspace_lower is not None and config.workspace_upper is not None:
            self.box = (
                np.asarray(config.workspace_lower, float),
                np.asarray(config.workspace_upper, float),
            )

    def in_workspace(self, joint_pos: Vec) -> bool:
        """True when there is no box, no kinematics, or the end effector is inside the box."""
        if self.box is None or self.fk is None:
            return True
        p = self.fk(joint_pos)
        if p is None:
            return True
        return bool(np.all(p >= self.box[0]) and np.all(p <= self.box[1]))

    def apply(self, mode: str, command: Vec, state: RobotState, prev: Vec) -> SafetyResult:
        """Check `command` (mode: position | velocity | torque) given the measured `state` and
        the previous command actually sent `prev` (for position: the previous target, or the
        measured position when motion starts; for velocity: the previous velocity)."""
        if not np.all(np.isfinite(command)):
            bad = [self.info.joint_names[i] for i in np.flatnonzero(~np.isfinite(command))]
            return SafetyResult(prev, ("nonfinite",), f"command has NaN/inf for {', '.join(bad)}")
        mef = self.config.measured_effort_factor
        if mef is not None and np.any(np.abs(state.joint_effort) > mef * self.effmax):
            j = int(np.argmax(np.abs(state.joint_effort) / self.effmax))
            return SafetyResult(
                prev,
                ("effort",),
                f"measured effort {state.joint_effort[j]:.1f} "
                f"N*m on {self.info.joint_names[j]} exceeds {mef:g}x its limit",
            )
        if mode == "position":
            return self._position(command, prev)
        if mode == "velocity":
            return self._velocity(command, state, prev)
        if mode == "torque":
            return self._torque(command, state)
        return SafetyResult(prev, (), f"command mode '{mode}' is not supported by the envelope")

    def _finish(self, out: Vec, acted: list[str]) -> SafetyResult:
        if acted and self.config.on_violation == "stop":
            return SafetyResult(out, tuple(acted), f"{', '.join(acted)} limit exceeded")
        return SafetyResult(out, tuple(acted), None)

    def _position(self, cmd: Vec, prev: Vec) -> SafetyResult:
        acted: list[str] = []
        out = np.clip(cmd, self.lower, self.upper)
        if np.any(out != cmd):
            acted.append("position")
        step = np.clip(out - prev, -self.step_pos, self.step_pos)
        if np.any(step != out - prev):
            acted.append("max_step" if self.step_is_config else "velocity")
            out = prev + step
            # prev itself may lie outside tightened limits; never leave the allowed range
            np.clip(out, np.minimum(prev, self.lower), np.maximum(prev, self.upper), out=out)
        if not self.in_workspace(out):
            acted.append("workspace")
            out = prev.copy()
        return self._finish(out, acted)

    def _velocity(self, cmd: Vec, state: RobotState, prev: Vec) -> SafetyResult:
        acted: list[str] = []
        out = np.clip(cmd, -self.vmax, self.vmax)
        if np.any(out != cmd):
            acted.append("velocity")
        step = np.clip(out - prev, -self.step_vel, self.step_vel)
        if np.any(step != out - prev):
            acted.append("max_step")
            out = prev + step
        q_next = state.joint_pos + out * self.dt
        leaving = ((q_next > self.upper) & (out > 0)) | ((q_next < self.lower) & (out < 0))
        if np.any(leaving):
            acted.append("position")
            out = np.where(leaving, 0.0, out)
        if not self.in_workspace(state.joint_pos + out * self.dt):
            acted.append("workspace")
            out = np.zeros_like(out)
        return self._finish(out, acted)

    def _torque(self, cmd: Vec, state: RobotState) -> SafetyResult:
        acted: list[str] = []
        out = np.clip(cmd, -self.effmax, self.effmax)
        if np.any(out != cmd):
            acted.append("effort")
        q = state.joint_pos
        if np.any(q > self.upper) or np.any(q < self.lower):
            return SafetyResult(
                out, (*acted, "position"), "joint outside its position limits under torque control"
            )
        if not self.in_workspace(q):
            return SafetyResult(out, (*acted, "workspace"), "end effector left the workspace box")
        return self._finish(out, acted)
