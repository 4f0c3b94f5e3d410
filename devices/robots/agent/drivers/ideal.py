"""`IdealDriver`: a joint-space servo with first-order tracking, on its own real-time thread.

It is for unit-testing the agent and the protocol without MuJoCo; the virtual lab
(devices/lab) is the realistic stand-in. Each joint follows its target as
`dq/dt = (target - q) / tau` (position mode; speed capped at the velocity limit) or
`d(qdot)/dt = (v_target - qdot) / tau` (velocity mode). The forward kinematics is a toy
serial chain (link length `link_m`, joints alternating about z and y), enough to exercise
the workspace box.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.wire.robot_types import CommandMode, JointLimits, RobotInfo, RobotState

Vec = NDArray[np.float64]
PANDA_LOWER = (-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973)
PANDA_UPPER = (2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973)
PANDA_VEL = (2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61)
PANDA_EFFORT = (87.0, 87.0, 87.0, 87.0, 12.0, 12.0, 12.0)
HOME = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785)


def panda_like_info(rate_hz: float = 250.0) -> RobotInfo:
    """Franka-Panda-like joint limits at `rate_hz`, with a workspace box in `meta`."""
    return RobotInfo(
        name="ideal",
        joint_names=tuple(f"joint{i + 1}" for i in range(7)),
        limits=JointLimits(
            np.array(PANDA_LOWER),
            np.array(PANDA_UPPER),
            np.array(PANDA_VEL),
            np.array(PANDA_EFFORT),
        ),
        control_rate_hz=rate_hz,
        command_modes=("position", "velocity"),
        description="ideal first-order joint servo (test driver)",
        meta={"workspace": {"lower": [-0.6, -0.6, 0.0], "upper": [0.6, 0.6, 0.9]}},
    )


class IdealDriver:
    """A RobotDriver whose joints track commands as first-order systems."""

    def __init__(
        self,
        info: RobotInfo | None = None,
        tau_s: float = 0.02,
        physics_hz: float = 1000.0,
        link_m: float = 0.15,
        initial: Vec | None = None,
        kp: float = 200.0,
    ) -> None:
        self._info = info or panda_like_info()
        n = len(self._info.joint_names)
        self.tau_s, self.link_m, self.kp = tau_s, link_m, kp
        self.physics_dt = 1.0 / physics_hz
        q0 = np.array(
            HOME[:n]
            if initial is None and n <= 7
            else (initial if initial is not None else np.zeros(n)),
            dtype=float,
        )
        self._q, self._dq = q0.copy(), np.zeros(n)
        self._mode: CommandMode = "position"
        self._target = q0.copy()
        self._lock = threading.Lock()
        self._seq = 0
        self._t = time.monotonic()
        self._running = False
        self._thread: threading.Thread | None = None
        self.commands: list[tuple[str, Vec]] = []  # every write, for tests that audit them
        self.record_commands = False
        self.holds = 0

    # -- RobotDriver -------------------------------------------------------------------
    def info(self) -> RobotInfo:
        return self._info

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._t = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="ideal-driver", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.hold()
        self._running = False
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def read_state(self) -> RobotState:
        with self._lock:
            q, dq = self._q.copy(), self._dq.copy()
            t, seq, target, mode = self._t, self._seq, self._target.copy(), self._mode
        eff = (
            np.clip(self.kp * (target - q), -self._info.limits.effort, self._info.limits.effort)
            if mode == "position"
            else np.zeros_like(q)
        )
        return RobotState(
            t=t,
            seq=seq,
            joint_pos=q,
            joint_vel=dq,
            joint_effort=eff,
            ee_pos=self.forward_kinematics(q),
        )

    def write_command(self, mode: CommandMode, values: Vec) -> None:
        if mode not in ("position", "velocity"):
            raise DeviceError(f"ideal driver: '{mode}' commands are not supported")
        v = np.asarray(values, dtype=float)
        if v.shape != self._q.shape or not np.all(np.isfinite(v)):
            raise DeviceError(f"ideal driver: bad command {v!r}")
        if self.record_commands:
            self.commands.append((mode, v.copy()))
        with self._lock:
            self._mode, self._target = mode, v.copy()

    def hold(self) -> None:
        with self._lock:
            self._mode, self._target = "position", self._q.copy()
            self._dq[:] = 0.0
            self.holds += 1

    def forward_kinematics(self, joint_pos: Vec) -> Vec:
        """Toy chain: base at z = link_m; joint i turns about z (even i) or y (odd i)."""
        R = np.eye(3)
        p = np.array([0.0, 0.0, self.link_m])
        for i, a in enumerate(joint_pos):
            c, s = math.cos(a), math.sin(a)
            if i % 2 == 0:
                r = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
            else:
                r = np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])
            R = R @ r
            p = p + R @ np.array([0.0, 0.0, self.link_m])
        return p

    # -- physics thread ----------------------------------------------------------------
    def step(self, dt: float) -> None:
        """Advance the servo by dt seconds (the thread calls this; tests may too)."""
        lim = self._info.limits
        with self._lock:
            a = 1.0 - math.exp(-dt / self.tau_s)
            if self._mode == "position":
                dq = np.clip((self._target - self._q) * a / dt, -lim.velocity, lim.velocity)
            else:
                dq = self._dq + (self._target - self._dq) * a
            self._q = np.clip(self._q + dq * dt, lim.lower - 0.05, lim.upper + 0.05)
            self._dq = dq
            self._t += dt
            self._seq += 1

    def _run(self) -> None:
        last = time.monotonic()
        while self._running:
            time.sleep(self.physics_dt)
            now = time.monotonic()
            self.step(now - last)
            last = now

    def snapshot(self) -> dict[str, Any]:
        """Internal truth for tests (a real robot has none)."""
        with self._lock:
            return {"q": self._q.copy(), "target": self._target.copy(), "mode": self._mode}
