"""Track the scanned objects in a recording's camera stream and write their poses into it.

    surface = RobotSurface("franka_panda/panda.urdf", joint_names)   # occlusion mask (FK)
    traj = run_to_end(track_recording(traj, frames, T_base_camera, models_from_scan(scan),
                                      table=table_plane(scan), surface=surface))
    tid = run_to_end(track_artifact(project, trajectory_id, scan_id, robot_description=...))

The robot protocol cannot report object poses (a real robot does not know them): they come
from the depth stream, by model-based tracking of the scanned objects
(reconstruction/object_tracking.py), started at the scan's poses. The robot hides objects
and must not be mistaken for one: its surface at each frame's time (URDF visual meshes,
sampled once, placed by forward kinematics at the joint positions recorded around the frame)
is masked out of the depth. A recording made with a camera (`record --camera`) carries the
frames as `camera.db3` next to it; `track_artifact` tracks them and saves a new trajectory
artifact (inputs: the recording and the scan) with `objects/<name>/pose` and
`objects/<name>/track_quality` channels. Samples where an object was lost are flagged and a
fit leaves them out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trimesh
from numpy.typing import NDArray

from devices.frames import RGBDFrame
from devices.trajectory import Trajectory
from reconstruction.object_track_types import FrameTracks, ObjectModel, ObjectTrackSettings
from reconstruction.object_tracks import add_object_tracks
from reconstruction.scan_result import ScanResult
from reconstruction.segment import Plane
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress
from resources.project import Project


class TrackError(TwinbenchError):
    """Object tracking of a recording cannot run; the message names the recording/camera."""


def models_from_scan(scan: ScanResult, names: Sequence[str] | None = None) -> list[ObjectModel]:
    """The scan's objects (all, or `names`) as tracking models at their scanned poses."""
    objs = [o for o in scan.objects if names is None or o.name in names]
    missing = sorted(set(names or ()) - {o.name for o in objs})
    if missing:
        raise TrackError(
            f"scan has no object(s) {missing} (it has {[o.name for o in scan.objects]})"
        )
    if not objs:
        raise TrackError("the scan has no objects to track")
    return [ObjectModel(o.name, o.mesh, np.asarray(o.T_base_object, float)) for o in objs]


def table_plane(scan: ScanResult) -> Plane | None:
    return None if scan.table_plane is None else Plane.from_list(list(scan.table_plane))


def _mesh_of(v: Any) -> trimesh.Trimesh | None:
    if v.kind == "mesh":
        if v.mesh is None:
            return None
        m = trimesh.load(v.mesh, force="mesh", process=False)
        if not isinstance(m, trimesh.Trimesh) or not len(m.faces):
            return None
        return trimesh.Trimesh(m.vertices * np.asarray(v.scale), m.faces, process=False)
    if v.kind == "box":
        return trimesh.creation.box(v.size)
    if v.kind == "cylinder":
        return trimesh.creation.cylinder(v.size[0], v.size[1])
    if v.kind == "sphere":
        return trimesh.creation.icosphere(2, v.size[0])
    return None


class RobotSurface:
    """Points on a URDF robot's visual surface, placed by forward kinematics."""

    def __init__(
        self, description: str, joint_names: Sequence[str], points_per_link: int = 400
    ) -> None:
        from twins.kinematics import RobotKinematics, description_path
        from twins.urdf import visuals

        path = description_path(description)
        self.kin = RobotKinematics(path, joint_names)
        parts: dict[str, list[NDArray[np.float64]]] = {}
        for k, v in enumerate(visuals(path)):
            mesh = _mesh_of(v)
            if mesh is None:
                continue
            pts, _ = trimesh.sample.sample_surface(mesh, points_per_link, seed=k)
            T = v.origin
            parts.setdefault(v.link, []).append(np.asarray(pts) @ T[:3, :3].T + T[:3, 3])
        if not parts:
            self.kin.close()
            raise TrackError(f"robot description '{description}': no visual geometry to mask")
        self.parts = {link: np.vstack(p) for link, p in parts.items()}

    def points(self, joint_pos: NDArray[np.float64]) -> NDArray[np.float64]:
        """(N, 3) base-frame points on the robot at `joint_pos`."""
        out = []
        for link, P in self.parts.items():
            T = self.kin.link_pose(link, joint_pos)
            out.append(P @ T[:3, :3].T + T[:3, 3])
        return np.vstack(out)

    def close(self) -> None:
        self.kin.close()

    def __enter__(self) -> RobotSurface:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def joints_at(traj: Trajectory, t: float) -> NDArray[np.float64]:
    """Joint positions recorded around robot time `t` (linear interpolation)."""
    q = traj["robot/joint_pos"]
    return np.array([np.interp(t, traj.t, q[:, j]) for j in range(q.shape[1])])


