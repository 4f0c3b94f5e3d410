"""The connected robot as a guided scan sees it (app/workflows/scan_robot.py): forward
kinematics of its own description, guarded moves that wait until the arm is still, and
wrist-camera frames paired with the joint state at their timestamp — all through the robot
protocol.

Camera waits are sized to the source (`camera_waits`): the first frame may take the robot
side's camera start-up (the lab starts a renderer process: up to a minute on a loaded
machine), later frames a generous number of frame periods; both are stretched by the load
on this machine. Frames are read on a thread of their own (`_FramePump`) so that a job can
say that it is waiting (`ConnectedArm.wait_camera`) and fail with a message that names the
camera, the robot, how long it waited and what to do.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.workflows.scan_plan import RobotScanError, RobotScanPlan
from devices.errors import DeviceError
from devices.frames import RGBDFrame
from devices.poses import pose_to_matrix, rotation_angle_deg
from devices.robots.client import RobotClient, load_per_core
from devices.robots.motion_stream import MotionStream, ramp_to, robot_limits
from reconstruction.scan_path import solve_view
from resources.jobs import Job, Progress
from twins.kinematics import RobotKinematics

# --- how long to wait for a robot's camera ---------------------------------------------------
IK_LIMIT_MARGIN = 0.05  # rad: scan and calibration poses keep this far inside the joint limits
DEFAULT_CAMERA_FPS = 15.0  # a camera whose robot does not state its rate (camera/<name>/fps)
CAMERA_STARTUP_S = 60.0  # the robot side starting a camera (the lab's renderer allowance)
NEXT_FRAME_MIN_S = 15.0  # never give up on the next frame sooner (what scans always waited)
LATE_FRAME_PERIODS = 100  # ... nor before this many frame periods (a slow camera)
MAX_LOAD_STRETCH = 4.0  # the waits grow with the load per core, up to this factor
SAY_WAITING_AFTER_S = 2.0  # a job waiting longer than this says so, about once a second
STOP_CHECK_AFTER_S = 0.5  # an arm not settled this long after a move: has the robot stopped?
MAX_GRAB_WINDOW_S = 2.4  # s: the longest state window a still frame is looked for in
MOVE_RATE_HZ = 100.0  # position commands per second of a move


@dataclass(frozen=True)
class CameraWaits:
    """How long a guided scan waits for one camera (s): `first_s` for its first frame after
    subscribing, `next_s` for each later one; sized from `fps` (`fps_stated`: the robot
    said so, else `DEFAULT_CAMERA_FPS`) and stretched by `stretch` (the load per core of
    this machine, 1 to `MAX_LOAD_STRETCH`)."""

    fps: float
    fps_stated: bool
    stretch: float
    first_s: float
    next_s: float

    def describe(self) -> str:
        rate = f"{self.fps:g} fps" + ("" if self.fps_stated else " assumed")
        return f"{rate}, load x{self.stretch:.1f}"


def camera_waits(fps: float | None, load: float | None = None) -> CameraWaits:
    """The waits for a camera at `fps` (None or <= 0: not stated) on a machine whose 1-minute
    load per core is `load` (default: now). The next frame: `LATE_FRAME_PERIODS` frame
    periods, at least `NEXT_FRAME_MIN_S`; the first: the camera's start-up
    (`CAMERA_STARTUP_S`) on top of that; both times the load stretch."""
    stated = fps is not None and fps > 0
    rate = float(fps) if stated and fps is not None else DEFAULT_CAMERA_FPS
    stretch = min(max(load_per_core() if load is None else load, 1.0), MAX_LOAD_STRETCH)
    late = max(NEXT_FRAME_MIN_S, LATE_FRAME_PERIODS / rate)
    return CameraWaits(
        fps=rate,
        fps_stated=stated,
        stretch=float(stretch),
        first_s=float(stretch * (CAMERA_STARTUP_S + late)),
        next_s=float(stretch * late),
    )


def stated_fps(meta: dict[str, Any], camera: str) -> float | None:
    """The frame rate a robot states for `camera` in its info (`camera/<name>/fps`)."""
    try:
        fps = float(meta.get(f"camera/{camera}/fps", 0.0) or 0.0)
    except (TypeError, ValueError):
        return None
    return fps if np.isfinite(fps) and fps > 0 else None


class _FramePump:
    """One camera's frames read on a thread of their own into a short queue (the newest
    kept), so that the job can wait for them with its own deadlines and say so meanwhile.

    `open` hands out the live pump of a client's camera if there is one: a job cancelled
    while the camera was starting leaves its pump waiting for the first frame (it stops at
    the next frame); a job started meanwhile on the same client adopts it instead of
    subscribing again beside it (the client keeps one frame queue per camera)."""

    _live: dict[tuple[int, str], _FramePump] = {}
    _live_lock = threading.Lock()

    @classmethod
    def open(cls, client: RobotClient, camera: str, waits: CameraWaits) -> _FramePump:
        with cls._live_lock:
            old = cls._live.get((id(client), camera))
            if old is not None and old.client is client and old._adopt(waits):
                return old
            pump = cls(client, camera, waits)
            cls._live[(id(client), camera)] = pump
        pump._thread.start()
        return pump

    def __init__(self, client: RobotClient, camera: str, waits: CameraWaits) -> None:
        self.client, self.camera, self.waits = client, camera, waits
        self.queue: queue.Queue[RGBDFrame] = queue.Queue(maxsize=4)
        self.first = threading.Event()  # a frame has arrived
        self.ended = threading.Event()  # the thread is done (error or closed)
        self.error: BaseException | None = None
        self.count = 0
        self.started = time.monotonic()
        self.last_at = self.started  # when the newest frame arrived (or the start)
        self._lock = threading.Lock()
        self._stop = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"scan-camera-{camera}", daemon=True)

    def _adopt(self, waits: CameraWaits) -> bool:
        with self._lock:
            if self._closing:
                return False
            self._stop = False
            self.waits, self.started = waits, time.monotonic()
            if not self.first.is_set():
                self.last_at = self.started
            return True

    def _run(self) -> None:
        # the client's own deadline is a backstop beyond ours (ours fail with a better word)
        frames = self.client.camera_frames(self.camera, timeout_s=self.waits.first_s + 10.0)
        try:
            for f in frames:
                with self._lock:
                    if self._stop:
                        self._closing = True
                        break
                    if self.queue.full():
                        try:
                            self.queue.get_nowait()
                        except queue.Empty:
                            pass
                    self.queue.put_nowait(f)
                    self.count += 1
                    self.last_at = time.monotonic()
                    self.first.set()
        except BaseException as exc:  # noqa: BLE001 - raised where the job waits
            self.error = exc
        finally:
            with self._lock:
                self._closing = True
            with self._live_lock:
                if self._live.get((id(self.client), self.camera)) is self:
                    del self._live[(id(self.client), self.camera)]
            try:
                frames.close()  # unsubscribes, from this thread
            except BaseException:  # noqa: BLE001 - a daemon thread must end quietly
                pass
            self.ended.set()

    def silent_s(self) -> float:
        """Seconds since the newest frame (since subscribing while none has come)."""
        return time.monotonic() - self.last_at

    def get(self, timeout_s: float) -> RGBDFrame | None:
        """The next frame, or None after `timeout_s`; raises the stream's own error."""
        end = time.monotonic() + timeout_s
        while True:
            try:
                return self.queue.get(timeout=max(0.0, min(0.25, end - time.monotonic())))
            except queue.Empty:
                pass
            if self.error is not None:
                raise self.error
            if self.ended.is_set() and self.queue.empty():
                raise DeviceError(
                    f"robot at {self.client.address}: camera '{self.camera}' stream ended"
                )
            self.client.check()  # a lost link says so now, not at the deadline
            if time.monotonic() >= end:
                return None

    def close(self, join_s: float) -> None:
        """Stop reading: the thread unsubscribes at the next frame (waited for up to
        `join_s`; a camera still starting up is left to a daemon thread)."""
        with self._lock:
            self._stop = True
        self._thread.join(timeout=join_s)


