"""The demo: a project in the user's data folder and the virtual lab as the robot.

`ensure_demo_project()` creates (or reopens) `<data_dir>/demo`; `start_lab(controller)` starts
the lab as its own process through the robots launcher, connects a client, and attaches it to
the session, so the devices panel shows the robot live. Closing the session (detach_robot)
disconnects and stops the lab process.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.jobs import Job, Progress
from app.project import MANIFEST, Project
from app.session import AppController, RobotLink, data_dir
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
    return proj


def lab_problem() -> str | None:
    """Why the virtual lab cannot be started here, or None when it can."""
    try:
        from devices.robots import launcher  # noqa: F401
    except ImportError as exc:
        return f"lab not available: this installation has no virtual lab launcher ({exc})"
    return None


def lab_job(scene: str = DEMO_SCENE) -> Job[RobotLink]:
    """Start the lab process, connect to it, and return a link (closing it stops the lab)."""
    problem = lab_problem()
    if problem is not None:
        raise LabUnavailable(problem)
    from devices.robots import launcher

    yield Progress(None, f"starting the virtual lab ({scene})…")
    lab = launcher.start_lab(scene=scene)
    try:
        yield Progress(0.5, "connecting to the lab robot…")
        link = launcher.connect(lab)
    except BaseException:
        lab.stop()
        raise
    yield Progress(1.0, "connected")
    return link


def start_lab(controller: AppController, scene: str = DEMO_SCENE) -> None:
    """Start the lab in the background (a job) and attach its robot to the session."""
    problem = lab_problem()
    if problem is not None:
        log.warning("%s", problem)
        controller.set_device_status("robot", "unavailable", problem)
        return
    controller.set_device_status("robot", "connecting", f"starting the virtual lab ({scene})…")

    def done(link: RobotLink) -> None:
        controller.attach_robot(link, detail=f"virtual lab '{scene}': {link.info().name}")

    def failed(msg: str) -> None:
        controller.set_device_status("robot", "error", f"lab not available: {msg}")

    controller.submit_job("Start virtual lab", lab_job(scene), on_done=done, on_failed=failed)


class LabUnavailable(TwinbenchError):
    """The lab cannot be started in this installation (message says why)."""
