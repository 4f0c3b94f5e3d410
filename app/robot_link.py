"""The robot link: one class for every robot the workbench connects to. The virtual lab is
just another agent speaking the robot protocol (devices/robots/wire/PROTOCOL.md), so the lab and
every hardware agent are an `AgentLink`; the lab's link also owns the agent process it
launched (stopped when the link closes, and its death ends the link).

    link = connect_agent("192.168.1.20:7700", token, fingerprint)   # a robot's agent
    link = run_to_end(lab_job("panda_table"))                        # the lab, launched here
    controller.attach_robot(link, detail=...)

A dropped link is dialled again by the client (`reconnect=True`) and the devices panel says
"reconnecting…", then "connected"; only closing the link, or a launched process dying, ends
it. `link_positions` draws the arm from its own description (URDF) through the workbench's
one forward kinematics (twins/kinematics.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.controller import DeviceStateName, camera_health, link_health
from devices.errors import DeviceError
from devices.robots.client import RobotClient
from devices.robots.wire.robot_types import RobotInfo, RobotState
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress
from twins.kinematics import RobotKinematics

log = logging.getLogger(__name__)


class LabUnavailable(TwinbenchError):
    """The lab cannot be started in this installation (message says why)."""


class AgentLink:
    """A RobotClient connected to a robot agent, and the agent process when this workbench
    launched it (`process`: `.host`, `.port`, `.alive`, `.proc`, `.terminate()`; the lab,
    `is_lab`). Satisfies `app.controller.RobotLink` (with `watch`, `health`, `camera_health`)."""

    def __init__(
        self,
        client: RobotClient,
        address: str | None = None,
        process: Any = None,
        is_lab: bool = False,
    ) -> None:
        self.client, self.process, self.is_lab = client, process, is_lab
        self.address = address or str(getattr(client, "address", ""))
        self._kin: RobotKinematics | None = None  # for `link_positions`, read in the background
        self._kin_lock = threading.Lock()
        self._kin_thread: threading.Thread | None = None
        self._load_figure()

    def info(self) -> RobotInfo:
        info = self.client.info
        if info is None:
            raise DeviceError(f"robot at {self.address}: not connected")
        return info

    @property
    def cameras(self) -> list[str]:
        return [
            str(c.get("name", c)) if isinstance(c, dict) else str(c)
            for c in getattr(self.client, "cameras", [])
        ]

    def _gone(self) -> str | None:
        """Why the launched agent process is gone (None while it runs, or without one)."""
        if self.process is None or getattr(self.process, "alive", True):
            return None
        code = getattr(getattr(self.process, "proc", None), "returncode", None)
        what = "the virtual lab process" if self.is_lab else "the agent process"
        return f"{what} at {self.address} exited (code {code})"

    def latest_state(self) -> RobotState | None:
        """The newest state; None while the link (re)connects. Raises DeviceError when the
        link is lost for good or the launched process is gone (that, or closing, ends it)."""
        gone = self._gone()
        if gone is not None:
            raise DeviceError(gone)
        try:
            return self.client.latest_state(timeout_s=0.0)
        except DeviceError:
            if getattr(self.client, "link_state", "") in ("reconnecting", "connected"):
                return None  # dialling again (or not a state yet on the new session)
            raise

    def watch(self, callback: Callable[[str, str], None]) -> None:
        """`callback(state, message)` on the link's news (reconnecting, connected, lost)."""

        def news(state: str, message: str) -> None:
            gone = self._gone()
            callback(state, f"{message} ({gone})" if state == "lost" and gone else message)

        self.client.on_link = news

    def health(self) -> tuple[DeviceStateName, str]:
        gone = self._gone()
        if gone is not None:
            return "error", gone
        return link_health(self.client)

    def camera_health(self) -> tuple[DeviceStateName, str] | None:
        if not self.cameras:
            return None
        names = ", ".join(self.cameras)
        served = (
            f"virtual lab cameras: {names} (served by the lab at {self.address})"
            if self.is_lab
            else f"cameras of the robot at {self.address}: {names}"
        )
        gone = self._gone()
        if gone is not None:
            return "error", f"{served}: {gone}"
        return camera_health(self.client, served)

    def _load_figure(self) -> None:
        """Read the arm's kinematics from its description (URDF) on a thread of its own:
        PyBullet reads it holding the GIL, or a worker process starts (the window waits for
        neither); `link_positions` draws nothing until it is ready."""
        with self._kin_lock:
            if self._kin_thread is not None:
                return
            info = self.client.info
            if info is None:
                return

            def load() -> None:
                try:
                    self._kin = RobotKinematics.from_description(info.description, info.joint_names)
                except TwinbenchError as exc:
                    log.info("robot %s: no stick figure (%s)", info.name, exc)

            self._kin_thread = threading.Thread(target=load, name="twinbench-arm-figure")
            self._kin_thread.daemon = True
            self._kin_thread.start()

    def link_positions(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64] | None:
        """Stick-figure points (K, 3) of the arm for drawing, from its own description
        (URDF) through the workbench's forward kinematics (`RobotKinematics.figure_points`);
        None while that is being read, or when the robot has no description it can read."""
        self._load_figure()
        kin = self._kin
        if kin is None:
            return None
        points: NDArray[np.float64] = kin.figure_points(joint_pos)
        return points

    def take_control(self) -> None:
        self.client.take_control()

    # no command method: motions reach the arm only through devices.robots.motion_stream (checked)
    def stop(self, reason: str) -> None:
        self.client.stop(reason)

    def protocol_client(self) -> RobotClient | None:
        return self.client if self.client.connected else None

    def bundle(self) -> dict[str, Any] | None:
        """The robot-description bundle the agent sent (URDF, limits, calibration)."""
        b = self.info().meta.get("bundle")
        return b if isinstance(b, dict) else None

    def close(self) -> None:
        """Disconnect, then stop the agent process if this link launched it."""
        try:
            self.client.close()
        finally:
            if self.process is not None:
                code = self.process.terminate()
                log.info(
                    "%s stopped (exit code %s)", "virtual lab" if self.is_lab else "agent", code
                )


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    try:
        if not host:
            raise ValueError
        return host, int(port)
    except ValueError:
        raise DeviceError(
            f"robot address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:7700"
        ) from None


