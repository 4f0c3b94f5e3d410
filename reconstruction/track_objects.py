"""Track the scanned objects through camera frames and write their poses into a recording.

    traj = run_to_end(track_recording(traj, frames, T_base_camera, models_from_scan(scan),
                                      table=table_plane(scan), surface=surface))
    tid = run_to_end(track_camera_file(project, Path("toss.db3"), scan_id))

The robot protocol cannot report object poses (a real robot does not know them): they come
from the depth stream, by model-based tracking of the scanned objects
(reconstruction/object_tracking.py), started at the scan's poses. The robot hides objects
and must not be mistaken for one: its surface at each frame's time (a `RobotMask`, e.g.
twins/robot_surface.py's `RobotSurface`, placed at the joint positions recorded around the
frame) is masked out of the depth. `track_recording` adds `objects/<name>/pose` and
`objects/<name>/track_quality` channels; samples where an object was lost are flagged and a
fit leaves them out. `track_camera_file` makes an object-only recording (no robot) from a
camera file seen by the scan's calibrated fixed camera. A robot recording's own camera
(`record --camera`, `camera.db3` next to it) is tracked by app/workflows/track.py
(`track_artifact`, which builds the robot's surface from its description).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from devices.cameras.playback import PlaybackSource
from devices.frames import RGBDFrame
from devices.trajectory import Trajectory
from reconstruction.object_track_types import (
    FrameTracks,
    ObjectModel,
    ObjectTrackSettings,
    RobotMask,
)
from reconstruction.object_tracking import ObjectTracker
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


def joints_at(traj: Trajectory, t: float) -> NDArray[np.float64]:
    """Joint positions recorded around robot time `t` (linear interpolation)."""
    q = traj["robot/joint_pos"]
    return np.array([np.interp(t, traj.t, q[:, j]) for j in range(q.shape[1])])


def track_frames(
    frames: Iterable[RGBDFrame],
    camera_pose: NDArray[np.float64] | Callable[[RGBDFrame], NDArray[np.float64]],
    models: Sequence[ObjectModel],
    table: Plane | None = None,
    robot: tuple[Trajectory, RobotMask] | None = None,
    settings: ObjectTrackSettings | None = None,
    total: int | None = None,
) -> Job[list[FrameTracks]]:
    """Job: track `models` through `frames` (timestamps on the robot's clock); returns
    every frame's tracks. `camera_pose`: T_base_camera of a fixed camera, or a function of
    the frame (a wrist camera). `robot` = (recording with robot/joint_pos, its surface)
    masks the robot at the joints recorded around each frame."""
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
    surface: RobotMask | None = None,
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


def db3_frames(folder: Path) -> tuple[list[RGBDFrame], str]:
    """The frames of the camera recording (.db3) saved in `folder`, and its file name."""
    files = sorted(folder.glob("*.db3"))
    if not files:
        raise TrackError(f"{folder}: no camera recording (.db3) next to this trajectory")
    return read_db3(files[0]), files[0].name


def read_db3(path: Path) -> list[RGBDFrame]:
    """Every frame of a camera recording (.db3); TrackError naming it when it holds none."""
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
    frames = read_db3(recording)
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
