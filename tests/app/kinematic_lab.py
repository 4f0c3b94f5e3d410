"""A RobotClient stand-in over an in-process lab scene, for driving the guided scan and
calibration jobs (app/workflows/connected_arm.py) without a `lab serve` process.

Commands put the arm where they say at once (no dynamics, exact joint readings); states
and camera frames share one clock (seconds since the client was made); each camera renders
the lab's TRUE mount at the newest commanded joints on a thread of its own at `fps`, after
`first_frame_delay_s` (a camera starting up), `frame_limit` frames in all (then silence:
a stalled camera), or none with `frame_limit=0`. The truth the
images carry comes from the lab config, so a calibration can be checked against it."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from devices.errors import DeviceError
from devices.frames import RGBDFrame
from devices.robots.wire.robot_types import RobotState
from devices.trajectory import Trajectory

if TYPE_CHECKING:
    from devices.robots.client import RobotClient

os.environ.setdefault("MUJOCO_GL", "egl")


class KinematicLabClient:
    def __init__(
        self,
        scene: str = "panda_calib",
        size: tuple[int, int] = (424, 240),
        fps: float = 15.0,
        state_hz: float = 100.0,
        first_frame_delay_s: float = 0.0,
        frame_limit: int | None = None,
        stated_fps: bool = False,
    ) -> None:
        from devices.lab.sim import LabSim

        self.sim = LabSim(scene)
        self.info = self.sim.info()
        if stated_fps:
            for c in self.info.cameras:
                self.info.meta[f"camera/{c}/fps"] = fps
        self.address = "kinematic-lab:0"
        self.connected = True
        self.events: list[dict[str, Any]] = []
        self.size, self.fps, self.state_hz = size, fps, state_hz
        self.first_frame_delay_s, self.frame_limit = first_frame_delay_s, frame_limit
        model = self.sim.model
        self._adr = [int(model.jnt_qposadr[model.joint(n).id]) for n in self.info.joint_names]
        self._qpos0 = self.sim.data.qpos.copy()
        self._q = np.asarray(self._qpos0[self._adr], float)
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._seq = 0
        self.frozen = False  # True: commands are ignored (held short by a safety limit)
        self.stop_reason: str | None = None  # set: the robot stopped (commands ignored)
        self.subscriptions: list[tuple[str, float]] = []  # (camera, timeout_s) asked for
        self.stopped: list[str | None] = []

    def robot(self) -> RobotClient:
        """This stand-in, typed as the client the jobs take."""
        return cast("RobotClient", self)

    # -- the clock and the arm -----------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0

    def snapshot(self) -> tuple[float, NDArray[np.float64]]:
        """(time, full qpos) for the lab camera: the arm at the newest command."""
        with self._lock:
            qpos = self._qpos0.copy()
            qpos[self._adr] = self._q
        return self.now(), qpos

    def latest_state(self, timeout_s: float = 1.0) -> RobotState:
        with self._lock:
            q = self._q.copy()
            self._seq += 1
            seq = self._seq
        n = len(q)
        return RobotState(self.now(), seq, q, np.zeros(n), np.zeros(n))

    def command_position(self, joint_pos: ArrayLike) -> None:
        lo, hi = np.asarray(self.info.limits.lower), np.asarray(self.info.limits.upper)
        if self.frozen or self.stop_reason is not None:
            return
        with self._lock:
            self._q = np.clip(np.asarray(joint_pos, float), lo, hi)

    # what devices/robots/motion_stream.py asks of a client (the guided scan's moves go
    # through it): one session that never reconnects, no envelope settings reported (so the
    # robot's own limits are what a move is checked against), commands as command_position
    epoch = 0

    def status(self) -> dict[str, Any]:
        return self.latest_status()

    def take_control(self) -> None:
        self.check()

    def box_distances(self, poses: ArrayLike) -> list[float] | None:
        return None  # no workspace box (the lab agent's is tested over the real protocol)

    def command(self, mode: str, values: ArrayLike) -> None:
        if mode != "position":
            raise DeviceError(f"robot at {self.address}: command mode '{mode}' not supported")
        self.command_position(values)

    def latest_status(self) -> dict[str, Any]:
        stopped = self.stop_reason is not None
        return {
            "mode": "stopped" if stopped else "command",
            "estop": False,
            "acted": [],
            "stop_reason": self.stop_reason,
        }

    def stream(self, duration_s: float) -> Trajectory:
        t, q = [], []
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            s = self.latest_state()
            t.append(s.t)
            q.append(s.joint_pos)
            time.sleep(1.0 / self.state_hz)
        return Trajectory(np.asarray(t), {"robot/joint_pos": np.asarray(q)})

    def check(self, epoch: int | None = None) -> None:
        if not self.connected:
            raise DeviceError(f"robot at {self.address}: connection closed")

    def stop(self, reason: str | None = None) -> None:
        self.stopped.append(reason)

    # -- cameras ---------------------------------------------------------------------------
    def camera_frames(
        self, camera: str, timeout_s: float = 5.0
    ) -> Generator[RGBDFrame, None, None]:
        from devices.lab.camera import LabCamera

        self.subscriptions.append((camera, timeout_s))
        q: queue.Queue[RGBDFrame] = queue.Queue(maxsize=4)
        done = threading.Event()

        def render() -> None:
            cam = LabCamera(self, camera, *self.size)
            try:
                if done.wait(self.first_frame_delay_s):
                    return
                period, k, t0 = 1.0 / self.fps, 0, time.monotonic()
                while not done.is_set():
                    if self.frame_limit is not None and k >= self.frame_limit:
                        done.wait()
                        return
                    f = cam.grab()
                    if q.full():
                        try:
                            q.get_nowait()
                        except queue.Empty:
                            pass
                    q.put_nowait(f)
                    k += 1
                    done.wait(max(0.0, t0 + k * period - time.monotonic()))
            finally:
                cam.close()

        th = threading.Thread(target=render, name=f"kinematic-lab-{camera}", daemon=True)
        th.start()
        try:
            while True:
                try:
                    yield q.get(timeout=timeout_s)
                except queue.Empty:
                    raise DeviceError(
                        f"robot at {self.address}: no frame from camera '{camera}' in "
                        f"{timeout_s:.1f} s"
                    ) from None
        finally:
            done.set()
            th.join(5.0)

    def close(self) -> None:
        self.connected = False
