"""The guided wrist-camera scan and calibration of a CONNECTED robot (virtual lab or
hardware, reached only through the robot protocol), as Qt-free jobs shared by the CLI, the
Scan page and `bench scan`. This is the one guided scan: the lab is just another robot.

- `calibrate_robot(client, ...)`: hand-eye calibration of the wrist camera from views of a
  ChArUco board lying on the table (reconstruction/calibration.py), plus every fixed camera
  that sees the same board (its T_base_camera).
- `scan_robot(client, options, record=..., calibration=...)`: move the arm through the
  planned view path (reconstruction/scan_path.py), wait until it settles, grab a
  wrist-camera frame over the protocol and pair it with the joint state at the frame's
  timestamp (same robot clock), camera pose = FK(q) @ T_hand_camera (FK from the robot's own
  description, twins/), fixed-camera frames at their calibrated pose, TSDF integration and
  object segmentation (reconstruction pipeline) -> ScanResult.
- `scan_lab(...)`: the virtual lab started as its own processes (`lab serve`): the
  calibration set-up (board on the table), then the workspace; calibrate, then scan.

The numbers of the path (workspace centre, exclusion box, board centre, calibration orbit,
second pass) live here and only here. The robot is left stopped at the end, on error and on
cancel (`gen.close()`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.jobs import Job, Progress, sub_job
from app.workflows.scan import ScanOptions, reconstruct_frames
from devices.errors import DeviceError
from devices.frames import RGBDFrame
from devices.robots.client import RobotClient
from reconstruction.pipeline import ScanSession
from reconstruction.scan_result import ScanResult
from reconstruction.tsdf import TSDFSettings
from resources.errors import TwinbenchError

# --- where to look (robot base frame, m): the one home of these numbers ----------------------
WORKSPACE_CENTRE = (0.57, 0.0, 0.03)  # centre of the tabletop workspace the orbit looks at
BOARD_CENTRE = (0.435, 0.0, 0.0)  # where the user lays the ChArUco board, roughly
# The robot's own base and column: never an object, whatever the camera sees there.
EXCLUDE_ROBOT = ((-0.3, -0.3, -0.1), (0.2, 0.3, 1.5))


class RobotScanError(TwinbenchError):
    """A guided scan of a connected robot cannot run; the message names robot and camera."""


@dataclass(frozen=True)
class Orbit:
    """`views` camera poses on an arc at `distance` m and `elevation_deg` around a centre."""

    distance: float
    elevation_deg: float
    views: int
    azimuth_deg: tuple[float, float]

    def targets(
        self, centre: tuple[float, float, float], base_azimuth_deg: float = 180.0
    ) -> list[NDArray[np.float64]]:
        from reconstruction.scan_path import orbit_targets

        return orbit_targets(
            centre,
            self.distance,
            self.elevation_deg,
            self.views,
            self.azimuth_deg,
            base_azimuth_deg=base_azimuth_deg,
        )


@dataclass
class RobotScanPlan:
    """Where to look and how to move (SI units). The first orbit is `views` views at
    `distance`/`elevation_deg`; `extra_orbits` follow; then the second pass: `object_views`
    views per object found, at each of `object_elevations_deg` (0 views: no second pass)."""

    centre: tuple[float, float, float] = WORKSPACE_CENTRE
    distance: float = 0.55
    elevation_deg: float = 55.0
    views: int = 10
    azimuth_deg: tuple[float, float] = (-80.0, 80.0)
    extra_orbits: tuple[Orbit, ...] = (Orbit(0.5, 70.0, 8, (-150.0, 150.0)),)
    object_views: int = 8  # per object and elevation (second pass); 0: none
    object_distance: float = 0.5
    object_elevations_deg: tuple[float, ...] = (35.0, 55.0)
    object_azimuth_deg: tuple[float, float] = (-180.0, 135.0)
    exclude: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...] = (
        EXCLUDE_ROBOT,
    )
    fixed_frames: int = 3  # frames from each calibrated fixed camera
    camera: str | None = None  # None: the first camera with a nominal mount pose
    speed_rad_s: float = 1.2  # joint-space speed of the moves
    settle_tol_rad: float = 3e-3
    settle_vel_rad_s: float = 0.02
    settle_timeout_s: float = 4.0

    @classmethod
    def quick(cls, **changes: Any) -> RobotScanPlan:
        """Fewer views: one orbit, one elevation of 6 views per object."""
        base = cls(views=8, extra_orbits=(), object_views=6, object_elevations_deg=(40.0,))
        return replace(base, **changes)

    def orbits(self) -> list[Orbit]:
        return [Orbit(self.distance, self.elevation_deg, self.views, self.azimuth_deg)] + list(
            self.extra_orbits
        )


@dataclass
class CalibrationPlan:
    """The guided calibration path: two thirds of the views on a wide orbit around the
    board, the rest steeper and closer (rotation about several axes for hand-eye)."""

    board_centre: tuple[float, float, float] = BOARD_CENTRE
    views: int = 12
    wide: tuple[float, float, tuple[float, float]] = (0.42, 60.0, (-70.0, 70.0))
    steep: tuple[float, float, tuple[float, float]] = (0.35, 75.0, (-120.0, 120.0))
    fixed_frames: int = 3

    def targets(self) -> list[NDArray[np.float64]]:
        n_wide = self.views * 2 // 3
        return Orbit(self.wide[0], self.wide[1], n_wide, self.wide[2]).targets(
            self.board_centre
        ) + Orbit(self.steep[0], self.steep[1], self.views - n_wide, self.steep[2]).targets(
            self.board_centre
        )


class ConnectedArm:
    """The connected robot as a scan sees it: FK of its description, guarded moves,
    frames paired with joint states."""

    def __init__(self, client: RobotClient, camera: str | None = None) -> None:
        from devices.poses import pose_to_matrix
        from twins.kinematics import RobotKinematics

        info = client.info
        if info is None:
            raise RobotScanError(f"robot at {client.address}: not connected")
        self.client, self.info = client, info
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
        self.lower, self.upper = np.asarray(info.limits.lower), np.asarray(info.limits.upper)
        self._frames: Iterator[RGBDFrame] | None = None
        self._primer: Any = None

    def prime_camera(self) -> None:
        """Subscribe to the camera now, in the background: its first frame can take seconds
        (the robot side starts its renderer / sensor) and overlaps the first move."""
        import threading

        frames = self.frames()
        self._prime_error: BaseException | None = None

        def prime() -> None:
            try:
                next(frames)
            except BaseException as exc:  # noqa: BLE001 - re-raised by grab()
                self._prime_error = exc

        self._primer = threading.Thread(target=prime, name="scan-camera-prime", daemon=True)
        self._primer.start()

    def fk(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.kin.link_pose(self.mount, q)

    def frames(self) -> Iterator[RGBDFrame]:
        if self._frames is None:
            # generous: the first frame may wait for the robot side to start its camera
            self._frames = self.client.camera_frames(self.camera, timeout_s=15.0)
        return self._frames

    def solve(
        self, T_base_camera: NDArray[np.float64], X: NDArray[np.float64], q0: NDArray[np.float64]
    ) -> NDArray[np.float64] | None:
        from reconstruction.scan_path import solve_view

        q, pe, ae = solve_view(self.fk, q0, T_base_camera, X, self.lower, self.upper)
        return q if pe <= 0.005 and ae <= 2.0 else None

    def move(self, q_target: NDArray[np.float64], plan: RobotScanPlan) -> tuple[float, bool]:
        """Interpolate position commands to `q_target`, then wait until settled.
        Returns (robot time when settled, settled within the timeout)."""
        import time

        q0 = self.client.latest_state().joint_pos
        dur = max(float(np.max(np.abs(q_target - q0))) / plan.speed_rad_s, 0.05)
        t0 = time.monotonic()
        while (s := (time.monotonic() - t0) / dur) < 1.0:
            self.client.command_position(q0 + (q_target - q0) * (3 * s * s - 2 * s**3))
            time.sleep(0.01)
        self.client.command_position(q_target)
        end = time.monotonic() + plan.settle_timeout_s
        while True:
            st = self.client.latest_state()
            ok = (
                np.max(np.abs(st.joint_pos - q_target)) < plan.settle_tol_rad
                and np.max(np.abs(st.joint_vel)) < plan.settle_vel_rad_s
            )
            if ok or time.monotonic() > end:
                return st.t, ok
            time.sleep(0.01)

    def grab(
        self, t_after: float, window_s: float = 0.3, still_rad: float = 1e-3, tries: int = 8
    ) -> tuple[RGBDFrame, NDArray[np.float64]]:
        """A frame taken after robot time `t_after` while the arm is still (no joint moves
        more than `still_rad` over the window; else the stillest of `tries` windows), with
        the joint positions at its timestamp: a line through the window's states, per joint,
        read at the frame's time (averages the encoder noise, follows a slow creep)."""
        frames = self.frames()
        if self._primer is not None:
            self._primer.join(timeout=20.0)
            self._primer = None
            if self._prime_error is not None:
                raise self._prime_error
        found: tuple[float, RGBDFrame, NDArray[np.float64]] | None = None
        for _ in range(tries):
            traj = self.client.stream(window_s)
            t, q = traj.t, traj.channels["robot/joint_pos"]
            best = None
            for _ in range(12):
                f = next(frames, None)
                if f is None:
                    raise RobotScanError(
                        f"robot {self.info.name}: camera '{self.camera}' stream ended"
                    )
                if f.timestamp < t_after or f.timestamp < t[0]:
                    continue
                if f.timestamp > t[-1]:
                    break
                best = f
            if best is None or len(t) < 3:
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
        return found[1], found[2]

    def grab_fixed(self, camera: str, n: int) -> list[RGBDFrame]:
        """`n` consecutive frames of fixed camera `camera` (the first one skipped: it may
        predate the subscription)."""
        frames = self.client.camera_frames(camera, timeout_s=15.0)
        try:
            next(frames)
            return [next(frames) for _ in range(n)]
        finally:
            frames.close()

    def stop(self) -> None:
        """Stop and release the robot; never raises (used in finally blocks)."""
        if self._primer is not None:
            self._primer.join(timeout=20.0)
            self._primer = None
        if self._frames is not None:
            try:
                self._frames.close()  # type: ignore[attr-defined]
            except ValueError:  # still waiting for its first frame in the primer
                pass
            self._frames = None
        try:
            if self.client.connected:
                self.client.stop("scan finished")
        except DeviceError:
            pass
        self.kin.close()


