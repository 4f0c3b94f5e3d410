"""The interface between the robot agent and whatever moves joints: the virtual lab or a
hardware driver. The agent (devices/robots/agent.py) is the only caller.

A driver owns its own timing: a hardware driver talks to a real controller; the lab driver
runs MuJoCo in real time on its own thread. The agent reads the newest state, decides a
command (after the safety envelope), and writes it at the control rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

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


class RobotDriver(Protocol):
    """What the agent needs from a robot. Implementations: devices/lab, hardware drivers,
    devices/robots/drivers/ideal.py (tests).

    Optional: `wait_state(after_seq, timeout) -> RobotState` — block until a state newer than
    `after_seq` exists (or `timeout` s pass) and return the newest; the agent then never acts
    twice on the same measurement. `command_time() -> float | None` — the robot-clock time
    the controller received the newest written command (see RobotState.command_time).
    """

    def info(self) -> RobotInfo: ...

    def start(self) -> None:
        """Begin moving time / talking to hardware; states become available."""

    def close(self) -> None:
        """Stop the robot (held, no motion) and release resources."""

    def read_state(self) -> RobotState:
        """The newest measured state (does not block longer than one control period)."""

    def write_command(self, mode: CommandMode, values: NDArray[np.float64]) -> None:
        """Send one command; already checked by the safety envelope."""

    def hold(self) -> None:
        """Stop: hold the current position with the driver's own safe controller."""

    def forward_kinematics(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64] | None:
        """End-effector position (3,) in the base frame for joint_pos, if the driver knows it.

        A driver may also offer `collision_points(joint_pos) -> (K, 3) | None` (optional,
        found with getattr): the end effector first, then points bounding every moving
        link's collision geometry; the safety envelope then keeps the links above the
        workspace box's floor (the table) too (devices/lab/driver.py has one)."""


def fresh_state(driver: RobotDriver, after_seq: int, timeout: float) -> RobotState:
    """The newest state; a driver with `wait_state` (the lab) can tell when a newer
    measurement than `after_seq` exists: wait up to `timeout` for it rather than act twice
    on the same one."""
    wait = getattr(driver, "wait_state", None)
    if wait is None:
        return driver.read_state()
    state: RobotState = wait(after_seq, timeout)
    return state


def stamp_command_time(driver: RobotDriver, state: RobotState) -> RobotState:
    """`state` with the time the driver's controller received the command just written
    (its optional `command_time()`); unchanged when the driver cannot say."""
    get = getattr(driver, "command_time", None)
    ct = get() if get is not None else None
    if ct is None or ct == state.command_time:
        return state
    return replace(state, command_time=float(ct))
