"""Tracked object poses as trajectory channels.

`object_channels(frames, camera_pose, models, base)` tracks the objects through a frame
sequence (`track_sequence`) and writes the result into a `Trajectory` (`add_object_tracks`)
as, per object,

- `objects/<name>/pose` (T, 7): xyz (m) + quaternion xyzw of the object's (scan) frame in the
  world, unit `xyz_m+quat_xyzw`;
- `objects/<name>/track_quality` (T, 2): column 0 the tracking quality 0..1, column 1 the
  lost flag (1 = no trustworthy measurement at this sample; the pose is held from the nearest
  tracked frame, and a fit must not use it), unit `1`.

On a recording's own time base (robot states at the control rate) poses are interpolated
between camera frames (linear position, slerp rotation); a sample is lost when either frame
around it is, or when it lies outside the tracked frames. Without a base trajectory the
channels are sampled at the frames' timestamps (an object-only recording).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import trimesh
from numpy.typing import NDArray
from scipy.spatial import cKDTree
from scipy.spatial.transform import Rotation, Slerp

from devices.frames import RGBDFrame
from devices.poses import POSE_UNIT, matrix_to_pose
from devices.trajectory import Trajectory
from reconstruction.object_track_types import (
    FrameTracks,
    ObjectModel,
    ObjectTrackingError,
    ObjectTrackSettings,
)
from reconstruction.object_tracking import _CUBE_ROTATIONS, ObjectTracker
from reconstruction.segment import Plane

QUALITY_UNIT = "1"
CameraPose = NDArray[np.float64] | Callable[[RGBDFrame], NDArray[np.float64]]
RobotPoints = Callable[[RGBDFrame], NDArray[np.float64] | None]


def pose_channel(name: str) -> str:
    return f"objects/{name}/pose"


def quality_channel(name: str) -> str:
    return f"objects/{name}/track_quality"


def track_sequence(
    frames: Iterable[RGBDFrame],
    camera_pose: CameraPose | None,
    models: Sequence[ObjectModel],
    robot_points: RobotPoints | None = None,
    table: Plane | None = None,
    settings: ObjectTrackSettings | None = None,
) -> list[FrameTracks]:
    """Track `models` through `frames`. `camera_pose` is one T_world_camera (fixed camera),
    a function of the frame (wrist camera: FK at the frame's time x hand-eye), or None for
    frames that carry their own `T_world_camera`; `robot_points(frame)` gives world points on
    the robot's surface for the occlusion mask. Raises ObjectTrackingError for bad models,
    poses or an empty frame sequence."""
    tracker = ObjectTracker(models, table, settings)
    out = []
    for f in frames:
        T = camera_pose(f) if callable(camera_pose) else camera_pose
        if T is None:
            T = f.T_world_camera
        if T is None:
            raise ObjectTrackingError(
                f"object tracking: frame {f.index} (t={f.timestamp:.3f} s) has no camera pose; "
                "give the calibrated camera pose"
            )
        out.append(tracker.update(f, T, robot_points(f) if robot_points else None))
    if not out:
        raise ObjectTrackingError("object tracking: the frame sequence is empty")
    return out


def object_channels(
    frames: Iterable[RGBDFrame],
    camera_pose: CameraPose | None,
    models: Sequence[ObjectModel],
    base: Trajectory | None = None,
    robot_points: RobotPoints | None = None,
    table: Plane | None = None,
    settings: ObjectTrackSettings | None = None,
) -> Trajectory:
    """RGB-D frames + camera pose(s) + object models -> `base` with the objects' pose and
    track-quality channels (or an object-only trajectory on the frames' time base):
    `track_sequence` then `add_object_tracks`."""
    tracks = track_sequence(frames, camera_pose, models, robot_points, table, settings)
    return add_object_tracks(tracks, base)


def _per_object(
    tracks: Sequence[FrameTracks], name: str
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """(t, poses (K, 7), quality, lost) over the frames; poses NaN before the first find."""
    t = np.array([f.timestamp for f in tracks], float)
    P = np.full((len(tracks), 7), np.nan)
    q = np.zeros(len(tracks))
    lost = np.ones(len(tracks), bool)
    for k, f in enumerate(tracks):
        tr = f.objects[name]
        if tr.T_world_object is not None:
            P[k] = matrix_to_pose(tr.T_world_object)
        q[k], lost[k] = tr.quality, tr.lost
    return t, P, q, lost


def summary(tracks: Sequence[FrameTracks]) -> dict[str, Any]:
    """Per object: frames, tracked share, re-detections, mean quality (for meta/reports)."""
    out: dict[str, Any] = {}
    for name in tracks[0].objects if tracks else ():
        methods = [f.objects[name].method for f in tracks]
        lost = [f.objects[name].lost for f in tracks]
        out[name] = {
            "frames": len(tracks),
            "tracked_ratio": 1.0 - float(np.mean(lost)),
            "redetections": methods.count("redetect"),
            "mean_quality": float(np.mean([f.objects[name].quality for f in tracks])),
        }
    return out


def add_object_tracks(
    tracks: Sequence[FrameTracks],
    base: Trajectory | None = None,
    meta: dict[str, Any] | None = None,
) -> Trajectory:
    """`base` with the tracked objects' pose and quality channels added (replacing channels
    of the same name), or a new real trajectory on the frames' timestamps when `base` is
    None. Raises ObjectTrackingError when no frame was tracked at all."""
    if not tracks:
        raise ObjectTrackingError("object tracking: no tracked frames to add")
    t_frames = np.array([f.timestamp for f in tracks], float)
    if not np.all(np.diff(t_frames) > 0):
        raise ObjectTrackingError(
            "object tracking: frame timestamps are not strictly increasing (frames out of "
            "order or repeated)"
        )
    t = t_frames if base is None else np.asarray(base.t, float)
    channels: dict[str, NDArray[np.float64]] = {}
    units: dict[str, str] = {}
    for name in tracks[0].objects:
        tf, P, q, lost = _per_object(tracks, name)
        good = ~lost & np.isfinite(P[:, 0])
        if not good.any():
            # never found: hold the start pose, every sample flagged
            first = next((p for p in P if np.isfinite(p[0])), None)
            if first is None:
                raise ObjectTrackingError(f"object tracking: object '{name}' has no pose at all")
            pose = np.repeat(first[None], len(t), axis=0)
            qual = np.column_stack([np.zeros(len(t)), np.ones(len(t))])
        else:
            pose, qual = _resample(tf, P, q, lost, good, t)
        channels[pose_channel(name)], units[pose_channel(name)] = pose, POSE_UNIT
        channels[quality_channel(name)], units[quality_channel(name)] = qual, QUALITY_UNIT
    extra = {"object_tracking": summary(tracks), **dict(meta or {})}
    if base is None:
        return Trajectory(t, channels, units, "real", extra)
    return base.with_channels(
        channels={**dict(base.channels), **channels},
        units={**dict(base.units), **units},
        meta={**dict(base.meta), **extra},
    )


def _resample(
    tf: NDArray[np.float64],
    P: NDArray[np.float64],
    q: NDArray[np.float64],
    lost: NDArray[np.bool_],
    good: NDArray[np.bool_],
    t: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    tg, Pg = tf[good], P[good]
    if len(tg) == 1:
        pose = np.repeat(Pg[:1], len(t), axis=0)
    else:
        tc = np.clip(t, tg[0], tg[-1])
        pos = np.stack([np.interp(tc, tg, Pg[:, k]) for k in range(3)], 1)
        rot = Slerp(tg, Rotation.from_quat(Pg[:, 3:7]))(tc).as_quat()
        rot[rot[:, 3] < 0] *= -1
        pose = np.hstack([pos, rot])
    # quality and lost flag from the frames around each sample
    i1 = np.clip(np.searchsorted(tf, t, side="left"), 0, len(tf) - 1)
    i0 = np.clip(np.searchsorted(tf, t, side="right") - 1, 0, len(tf) - 1)
    outside = (t < tf[0] - 1e-9) | (t > tf[-1] + 1e-9)
    flag = lost[i0] | lost[i1] | outside
    qual = np.where(flag, 0.0, np.minimum(q[i0], q[i1]))
    return pose, np.column_stack([qual, flag.astype(float)])


# -- evaluation against known poses (tests, benchmarks) ---------------------------------------
def _maps_onto_itself(
    pts: NDArray[np.float64],
    tree: cKDTree,
    R: NDArray[np.float64],
    c: NDArray[np.float64],
    tol: float,
) -> bool:
    d, _ = tree.query((pts - c) @ R.T + c)
    return bool(np.mean(d) < tol)


def shape_symmetries(
    mesh: trimesh.Trimesh, tol: float = 0.001
) -> tuple[list[NDArray[np.float64]], int | None]:
    """Rotations about the mesh's bounding-box centre that map it onto itself (of the 24
    axis-aligned ones), and the axis (0, 1, 2) of a continuous symmetry, if any (a
    cylinder's). A pose error is only an error modulo these: depth cannot tell them apart."""
    pts, _ = trimesh.sample.sample_surface(mesh, 1500, seed=0)
    dense, _ = trimesh.sample.sample_surface(mesh, 20000, seed=1)
    tree = cKDTree(dense)
    c = 0.5 * (mesh.bounds[0] + mesh.bounds[1])
    axis = None
    for k in range(3):
        rv = np.zeros(3)
        ok = True
        for a in (0.37, 1.1, 2.3):
            rv[k] = a
            if not _maps_onto_itself(pts, tree, Rotation.from_rotvec(rv).as_matrix(), c, tol):
                ok = False
                break
        if ok:
            axis = k
            break
    sym = [R for R in _CUBE_ROTATIONS if _maps_onto_itself(pts, tree, R, c, tol)]
    return sym, axis


def pose_error(
    mesh: trimesh.Trimesh,
    T_est: NDArray[np.float64],
    T_true: NDArray[np.float64],
    symmetries: tuple[list[NDArray[np.float64]], int | None] | None = None,
) -> tuple[float, float]:
    """(position error in mm of the shape's centre, rotation error in degrees modulo the
    shape's symmetries) of an estimated object pose against the true one."""
    sym, axis = symmetries if symmetries is not None else shape_symmetries(mesh)
    c = 0.5 * (mesh.bounds[0] + mesh.bounds[1])
    mm = 1000.0 * float(
        np.linalg.norm(T_est[:3, :3] @ c + T_est[:3, 3] - T_true[:3, :3] @ c - T_true[:3, 3])
    )
    Re, Rt = T_est[:3, :3], T_true[:3, :3]
    if axis is not None:
        cosang = float(np.clip(Re[:, axis] @ Rt[:, axis], -1.0, 1.0))
        deg = float(np.degrees(np.arccos(cosang)))
        if any(R[axis, axis] < 0 for R in sym):  # flipped end over end looks the same
            deg = min(deg, 180.0 - deg)
        return mm, deg
    angles = [Rotation.from_matrix(Re @ R @ Rt.T).magnitude() for R in sym or [np.eye(3)]]
    return mm, float(np.degrees(min(angles)))