def _camera_poses(
    arm: ConnectedArm,
    targets: list[NDArray[np.float64]],
    X: NDArray[np.float64],
    plan: RobotScanPlan,
    out: dict[str, Any],
) -> Iterator[RGBDFrame]:
    """Frames at the targets with T_world_camera = FK(q at the frame) @ X."""
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


class _Recorder:
    """Frames through the SDK's software device into a .db3 (with the scan's sidecar),
    renumbered: wrist and fixed frames become one gap-free stream."""

    def __init__(self, path: Path, first: RGBDFrame, name: str, meta: dict[str, Any]) -> None:
        from devices.cameras.software import SoftwareCamera

        self.cam = SoftwareCamera(first.intrinsics, first.depth_scale, record_path=path, name=name)
        self.cam.info.meta.update(meta)
        self.count = 0

    def push(self, frame: RGBDFrame) -> RGBDFrame:
        self.count += 1
        pushed: RGBDFrame = self.cam.push(
            replace(frame, index=self.count, timestamp=self.count / 30.0)
        )
        return pushed

    def close(self) -> None:
        self.cam.close()


def _jsonable(c: dict[str, Any]) -> dict[str, Any]:
    return {k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v) for k, v in c.items()}


def _stopped(opt: ScanOptions) -> bool:
    return opt.stop is not None and opt.stop.is_set()


