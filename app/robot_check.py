"""Add a robot: connect to an agent (`agent serve` on the robot's computer; the link is
app/robot_link.py's), check it with a live joint readout and a slow test motion inside the
envelope, stop it, attach it to the session. The GUI's "Add robot…" dialog
(widgets/add_robot.py) is a thin view of this; the drivers it offers are the agent's own
(`devices.robots.agent.drivers.DRIVER_NAMES`, built by `registry.DRIVERS`).

    link = connect_agent("192.168.1.20:7700", token, fingerprint)    # app.robot_link
    motion = TestMotion(link); motion.start(); ...; motion.stop()
    controller.attach_robot(link, detail=...)
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.robot_link import AgentLink
from devices.errors import DeviceError
from devices.robots.agent.drivers.arm_calibration import ArmCalibration
from devices.robots.agent.launch import start_agent_process
from devices.robots.motion import Motion
from devices.robots.motion_stream import MotionStopped, MotionStream
from devices.robots.wire.robot_types import RobotInfo

TEST_AMPLITUDE_RAD = 0.15  # at most; and at most 10 % of each joint's range
TEST_PERIOD_S = 4.0


def test_targets(info: RobotInfo, q0: NDArray[np.float64], t: float) -> NDArray[np.float64]:
    """A slow sine about q0 on every joint, kept inside the limits with a 10 % margin; it
    starts at q0 at rest and blends (smoothstep) to the centre and amplitude over 1 s."""
    lo, hi = np.asarray(info.limits.lower), np.asarray(info.limits.upper)
    span = hi - lo
    amp = np.minimum(TEST_AMPLITUDE_RAD, 0.1 * span)
    centre = np.clip(q0, lo + 0.1 * span + amp, hi - 0.1 * span - amp)
    u = min(1.0, max(t, 0.0) / 1.0)
    ramp = u * u * (3.0 - 2.0 * u)
    base = q0 + ramp * (centre - q0)
    return np.asarray(base + ramp * amp * np.sin(2 * np.pi * t / TEST_PERIOD_S), dtype=float)


def test_motion(
    info: RobotInfo, q0: NDArray[np.float64], seconds: float = 8.0, rate_hz: float = 50.0
) -> Motion:
    """`test_targets` from q0 over `seconds`, sampled at `rate_hz`, as a plan."""
    t = np.linspace(0.0, seconds, max(int(round(seconds * rate_hz)) + 1, 2))
    return Motion(
        "test motion",
        {"seconds": seconds, "amplitude_rad": TEST_AMPLITUDE_RAD, "period_s": TEST_PERIOD_S},
        t,
        np.array([test_targets(info, q0, float(tt)) for tt in t]),
        tuple(info.joint_names),
        description="a slow sine on every joint about the pose it holds",
    )


def check_calibration(path: Path) -> str:
    """One line describing a calibration JSON (raises DeviceError naming the problem)."""

    cal = ArmCalibration.load(path)
    return f"{cal.robot}: {len(cal.joints)} joints ({', '.join(cal.names)})"


def serve_command(driver: str, device: str = "", calibration: str = "", port: int = 7700) -> str:
    """The command to run on the robot's computer for `driver`."""
    cmd = f"python -m devices.robots.agent.serve --driver {driver} --port {port} --token-file TOKEN"
    if driver in ("dynamixel", "feetech"):
        cmd += f" --device {device or '/dev/ttyUSB0'} --calibration {calibration or 'arm.json'}"
    elif driver == "franka":
        cmd += f" --robot-ip {device or '172.16.0.2'}"
    return cmd


def save_bundle(info: RobotInfo, folder: Path) -> Path:
    """Write the robot-description bundle of a connected robot (`info.meta["bundle"]`) into
    `folder`: its URDF, `limits.json` and (servo arms) `calibration.json`; returns the URDF
    path, ready for `twin build --robot`. Raises DeviceError when the robot sent none."""
    import json

    bundle = info.meta.get("bundle")
    if not isinstance(bundle, dict) or not bundle.get("urdf"):
        raise DeviceError(f"robot {info.name}: its agent sent no robot description (URDF)")
    folder.mkdir(parents=True, exist_ok=True)
    name = Path(str(bundle.get("urdf_name") or f"{info.name}.urdf")).name
    urdf = folder / name
    text = str(bundle["urdf"])
    if isinstance(bundle.get("limits"), dict):
        text = _with_robot_limits(text, info.joint_names, bundle["limits"])
    urdf.write_text(text)
    (folder / "limits.json").write_text(json.dumps(bundle.get("limits"), indent=2))
    if bundle.get("calibration"):
        (folder / "calibration.json").write_text(json.dumps(bundle["calibration"], indent=2))
    return urdf


