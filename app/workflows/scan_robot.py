"""Guided wrist-camera scan of a CONNECTED robot (virtual lab or hardware, reached only
through the robot protocol), as Qt-free jobs shared by the CLI and the Scan page.

- `scan_robot(client, options, record=...)`: move the arm through the planned view path
  (reconstruction/scan_path.py), wait until it settles, grab a wrist-camera frame over the
  protocol and pair it with the joint state at the frame's timestamp (same robot clock),
  camera pose = FK(q) @ T_hand_camera (FK from the robot's own description, twins/), TSDF
  integration and object segmentation (reconstruction pipeline) -> ScanResult.
- `calibrate_robot(client, ...)`: hand-eye calibration of the wrist camera from views of a
  ChArUco board lying on the table (reconstruction/calibration.py), for `calibration=`.

The robot is left stopped at the end, on error and on cancel (`gen.close()`).
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


class RobotScanError(TwinbenchError):
    """A guided scan of a connected robot cannot run; the message names robot and camera."""


@dataclass
class RobotScanPlan:
    """Where to look and how to move (SI units)."""

    centre: tuple[float, float, float] = (0.57, 0.0, 0.03)  # workspace centre, base frame
    distance: float = 0.55
    elevation_deg: float = 55.0
    views: int = 8
    azimuth_deg: tuple[float, float] = (-80.0, 80.0)
    object_views: int = 4  # per object found by the orbit (second pass); 0: none
    object_distance: float = 0.5
    object_elevation_deg: float = 40.0
    camera: str | None = None  # None: the first camera with a nominal mount pose
    speed_rad_s: float = 1.2  # joint-space speed of the moves
    settle_tol_rad: float = 3e-3
    settle_vel_rad_s: float = 0.02
    settle_timeout_s: float = 4.0


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

    def grab(self, t_after: float, window_s: float = 0.3) -> tuple[RGBDFrame, NDArray[np.float64]]:
        """A frame taken after robot time `t_after`, with the joint positions interpolated
        at its timestamp from the states recorded while it was taken."""
        frames = self.frames()
        if self._primer is not None:
            self._primer.join(timeout=20.0)
            self._primer = None
            if self._prime_error is not None:
                raise self._prime_error
        for _ in range(5):
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
            if best is not None:
                qf = np.array([np.interp(best.timestamp, t, q[:, j]) for j in range(q.shape[1])])
                return best, qf
        raise RobotScanError(
            f"robot {self.info.name}: camera '{self.camera}' frame timestamps "
            f"never fall inside the state stream (different clocks?)"
        )

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


def scan_robot(
    client: RobotClient,
    options: ScanOptions | None = None,
    record: Path | None = None,
    plan: RobotScanPlan | None = None,
    calibration: dict[str, Any] | None = None,
) -> Job[ScanResult]:
    """Guided wrist scan of the connected robot. `calibration` ({"T_hand_camera": 4x4, ...}
    from `calibrate_robot`) or else the robot's NOMINAL camera mount pose."""
    from devices.cameras.software import SoftwareCamera
    from reconstruction.scan_path import orbit_targets
    from reconstruction.segment import cluster_objects, fit_table_plane

    opt = options or ScanOptions()
    plan = plan or RobotScanPlan()
    opt.exclude = opt.exclude or [(np.array([-0.3, -0.3, -0.1]), np.array([0.2, 0.3, 1.5]))]
    arm = ConnectedArm(client, plan.camera)
    cam = None
    try:
        X = np.asarray((calibration or {}).get("T_hand_camera", arm.T_mount_camera_nominal))
        calib = {
            k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v)
            for k, v in (calibration or {}).items()
        }
        calib.setdefault("T_hand_camera", X.tolist())
        calib["hand_camera_source"] = "hand-eye" if calibration else "nominal mount pose"
        log: dict[str, Any] = {"unreachable": 0, "unsettled": 0, "paired": []}
        yield Progress(
            0.0,
            f"scanning with {arm.info.name} camera '{arm.camera}' ({calib['hand_camera_source']})",
        )
        sess = ScanSession(TSDFSettings(voxel_size=opt.voxel_size, depth_max=opt.depth_max))
        stream = _camera_poses(
            arm,
            orbit_targets(
                plan.centre, plan.distance, plan.elevation_deg, plan.views, plan.azimuth_deg
            ),
            X,
            plan,
            log,
        )
        if record is not None:
            first = next(stream, None)
            if first is None:
                raise RobotScanError(f"robot {arm.info.name}: no view of the path is reachable")
            cam = SoftwareCamera(
                first.intrinsics,
                first.depth_scale,
                record_path=record,
                name=f"Twinbench {arm.info.name} {arm.camera}",
            )
            cam.info.meta.update(
                {
                    "T_hand_camera": X.tolist(),
                    "source": "robot",
                    "robot": arm.info.name,
                    "calibration": calib,
                    "exclude": [[lo.tolist(), hi.tolist()] for lo, hi in opt.exclude],
                }
            )
            stream = (cam.push(f) for f in _chain1(first, stream))
        second_share = 0.4 if plan.object_views else 0.0
        yield from sub_job(
            reconstruct_frames(stream, None, opt, session=sess, finish=False, total=plan.views),
            0.0,
            0.9 - second_share,
            "orbit: ",
        )
        if plan.object_views and not (opt.stop is not None and opt.stop.is_set()):
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
                for T in orbit_targets(
                    tuple(cl.footprint_centre(plane)),
                    plan.object_distance,
                    plan.object_elevation_deg,
                    plan.object_views,
                    (-180, 135),
                    base_azimuth_deg=0,
                )
            ]
            more = _camera_poses(arm, second, X, plan, log)
            if cam is not None:
                more = (cam.push(f) for f in more)
            yield from sub_job(
                reconstruct_frames(more, None, opt, session=sess, finish=False, total=len(second)),
                0.5,
                0.9,
                "objects: ",
            )
        arm.stop()  # the arm is still for the segmentation
        res = yield from sub_job(
            reconstruct_frames(iter(()), None, opt, session=sess, calibration=calib), 0.9, 1.0
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
            "paired_states": log["paired"],
        }
        if cam is not None:
            capture.update({"sdk_version": cam.info.sdk_version, "device": cam.info.device})
        return replace(res, warnings=tuple(warnings), capture=capture)
    finally:
        if cam is not None:
            cam.close()
        arm.stop()