def scan_robot(
    client: RobotClient,
    options: ScanOptions | None = None,
    record: Path | None = None,
    plan: RobotScanPlan | None = None,
    calibration: dict[str, Any] | None = None,
) -> Job[ScanResult]:
    """Guided wrist scan of the connected robot. `calibration` ({"T_hand_camera": 4x4, and
    "T_base_fixed" + "fixed_camera" when a fixed camera was calibrated} from
    `calibrate_robot`), or else the robot's NOMINAL camera mount pose."""
    from reconstruction.segment import cluster_objects, fit_table_plane

    opt = options or ScanOptions()
    plan = plan or RobotScanPlan()
    opt.exclude = opt.exclude or [
        (np.array(lo, float), np.array(hi, float)) for lo, hi in plan.exclude
    ]
    arm = ConnectedArm(client, plan.camera)
    rec: _Recorder | None = None
    try:
        X = np.asarray((calibration or {}).get("T_hand_camera", arm.T_mount_camera_nominal))
        calib = _jsonable(calibration or {})
        calib.setdefault("T_hand_camera", X.tolist())
        calib["hand_camera_source"] = "hand-eye" if calibration else "nominal mount pose"
        fixed = calib.get("fixed_camera")
        T_fixed = np.asarray(calib["T_base_fixed"]) if fixed in arm.fixed_cameras else None
        log: dict[str, Any] = {"unreachable": 0, "unsettled": 0, "paired": []}
        yield Progress(
            0.0,
            f"scanning with {arm.info.name} camera '{arm.camera}' ({calib['hand_camera_source']})",
        )
        sess = ScanSession(TSDFSettings(voxel_size=opt.voxel_size, depth_max=opt.depth_max))
        first_pass = [T for orbit in plan.orbits() for T in orbit.targets(plan.centre)]
        fixed_frames: list[RGBDFrame] = []
        if T_fixed is not None and plan.fixed_frames:
            yield Progress(0.0, f"fixed camera '{fixed}': {plan.fixed_frames} frames")
            fixed_frames = [
                replace(f, T_world_camera=T_fixed)
                for f in arm.grab_fixed(str(fixed), plan.fixed_frames)
            ]
        stream: Iterator[RGBDFrame] = _chain(
            fixed_frames, _camera_poses(arm, first_pass, X, plan, log)
        )
        if record is not None:
            first = next(stream, None)
            if first is None:
                raise RobotScanError(f"robot {arm.info.name}: no view of the path is reachable")
            rec = _Recorder(
                record,
                first,
                f"Twinbench {arm.info.name} {arm.camera}",
                {
                    "T_hand_camera": X.tolist(),
                    "source": "robot",
                    "robot": arm.info.name,
                    "calibration": calib,
                    "exclude": [[lo.tolist(), hi.tolist()] for lo, hi in opt.exclude],
                    **({"T_base_camera": T_fixed.tolist()} if T_fixed is not None else {}),
                },
            )
            stream = (rec.push(f) for f in _chain([first], stream))
        second_share = 0.4 if plan.object_views else 0.0
        yield from sub_job(
            reconstruct_frames(
                stream,
                None,
                opt,
                session=sess,
                finish=False,
                total=len(first_pass) + len(fixed_frames),
            ),
            0.0,
            0.9 - second_share,
            "orbit: ",
        )
        if plan.object_views and plan.object_elevations_deg and not _stopped(opt):
            pts, cols = sess.tsdf.points()
            try:
                plane, _ = fit_table_plane(pts, seed=opt.seed, up=np.array([0.0, 0, 1]))
                clusters = cluster_objects(pts, cols, plane, exclude=list(opt.exclude))  # type: ignore[arg-type]
            except TwinbenchError as exc:
                clusters = []
                yield Progress(None, f"no objects for a second pass ({exc})")
            second = [
                T
                for cl in clusters
                for el in plan.object_elevations_deg
                for T in Orbit(
                    plan.object_distance, el, plan.object_views, plan.object_azimuth_deg
                ).targets(tuple(cl.footprint_centre(plane)), base_azimuth_deg=0)
            ]
            more = _camera_poses(arm, second, X, plan, log)
            if rec is not None:
                more = (rec.push(f) for f in more)
            yield from sub_job(
                reconstruct_frames(more, None, opt, session=sess, finish=False, total=len(second)),
                0.5,
                0.9,
                "objects: ",
            )
        arm.stop()  # the arm is still for the segmentation
        res = yield from sub_job(
            reconstruct_frames(
                iter(()), None, opt, session=sess, T_base_camera=T_fixed, calibration=calib
            ),
            0.9,
            1.0,
        )
        assert res is not None
        warnings = list(res.warnings)
        if log["unreachable"]:
            warnings.append(f"{log['unreachable']} views of the path were out of reach")
        if log["unsettled"]:
            warnings.append(f"{log['unsettled']} views taken before the arm had settled")
        capture = {
            **res.capture,
            "source": "robot",
            "robot": arm.info.name,
            "robot_address": client.address,
            "camera": arm.camera,
            "views": len(log["paired"]),
            "fixed_frames": len(fixed_frames),
            "paired_states": log["paired"],
        }
        if rec is not None:
            capture.update({"sdk_version": rec.cam.info.sdk_version, "device": rec.cam.info.device})
        return replace(res, warnings=tuple(warnings), capture=capture)
    finally:
        if rec is not None:
            rec.close()
        arm.stop()


