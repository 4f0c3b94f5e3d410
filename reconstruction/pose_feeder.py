"""Live object poses for a deployed policy: the robot's camera stream through the Real2Sim
object tracker, streamed to the robot agent (`object_pose` messages, PROTOCOL.md).

    feeder = ObjectPoseFeeder(client, "fixed", models_from_scan(scan, ["cylinder"]),
                              T_base_camera, table=table_plane(scan), surface=surface)
    feeder.start(); feeder.wait_first(5.0)      # a pose is at the agent before the run
    ...                                         # client.run_policy(...)
    feeder.stop(); feeder.stats.summary()       # frames, lost, latency, refusals

Two threads: a reader keeps only the newest camera frame (`client.camera_frames`), the
tracker thread tracks the newest frame it has not tracked yet (a slow tracker skips frames
rather than falling behind) and sends each object's pose with the frame's capture time, its
quality and whether it is lost. Frames are stamped on the robot's clock by the robot's own
camera feed (the lab's camera stamps the lab clock); a camera on another clock (one on the
workbench: `frames=`) is mapped by `clock_offset_s` (robot time = camera time + offset), or,
with `clock_offset_s=None`, by `ClockMap` from the frames' arrival times. The robot is
masked out of the depth at the newest measured joint positions (`surface`, a `RobotMask`:
twins/robot_surface.py places the robot's URDF by forward kinematics). The agent, not this
feeder, decides when tracking is too old: a feeder that dies or falls behind stops the robot
through the agent's age limit (its receiving end is devices/robots/agent/object_poses.py).

A deployment names where its poses come from with an `ObjectSource` (`object_source`: the
scan in the twin's lineage gives the models, table and calibrated camera); `track_now` is
the object's pose now, `start_feed` the running feed. A policy's source
(`policy_object_source`) and the robot's surface are put together by
app/workflows/deploy_plan.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.frames import RGBDFrame
from devices.poses import drop_spin, matrix_to_pose, pose_to_matrix
from devices.robots.client import RobotClient
from reconstruction.object_track_types import (
    FrameTracks,
    ObjectModel,
    ObjectTrack,
    ObjectTrackSettings,
    RobotMask,
)
from reconstruction.object_tracking import ObjectTracker
from reconstruction.scan_result import ScanResult
from reconstruction.segment import Plane
from reconstruction.track_objects import models_from_scan, table_plane

log = logging.getLogger(__name__)
# live: every 2nd depth pixel (a quarter of the points; the tracker's time is most of the
# pose's age at the agent, and the age limit is a few camera frames)
LIVE_SETTINGS = ObjectTrackSettings(stride=2)


class ClockMap:
    """Camera clock -> robot clock by the smallest delay seen: offset = min over frames of
    (robot time when the frame arrived - its camera stamp). A pose's age is then short by
    the camera's smallest capture-to-arrival latency (a few ms over USB), never longer;
    a drift between the clocks is not followed (restart the feed every few minutes)."""

    def __init__(self, offset_s: float | None = None) -> None:
        self.fixed = offset_s is not None
        self.offset_s = float(offset_s) if offset_s is not None else float("inf")

    def robot_time(self, camera_t: float, robot_t_at_arrival: float) -> float:
        if not self.fixed:
            self.offset_s = min(self.offset_s, robot_t_at_arrival - camera_t)
        return camera_t + self.offset_s


@dataclass
class FeedStats:
    """What the feeder did (times in s; robot clock where it says so)."""

    frames: int = 0  # frames tracked
    skipped: int = 0  # frames that arrived while the tracker was busy (not tracked)
    sent: int = 0  # object reports sent
    lost: int = 0  # reports that said lost
    track_s: list[float] = field(default_factory=list)  # tracker time per frame
    age_s: list[float] = field(default_factory=list)  # robot time at send - capture time
    poses: list[tuple[float, str, list[float], float, bool]] = field(default_factory=list)
    error: str = ""  # why the feeder stopped early

    def summary(self) -> dict[str, Any]:
        def pct(v: list[float], q: float) -> float:
            return float(np.percentile(v, q)) if v else float("nan")

        return {
            "frames": self.frames,
            "skipped": self.skipped,
            "sent": self.sent,
            "lost": self.lost,
            "track_ms_median": 1e3 * pct(self.track_s, 50),
            "age_ms_median": 1e3 * pct(self.age_s, 50),
            "age_ms_p95": 1e3 * pct(self.age_s, 95),
            "error": self.error,
        }


class ObjectPoseFeeder:
    """Tracks `models` in camera `camera` of the robot behind `client` and streams the
    poses of `send` (default: every model) to its agent until `stop()`."""

    def __init__(
        self,
        client: RobotClient,
        camera: str,
        models: Sequence[ObjectModel],
        T_base_camera: NDArray[np.float64],
        table: Plane | None = None,
        surface: RobotMask | None = None,
        settings: ObjectTrackSettings | None = None,
        send: Sequence[str] | None = None,
        clock_offset_s: float | None = 0.0,
        frame_timeout_s: float = 60.0,
        stream: bool = True,
        spinless: Sequence[str] = (),
        frames: Callable[[], Iterator[RGBDFrame]] | None = None,
    ) -> None:
        T = np.asarray(T_base_camera, float)
        if T.shape != (4, 4) or not np.all(np.isfinite(T)):
            raise DeviceError(f"camera '{camera}': T_base_camera must be a finite 4x4 matrix")
        info = client.info
        if info is not None and info.cameras and camera not in info.cameras:
            raise DeviceError(
                f"robot {info.name} has no camera '{camera}' (it serves {list(info.cameras)})"
            )
        self.client, self.camera, self.T = client, camera, T
        self.tracker = ObjectTracker(models, table, settings)
        self.surface = surface
        self.send = tuple(send) if send else tuple(m.name for m in models)
        self.clock = ClockMap(clock_offset_s)
        self.frames = frames  # None: the robot's camera `camera` over the protocol
        self.frame_timeout_s = frame_timeout_s
        self.stream = stream  # False: track only (before a policy that observes it is loaded)
        self.spinless = set(spinless)
        self.stats = FeedStats()
        self.fresh_s = float("inf")
        self.steady_frames = 1
        self._steady = 0
        self._stop = threading.Event()
        self._new = threading.Condition()
        self._frame: RGBDFrame | None = None
        self._frame_t = float("nan")
        self._first = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for fn, name in ((self._read, "camera"), (self._track, "tracker")):
            th = threading.Thread(target=fn, name=f"twinbench-feed-{name}", daemon=True)
            th.start()
            self._threads.append(th)

    def wait_first(self, timeout_s: float, fresh_s: float = float("inf"), frames: int = 1) -> bool:
        """True once `frames` frames in a row gave a good pose of every sent object,
        captured less than `fresh_s` before it was sent (a camera's first frames may be
        old, and a camera that just started may not keep its rate yet); False after
        `timeout_s` or if the feeder stopped (`stats.error` says why)."""
        self.fresh_s, self.steady_frames = fresh_s, frames
        return self._first.wait(timeout_s) and not self.stats.error

    @property
    def alive(self) -> bool:
        return not self._stop.is_set() and all(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        self._stop.set()
        with self._new:
            self._new.notify_all()
        for th in self._threads:
            th.join(timeout=3.0)  # a reader still waiting for a frame exits on its own

    def close(self) -> None:
        """Stop, and release the robot surface it masks with."""
        self.stop()
        if self.surface is not None:
            self.surface.close()

    def __enter__(self) -> ObjectPoseFeeder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _fail(self, why: str) -> None:
        if not self.stats.error:
            self.stats.error = why
            log.warning("object pose feed stopped: %s", why)
        self._stop.set()
        with self._new:
            self._new.notify_all()

    # -- threads ----------------------------------------------------------------------------
    def _read(self) -> None:
        if self.frames is not None:
            frames: Iterator[RGBDFrame] = self.frames()
        else:
            frames = self.client.camera_frames(self.camera, timeout_s=self.frame_timeout_s)
        try:
            for f in frames:
                if self._stop.is_set():
                    return
                t_robot = self.clock.robot_time(float(f.timestamp), self.client.latest_state().t)
                with self._new:
                    if self._frame is not None:
                        self.stats.skipped += 1
                    self._frame, self._frame_t = f, t_robot
                    self._new.notify_all()
        except DeviceError as exc:
            self._fail(f"camera '{self.camera}': {exc}")
        finally:
            close = getattr(frames, "close", None)
            if close is not None:
                close()

    def _track(self) -> None:
        seen: set[str] = set()
        try:
            while not self._stop.is_set():
                with self._new:
                    while self._frame is None and not self._stop.is_set():
                        self._new.wait(0.5)
                    frame, self._frame, t_cap = self._frame, None, self._frame_t
                if frame is None:
                    continue
                self._track_one(frame, t_cap, seen)
        except DeviceError as exc:
            self._fail(str(exc))
        except Exception as exc:  # a tracker bug must not leave a silent feed behind
            self._fail(f"object tracker failed: {exc}")

    def _track_one(self, frame: RGBDFrame, t_cap: float, seen: set[str]) -> None:
        """Track `frame` (captured at robot time `t_cap`) and send every pose."""
        t0 = time.perf_counter()
        pts = None
        if self.surface is not None:
            pts = self.surface.points(self.client.latest_state().joint_pos)
        tracks = self.tracker.update(frame, self.T, pts)
        self.stats.track_s.append(time.perf_counter() - t0)
        self.stats.frames += 1
        age = self.client.latest_state().t - t_cap
        seen.clear()
        for name in self.send:
            tr = tracks.objects[name]
            if tr.T_world_object is None:
                continue
            pose = matrix_to_pose(tr.T_world_object)
            if name in self.spinless:
                pose = drop_spin(pose)
            if self.stream:
                self.client.send_object_pose(name, pose, t_cap, float(tr.quality), bool(tr.lost))
            self.stats.sent += 1
            self.stats.lost += int(tr.lost)
            self.stats.poses.append((t_cap, name, pose.tolist(), float(tr.quality), tr.lost))
            if not tr.lost and age < self.fresh_s:
                seen.add(name)
        self.stats.age_s.append(age)
        self._steady = self._steady + 1 if seen >= set(self.send) else 0
        if self._steady >= self.steady_frames:
            self._first.set()

    def last_good(self, name: str) -> tuple[float, NDArray[np.float64]] | None:
        """(capture time, pose (7,)) of the newest good pose of `name`, or None."""
        for t, n, pose, _, lost in reversed(self.stats.poses):
            if n == name and not lost:
                return t, np.asarray(pose, float)
        return None


@dataclass(frozen=True)
class ObjectSource:
    """Where a deployment's object poses come from: a robot camera seen through the
    tracker, with the camera's calibrated pose and the scanned object models."""

    camera: str
    models: tuple[ObjectModel, ...]
    T_base_camera: NDArray[np.float64]
    table: Plane | None = None
    robot_description: str = ""  # URDF key of the robot to mask out (twins/robot_surface.py)
    clock_offset_s: float | None = 0.0  # None: mapped from arrival times (ClockMap)
    settings: ObjectTrackSettings | None = LIVE_SETTINGS
    spinless: tuple[str, ...] = ()  # symmetric about their z: spin dropped (drop_spin)
    frames: Callable[[], Iterator[RGBDFrame]] | None = None  # a workbench camera's frames

    def feeder(
        self,
        client: RobotClient,
        send: Sequence[str],
        stream: bool,
        surface: RobotMask | None = None,
    ) -> ObjectPoseFeeder:
        """A feeder of `send`'s poses; `surface` (the robot described by
        `robot_description`: twins/robot_surface.py) is masked out of the depth."""
        return ObjectPoseFeeder(
            client,
            self.camera,
            self.models,
            self.T_base_camera,
            self.table,
            surface,
            self.settings,
            send=send,
            clock_offset_s=self.clock_offset_s,
            spinless=self.spinless,
            frames=self.frames,
            stream=stream,
        )


