"""`LabDriver`: a `RobotDriver` whose robot is a `LabSim` stepped in real time.

Physics runs on its own thread on an absolute schedule (step k is due at t0 + k*dt; the
thread sleeps until then, or catches up without sleeping when late). If it falls more than
`max_lag_s` behind, it stops trying to catch up and the lost time shows as a realtime
factor < 1. Every public method is thread-safe (one lock around the sim).

    from devices.lab.driver import make_driver
    with make_driver("panda_table") as drv:     # started; closed (held) on exit
        s = drv.read_state()
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from types import TracebackType

import numpy as np
from numpy.typing import NDArray

from devices.lab.camera import LabCamera
from devices.lab.config import LabConfig, LabError
from devices.lab.sim import LabSim
from devices.robots.wire.robot_types import CommandMode, RobotInfo, RobotState


class LabDriver:
    """The virtual lab robot, in real time. Implements devices.robots.agent.drivers.interface.RobotDriver."""

    def __init__(self, sim: LabSim, max_lag_s: float = 0.1) -> None:
        self.sim = sim
        self._lock = threading.Lock()
        self._new_state = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._max_lag = max_lag_s
        self._info = sim.info()
        self._samples: deque[tuple[float, float]] = deque(maxlen=400)  # (wall, lab time)
        self._steps = 0
        self._wall0 = 0.0
        self._sim0 = 0.0
        self._error: BaseException | None = None
        self.overruns = 0  # times the schedule was reset after falling behind

    # --- RobotDriver -------------------------------------------------------------------

    def info(self) -> RobotInfo:
        return self._info

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"lab-{self.sim.scene.name}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Hold, stop the physics thread and wait for it."""
        with self._lock:
            self.sim.hold()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def read_state(self) -> RobotState:
        self._check()
        with self._lock:
            return self.sim.read_state()

    def wait_state(self, after_seq: int, timeout: float = 0.1) -> RobotState:
        """Block until a state newer than `after_seq` exists (or timeout); return the newest."""
        with self._new_state:
            self._new_state.wait_for(
                lambda: self.sim.seq > after_seq or self._stop.is_set(), timeout
            )
            return self.sim.read_state()

    def write_command(self, mode: CommandMode, values: NDArray[np.float64]) -> None:
        self._check()
        with self._lock:
            self.sim.write_command(mode, values)

    def hold(self) -> None:
        with self._lock:
            self.sim.hold()

    def command_time(self) -> float:
        """Lab time the newest command arrived (RobotDriver's optional `command_time`)."""
        with self._lock:
            return self.sim.command_time

    def forward_kinematics(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64] | None:
        with self._lock:
            return self.sim.forward_kinematics(joint_pos)

    def collision_points(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64] | None:
        """RobotDriver's optional `collision_points`: the tool point, then the corners of
        every moving link's collision box (nominal kinematics), for the safety envelope."""
        with self._lock:
            return self.sim.collision_points(joint_pos)

    def body_pose(self, body: str, joint_pos: NDArray[np.float64]) -> NDArray[np.float64]:
        """T_base_body (4x4) of a robot body at joint_pos (nominal kinematics)."""
        with self._lock:
            return self.sim.body_pose(body, joint_pos)

    # --- lab extras --------------------------------------------------------------------

    @property
    def time(self) -> float:
        """The lab clock (s): simulated time, which tracks wall time when realtime."""
        with self._lock:
            return self.sim.time

    def reset(self) -> None:
        """Back to the config's initial state (robot held at its initial joints). The lab
        clock and the state sequence keep counting: they stay monotonic."""
        with self._lock:
            self.sim.reset(keep_clock=True)

    def set_object(
        self,
        name: str,
        pose: NDArray[np.float64] | None = None,
        lin_vel: NDArray[np.float64] | None = None,
        ang_vel: NDArray[np.float64] | None = None,
    ) -> None:
        """Place or throw an object now (see LabSim.set_object). Not on the protocol."""
        with self._lock:
            self.sim.set_object(name, pose, lin_vel, ang_vel)

    def snapshot(self) -> tuple[float, NDArray[np.float64]]:
        """(lab time, full qpos copy): what a camera needs to render the current scene."""
        with self._lock:
            return self.sim.time, self.sim.data.qpos.copy()

    def realtime_factor(self, window_s: float | None = 2.0) -> float:
        """Lab seconds per wall second, over the last `window_s` (None: since start)."""
        with self._lock:
            samples = list(self._samples)
            wall_now, sim_now = time.perf_counter(), self.sim.time
        if window_s is None:
            w0, s0 = self._wall0, self._sim0
        else:
            old = [s for s in samples if s[0] >= wall_now - window_s] or samples[-1:]
            if not old:
                return float("nan")
            w0, s0 = old[0]
        return (sim_now - s0) / (wall_now - w0) if wall_now > w0 else float("nan")

    def steps_per_second(self) -> float:
        """Physics steps per wall second since start."""
        el = time.perf_counter() - self._wall0
        return self._steps / el if el > 0 else float("nan")

    def camera(self, name: str, width: int = 640, height: int = 480, seed: int | None = None):  # noqa: ANN201 - LabCamera, imported lazily
        """A `LabCamera` rendering this driver's scene (see devices/lab/camera.py)."""

        return LabCamera(self, name, width, height, seed=seed)

    # --- thread ------------------------------------------------------------------------

    def _run(self) -> None:
        dt = self.sim.dt
        try:
            with self._lock:
                self._wall0, self._sim0 = time.perf_counter(), self.sim.time
            t0, k, next_sample = self._wall0, 0, self._wall0
            while not self._stop.is_set():
                with self._lock:
                    self.sim.step()
                    self._steps += 1
                    self._new_state.notify_all()
                k += 1
                now = time.perf_counter()
                if now >= next_sample:
                    with self._lock:
                        self._samples.append((now, self.sim.time))
                    next_sample = now + 0.05
                due = t0 + k * dt
                if due > now:
                    time.sleep(due - now)
                elif now - due > self._max_lag:
                    t0 += now - due  # give up catching up: this time is lost
                    self.overruns += 1
        except BaseException as exc:  # surfaced to callers by _check()
            self._error = exc

    def _check(self) -> None:
        if self._error is not None:
            raise LabError(
                f"lab {self.sim.scene.name}: physics thread died: {self._error!r}"
            ) from self._error

    def __enter__(self) -> LabDriver:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def make_driver(
    scene: str,
    config_path: Path | None = None,
    *,
    start: bool = True,
    config: LabConfig | None = None,
) -> LabDriver:
    """A LabDriver for `scene` with truth from `config_path` (JSON) or the scene default.

    Started unless start=False. Raises LabError for an unknown scene or a bad config.
    """
    sim = LabSim(scene, config if config is not None else config_path)
    drv = LabDriver(sim)
    if start:
        drv.start()
    return drv