def track_frames(
    frames: Iterable[RGBDFrame],
    camera_pose: NDArray[np.float64] | Callable[[RGBDFrame], NDArray[np.float64]],
    models: Sequence[ObjectModel],
    table: Plane | None = None,
    robot: tuple[Trajectory, RobotSurface] | None = None,
    settings: ObjectTrackSettings | None = None,
    total: int | None = None,
) -> Job[list[FrameTracks]]:
    """Job: track `models` through `frames` (timestamps on the robot's clock); returns
    every frame's tracks. `camera_pose`: T_base_camera of a fixed camera, or a function of
    the frame (a wrist camera). `robot` = (recording with robot/joint_pos, its surface)
    masks the robot at the joints recorded around each frame."""
    from reconstruction.object_tracking import ObjectTracker

    if robot is not None and "robot/joint_pos" not in robot[0].channels:
        raise TrackError("masking the robot needs a recording with robot/joint_pos")
    tracker = ObjectTracker(models, table, settings)
    tracks = []
    for k, f in enumerate(frames):
        T = camera_pose(f) if callable(camera_pose) else camera_pose
        pts = None if robot is None else robot[1].points(joints_at(robot[0], f.timestamp))
        tracks.append(tracker.update(f, T, pts))
        lost = [n for n, tr in tracks[-1].objects.items() if tr.lost]
        yield Progress(
            (k + 1) / total if total else None,
            f"frame {k + 1}{f' of {total}' if total else ''}"
            + (f": lost {', '.join(lost)}" if lost else ""),
        )
    if not tracks:
        raise TrackError("no camera frames to track")
    return tracks


def track_recording(
    traj: Trajectory | None,
    frames: Iterable[RGBDFrame],
    camera_pose: NDArray[np.float64] | Callable[[RGBDFrame], NDArray[np.float64]],
    models: Sequence[ObjectModel],
    table: Plane | None = None,
    surface: RobotSurface | None = None,
    settings: ObjectTrackSettings | None = None,
    total: int | None = None,
) -> Job[Trajectory]:
    """Job: `track_frames`, then `traj` with the object channels added (or, with `traj`
    None, an object-only recording on the frames' time base). `surface` masks the robot at
    the joints of `traj`."""
    if surface is not None and traj is None:
        raise TrackError("masking the robot needs a recording with robot/joint_pos")
    robot = (traj, surface) if traj is not None and surface is not None else None
    tracks = yield from track_frames(frames, camera_pose, models, table, robot, settings, total)
    if traj is not None:
        inside = [f for f in tracks if traj.t[0] - 0.5 <= f.timestamp <= traj.t[-1] + 0.5]
        if not inside:
            raise TrackError(
                f"camera frames (t = {tracks[0].timestamp:.2f}..{tracks[-1].timestamp:.2f} s) "
                f"do not overlap the recording (t = {traj.t[0]:.2f}..{traj.t[-1]:.2f} s): "
                "different clocks?"
            )
    return add_object_tracks(tracks, traj)


def _db3_frames(folder: Path) -> tuple[list[RGBDFrame], str]:
    files = sorted(folder.glob("*.db3"))
    if not files:
        raise TrackError(f"{folder}: no camera recording (.db3) next to this trajectory")
    return _read_db3(files[0]), files[0].name


def _read_db3(path: Path) -> list[RGBDFrame]:
    from devices.cameras.playback import PlaybackSource

    with PlaybackSource(path) as src:
        frames = list(src.frames())
    if not frames:
        raise TrackError(f"{path}: the camera recording holds no frames")
    return frames


