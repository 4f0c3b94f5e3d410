"""Object tracking benchmark: the lab's Panda pushes the box while the cylinder is dropped
and the U-block slid by hand; the fixed camera's depth stream is tracked with the robot
masked by forward kinematics (reconstruction/track_objects.py, twins/robot_surface.py) and
every tracked pose is compared with the lab's hidden truth.

Models are the true shapes started at their resting poses perturbed by a scan's typical
error (3 mm, 1.5 deg; the scan itself is `bench scan`); the camera pose is the lab's true
one (a calibrated camera; calibration error is `bench scan`'s). Errors are of the shape's
centre and modulo the shape's symmetries (a cylinder's spin about its axis is invisible).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.lab.camera import LabCamera
from devices.lab.sim import LabSim
from devices.lab.truth import object_mesh, truth_camera_pose
from devices.poses import pose_to_matrix
from devices.trajectory import Trajectory
from reconstruction.object_track_types import ObjectModel
from reconstruction.object_tracks import add_object_tracks, pose_error, shape_symmetries
from reconstruction.segment import Plane
from reconstruction.track_objects import track_frames
from resources.jobs import run_to_end
from twins.pushes import plan_push
from twins.robot_surface import RobotSurface

DESCRIPTION = (
    "lab push + drop + slide seen by the fixed camera: tracked poses vs the lab's hidden "
    "truth (track_err_mm, track_err_deg), tracked_ratio, tracking fps"
)
CONTROL_HZ = 250.0


@dataclass
class LabRun:
    """A lab recording with its camera frames and the truth at each frame."""

    traj: Any  # Trajectory: robot/joint_pos, robot/command
    frames: list[Any]  # RGBDFrame, timestamps on the lab (robot) clock
    truth: list[dict[str, NDArray[np.float64]]]  # per frame: object -> pose (7,)
    models: list[Any]  # ObjectModel at scan-like poses
    meshes: dict[str, Any]  # object -> true mesh (object frame)
    T_base_camera: NDArray[np.float64]
    description: str
    joint_names: list[str]


def lab_push(
    fps: float = 15.0, width: int = 424, height: int = 240, seed: int = 0, hands: bool = True
) -> LabRun:
    """Play a push of the box (twins/pushes.py) in the lab at the control rate, grab the
    fixed camera at `fps`; with `hands`, the cylinder is dropped from 15 cm and the U-block
    slid while the arm moves."""
    from scipy.spatial.transform import Rotation

    sim = LabSim("panda_table")
    info = sim.info()
    q0 = sim.read_state().joint_pos
    box = next(o for o in sim.config.objects if o.name == "box")
    motion = plan_push(
        info, q0, None, target_xy=tuple(box.pose[:2]), direction=90.0, speed=0.15,
        distance=0.16, velocity=0.8,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    models, meshes = [], {}
    for o in sim.config.objects:
        d = np.eye(4)
        d[:3, :3] = Rotation.from_rotvec(rng.normal(0, np.radians(1.5), 3)).as_matrix()
        d[:3, 3] = rng.normal(0, 0.003, 3)
        meshes[o.name] = object_mesh(o)
        models.append(ObjectModel(o.name, meshes[o.name], d @ pose_to_matrix(o.pose)))
    cam = LabCamera(sim, "fixed", width, height)
    per_tick = max(1, int(round(1.0 / (CONTROL_HZ * sim.dt))))
    frame_every = 1.0 / fps
    T, Q, U = [], [], []
    frames, truth = [], []
    next_frame = 0.0
    t_end = float(motion.t[-1]) + 0.5
    drop_at, slide_at = 0.35 * t_end, 0.55 * t_end
    try:
        while sim.time < t_end:
            now = sim.time
            u = np.array([np.interp(now, motion.t, motion.command[:, j]) for j in range(7)])
            sim.write_command("position", u)
            if hands and drop_at <= now < drop_at + 1 / CONTROL_HZ:
                p = sim.truth_object_poses()["cylinder"].copy()
                p[2] += 0.15
                sim.set_object("cylinder", pose=p, ang_vel=np.array([0.0, 3.0, 0.0]))
            if hands and slide_at <= now < slide_at + 1 / CONTROL_HZ:
                sim.set_object(
                    "u_block", lin_vel=np.array([-0.5, 0.2, 0.0]), ang_vel=np.array([0, 0, 2.0])
                )
            sim.step(per_tick)
            s = sim.read_state()
            T.append(s.t)
            Q.append(s.joint_pos)
            U.append(u)
            if sim.time >= next_frame:
                frames.append(cam.grab())
                truth.append(sim.truth_object_poses())
                next_frame += frame_every
    finally:
        cam.close()
    traj = Trajectory(
        np.asarray(T),
        {"robot/joint_pos": np.asarray(Q), "robot/command": np.asarray(U)},
        {"robot/joint_pos": "rad", "robot/command": "rad"},
        "real",
        {"joint_names": list(info.joint_names), "name": "push"},
    )
    return LabRun(
        traj,
        frames,
        truth,
        models,
        meshes,
        truth_camera_pose(sim.config, "fixed"),
        info.description,
        list(info.joint_names),
    )


def score(run_: LabRun, tracks: list[Any]) -> dict[str, Any]:
    """Errors of tracked (not lost) poses against the truth, overall and per object."""

    per: dict[str, dict[str, Any]] = {}
    mm_all, deg_all, lost_all = [], [], []
    for name, mesh in run_.meshes.items():
        sym = shape_symmetries(mesh)
        mm, deg, lost = [], [], 0
        for ft, truth in zip(tracks, run_.truth, strict=True):
            tr = ft.objects[name]
            if tr.lost or tr.T_world_object is None:
                lost += 1
                continue
            e = pose_error(mesh, tr.T_world_object, pose_to_matrix(truth[name]), sym)
            mm.append(e[0])
            deg.append(e[1])
        moved = max(
            float(np.linalg.norm(t[name][:3] - run_.truth[0][name][:3])) for t in run_.truth
        )
        per[name] = {
            "track_err_mm": round(float(np.mean(mm)), 3) if mm else None,
            "track_err_mm_p95": round(float(np.percentile(mm, 95)), 3) if mm else None,
            "track_err_deg": round(float(np.mean(deg)), 3) if deg else None,
            "tracked_ratio": round(1 - lost / len(tracks), 3),
            "redetections": sum(ft.objects[name].method == "redetect" for ft in tracks),
            "moved_m": round(moved, 3),
        }
        mm_all += mm
        deg_all += deg
        lost_all.append(lost)
    return {
        "track_err_mm": round(float(np.mean(mm_all)), 3),
        "track_err_mm_p95": round(float(np.percentile(mm_all, 95)), 3),
        "track_err_deg": round(float(np.mean(deg_all)), 3),
        "track_err_deg_p95": round(float(np.percentile(deg_all, 95)), 3),
        "tracked_ratio": round(1 - sum(lost_all) / (len(tracks) * len(run_.meshes)), 3),
        "objects": per,
    }


def run(quick: bool = False) -> dict[str, Any]:
    fps = 7.5 if quick else 15.0
    t0 = time.perf_counter()
    lab = lab_push(fps=fps)
    record_s = time.perf_counter() - t0
    table = Plane(np.array([0.0, 0.0, 1.0]), 0.0)
    with RobotSurface(lab.description, lab.joint_names) as surface:
        t1 = time.perf_counter()
        tracks = run_to_end(
            track_frames(lab.frames, lab.T_base_camera, lab.models, table, (lab.traj, surface))
        )
        track_s = time.perf_counter() - t1
    out = score(lab, tracks)
    traj = add_object_tracks(tracks, lab.traj)  # the channels a fit reads
    flagged = {n: int(traj[f"objects/{n}/track_quality"][:, 1].sum()) for n in lab.meshes}
    size = f"{lab.frames[0].intrinsics.width}x{lab.frames[0].intrinsics.height}"
    out.update(
        {
            "frames": len(lab.frames),
            "camera": f"fixed {size} at {fps:g} fps",
            "fps": round(len(lab.frames) / track_s, 2),
            "record_s": round(record_s, 2),
            "samples": len(traj),
            "samples_flagged_lost": flagged,
            "target_track_err_mm": 3.0,
        }
    )
    return out
