"""Ground truth of a lab scene, for benchmarks and tests ONLY (never for the protocol).

    from devices.lab.truth import truth_meshes, truth_camera_pose
    meshes = truth_meshes(LabConfig.load(path))             # {"table": ..., "box": ...}
    T_world_cam = truth_camera_pose(cfg, "wrist", joint_pos=q_true)

All in the world frame = robot base frame, metres; camera poses in OpenCV axes (x right,
y down, z forward), as `T_world_camera` (maps camera points to world points).
"""

from __future__ import annotations

import functools
import json

import mujoco
import numpy as np
import trimesh
from numpy.typing import ArrayLike, NDArray

from devices.lab.config import LabConfig, ObjectConfig
from devices.lab.meshes import load_mesh
from devices.lab.parts import TABLE_THICKNESS, TABLE_X, TABLE_Y
from devices.lab.scenes import build_model, get_scene
from devices.poses import pose_to_matrix


def object_mesh(o: ObjectConfig) -> trimesh.Trimesh:
    """The object's true shape in its own frame (bounding-box centre at the origin)."""
    if o.shape == "box":
        return trimesh.creation.box(extents=o.size)
    if o.shape == "cylinder":
        r, h = o.size
        return trimesh.creation.cylinder(radius=r, height=h, sections=64)
    m = load_mesh(o.mesh).copy()
    m.apply_scale(float(o.size[0]) if o.size else 1.0)
    return m


def table_mesh() -> trimesh.Trimesh:
    """The table slab (top face at z = 0)."""
    ext = (TABLE_X[1] - TABLE_X[0], TABLE_Y[1] - TABLE_Y[0], TABLE_THICKNESS)
    m = trimesh.creation.box(extents=ext)
    m.apply_translation((sum(TABLE_X) / 2, sum(TABLE_Y) / 2, -TABLE_THICKNESS / 2))
    return m


def truth_meshes(
    config: LabConfig, poses: dict[str, ArrayLike] | None = None
) -> dict[str, trimesh.Trimesh]:
    """World-frame meshes of the table (if the scene has one) and every object.

    Objects are placed at `poses[name]` (xyz + quat xyzw, e.g. from
    `LabSim.truth_object_poses()`) or else at their config pose (where they rest).
    """
    out: dict[str, trimesh.Trimesh] = {}
    if config.scene in ("panda_table", "panda_calib", "objects_table"):
        out["table"] = table_mesh()
    for o in config.objects:
        m = object_mesh(o)
        pose = poses[o.name] if poses and o.name in poses else o.pose
        m.apply_transform(pose_to_matrix(pose))
        out[o.name] = m
    return out


@functools.lru_cache(maxsize=4)
def _kinematic_model(config_json: str) -> tuple[mujoco.MjModel, mujoco.MjData]:
    config = LabConfig.from_dict(json.loads(config_json))
    model = build_model(config.scene, config)
    return model, mujoco.MjData(model)


def truth_camera_pose(
    config: LabConfig, camera: str, joint_pos: ArrayLike | None = None
) -> NDArray[np.float64]:
    """TRUE T_world_camera (4x4, OpenCV axes) of `camera`.

    Fixed cameras: from the config. Wrist cameras: the mount body's pose at the TRUE
    `joint_pos` (default: the config's initial joints) times the true hand-eye transform.
    """
    c = config.camera(camera)
    if c.kind == "fixed":
        return pose_to_matrix(c.pose)
    model, data = _kinematic_model(json.dumps(config.to_dict(), sort_keys=True))
    scene = get_scene(config.scene)
    q = np.asarray(config.initial_joint_pos if joint_pos is None else joint_pos, float)
    for name, v in zip(scene.joint_names, q, strict=True):
        data.qpos[model.jnt_qposadr[model.joint(name).id]] = v
    mujoco.mj_kinematics(model, data)
    b = model.body(c.mount_body).id
    T = np.eye(4)
    T[:3, :3] = data.xmat[b].reshape(3, 3)
    T[:3, 3] = data.xpos[b]
    return T @ pose_to_matrix(c.pose)