def track_now(
    client: RobotClient,
    source: ObjectSource,
    name: str,
    timeout_s: float = 60.0,
    surface: RobotMask | None = None,
) -> NDArray[np.float64]:
    """The object's current pose (7,) from the camera through the tracker (nothing is sent
    to the robot; `surface` masked out and closed); DeviceError naming the camera and object
    when it is not found."""
    feeder = source.feeder(client, [name], stream=False, surface=surface)
    feeder.start()
    try:
        ok = feeder.wait_first(timeout_s, fresh_s=0.5)
        if ok:  # a second frame from where the first converged
            n = feeder.stats.frames
            end = time.monotonic() + 2.0
            while feeder.stats.frames <= n and feeder.alive and time.monotonic() < end:
                time.sleep(0.01)
    finally:
        feeder.close()
    last = feeder.last_good(name)
    if not ok or last is None:
        raise DeviceError(
            f"camera '{source.camera}': object '{name}' not found by the tracker within "
            f"{timeout_s:g} s ({feeder.stats.error or f'{feeder.stats.frames} frames tracked'})"
        )
    return last[1]


def scan_of_twin(project: Any, twin_id: str) -> str | None:
    """The scan artifact a twin was built from (following fitted versions to their parent)."""
    seen: set[str] = set()
    todo = [twin_id]
    while todo:
        aid = todo.pop()
        if aid in seen:
            continue
        seen.add(aid)
        art = project.artifact(aid)
        if art.kind == "scan":
            return str(aid)
        todo.extend(i for i in art.inputs if project.artifact(i).kind in ("scan", "twin"))
    return None