def _chain1(first: RGBDFrame, rest: Iterator[RGBDFrame]) -> Iterator[RGBDFrame]:
    yield first
    yield from rest


def calibrate_robot(
    client: RobotClient,
    views: int = 10,
    board_centre: tuple[float, float, float] = (0.435, 0.0, 0.0),
    plan: RobotScanPlan | None = None,
) -> Job[dict[str, Any]]:
    """Hand-eye calibration of the wrist camera from ChArUco board views (the board lying
    on the table near `board_centre`; the lab's panda_calib scene), robot moved by the
    guided calibration path as in the in-process lab scan."""
    from reconstruction.calibration import detect_board, hand_eye, intrinsics_check
    from reconstruction.scan_path import orbit_targets

    plan = plan or RobotScanPlan()
    arm = ConnectedArm(client, plan.camera)
    try:
        X0 = arm.T_mount_camera_nominal
        targets = orbit_targets(board_centre, 0.42, 60, views * 2 // 3, (-70, 70)) + orbit_targets(
            board_centre, 0.35, 75, views - views * 2 // 3, (-120, 120)
        )
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
                (i + 1) / len(targets),
                f"calibration view {i + 1}/{len(targets)}: {len(found)} boards found",
            )
        if intr is None:
            raise RobotScanError(f"robot {arm.info.name}: no calibration view is reachable")
        he = hand_eye(hands, found, intr)
        return {
            "T_hand_camera": he.T,
            "hand_eye": he.summary(),
            "board_missed_views": missed,
            "intrinsics_check": intrinsics_check(found, intr),
        }
    finally:
        arm.stop()