def _chain(first: list[RGBDFrame], rest: Iterator[RGBDFrame]) -> Iterator[RGBDFrame]:
    yield from first
    yield from rest


def calibrate_robot(
    client: RobotClient,
    views: int | None = None,
    board_centre: tuple[float, float, float] | None = None,
    plan: RobotScanPlan | None = None,
    calibration_plan: CalibrationPlan | None = None,
) -> Job[dict[str, Any]]:
    """Hand-eye calibration of the wrist camera from ChArUco board views (the board lying on
    the table near the plan's board centre: the lab's panda_calib scene), robot moved along
    the guided calibration path; then every fixed camera that sees the board gets its
    T_base_camera from the board's base pose ("T_base_fixed", "fixed_camera", "fixed").
    Raises RobotScanError when no view is reachable (CalibrationError from too few boards)."""
    from reconstruction.calibration import (
        detect_board,
        fixed_camera,
        hand_eye,
        intrinsics_check,
        refine_with_depth,
    )

    plan = plan or RobotScanPlan()
    cp = calibration_plan or CalibrationPlan()
    cp = replace(
        cp,
        views=views if views is not None else cp.views,
        board_centre=board_centre if board_centre is not None else cp.board_centre,
    )
    arm = ConnectedArm(client, plan.camera)
    try:
        X0 = arm.T_mount_camera_nominal
        targets = cp.targets()
        hands, found, missed, intr = [], [], [], None
        q = client.latest_state().joint_pos
        arm.prime_camera()
        for i, T in enumerate(targets):
            qt = arm.solve(T, X0, q)
            if qt is not None:
                q = qt
                t_settled, _ = arm.move(qt, plan)
                f, qf = arm.grab(t_settled)
                intr = f.intrinsics
                v = detect_board(f)
                if v is None:
                    missed.append(i)
                else:
                    hands.append(arm.fk(qf))
                    found.append(v)
            yield Progress(
                0.9 * (i + 1) / len(targets),
                f"calibration view {i + 1}/{len(targets)}: {len(found)} boards found",
            )
        if intr is None:
            raise RobotScanError(f"robot {arm.info.name}: no calibration view is reachable")
        he = hand_eye(hands, found, intr)
        out: dict[str, Any] = {
            "T_hand_camera": he.T,
            "hand_eye": he.summary(),
            "board_missed_views": missed,
            "intrinsics_check": intrinsics_check(found, intr),
        }
        for name in arm.fixed_cameras:
            yield Progress(0.95, f"fixed camera '{name}': looking for the board")
            fviews = []
            frames = arm.grab_fixed(name, cp.fixed_frames)
            for f in frames:
                v = detect_board(f)
                if v is not None:
                    fviews.append(refine_with_depth(v, f))
            if not fviews:
                out.setdefault("fixed_not_calibrated", []).append(name)
                continue
            fc = fixed_camera(fviews, he.T_base_board, frames[0].intrinsics, depth_refined=True)
            if "fixed_camera" not in out:  # the scan uses the first one
                out.update({"fixed_camera": name, "T_base_fixed": fc.T, "fixed": fc.summary()})
        yield Progress(1.0, f"hand-eye from {len(found)} board views")
        return out
    finally:
        arm.stop()


