"""The demo: a project in the user's data folder and the virtual lab as the robot.

`ensure_demo_project()` creates (or reopens) `<data_dir>/demo`; `start_lab(controller)` starts
the lab as its own process through the robots launcher, connects a client, and attaches it to
the session, so the devices panel shows the robot live. Closing the session (detach_robot)
disconnects and stops the lab process.

The lab is just another robot agent: its link is app/robot_link.py's `AgentLink`, which
also stops the lab process it launched. It outlives a late reader: when the link drops (a
loaded laptop, a paused process) the client dials the lab again by itself and the devices
panel says "reconnecting…", then "connected"; only closing the session or the lab process
dying ends it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from app.controller import AppController, data_dir
from app.robot_link import AgentLink, lab_job, lab_problem
from devices.robots.motion import Motion
from devices.robots.motion_stream import MotionStream
from devices.robots.wire.robot_types import RobotInfo
from devices.trajectory import COMMAND_DELAY, Trajectory
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress, run_to_end
from resources.project import MANIFEST, Project

log = logging.getLogger(__name__)

DEMO_FOLDER = "demo"
DEMO_SCENE = "panda_table"


def demo_project_dir() -> Path:
    """Where the demo project lives: <data_dir>/demo (see app.controller.data_dir)."""
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


def start_lab(controller: AppController, scene: str = DEMO_SCENE) -> None:
    """Start the lab in the background (a job) and attach its robot to the session."""
    problem = lab_problem()
    if problem is not None:
        log.warning("%s", problem)
        controller.set_device_status("robot", "unavailable", problem)
        return
    controller.set_device_status("robot", "connecting", f"starting the virtual lab ({scene})…")

    def done(link: AgentLink) -> None:
        controller.attach_robot(link, detail=f"{link.info().name} (virtual lab) at {link.address}")
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
    link: AgentLink, duration_s: float = 12.0, rate_hz: float = 50.0, amplitude_rad: float = 0.35
) -> Job[int]:
    """Move the lab arm gently (`demo_motion` around the pose it holds) so the live view has
    something to show, through the one checked motion stream (`devices.robots.motion_stream`: a
    motion outside the robot's limits is refused before anything moves); stops (holds) the
    robot when done or cancelled. Returns the number of commands sent."""
    client = link.client
    motion = demo_motion(
        link.info(), client.latest_state().joint_pos, duration_s, rate_hz, amplitude_rad
    )
    stream = MotionStream(client, motion, rate_hz=rate_hz)
    for p in stream.play():
        if p.fraction is not None and p.fraction < 1.0:  # (the stream always says how far)
            t = p.fraction * duration_s
            yield Progress(p.fraction, f"demo motion {t:.1f}/{duration_s:.0f} s")
    yield Progress(1.0, "back at the start pose")
    return stream.sent


def record_job(link: AgentLink, duration_s: float = 5.0) -> Job[Trajectory]:
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
