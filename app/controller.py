"""The application controller: a Qt-free model of what the desktop app shows and does.

`AppController` holds the open project, the recent-projects list, the log, the state of the
connected devices and the job hook. Views (widgets/) observe it through plain callbacks
(`Event.connect`) and act only through its methods, napari/Orange style: the same object
drives a test, a script or the window.

Callbacks run on the thread that caused the change (log records can arrive from worker
threads); Qt views marshal to the GUI thread themselves.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from devices.robots.wire.robot_types import RobotInfo, RobotState
from devices.trajectory import Trajectory
from resources import atomic
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress, run_to_end
from resources.project import Project, ProjectError

if TYPE_CHECKING:
    from app.workflows.scan_frames import ScanOptions
    from devices.robots.client import RobotClient
    from reconstruction.scan_result import ScanResult

log = logging.getLogger(__name__)

T = TypeVar("T")
RECENT_FILE = "recent.json"
MAX_RECENT = 10


def config_dir() -> Path:
    """Per-user settings folder: $TWINBENCH_CONFIG_DIR, else $XDG_CONFIG_HOME/twinbench,
    else ~/.config/twinbench."""
    env = os.environ.get("TWINBENCH_CONFIG_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "twinbench"


def data_dir() -> Path:
    """Per-user data folder (the demo project lives here): $TWINBENCH_DATA_DIR, else
    $XDG_DATA_HOME/twinbench, else ~/.local/share/twinbench."""
    env = os.environ.get("TWINBENCH_DATA_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "twinbench"


class Event(Generic[T]):
    """A tiny observable: `connect(cb)`, `disconnect(cb)`, `emit(value)`.

    A callback that raises is logged and does not stop the others.
    """

    def __init__(self) -> None:
        self._callbacks: list[Callable[[T], None]] = []
        self._lock = threading.Lock()

    def connect(self, cb: Callable[[T], None]) -> None:
        with self._lock:
            self._callbacks.append(cb)

    def disconnect(self, cb: Callable[[T], None]) -> None:
        with self._lock:
            if cb in self._callbacks:
                self._callbacks.remove(cb)

    def emit(self, value: T) -> None:
        with self._lock:
            cbs = list(self._callbacks)
        for cb in cbs:
            try:
                cb(value)
            except Exception:  # a broken view must not break the model
                log.exception("observer %r failed", cb)


DeviceStateName = Literal[
    "unavailable", "disconnected", "connecting", "connected", "reconnecting", "stale", "error"
]
STALE_S = 2.0  # a device row says "stale" when nothing came from it for this long


@dataclass(frozen=True)
class DeviceStatus:
    """Connection state of one device ("robot", "camera") with a human detail line."""

    name: str
    state: DeviceStateName
    detail: str = ""


@dataclass(frozen=True)
class LogEntry:
    """One log record as the log panel shows it."""

    time: float
    level: int
    logger: str
    message: str
    traceback: str = ""

    @property
    def level_name(self) -> str:
        return logging.getLevelName(self.level)


class RobotLink(Protocol):
    """What the session needs from a connected robot (a RobotClient adapter satisfies it).

    Optional, found by name: `watch(callback)` registers `callback(state, message)` for the
    link's own news ("reconnecting", "connected", "lost"); `health()` -> (state, detail) and
    `camera_health()` -> (state, detail) | None give the robot and camera rows on demand
    (`AppController.poll_devices`); `cameras` names cameras served over the link."""

    def info(self) -> RobotInfo: ...

    def latest_state(self) -> RobotState | None:
        """The newest streamed state, or None before the first one. Never blocks."""

    def close(self) -> None:
        """Disconnect (and stop whatever the link started, e.g. the lab process)."""

    def protocol_client(self) -> RobotClient | None:
        """The robot-protocol client behind the link, which workflows that move the arm
        (the guided scan) drive; None when it is not connected."""


@dataclass
class JobRequest:
    """A job handed to whoever runs jobs (the GUI's runner, or synchronously when none)."""

    title: str
    job: Job[Any]
    on_done: Callable[[Any], None] | None = None
    on_failed: Callable[[str], None] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class SessionLogHandler(logging.Handler):
    """A logging handler that keeps the last records and feeds them to `AppController.log_added`."""

    def __init__(self, controller: AppController, level: int = logging.INFO) -> None:
        super().__init__(level)
        self._controller = controller

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # malformed %-args: show the raw template rather than nothing
            msg = str(record.msg)
        tb = ""
        if record.exc_info and record.exc_info[0] is not None:
            tb = logging.Formatter().formatException(record.exc_info)
        self._controller._add_log(LogEntry(record.created, record.levelno, record.name, msg, tb))


class AppController:
    """The open project, recent projects, log, devices and jobs of one app session."""

    def __init__(self, config: Path | None = None, max_log: int = 2000) -> None:
        self.config_path = Path(config) if config is not None else config_dir()
        self.project: Project | None = None
        self.project_changed: Event[Project | None] = Event()
        self.recent_changed: Event[list[Path]] = Event()
        self.devices_changed: Event[dict[str, DeviceStatus]] = Event()
        self.log_added: Event[LogEntry] = Event()
        self.job_requested: Event[JobRequest] = Event()
        self.job_executor: Callable[[JobRequest], None] | None = None
        self._log: deque[LogEntry] = deque(maxlen=max_log)
        self._log_lock = threading.Lock()
        self._devices: dict[str, DeviceStatus] = {
            "robot": DeviceStatus("robot", "disconnected", "no robot connected"),
            "camera": DeviceStatus("camera", "disconnected", "no camera connected"),
        }
        self._robot: RobotLink | None = None
        self._robot_info: RobotInfo | None = None
        self._robot_detail = ""
        self._robot_lock = threading.Lock()
        # one writer of the device rows at a time: the link's news comes on its own threads
        # (a drop on one, the reconnect on another) while the panel polls; a poll that read
        # "reconnecting" and wrote it after the reconnect's "connected" left the row wrong
        self._rows_lock = threading.RLock()
        self._handler: SessionLogHandler | None = None
        # open3d + pybullet (1.1 s): app.robot_link, so the `agent` command, loads this module
        from app.workflows.deploy_plan import predict_in_worker
        from twins.kinematics import read_in_worker

        # a job reading a robot's URDF or predicting a deploy in the twin (PyBullet) must not
        # hold the window (the GIL): both in worker processes
        read_in_worker()
        predict_in_worker()

    # -- logging -------------------------------------------------------------------------
    def install_log_handler(self, logger: logging.Logger | None = None) -> SessionLogHandler:
        """Route Python logging (root logger by default) into this session's log."""
        target = logger or logging.getLogger()
        if self._handler is None:
            self._handler = SessionLogHandler(self)
        if self._handler not in target.handlers:
            target.addHandler(self._handler)
        if target.level == logging.NOTSET or target.level > logging.INFO:
            target.setLevel(logging.INFO)
        return self._handler

    def remove_log_handler(self, logger: logging.Logger | None = None) -> None:
        if self._handler is not None:
            (logger or logging.getLogger()).removeHandler(self._handler)

    def _add_log(self, entry: LogEntry) -> None:
        with self._log_lock:
            self._log.append(entry)
        self.log_added.emit(entry)

    def log_entries(self) -> list[LogEntry]:
        with self._log_lock:
            return list(self._log)

    # -- projects ------------------------------------------------------------------------
    def open_project(self, path: Path) -> Project:
        """Open a project; on failure raises ProjectError and keeps the current one."""
        proj = Project.open(Path(path).expanduser().resolve())
        self._set_project(proj)
        log.info("opened project '%s' at %s", proj.name, proj.root)
        return proj

    def new_project(self, path: Path, name: str | None = None) -> Project:
        """Create a project folder (new or empty) and make it the open project."""
        proj = Project.create(Path(path).expanduser().resolve(), name=name)
        self._set_project(proj)
        log.info("created project '%s' at %s", proj.name, proj.root)
        return proj

    def save_project(self) -> None:
        """Write the open project's manifest (artifacts are already saved as they are made)."""
        if self.project is None:
            raise ProjectError("no project is open; create or open one first (File menu)")
        self.project.save()
        log.info("saved project '%s'", self.project.name)

    def close_project(self) -> None:
        if self.project is not None:
            self.project = None
            self.project_changed.emit(None)

    def notify_project_changed(self) -> None:
        """Tell views the open project gained artifacts (call after a workflow wrote one)."""
        self.project_changed.emit(self.project)

    def save_trajectory(
        self, traj: Trajectory, summary: str = "", settings: dict[str, Any] | None = None
    ) -> str:
        """Store a trajectory as a new artifact of the open project; returns its id."""
        if self.project is None:
            raise ProjectError("no project is open; create or open one before recording")
        meta = {k: v for k, v in traj.meta.items() if isinstance(v, (str, int, float, bool))}
        with self.project.new_artifact(
            "trajectory", settings={**meta, **(settings or {})}, summary=summary
        ) as folder:
            traj.save(folder)
        aid = self.project.artifacts("trajectory")[-1].id
        log.info("saved trajectory %s (%d samples, %.1f s)", aid, len(traj), traj.duration)
        self.notify_project_changed()
        return aid

    def load_trajectory(self, artifact_id: str) -> Trajectory:
        """Load a trajectory artifact of the open project."""
        if self.project is None:
            raise ProjectError("no project is open")
        return Trajectory.load(self.project.path_of(artifact_id))

    def _set_project(self, proj: Project) -> None:
        self.project = proj
        self._remember(proj.root)
        self.project_changed.emit(proj)

    def open_last(self) -> Project | None:
        """Open the most recent project that still opens; None if there is none."""
        for p in self.recent_projects():
            try:
                return self.open_project(p)
            except ProjectError as exc:
                log.warning("could not reopen recent project: %s", exc)
        return None

    # -- recent projects -----------------------------------------------------------------
    @property
    def recent_file(self) -> Path:
        return self.config_path / RECENT_FILE

    def recent_projects(self) -> list[Path]:
        """Recent project folders, newest first. A missing or corrupt file means none."""
        f = self.recent_file
        if not f.is_file():
            return []
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
            items = data["recent"] if isinstance(data, dict) else []
            return [Path(p) for p in items if isinstance(p, str)][:MAX_RECENT]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable recent-projects list, ignoring it (%s)", f, exc)
            return []

    def _remember(self, root: Path) -> None:
        root = Path(root).resolve()
        items = [root] + [p for p in self.recent_projects() if p != root]
        self._write_recent(items[:MAX_RECENT])

    def forget_recent(self, root: Path) -> None:
        self._write_recent([p for p in self.recent_projects() if p != Path(root)])

    def _write_recent(self, items: list[Path]) -> None:
        try:
            atomic.write_json(self.recent_file, {"version": 1, "recent": [str(p) for p in items]})
        except OSError as exc:  # a read-only home must not stop the app
            log.warning("%s: cannot save recent projects (%s)", self.recent_file, exc)
            return
        self.recent_changed.emit(items)

    # -- devices -------------------------------------------------------------------------
    def devices(self) -> dict[str, DeviceStatus]:
        return dict(self._devices)

    def set_device_status(self, name: str, state: DeviceStateName, detail: str = "") -> None:
        self._devices[name] = DeviceStatus(name, state, detail)
        self.devices_changed.emit(self.devices())

    def attach_robot(self, link: RobotLink, detail: str = "") -> None:
        """Make `link` the connected robot; the devices panel starts showing its state."""
        self.detach_robot()
        self._robot = link
        self._robot_info = link.info()
        self._robot_detail = detail or self._robot_info.name
        watch = getattr(link, "watch", None)
        if callable(watch):
            watch(lambda state, message: self._on_link(link, state, message))
        self.set_device_status("robot", "connected", self._robot_detail)
        log.info("robot connected: %s", self._robot_detail)

    def detach_robot(self, detail: str = "no robot connected") -> None:
        """Close the robot link (if any) and mark the robot disconnected."""
        with self._robot_lock:
            link, self._robot, self._robot_info = self._robot, None, None
        if link is not None:
            try:
                link.close()
            except Exception:
                log.exception("error while disconnecting the robot")
            self.set_device_status("robot", "disconnected", detail)
            if _served_cameras(link):
                self.set_device_status("camera", "disconnected", "no camera connected")

    @property
    def robot_info(self) -> RobotInfo | None:
        return self._robot_info

    def robot_state(self) -> RobotState | None:
        """Newest robot state, or None when not connected or while its link reconnects.
        A link that is gone for good is reported once (and closed)."""
        link = self._robot
        if link is None:
            return None
        try:
            return link.latest_state()
        except Exception as exc:
            self._robot_lost(link, str(exc))
            return None

    def _robot_lost(self, link: RobotLink, why: str) -> None:
        with self._robot_lock:
            if self._robot is not link:
                return  # reported already, or replaced
            self._robot, self._robot_info = None, None
        log.error("robot connection lost: %s", why)
        try:
            link.close()
        except Exception:
            log.exception("error while closing the lost robot link")
        self.set_device_status("robot", "error", f"connection lost: {why}")
        if _served_cameras(link):
            self.set_device_status("camera", "error", f"served by the robot: {why}")

    def _on_link(self, link: RobotLink, state: str, message: str) -> None:
        """News from the robot link's own threads: it dropped and is reconnecting, it is
        back (a new session), or it is gone for good."""
        with self._rows_lock:
            if self._robot is not link:
                return
            if state == "reconnecting":
                log.warning("%s", message)
                self.set_device_status("robot", "reconnecting", message)
            elif state == "connected":
                log.warning("%s", message)
                self.set_device_status("robot", "connected", self._robot_detail)
            elif state == "lost":
                self._robot_lost(link, message)
                return
            self.poll_devices()

    def poll_devices(self) -> None:
        """Bring the robot and camera rows up to date with the link's health (the devices
        panel calls this a few times a second): "stale" when no state or frame came for
        `STALE_S`, "reconnecting…" while the link dials again, back to "connected"."""
        with self._rows_lock:
            link = self._robot
            if link is None:
                return
            health = getattr(link, "health", None)
            if callable(health):
                state, detail = health()
                if state == "error":  # gone for good (the lab process died): reported once
                    self._robot_lost(link, detail)
                    return
                if state == "connected":
                    detail = self._robot_detail
                self._set_if_changed("robot", state, detail)
            camera = getattr(link, "camera_health", None)
            if callable(camera):
                row = camera()
                if row is not None:
                    self._set_if_changed("camera", row[0], row[1])

    def _set_if_changed(self, name: str, state: DeviceStateName, detail: str) -> None:
        if self._robot is None:
            return
        old = self._devices.get(name)
        if old is None or (old.state, old.detail) != (state, detail):
            self.set_device_status(name, state, detail)

    def robot_links(self, joint_pos: Any) -> Any:
        """Stick-figure points (K, 3) of the connected arm at joint_pos, if its link can
        draw one (optional `link_positions` method); else None."""
        fn = getattr(self._robot, "link_positions", None)
        return fn(joint_pos) if callable(fn) else None

    @property
    def robot_link(self) -> RobotLink | None:
        """The connected robot's link (for workflows that command it), or None."""
        return self._robot

    def _robot_client(self) -> RobotClient | None:
        link = self._robot
        return link.protocol_client() if link is not None else None

    @property
    def can_scan_robot(self) -> bool:
        """A connected robot that a guided wrist scan can drive."""
        return self._robot_client() is not None

    def robot_scan_job(
        self, options: ScanOptions | None = None, record: Path | None = None
    ) -> Job[ScanResult]:
        """The guided wrist scan of the connected robot (app.workflows.scan_robot).
        Raises TwinbenchError when no robot is connected."""
        # open3d + cv2 (0.9 s): app.robot_link, so the `agent` command, loads this module
        from app.workflows.scan_robot import scan_robot

        client = self._robot_client()
        if client is None:
            raise TwinbenchError(
                "no robot connected (Devices ▸ Start virtual lab, or Add robot… in the "
                "Devices panel)"
            )

        def job() -> Job[ScanResult]:
            # take control first: after a reconnect the robot moves for nobody until then
            client.take_control()
            return (yield from scan_robot(client, options, record=record))

        return job()

    # -- jobs ----------------------------------------------------------------------------
    def submit_job(
        self,
        title: str,
        job: Job[Any],
        on_done: Callable[[Any], None] | None = None,
        on_failed: Callable[[str], None] | None = None,
    ) -> None:
        """Run a job: in the GUI on its worker pool, otherwise here, synchronously."""
        req = JobRequest(title, job, on_done, on_failed)
        if self.job_executor is not None:
            self.job_executor(req)
            return
        try:
            result = run_to_end(job, lambda p: log.debug("%s: %s", title, p.message))
        except Exception as exc:
            log.exception("%s failed", title)
            if on_failed is not None:
                on_failed(str(exc))
            return
        if on_done is not None:
            on_done(result)

    def shutdown(self) -> None:
        """Disconnect devices and detach logging; call once when the app closes."""
        self.detach_robot()
        self.remove_log_handler()


def _served_cameras(link: object) -> bool:
    """Whether `link` serves the camera row (the lab's cameras come over its link)."""
    try:
        return bool(getattr(link, "cameras", None))
    except Exception:
        return False


def link_health(client: RobotClient, stale_s: float = STALE_S) -> tuple[DeviceStateName, str]:
    """The robot row for a protocol client: connected, stale (no state for `stale_s`),
    reconnecting, or error (gone)."""
    state = getattr(client, "link_state", "connected")
    if state == "reconnecting":
        return "reconnecting", str(getattr(client, "link_detail", "")) or "reconnecting…"
    if state in ("lost", "closed"):
        return "error", str(getattr(client, "link_detail", "")) or "connection lost"
    age = client.state_age()
    if age is not None and age > stale_s:  # (no running age: the row changes once)
        return "stale", (
            f"no state for over {stale_s:g} s (the link counts as lost after "
            f"{client.stale_timeout_s:.0f} s of silence, then reconnects)"
        )
    return "connected", ""


def camera_health(
    client: RobotClient, served: str, stale_s: float = STALE_S
) -> tuple[DeviceStateName, str]:
    """The camera row for cameras served over a protocol client (`served` describes them):
    "stale" when a camera streaming to us sent no frame for `stale_s`, the robot link's
    trouble when it has some, else connected (streaming or idle)."""
    robot, why = link_health(client, float("inf"))
    if robot != "connected":
        return robot, f"{served}: {why}"
    ages = client.camera_ages()
    old = {c: a for c, a in ages.items() if a > stale_s}
    if old:
        return "stale", f"{served}: no frames from {', '.join(map(repr, sorted(old)))} " + (
            f"for over {stale_s:g} s"
        )
    if ages:
        return "connected", f"{served}; streaming {', '.join(sorted(ages))}"
    return "connected", served


def idle_job(seconds: float, steps: int = 10) -> Job[float]:
    """A job that only waits (used by previews and tests of the job runner)."""
    for i in range(steps):
        yield Progress(i / steps, f"waiting {i + 1}/{steps}")
        time.sleep(seconds / steps)
    yield Progress(1.0, "done")
    return seconds