LAB_CAMERA_SIZE = "640x480"  # the lab cameras render D435-like 640x480 for scans


def _lab_robot(scene: str, config: Path | None, what: str) -> Job[tuple[Any, RobotClient]]:
    """Start `lab serve` for `scene` as its own process and connect to it."""
    from devices.robots.launch import start_lab_process

    yield Progress(None, f"starting the virtual lab ({what}: {scene})…")
    lab = start_lab_process(scene, config, camera_size=LAB_CAMERA_SIZE, camera_fps=15)
    try:
        client = RobotClient(lab.host, lab.port, lab.token, name="twinbench-scan")
        client.connect()
    except BaseException:
        lab.terminate()
        raise
    return lab, client


def scan_lab(
    options: ScanOptions | None = None,
    config: Path | None = None,
    record: Path | None = None,
    quick: bool = False,
    calibration_config: Path | None = None,
    calibration: dict[str, Any] | None = None,
) -> Job[ScanResult]:
    """Scan the virtual lab through the robot protocol, as a user would a real cell: with
    the board on the table (lab scene panda_calib, truth `calibration_config`) calibrate the
    wrist and fixed cameras, then (scene panda_table, truth `config`) run the guided scan.
    Each lab is its own process, stopped before this returns. `calibration` skips the
    first step."""
    plan = RobotScanPlan.quick() if quick else RobotScanPlan()
    if calibration is None:
        lab, client = yield from _lab_robot("panda_calib", calibration_config, "calibration")
        try:
            calibration = yield from sub_job(
                calibrate_robot(client, plan=plan),  # 12 views even when quick: ~30 s
                0.0,
                0.25,
                "calibrating: ",
            )
        finally:
            client.close()
            lab.terminate()
    lab, client = yield from _lab_robot("panda_table", config, "scan")
    try:
        res = yield from sub_job(
            scan_robot(client, options, record, plan, calibration), 0.25, 1.0, "scan: "
        )
    finally:
        client.close()
        lab.terminate()
    return replace(res, capture={**res.capture, "source": "lab"})
