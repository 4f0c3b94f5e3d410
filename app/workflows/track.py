"""The Track step: the scanned objects tracked in the camera recording saved with a robot
recording, their poses written into a new trajectory artifact.

    tid = run_to_end(track_artifact(project, trajectory_id, scan_id, robot_description=...))

A recording made with a camera (`record --camera`) carries the frames as `camera.db3` next
to it; `track_artifact` tracks them (reconstruction/track_objects.py: the objects' models
started at the scan's poses, the robot masked by its surface at the recorded joints,
twins/robot_surface.py) and saves a new trajectory artifact (inputs: the recording and the
scan) with `objects/<name>/pose` and `objects/<name>/track_quality` channels. An
object-only camera file is `reconstruction.track_objects.track_camera_file`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.frames import RGBDFrame
from devices.trajectory import Trajectory
from reconstruction.object_track_types import ObjectTrackSettings
from reconstruction.scan_result import ScanResult
from reconstruction.track_objects import (
    TrackError,
    db3_frames,
    joints_at,
    models_from_scan,
    table_plane,
    track_recording,
)
from resources.jobs import Job, Progress
from resources.project import Project
from twins.robot_surface import RobotSurface


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
    frames, fname = db3_frames(project.path_of(trajectory_id))
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
