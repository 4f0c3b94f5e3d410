"""The interface between the robot agent and whatever moves joints: the virtual lab or a
hardware driver. The agent (devices/robots/agent/control.py) is the only caller.

A driver owns its own timing: a hardware driver talks to a real controller; the lab driver
runs MuJoCo in real time on its own thread. The agent reads the newest state, decides a
command (after the safety envelope), and writes it at the control rate. The values it
exchanges (`RobotInfo`, `RobotState`, `CommandMode`) are the wire's
(devices/robots/wire/robot_types.py): the workbench reads the same ones back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from devices.robots.wire.robot_types import CommandMode, RobotInfo, RobotState


class RobotDriver(Protocol):
    """What the agent needs from a robot. Implementations: devices/lab, hardware drivers,
    devices/robots/agent/drivers/ideal.py (tests).

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
