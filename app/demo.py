"""The demo: a project in the user's data folder and the virtual lab as the robot.

`ensure_demo_project()` creates (or reopens) `<data_dir>/demo`; `start_lab(controller)` starts
the lab as its own process through the robots launcher, connects a client, and attaches it to
the session, so the devices panel shows the robot live. Closing the session (detach_robot)
disconnects and stops the lab process.

The lab outlives a late reader: when the link drops (a loaded laptop, a paused process) the
client dials the lab again by itself (`lab_client`) and the devices panel says
"reconnecting…", then "connected"; only closing the session or the lab process dying ends it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.jobs import Job, Progress, run_to_end
from app.project import MANIFEST, Project
from app.session import AppController, DeviceStateName, camera_health, data_dir, link_health
from devices.errors import DeviceError
from devices.robots.client import RobotClient
from devices.robots.driver import RobotInfo, RobotState
from devices.robots.motion import Motion
from devices.robots.stream import MotionStream
from devices.trajectory import COMMAND_DELAY, Trajectory
from resources.errors import TwinbenchError

log = logging.getLogger(__name__)

DEMO_FOLDER = "demo"
DEMO_SCENE = "panda_table"


def demo_project_dir() -> Path:
    """Where the demo project lives: <data_dir>/demo (see app.session.data_dir)."""
    return data_dir() / DEMO_FOLDER


def ensure_demo_project(root: Path | None = None) -> Project:
    """Open the demo project, creating it the first time. A broken one is reported (never
    overwritten: it is the user's data)."""
    root = Path(root) if root is not None else demo_project_dir()
    if (root / MANIFEST).is_file():
        return Project.open(root)
    proj = Project.create(root, name="Twinbench demo")
    proj.settings["demo"] = True
    proj.settings["lab_scene"] = DEMO_SCENE
    proj.save()
    log.info("created the demo project at %s", root)
    _add_demo_twin(proj)
    return proj


def _add_demo_twin(proj: Project) -> None:
    """Give a new demo project something to look at: the procedural demo scan (the lab's
    box, cylinder and U-block on a table) and a Panda twin built from it (~2 s, once)."""
    from app.workflows.twin import build_twin  # twins/ (PyBullet) only when needed

    try:
        twin_id = run_to_end(build_twin(proj, None, procedural=True, name="demo twin"))
    except TwinbenchError as exc:  # the project itself is fine without it: say so, go on
        log.warning("demo project: could not build the demo twin (%s)", exc)
        return
    log.info("demo project: built twin %s from the procedural demo scan", twin_id)


def lab_problem() -> str | None:
    """Why the virtual lab cannot be started here, or None when it can."""
    try:
        from devices.robots import client, launch  # noqa: F401
    except ImportError as exc:
        return f"lab not available: this installation has no virtual lab launcher ({exc})"
    return None


# Franka Panda kinematics (modified DH, from Franka's documentation), only to draw the lab
# arm as a stick figure: joints 1-7, then the flange, then the grasp point 0.105 m further.
_PANDA_A = (0.0, 0.0, 0.0, 0.0825, -0.0825, 0.0, 0.088, 0.0)
_PANDA_D = (0.333, 0.0, 0.316, 0.0, 0.384, 0.0, 0.0, 0.107)
_PANDA_ALPHA = (0.0, -np.pi / 2, np.pi / 2, np.pi / 2, -np.pi / 2, np.pi / 2, np.pi / 2, 0.0)
PANDA_TOOL_OFFSET_M = 0.105


def panda_link_positions(joint_pos: NDArray[np.float64]) -> NDArray[np.float64]:
    """Points (10, 3) in the base frame, m: base, joint frames 1-7, flange, grasp point."""
    q = np.asarray(joint_pos, dtype=float)
    if q.shape != (7,):
        raise ValueError(f"Panda has 7 joints, got joint_pos of shape {q.shape}")
    T = np.eye(4)
    pts = [T[:3, 3].copy()]
    for i in range(8):
        th = q[i] if i < 7 else 0.0
        ca, sa = np.cos(_PANDA_ALPHA[i]), np.sin(_PANDA_ALPHA[i])
        ct, st = np.cos(th), np.sin(th)
        d, a = _PANDA_D[i], _PANDA_A[i]
        T = T @ np.array(
            [
                [ct, -st, 0, a],
                [st * ca, ct * ca, -sa, -sa * d],
                [st * sa, ct * sa, ca, ca * d],
                [0, 0, 0, 1],
            ]
        )
        pts.append(T[:3, 3].copy())
    pts.append(T[:3, 3] + PANDA_TOOL_OFFSET_M * T[:3, 2])
    return np.array(pts)


class LabLink:
    """A lab process plus the RobotClient connected to it; `close()` disconnects and stops
    the lab. Satisfies `app.session.RobotLink` (with `watch`, `health`, `camera_health`)."""

    def __init__(self, lab: Any, client: Any, scene: str) -> None:
        self.lab, self.client, self.scene = lab, client, scene

    def info(self) -> RobotInfo:
        info: RobotInfo = self.client.info
        return info

    @property
    def cameras(self) -> list[str]:
        return list(getattr(self.client, "cameras", []))

    def _lab_gone(self) -> str | None:
        alive = getattr(self.lab, "alive", True)
        if alive:
            return None
        proc = getattr(self.lab, "proc", None)
        code = getattr(proc, "returncode", None)
        return f"the virtual lab process at {self.lab.host}:{self.lab.port} exited (code {code})"

    def latest_state(self) -> RobotState | None:
        """The newest state; None while the link reconnects. Raises DeviceError when the
        lab process is gone (that, or closing, is what ends the lab link)."""
        gone = self._lab_gone()
        if gone is not None:
            raise DeviceError(gone)
        try:
            state: RobotState = self.client.latest_state(timeout_s=0.0)
        except DeviceError:
            if getattr(self.client, "link_state", "") in ("reconnecting", "connected"):
                return None  # dialling again (or not a state yet on the new session)
            raise
        return state

    def watch(self, callback: Callable[[str, str], None]) -> None:
        """`callback(state, message)` on the link's news (reconnecting, connected, lost)."""

        def news(state: str, message: str) -> None:
            gone = self._lab_gone()
            callback(state, f"{message} ({gone})" if state == "lost" and gone else message)

        self.client.on_link = news

    def health(self) -> tuple[DeviceStateName, str]:
        gone = self._lab_gone()
        if gone is not None:
            return "error", gone
        return link_health(self.client)

    def camera_health(self) -> tuple[DeviceStateName, str] | None:
        if not self.cameras:
            return None
        served = (
            f"virtual lab cameras: {', '.join(self.cameras)} (served by the lab at "
            f"{self.lab.host}:{self.lab.port})"
        )
        gone = self._lab_gone()
        if gone is not None:
            return "error", f"{served}: {gone}"
        return camera_health(self.client, served)

    def link_positions(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64] | None:
        """Stick-figure points of the arm for drawing (Panda only; None otherwise)."""
        if len(self.info().joint_names) == 7 and "panda" in self.info().joint_names[0]:
            return panda_link_positions(joint_pos)
        return None

    def take_control(self) -> None:
        self.client.take_control()

    def command_position(self, joint_pos: NDArray[np.float64]) -> None:
        self.client.command_position(joint_pos)

    def stop(self, reason: str) -> None:
        self.client.stop(reason)

    def protocol_client(self) -> RobotClient | None:
        return self.client if self.client.connected else None

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            code = self.lab.terminate()
            log.info("virtual lab stopped (exit code %s)", code)


def lab_client(lab: Any, name: str = "twinbench-gui") -> RobotClient:
    """A client for the lab process `lab` that rides out a busy machine: its no-data
    timeout sized from the lab's heartbeat deadline and the load, and a dropped link dialled
    again while the lab process lives (not connected yet: call `connect()`)."""
    return RobotClient(
        lab.host,
        lab.port,
        lab.token,
        name=name,
        reconnect=True,
        reconnect_while=lambda: bool(lab.alive),
    )


def lab_job(scene: str = DEMO_SCENE) -> Job[LabLink]:
    """Start the lab process, connect to it, wait for the first state; returns the link."""
    problem = lab_problem()
    if problem is not None:
        raise LabUnavailable(problem)
    from devices.robots.launch import start_lab_process

    yield Progress(None, f"starting the virtual lab ({scene})…")
    lab = start_lab_process(scene)
    client = None
    try:
        yield Progress(0.6, f"connecting to the lab robot at {lab.host}:{lab.port}…")
        client = lab_client(lab)
        client.connect()
        client.latest_state(timeout_s=5.0)
        yield Progress(1.0, "connected")
    except BaseException:  # includes cancel (GeneratorExit): never leave the lab running
        if client is not None:
            client.close()
        lab.terminate()
        raise
    return LabLink(lab, client, scene)


def start_lab(controller: AppController, scene: str = DEMO_SCENE) -> None:
    """Start the lab in the background (a job) and attach its robot to the session."""
    problem = lab_problem()
    if problem is not None:
        log.warning("%s", problem)
        controller.set_device_status("robot", "unavailable", problem)
        return
    controller.set_device_status("robot", "connecting", f"starting the virtual lab ({scene})…")

    def done(link: LabLink) -> None:
        addr = f"{link.lab.host}:{link.lab.port}"
        controller.attach_robot(link, detail=f"{link.info().name} (virtual lab) at {addr}")
        controller.poll_devices()  # the camera row: the lab's cameras, over this link

    def failed(msg: str) -> None:
        controller.set_device_status("robot", "error", f"lab not available: {msg}")

    controller.submit_job("Start virtual lab", lab_job(scene), on_done=done, on_failed=failed)


def demo_motion(
    info: RobotInfo,
    start: NDArray[np.float64],
    duration_s: float = 12.0,
    rate_hz: float = 50.0,
    amplitude_rad: float = 0.35,
) -> Motion:
    """The demo motion: sinusoids on joints 1, 2 and 4 around `start`, eased in and out
    over 1.5 s, back at `start` at the end; sampled at `rate_hz`."""
    start = np.asarray(start, dtype=float)
    weights = np.zeros(len(start))
    weights[[i for i in (0, 1, 3) if i < len(start)]] = (1.0, 0.5, 0.6)[: min(3, len(start))]
    t = np.linspace(0.0, duration_s, max(int(round(duration_s * rate_hz)) + 1, 2))
    ramp = np.clip(np.minimum(t / 1.5, (duration_s - t) / 1.5), 0.0, 1.0)
    wave = (ramp * amplitude_rad * np.sin(2 * np.pi * t / 4.0))[:, None]
    return Motion(
        "demo motion",
        {"duration_s": duration_s, "amplitude_rad": amplitude_rad},
        t,
        start + wave * weights,
        tuple(info.joint_names),
        description="sinusoids on joints 1, 2 and 4 around the start pose",
    )


def motion_job(
    link: LabLink, duration_s: float = 12.0, rate_hz: float = 50.0, amplitude_rad: float = 0.35
) -> Job[int]:
    """Move the lab arm gently (`demo_motion` around the pose it holds) so the live view has
    something to show, through the one checked motion stream (`devices.robots.stream`: a
    motion outside the robot's limits is refused before anything moves); stops (holds) the
    robot when done or cancelled. Returns the number of commands sent."""
    client = link.client
    motion = demo_motion(
        link.info(), client.latest_state().joint_pos, duration_s, rate_hz, amplitude_rad
    )
    stream = MotionStream(client, motion, rate_hz=rate_hz)
    for fraction, _ in stream.play():
        if fraction < 1.0:
            t = fraction * duration_s
            yield Progress(fraction, f"demo motion {t:.1f}/{duration_s:.0f} s")
    yield Progress(1.0, "back at the start pose")
    return stream.sent


def record_job(link: LabLink, duration_s: float = 5.0) -> Job[Trajectory]:
    """Record the robot's state stream for `duration_s` s into a real Trajectory.

    (Stands in for the record workflow until app/workflows/record.py exists; the GUI saves
    the result into the project with `AppController.save_trajectory`.)
    """
    yield Progress(None, f"recording {duration_s:.0f} s of robot state…")
    traj: Trajectory = link.client.stream(duration_s)
    # robot/command and its arrival delay are NaN where nothing was commanded (by design);
    # measured channels must be finite
    unmeasured = ("robot/command", COMMAND_DELAY)
    measured = traj.with_channels(
        channels={k: v for k, v in traj.channels.items() if k not in unmeasured}
    )
    measured.check_finite(f"recording from {link.info().name}")
    yield Progress(1.0, f"recorded {len(traj)} states")
    return traj


class LabUnavailable(TwinbenchError):
    """The lab cannot be started in this installation (message says why)."""
