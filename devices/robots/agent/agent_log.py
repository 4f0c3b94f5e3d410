"""The agent's log: per control tick, the raw command (policy output or client command), the
command actually sent, the measured state, and which safety limits acted. Preallocated ring
buffers, so logging costs no allocation in the control loop."""

from __future__ import annotations

import threading

import numpy as np
from numpy.typing import NDArray

from devices.robots.agent.safety import LIMIT_NAMES

MODES = ("idle", "command", "policy", "stopped", "estop")


class AgentLog:
    """Ring buffer of the last `capacity` ticks for n joints."""

    def __init__(self, n: int, capacity: int) -> None:
        self.n, self.capacity = n, capacity
        self.t = np.zeros(capacity)
        self.raw = np.zeros((capacity, n))
        self.sent = np.zeros((capacity, n))
        self.joint_pos = np.zeros((capacity, n))
        self.joint_vel = np.zeros((capacity, n))
        self.acted = np.zeros(capacity, dtype=np.int64)  # bit i: LIMIT_NAMES[i] acted
        self.mode = np.zeros(capacity, dtype=np.int64)  # index into MODES
        self.count = 0
        self._lock = threading.Lock()

    def record(
        self,
        t: float,
        raw: NDArray[np.float64] | None,
        sent: NDArray[np.float64] | None,
        joint_pos: NDArray[np.float64],
        joint_vel: NDArray[np.float64],
        acted: tuple[str, ...],
        mode: str,
    ) -> None:
        with self._lock:
            i = self.count % self.capacity
            self.t[i] = t
            self.raw[i] = np.nan if raw is None else raw
            self.sent[i] = np.nan if sent is None else sent
            self.joint_pos[i] = joint_pos
            self.joint_vel[i] = joint_vel
            bits = 0
            for name in acted:
                bits |= 1 << LIMIT_NAMES.index(name)
            self.acted[i] = bits
            self.mode[i] = MODES.index(mode)
            self.count += 1

    def snapshot(
        self, last: int | None = None
    ) -> dict[str, NDArray[np.float64] | NDArray[np.int64]]:
        """Copies of the logged ticks in time order (the newest `last` ticks if given)."""
        with self._lock:
            m = min(self.count, self.capacity)
            if last is not None:
                m = min(m, last)
            idx = np.arange(self.count - m, self.count) % self.capacity
            return {
                "t": self.t[idx].copy(),
                "raw": self.raw[idx].copy(),
                "sent": self.sent[idx].copy(),
                "joint_pos": self.joint_pos[idx].copy(),
                "joint_vel": self.joint_vel[idx].copy(),
                "acted": self.acted[idx].copy(),
                "mode": self.mode[idx].copy(),
            }