def connect_agent(address: str, token: str, fingerprint: str | None = None) -> AgentLink:
    """Connect to the agent at HOST:PORT and wait for its first state."""
    host, port = parse_address(address)
    if not token.strip():
        raise DeviceError(f"robot at {address}: give the agent's access token")
    client = RobotClient(
        host,
        port,
        token.strip(),
        name="twinbench-add-robot",
        tls_fingerprint=fingerprint or None,
        reconnect=True,  # a busy laptop's hiccup is not a lost robot: dial it again
    )
    try:
        client.connect()
        client.latest_state(timeout_s=5.0)
    except BaseException:
        client.close()
        raise
    return AgentLink(client, f"{host}:{port}")


def launched_client(process: Any, name: str = "twinbench-gui") -> RobotClient:
    """A client for an agent process this workbench launched (the lab) that rides out a
    busy machine: a dropped link is dialled again while the process lives (not connected
    yet: call `connect()`)."""
    return RobotClient(
        process.host,
        process.port,
        process.token,
        name=name,
        reconnect=True,
        reconnect_while=lambda: bool(process.alive),
    )


def lab_problem() -> str | None:
    """Why the virtual lab cannot be started here, or None when it can."""
    try:
        # a probe: an installation without the lab's launcher is told so, not failed
        from devices.robots import client  # noqa: F401
        from devices.robots.agent import launch  # noqa: F401
    except ImportError as exc:
        return f"lab not available: this installation has no virtual lab launcher ({exc})"
    return None


def lab_job(scene: str = "panda_table", extra_args: list[str] | None = None) -> Job[AgentLink]:
    """Launch the lab's agent process, connect to it, wait for the first state; returns its
    link (which stops the process when closed)."""
    problem = lab_problem()
    if problem is not None:
        raise LabUnavailable(problem)
    # after lab_problem(): an installation without the launcher gets LabUnavailable
    from devices.robots.agent.launch import start_lab_process

    yield Progress(None, f"starting the virtual lab ({scene})…")
    lab = start_lab_process(scene, extra_args=extra_args)
    client = None
    try:
        yield Progress(0.6, f"connecting to the lab robot at {lab.host}:{lab.port}…")
        client = launched_client(lab)
        client.connect()
        client.latest_state(timeout_s=5.0)
        yield Progress(1.0, "connected")
    except BaseException:  # includes cancel (GeneratorExit): never leave the lab running
        if client is not None:
            client.close()
        lab.terminate()
        raise
    return AgentLink(client, f"{lab.host}:{lab.port}", process=lab, is_lab=True)