def object_source(
    project: Any,
    twin_id: str,
    objects: Sequence[str],
    camera: str | None = None,
    T_base_camera: NDArray[np.float64] | None = None,
    robot_description: str = "",
) -> ObjectSource:
    """The tracker's view of `objects` for a policy trained in twin `twin_id`: the scan the
    twin came from gives the object models (at their scanned poses), the table and, unless
    `T_base_camera` is given (e.g. a `calibrate --out` result), the calibrated fixed camera
    and its pose. DeviceError naming what is missing."""
    scan_id = scan_of_twin(project, twin_id)
    if scan_id is None:
        raise DeviceError(f"twin '{twin_id}' has no scan in its lineage to track objects from")
    scan = ScanResult.load(project.path_of(scan_id))
    calib = scan.calibration or {}
    if T_base_camera is None:
        if "T_base_fixed" not in calib:
            raise DeviceError(
                f"scan '{scan_id}' has no calibrated fixed camera: give the camera's pose "
                "(--camera-pose FILE from `calibrate --out`, with T_base_camera)"
            )
        T_base_camera = np.asarray(calib["T_base_fixed"], float)
    cam = camera or calib.get("fixed_camera") or ""
    if not cam:
        raise DeviceError(f"scan '{scan_id}' names no fixed camera: give --camera NAME")
    try:
        models = models_from_scan(scan, list(objects))
    except Exception as exc:  # TrackError naming the scan's objects
        raise DeviceError(f"scan '{scan_id}': {exc}") from None
    return ObjectSource(
        str(cam), tuple(models), np.asarray(T_base_camera, float), table_plane(scan),
        robot_description,
    )  # fmt: skip


