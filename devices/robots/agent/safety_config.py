"""How strict the safety envelope is (`SafetyConfig`) and the one it starts with.

Scales are fractions of the robot's limits; a configuration sent with a policy may only
tighten the agent's (`SafetyConfig.tightened`). The envelope itself is `devices.robots.agent.safety`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import numpy as np

from devices.errors import DeviceError
from devices.robots.wire.robot_types import RobotInfo

OnViolation = Literal["clamp", "stop"]


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
    # -- limits on the measured state --
    brake_decel: float = 5.0  # rad/s^2 the envelope counts on to stop a joint before a limit
    max_accel: float = 10.0  # rad/s^2 a position target may accelerate (or reverse) at
    lead_s: float = 0.08  # a position target leads the measured joint by <= velocity * lead_s
    measured_velocity_factor: float = 1.1  # stop when |measured velocity| > factor * limit
    limit_tolerance: float = 0.002  # rad (joints) and m (box) of measured overshoot tolerated

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
        if not (
            cfg.brake_decel > 0
            and cfg.max_accel > 0
            and cfg.lead_s > 0
            and cfg.measured_velocity_factor >= 1
        ):
            raise DeviceError(
                f"{where}: brake_decel, max_accel and lead_s must be > 0, "
                "measured_velocity_factor >= 1"
            )
        if not (0 <= cfg.limit_tolerance <= 0.05):
            raise DeviceError(f"{where}: limit_tolerance must be within [0, 0.05]")
        for name in (f.name for f in fields(cfg)):
            v = getattr(cfg, name)
            vals = v if isinstance(v, tuple) else (v,)
            if any(isinstance(x, float) and not math.isfinite(x) for x in vals):
                raise DeviceError(f"{where}: {name} must be finite, got {v}")
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
            brake_decel=min(self.brake_decel, other.brake_decel),
            max_accel=min(self.max_accel, other.max_accel),
            lead_s=min(self.lead_s, other.lead_s),
            measured_velocity_factor=min(
                self.measured_velocity_factor, other.measured_velocity_factor
            ),
            limit_tolerance=min(self.limit_tolerance, other.limit_tolerance),
        )


def default_config(info: RobotInfo) -> SafetyConfig:
    """The envelope the agent starts with: the robot's limits and workspace box."""
    ws = info.meta.get("workspace") if isinstance(info.meta, dict) else None
    if isinstance(ws, dict) and "lower" in ws and "upper" in ws:
        lo = [float(x) for x in ws["lower"]]
        hi = [float(x) for x in ws["upper"]]
        return SafetyConfig(
            workspace_lower=(lo[0], lo[1], lo[2]), workspace_upper=(hi[0], hi[1], hi[2])
        )
    return SafetyConfig()
