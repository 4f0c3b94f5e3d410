"""What a robot says about itself and what it measures: `RobotInfo` (name, joints,
`JointLimits`, control rate, command modes, cameras, description), `RobotState` (one measured
state) and `CommandMode`. Both ends of the wire use them: the agent and its drivers produce
them, the workbench's client reads them back from `get_info` and the state stream
(PROTOCOL.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

CommandMode = Literal["position", "velocity", "torque", "voltage"]


@dataclass(frozen=True)
class JointLimits:
    """Per-joint limits, arrays of shape (n,), SI units (rad or m; rad/s; N*m or N)."""

    lower: NDArray[np.float64]
    upper: NDArray[np.float64]
    velocity: NDArray[np.float64]
    effort: NDArray[np.float64]

    def to_dict(self) -> dict[str, list[float]]:
        return {
            k: np.asarray(getattr(self, k), dtype=float).tolist()
            for k in ("lower", "upper", "velocity", "effort")
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JointLimits:
        return cls(
            *(np.asarray(d[k], dtype=float) for k in ("lower", "upper", "velocity", "effort"))
        )


@dataclass(frozen=True)
class RobotInfo:
    """What a robot says about itself on connect. Never contains simulator truth."""

    name: str
    joint_names: tuple[str, ...]
    limits: JointLimits
    control_rate_hz: float
    command_modes: tuple[str, ...] = ("position",)
    cameras: tuple[str, ...] = ()
    description: str = ""  # e.g. URDF file name or resource key of the robot model
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "joint_names": list(self.joint_names),
            "limits": self.limits.to_dict(),
            "control_rate_hz": self.control_rate_hz,
            "command_modes": list(self.command_modes),
            "cameras": list(self.cameras),
            "description": self.description,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RobotInfo:
        return cls(
            name=str(d["name"]),
            joint_names=tuple(d["joint_names"]),
            limits=JointLimits.from_dict(d["limits"]),
            control_rate_hz=float(d["control_rate_hz"]),
            command_modes=tuple(d.get("command_modes", ("position",))),
            cameras=tuple(d.get("cameras", ())),
            description=str(d.get("description", "")),
            meta=dict(d.get("meta", {})),
        )


@dataclass(frozen=True)
class RobotState:
    """One measured state. `t` is the robot's monotonic clock in seconds."""

    t: float
    seq: int
    joint_pos: NDArray[np.float64]
    joint_vel: NDArray[np.float64]
    joint_effort: NDArray[np.float64]
    ee_pos: NDArray[np.float64] | None = None  # (3,) end effector in base frame, m
    # Robot-clock time (s) at which the robot's controller received the newest command
    # written to the driver (command timing jitter lives here: a 250 Hz stream reaches a
    # 1 kHz or 500 Hz controller on one tick or the next). A fixed delay inside the
    # controller after that is the twin's latency. None when the driver cannot say. Real
    # robots expose it (Franka's per-tick q_d, UR RTDE target_q); the agent stamps it on
    # each state message after writing that tick's command (PROTOCOL.md `command_time`).
    command_time: float | None = None
