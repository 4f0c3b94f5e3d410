"""Fault injection for franky-sim: a joint reflex on demand. franky-sim 1.0.4 simulates no
errors, so this wrapper (loaded only inside the franky-sim process, by franky_peer's shim)
adds the one a real arm raises most: on SIGUSR1 the running motion is aborted with libfranka's
`kReflexAborted` status and the state reports `joint_reflex` in its errors and reflex reason
(robot mode Reflex) until the client runs automatic error recovery, exactly what a Franka
does when a collision threshold is crossed.
"""

from __future__ import annotations

import signal
from typing import Any

JOINT_REFLEX = 6  # index of kJointReflex in libfranka's error list
N_ERRORS = 41
_pending = {"reflex": False}


def install() -> None:
    """Patch franky-sim's robot server in this process (call before its main())."""
    from franky_sim import franka_robot_protocol as proto
    from franky_sim.franka_robot_server import FrankaRobotServer
    from franky_sim.franka_server import BaseCommand

    errors = tuple(i == JOINT_REFLEX for i in range(N_ERRORS))
    plain_state = FrankaRobotServer.robot_state.fget  # type: ignore[attr-defined]
    plain_process = FrankaRobotServer.process_commands

    def robot_state(self: Any) -> Any:
        state = plain_state(self)
        if getattr(self, "_reflex", False):
            state = state.replace(
                robot_mode=proto.RobotMode.kReflex, errors=errors, reflex_reason=errors
            )
        return state

    def process_commands(self: Any) -> None:
        plain_process(self)
        if _pending["reflex"] and self.current_motion_id:
            _pending["reflex"] = False
            self._reflex = True
            motion_id = self.current_motion_id
            self.stop_motion(send_preemption_signal=False)
            self.reset_current_motion_id()
            BaseCommand.send_response(
                self._tcp_socket,
                proto.RobotCommand.kMove,
                motion_id,
                proto.MoveStatus.kReflexAborted,
            )

    def recover(self: Any, server: Any) -> None:
        server._reflex = False
        self.reply(proto.AutomaticErrorRecoveryStatus.kSuccess)

    FrankaRobotServer.robot_state = property(robot_state)  # type: ignore[method-assign,assignment]
    FrankaRobotServer.process_commands = process_commands  # type: ignore[method-assign]
    proto.AutomaticErrorRecoveryCommand.handle = recover  # type: ignore[method-assign]

    def on_signal(signum: int, frame: object) -> None:
        _pending["reflex"] = True

    signal.signal(signal.SIGUSR1, on_signal)