def start_feed(
    client: RobotClient,
    source: ObjectSource,
    name: str,
    spec: Any,
    surface: RobotMask | None = None,
) -> ObjectPoseFeeder:
    """The object pose feed of a deployment (policy spec `spec`), running, with a fresh
    good pose at the agent (`surface` masked out; `close()` closes it); DeviceError naming
    the camera when it gives none (a camera's first frame can take long, the lab's renderer
    starts, and be old)."""
    feeder = source.feeder(client, [name], stream=True, surface=surface)
    feeder.start()
    if not feeder.wait_first(60.0, fresh_s=0.5 * float(spec.object_max_age_s), frames=3):
        feeder.close()
        raise DeviceError(
            f"camera '{source.camera}': no tracked pose of '{name}' to stream to the robot "
            f"({feeder.stats.error or f'{feeder.stats.frames} frames tracked'}); the policy "
            "was not started"
        )
    return feeder


def save_poses(path: Any, feeder: ObjectPoseFeeder) -> None:
    """Every pose the feeder streamed (npz): t (robot clock), pose (7), quality, lost."""
    p = feeder.stats.poses
    with open(path, "wb") as fh:
        np.savez(
            fh,
            t=np.array([r[0] for r in p], float),
            pose=np.array([r[2] for r in p], float).reshape(len(p), 7),
            quality=np.array([r[3] for r in p], float),
            lost=np.array([r[4] for r in p], bool),
        )


def feed_tracks(stats: FeedStats, names: Sequence[str]) -> list[FrameTracks]:
    """The poses a feeder streamed, as one `FrameTracks` per tracked frame (robot clock,
    in capture order; a name not reported in a frame is lost there) for
    `reconstruction.object_tracks.add_object_tracks`: the run's `objects/<name>/pose`
    channels are exactly what the agent was told."""
    by_t: dict[float, dict[str, ObjectTrack]] = {}
    for t, name, pose, quality, lost in stats.poses:
        T = pose_to_matrix(np.asarray(pose, float))
        by_t.setdefault(float(t), {})[name] = ObjectTrack(T, quality, lost)
    out = []
    for k, t in enumerate(sorted(by_t)):
        seen = by_t[t]
        objs = {n: seen.get(n, ObjectTrack(None, 0.0, True, method="lost")) for n in names}
        out.append(FrameTracks(t, k, objs))
    return out


def read_camera_pose(path: Path) -> NDArray[np.float64]:
    """T_base_camera (4x4) from a `calibrate --out` JSON; DeviceError naming the file."""
    try:
        T = np.asarray(json.loads(Path(path).read_text())["T_base_camera"], float)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DeviceError(f"{path}: not a camera pose file with T_base_camera ({exc})") from None
    if T.shape != (4, 4) or not np.all(np.isfinite(T)):
        raise DeviceError(f"{path}: T_base_camera must be a finite 4x4 matrix")
    return T