def track_camera_file(
    project: Project,
    recording: Path,
    scan_id: str,
    settings: ObjectTrackSettings | None = None,
    name: str | None = None,
) -> Job[str]:
    """Job: an object-only recording (objects tossed, slid or dropped in front of the
    scan's calibrated fixed camera, no robot) from a camera file (.db3): the scan's objects
    tracked into a new trajectory artifact on the frames' time base (input: the scan; the
    file is named in its settings). Nothing is saved on error or cancel."""
    recording = Path(recording)
    scan = ScanResult.load(project.path_of(scan_id))
    calib = scan.calibration or {}
    if "T_base_fixed" not in calib:
        raise TrackError(
            f"{recording}: scan '{scan_id}' has no calibrated fixed camera to see it from"
        )
    yield Progress(None, f"reading {recording.name}")
    frames = _read_db3(recording)
    frames = [f for i, f in enumerate(frames) if i == 0 or f.timestamp > frames[i - 1].timestamp]
    out = yield from track_recording(
        None,
        iter(frames),
        np.asarray(calib["T_base_fixed"], float),
        models_from_scan(scan),
        table_plane(scan),
        settings=settings,
        total=len(frames),
    )
    meta = {
        **dict(out.meta),
        "name": name or recording.stem,
        "camera": calib.get("fixed_camera"),
        "time_origin_s": float(out.t[0]),  # the camera clock at t = 0
    }
    out = out.with_channels(t=out.t - out.t[0], meta=meta)
    report = out.meta.get("object_tracking", {})
    with project.new_artifact(
        "trajectory",
        inputs=[scan_id],
        settings={"camera_recording": str(recording), "scan": scan_id, "object_only": True},
        summary=f"object-only recording {recording.name}: "
        + ", ".join(f"{n} {100 * r['tracked_ratio']:.0f} % tracked" for n, r in report.items()),
    ) as folder:
        out.save(folder)
    return project.artifacts("trajectory")[-1].id


def wrist_camera_pose(
    traj: Trajectory, surface: RobotSurface, mount_link: str, T_mount_camera: NDArray[np.float64]
) -> Callable[[RGBDFrame], NDArray[np.float64]]:
    """T_base_camera of a camera on link `mount_link` at each frame's time: forward
    kinematics at the joints recorded around the frame, times the hand-eye transform."""
    X = np.asarray(T_mount_camera, float)

    def pose(frame: RGBDFrame) -> NDArray[np.float64]:
        return surface.kin.link_pose(mount_link, joints_at(traj, frame.timestamp)) @ X

    return pose


def track_artifact(
    project: Project,
    trajectory_id: str,
    scan_id: str,
    camera: str | None = None,
    robot_description: str | None = None,
    settings: ObjectTrackSettings | None = None,
    mount_link: str | None = None,
) -> Job[str]:
    """Job: track the scan's objects in the camera recording saved with trajectory
    `trajectory_id`; saves a new trajectory artifact (inputs: the recording and the scan)
    and returns its id. The camera is the scan's calibrated fixed camera, or a wrist camera
    on `mount_link` (with the scan's hand-eye `T_hand_camera` and `robot_description`);
    `robot_description` (URDF key) also masks the robot. Nothing is saved on error or
    cancel."""
    traj = Trajectory.load(project.path_of(trajectory_id))
    scan = ScanResult.load(project.path_of(scan_id))
    cam = camera or str(traj.meta.get("camera", ""))
    calib = scan.calibration or {}
    fixed = bool(cam) and cam == calib.get("fixed_camera") and "T_base_fixed" in calib
    wrist = bool(mount_link) and "T_hand_camera" in calib
    if not fixed and not wrist:
        raise TrackError(
            f"recording '{trajectory_id}': camera '{cam or '?'}' has no calibrated pose in scan "
            f"'{scan_id}' (calibrated fixed camera: {calib.get('fixed_camera') or 'none'}; a "
            "wrist camera needs --mount-link, --robot-description and the scan's hand-eye)"
        )
    if wrist and not fixed and not robot_description:
        raise TrackError(
            f"recording '{trajectory_id}': a wrist camera on '{mount_link}' needs the robot's "
            "description (--robot-description) for its pose"
        )
    yield Progress(None, f"reading the camera recording of '{trajectory_id}'")
    frames, fname = _db3_frames(project.path_of(trajectory_id))
    surface = None
    if robot_description:
        surface = RobotSurface(robot_description, [str(j) for j in traj.meta["joint_names"]])
    try:
        if fixed:
            pose: Any = np.asarray(calib["T_base_fixed"], float)
        else:
            assert surface is not None and mount_link
            pose = wrist_camera_pose(traj, surface, mount_link, np.asarray(calib["T_hand_camera"]))
        out = yield from track_recording(
            traj,
            iter(frames),
            pose,
            models_from_scan(scan),
            table_plane(scan),
            surface,
            settings,
            total=len(frames),
        )
    finally:
        if surface is not None:
            surface.close()
    report = out.meta.get("object_tracking", {})
    with project.new_artifact(
        "trajectory",
        inputs=[trajectory_id, scan_id],
        settings={"tracked_camera": cam, "camera_recording": fname, "scan": scan_id},
        summary=f"{trajectory_id} with object poses from camera '{cam}': "
        + ", ".join(f"{n} {100 * r['tracked_ratio']:.0f} % tracked" for n, r in report.items()),
    ) as folder:
        out.save(folder)
    return project.artifacts("trajectory")[-1].id
