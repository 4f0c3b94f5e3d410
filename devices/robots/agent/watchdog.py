"""The agent's watchdog: deadlines for the workbench heartbeat, streamed commands and the
policy output. The agent checks it every control tick, so a missed deadline stops the robot
within one control period (plus loop jitter)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from devices.errors import DeviceError


@dataclass(frozen=True)
class WatchdogConfig:
    """Deadlines in seconds. `policy_timeout_s`: longest time without a fresh policy output
    (None: 5 control periods; a late output keeps the previous command until then)."""

    heartbeat_timeout_s: float = 0.25
    command_timeout_s: float = 0.1  # velocity/torque streams must refresh this often
    policy_timeout_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WatchdogConfig:
        known = {f.name for f in fields(cls)}
        if set(d) - known:
            raise DeviceError(f"watchdog config: unknown setting(s) {sorted(set(d) - known)}")
        vals: dict[str, Any] = {k: (None if v is None else float(v)) for k, v in d.items()}
        cfg = cls(**vals)
        if cfg.heartbeat_timeout_s <= 0 or cfg.command_timeout_s <= 0:
            raise DeviceError("watchdog config: timeouts must be positive")
        return cfg


class Watchdog:
    """Tracks the heartbeat and command deadlines of the client in control.

    Not thread-safe by itself: heartbeats are single float stores (atomic in CPython) and
    only the control loop calls `check`.
    """

    def __init__(self, config: WatchdogConfig, dt: float) -> None:
        self.config = config
        self.dt = dt
        self.policy_timeout_s = (
            config.policy_timeout_s if config.policy_timeout_s is not None else 5.0 * dt
        )
        self.last_heartbeat = float("-inf")
        self.last_command = float("-inf")
        self.armed = False
        self.grace_until = float("-inf")  # after the agent's own stall: time to read the backlog

    @property
    def drain_s(self) -> float:
        """How long the connection gets, after the agent itself stalled, to deliver the
        heartbeats that piled up unread meanwhile."""
        return 0.5 * self.config.heartbeat_timeout_s

    def arm(self, now: float) -> None:
        """Motion starts: deadlines run from now."""
        self.last_heartbeat = max(self.last_heartbeat, now)
        self.last_command = max(self.last_command, now)
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def heartbeat(self, now: float) -> None:
        self.last_heartbeat = now

    def command(self, now: float) -> None:
        self.last_command = now

    def agent_stalled(self, start: float, end: float) -> bool:
        """The agent's own control loop did not run from `start` to `end` (the robot side was
        held up: a loaded computer, a paused process). Heartbeats sent meanwhile are still
        unread, so silence in that window is not the workbench's: when the workbench was
        heard from within the deadline as of `start`, the heartbeat deadline is pushed to
        `end` + `drain_s`. A workbench already silent at `start` gets nothing, so a lost
        workbench is stopped at most the stall plus `drain_s` late. The streamed-command
        deadline gets no grace: a velocity command went stale on the robot either way.
        Returns whether grace was given."""
        if not self.armed or self.last_heartbeat + self.config.heartbeat_timeout_s < start:
            return False
        self.grace_until = max(self.grace_until, end + self.drain_s)
        return True

    def heartbeat_deadline(self) -> float:
        return max(self.last_heartbeat + self.config.heartbeat_timeout_s, self.grace_until)

    def check(self, now: float, streamed_command: bool) -> tuple[str, float] | None:
        """(reason, deadline) of the first missed deadline, or None while all is well."""
        if not self.armed:
            return None
        deadline = self.heartbeat_deadline()
        if now > deadline:
            return (
                f"watchdog: no heartbeat from the workbench for "
                f"{(now - self.last_heartbeat) * 1e3:.0f} ms "
                f"(limit {self.config.heartbeat_timeout_s * 1e3:.0f} ms)",
                deadline,
            )
        if streamed_command:
            deadline = self.last_command + self.config.command_timeout_s
            if now > deadline:
                return (
                    f"watchdog: streamed command is {(now - self.last_command) * 1e3:.0f} ms "
                    f"old (limit {self.config.command_timeout_s * 1e3:.0f} ms)",
                    deadline,
                )
        return None