class ConnectedArm:
    """The connected robot as a scan sees it: FK of its description, guarded moves,
    frames paired with joint states."""

    def __init__(self, client: RobotClient, camera: str | None = None) -> None:
        info = client.info
        if info is None:
            raise RobotScanError(f"robot at {client.address}: not connected")
        self.client, self.info = client, info
        self.last_motion_rad = 0.0  # how far the arm moved over the last `grab`'s window
        cams = [c for c in info.cameras if f"camera/{c}/nominal_T_mount_camera" in info.meta]
        if camera is None:
            if not cams:
                raise RobotScanError(
                    f"robot {info.name} at {client.address} reports no wrist "
                    f"camera with a mount pose (cameras: {list(info.cameras)})"
                )
            camera = cams[0]
        if camera not in cams:
            raise RobotScanError(
                f"robot {info.name}: camera '{camera}' has no mount pose (wrist cameras: {cams})"
            )
        self.camera = camera
        self.fixed_cameras = [c for c in info.cameras if c not in cams]
        self.mount = str(info.meta.get(f"camera/{camera}/mount_body", ""))
        self.T_mount_camera_nominal = pose_to_matrix(
            info.meta[f"camera/{camera}/nominal_T_mount_camera"]
        )
        self.kin = RobotKinematics.from_description(info.description, info.joint_names)
        # views are solved this far inside the joint limits: a target at a limit overshoots
        # it a little when reached, and the robot stops the arm for that (a measured-state
        # safety stop: joint 7 at its limit for a view that held the camera's roll)
        lo, hi = np.asarray(info.limits.lower), np.asarray(info.limits.upper)
        self.lower, self.upper = lo + IK_LIMIT_MARGIN, hi - IK_LIMIT_MARGIN
        self._pump: _FramePump | None = None

    def waits(self, camera: str | None = None) -> CameraWaits:
        """How long to wait for `camera` (default: the wrist camera) now."""
        name = camera or self.camera
        return camera_waits(stated_fps(dict(self.info.meta), name))

    def prime_camera(self) -> None:
        """Subscribe to the wrist camera now, in the background: its first frame can take
        long (the robot side starts its renderer / sensor) and overlaps the first move.
        Subscribing again while subscribed does nothing."""
        if self._pump is None:
            self._pump = _FramePump.open(self.client, self.camera, self.waits())

    def wait_camera(self) -> Job[None]:
        """Wait (subscribing if need be) until the wrist camera streams, saying so while it
        takes longer than a couple of seconds; raises RobotScanError past its wait."""
        self.prime_camera()
        assert self._pump is not None
        yield from self._await_first(self._pump)

    def _await_first(self, pump: _FramePump) -> Job[None]:
        said = 0.0
        while not pump.first.wait(0.25):
            if pump.error is not None:
                raise pump.error
            self.client.check()
            waited = time.monotonic() - pump.started
            if waited > pump.waits.first_s:
                raise self._no_frame_error(pump, waited)
            if waited >= SAY_WAITING_AFTER_S and waited - said >= 1.0:
                said = waited
                yield Progress(
                    None,
                    f"waiting for camera '{pump.camera}' frames ({waited:.0f} s of up to "
                    f"{pump.waits.first_s:.0f} s)…",
                )

    def _next_frame(self, pump: _FramePump) -> RGBDFrame:
        """The next frame of `pump`: up to its first-frame wait (counted from subscribing)
        before the first, its next-frame wait after; RobotScanError past it."""
        if pump.first.is_set():
            timeout = pump.waits.next_s
        else:
            timeout = pump.waits.first_s - (time.monotonic() - pump.started)
        f = pump.get(max(timeout, 0.0))
        if f is None:
            raise self._no_frame_error(pump, pump.silent_s())
        return f

    def _no_frame_error(self, pump: _FramePump, waited: float) -> RobotScanError:
        w, cam = pump.waits, pump.camera
        where = f"robot {self.info.name} at {self.client.address}"
        said = [
            str(e.get("message"))
            for e in list(getattr(self.client, "events", ()))
            if e.get("kind") in ("camera", "error") and cam in str(e.get("message", ""))
        ]
        robot_said = f" The robot said: {said[-1]}." if said else ""
        if pump.count == 0:
            return RobotScanError(
                f"{where}: no frame from camera '{cam}' in {waited:.0f} s (its first frame "
                f"may take up to {w.first_s:.0f} s here: {w.describe()}).{robot_said} Check "
                f"on the robot's side that camera '{cam}' is connected and streaming (the "
                "agent's or lab's log says why not), close heavy programs on this machine, "
                "then start again."
            )
        return RobotScanError(
            f"{where}: camera '{cam}' stopped sending frames: none for {waited:.0f} s after "
            f"{pump.count} frames (up to {w.next_s:.0f} s allowed here: {w.describe()})."
            f"{robot_said} Check the camera's cable and the robot's computer (its log says "
            "why), close heavy programs on this machine, then start again."
        )

    def fk(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.kin.link_pose(self.mount, q)

    def solve(
        self,
        T_base_camera: NDArray[np.float64],
        X: NDArray[np.float64],
        q0: NDArray[np.float64],
        roll_free: bool = True,
    ) -> NDArray[np.float64] | None:
        """Joint positions putting the camera at `T_base_camera` (within 5 mm and 2 deg;
        its roll about the optical axis free if `roll_free`), or None when out of reach."""

        q, pe, ae = solve_view(self.fk, q0, T_base_camera, X, self.lower, self.upper)
        if not roll_free and pe <= 0.005 and ae <= 2.0:
            # from the nearest pose with the right viewing axis, turn to the right roll
            q, pe, ae = solve_view(
                self.fk, q, T_base_camera, X, self.lower, self.upper, roll_free=False
            )
            ae = max(ae, rotation_angle_deg(self.fk(q) @ X, T_base_camera))
        return q if pe <= 0.005 and ae <= 2.0 else None

    def move(self, q_target: NDArray[np.float64], plan: RobotScanPlan) -> tuple[float, bool]:
        """Stream a smooth move to `q_target` (`devices.robots.motion_stream`: checked against the
        robot's limits first, MotionError naming the one it breaks), then wait until settled.
        Returns (robot time when settled, settled within the timeout). Raises
        RobotScanError when the robot stops the arm meanwhile (its watchdog, a safety stop,
        an e-stop, someone's stop): commands are refused then, and views taken from the
        pose it holds would all be the same view."""
        q0 = self.client.latest_state().joint_pos
        move = ramp_to(
            "scan move",
            tuple(self.info.joint_names),
            q0,
            np.asarray(q_target, float),
            robot_limits(self.client),
            plan.speed_rad_s,
            rate_hz=MOVE_RATE_HZ,
        )
        # checked against the robot's limits before the first command (MotionError); the
        # arm is held at the target afterwards (the scan stops it when it is done). Control
        # is not taken again: the scan took it as it began, and a stop meanwhile (watchdog,
        # safety, someone's stop) must end the scan below, not be cleared by the next move
        stream = MotionStream(
            self.client, move, rate_hz=MOVE_RATE_HZ, stop_when_done=False, take_control=False
        )
        for _ in stream.play():
            pass
        settling = time.monotonic()
        end = settling + plan.settle_timeout_s
        while True:
            st = self.client.latest_state()
            ok = (
                np.max(np.abs(st.joint_pos - q_target)) < plan.settle_tol_rad
                and np.max(np.abs(st.joint_vel)) < plan.settle_vel_rad_s
            )
            if ok:
                return st.t, ok
            now = time.monotonic()
            if now > end or now - settling > STOP_CHECK_AFTER_S:
                self._check_not_stopped()  # (not sooner: the states may lag the commands)
            if now > end:
                return st.t, ok
            time.sleep(0.01)

    def _check_not_stopped(self) -> None:
        status = self.client.latest_status()
        mode = status.get("mode")
        if mode not in ("stopped", "estop"):
            return
        why = str(status.get("stop_reason") or mode)
        advice = (
            "this computer was too busy to keep the robot's heartbeat: close heavy programs "
            "here, then start again (the robot moves again once control is taken)"
            if why.startswith("watchdog")
            else "see why on the robot's side, clear it (reset an e-stop), then start again"
        )
        raise RobotScanError(
            f"robot {self.info.name} at {self.client.address} stopped the arm ({why}; mode "
            f"{mode}) while the scan moved it, so the scan ended there: {advice}."
        )

    def grab(
        self, t_after: float, window_s: float = 0.3, still_rad: float = 1e-3, tries: int = 8
    ) -> tuple[RGBDFrame, NDArray[np.float64]]:
        """A frame taken after robot time `t_after` while the arm is still (no joint moves
        more than `still_rad` over the window; else the stillest of `tries` windows), with
        the joint positions at its timestamp: a line through the window's states, per joint,
        read at the frame's time (averages the encoder noise, follows a slow creep)."""
        self.prime_camera()
        pump = self._pump
        assert pump is not None
        found: tuple[float, RGBDFrame, NDArray[np.float64]] | None = None
        window = window_s
        for _ in range(tries):
            traj = self.client.stream(window)
            t, q = traj.t, traj.channels["robot/joint_pos"]
            best = None
            for _ in range(12):
                f = self._next_frame(pump)
                if f.timestamp < t_after or f.timestamp < t[0]:
                    continue
                if f.timestamp > t[-1]:
                    break
                best = f
            if best is None or len(t) < 3:
                # no frame inside the window: the camera stalled for longer (a busy machine
                # rendered none in 0.3 s, eight times over, and the scan failed); the arm is
                # still, so a longer window costs nothing but time
                window = min(2.0 * window, MAX_GRAB_WINDOW_S)
                continue
            slope, qf = np.polyfit(t - best.timestamp, q, 1)
            motion = float(np.max(np.abs(slope)) * (t[-1] - t[0]))
            if found is None or motion < found[0]:
                found = (motion, best, np.asarray(qf, float))
            if motion <= still_rad:
                break
        if found is None:
            raise RobotScanError(
                f"robot {self.info.name}: camera '{self.camera}' frame timestamps "
                f"never fall inside the state stream (different clocks?)"
            )
        self.last_motion_rad = found[0]
        return found[1], found[2]

    def grab_fixed(self, camera: str, n: int) -> Job[list[RGBDFrame]]:
        """`n` consecutive frames of fixed camera `camera` (the first one skipped: it may
        predate the subscription), saying so while its first frame takes long."""
        pump = _FramePump.open(self.client, camera, self.waits(camera))
        try:
            yield from self._await_first(pump)
            self._next_frame(pump)
            return [self._next_frame(pump) for _ in range(n)]
        finally:
            pump.close(join_s=_join_s(pump.waits))

    def stop(self) -> None:
        """Stop and release the robot; never raises (used in finally blocks)."""
        if self._pump is not None:
            self._pump.close(join_s=_join_s(self._pump.waits))
            self._pump = None
        try:
            if self.client.connected:
                self.client.stop("scan finished")
        except DeviceError:
            pass
        self.kin.close()


def _join_s(w: CameraWaits) -> float:
    """How long to wait for a frame thread to end: a few frame periods (a stalled stream's
    thread is a daemon that ends at the client's own deadline)."""
    return min(5.0, 3.0 / w.fps + 0.5)


def camera_poses(
    arm: ConnectedArm,
    targets: list[NDArray[np.float64]],
    X: NDArray[np.float64],
    plan: RobotScanPlan,
    out: dict[str, Any],
) -> Iterator[RGBDFrame]:
    """Frames at the targets with T_world_camera = FK(q at the frame) @ X (subscribe
    first with `arm.wait_camera()` to have a slow camera start-up reported)."""
    q = arm.client.latest_state().joint_pos
    arm.prime_camera()
    for T in targets:
        qt = arm.solve(T, X, q)
        if qt is None:
            out["unreachable"] += 1
            continue
        q = qt
        t_settled, ok = arm.move(qt, plan)
        if not ok:
            out["unsettled"] += 1
        f, qf = arm.grab(t_settled)
        out["paired"].append({"frame_t": f.timestamp, "joint_pos": qf.tolist()})
        yield replace(f, T_world_camera=arm.fk(qf) @ X)