def _with_robot_limits(urdf: str, names: tuple[str, ...], limits: dict[str, Any]) -> str:
    """The URDF with each named joint's <limit> narrowed to the limits the agent enforces
    (the tighter of both per bound). A Franka's libfranka model URDF is the Panda's, wider
    than the FR3's envelope (joint 6: lower -0.02 vs 0.54 rad); a twin built from it would
    train toward and deploy goals the robot refuses. Unparsable URDFs are kept verbatim."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(urdf)
        cols = {k: [float(v) for v in limits[k]] for k in ("lower", "upper", "velocity", "effort")}
    except (ET.ParseError, KeyError, TypeError, ValueError):
        return urdf
    index = {n: i for i, n in enumerate(names)}
    changed = False
    for joint in root.iter("joint"):
        i = index.get(str(joint.get("name")))
        lim = joint.find("limit")
        if i is None or lim is None or joint.get("type") not in ("revolute", "prismatic"):
            continue
        for key, tighter in (("lower", max), ("upper", min), ("velocity", min), ("effort", min)):
            robot = cols[key][i] if i < len(cols[key]) else None
            if robot is None or not np.isfinite(robot):
                continue
            own = lim.get(key)
            # effort="0" / velocity="0" is a CAD exporter's "none given", not a limit of 0
            given = own is not None and (key in ("lower", "upper") or float(own) > 0)
            value = robot if own is None or not given else tighter(float(own), robot)
            if own is None or value != float(own):
                lim.set(key, repr(value))
                changed = True
        if float(lim.get("lower", "0")) > float(lim.get("upper", "0")):  # disjoint: the robot's
            lim.set("lower", repr(cols["lower"][i]))
            lim.set("upper", repr(cols["upper"][i]))
    return ET.tostring(root, encoding="unicode") if changed else urdf


def start_emulated_agent(vendor: str = "feetech") -> Any:
    """An agent process in front of an emulated servo arm (`agent serve --driver VENDOR
    --emulate`), for previews and demos: `.host`, `.port`, `.token`, `.terminate()`."""

    return start_agent_process(vendor, ["--emulate", "--rate", "100"], timeout_s=60)


class TestMotion:
    """Streams `test_motion` to a link's robot from its own thread until it ends or `stop()`,
    through the one checked motion stream (`devices.robots.motion_stream`): `start()` refuses a
    motion outside the robot's limits (MotionError) before anything moves. Always ends with
    a stop (robot held)."""

    def __init__(self, link: AgentLink, seconds: float = 8.0, rate_hz: float = 50.0) -> None:
        self.link, self.seconds, self.rate_hz = link, seconds, rate_hz
        self.error: str | None = None
        self.sent = 0
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        state = self.link.latest_state()
        if state is None:
            raise DeviceError(f"robot at {self.link.address}: no state yet")
        self._halt.clear()
        motion = test_motion(self.link.info(), state.joint_pos.copy(), self.seconds, self.rate_hz)
        stream = MotionStream(
            self.link.client, motion, rate_hz=self.rate_hz, stop_event=self._halt
        )  # checked here: refused before anything moves
        self.error = None
        self._thread = threading.Thread(
            target=self._run, args=(stream,), name="twinbench-test-motion", daemon=True
        )
        self._thread.start()

    def _run(self, stream: MotionStream) -> None:
        try:
            for _ in stream.play():  # stops the robot at its end, on error and on stop()
                self.sent = stream.sent
        except MotionStopped:
            pass
        except DeviceError as exc:
            self.error = str(exc)
        finally:
            self.sent = stream.sent

    def stop(self) -> None:
        """Stop now (the robot is held); waits for the streaming thread to end."""
        self._halt.set()
        try:
            self.link.stop("stop pressed")
        except DeviceError as exc:
            self.error = self.error or str(exc)
        if self._thread is not None:
            self._thread.join(timeout=2.0)
