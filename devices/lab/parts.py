"""Building blocks of lab scenes on an MjSpec: world settings, table, free objects with
their true physics, cameras, joint motors. scenes.py assembles them per scene.

Frames: the world is the robot base frame; the table top is the plane z = 0.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np
import trimesh
from scipy.spatial.transform import Rotation

from devices.lab.config import LabConfig, LabError, Pose, contact_solref
from devices.lab.meshes import mesh_files
from devices.poses import matrix_to_pose, pose_to_matrix, quat_xyzw_to_wxyz

TABLE_X = (-0.25, 0.95)  # table top extent in the base frame, m
TABLE_Y = (-0.6, 0.6)
TABLE_THICKNESS = 0.04
FLOOR_Z = -0.75
# OpenCV camera (z forward, y down) -> MuJoCo camera (looks along -z, y up).
R_CV_MJ = np.diag([1.0, -1.0, -1.0])
FOVY_DEG = math.degrees(2 * math.atan(360.0 / 920.0))  # D435 colour, 1280x720, fy = 920


def look_at(eye: tuple[float, float, float], target: tuple[float, float, float]) -> Pose:
    """OpenCV camera pose (z towards target, y down-ish) at `eye`, as xyz + quat xyzw."""
    e, t = np.asarray(eye, float), np.asarray(target, float)
    z = (t - e) / np.linalg.norm(t - e)
    x = np.cross(z, (0.0, 0.0, 1.0))
    x /= np.linalg.norm(x)
    T = np.eye(4)
    T[:3, :3] = np.column_stack([x, np.cross(z, x), z])
    T[:3, 3] = e
    return as_pose(matrix_to_pose(T))


def as_pose(a: np.ndarray) -> Pose:
    return tuple(float(v) for v in a)  # type: ignore[return-value]


def yaw_pose(x: float, y: float, z: float, yaw_deg: float) -> Pose:
    q = Rotation.from_euler("z", yaw_deg, degrees=True).as_quat()
    return (x, y, z, *(float(v) for v in q))  # type: ignore[return-value]


def _mj_pos_quat(pose: Pose) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(pose[:3]), quat_xyzw_to_wxyz(pose[3:7])


# --- scene pieces ------------------------------------------------------------------------


def base_spec(cfg: LabConfig, spec: mujoco.MjSpec | None = None) -> mujoco.MjSpec:
    spec = spec or mujoco.MjSpec()
    spec.option.timestep = cfg.timestep
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    # Objects at rest sleep (3x faster with three resting objects); contact wakes them.
    spec.option.enableflags |= mujoco.mjtEnableBit.mjENBL_SLEEP
    spec.visual.global_.offwidth = 1280
    spec.visual.global_.offheight = 720
    # No MSAA: resolved depth would come from sample 0, ~0.4 px off the pixel centre.
    spec.visual.quality.offsamples = 0
    spec.visual.map.znear = 0.01
    spec.visual.map.zfar = 50.0
    spec.visual.headlight.ambient = (0.35, 0.35, 0.35)
    spec.visual.headlight.diffuse = (0.4, 0.4, 0.4)
    spec.stat.extent = 1.5
    spec.stat.center = (0.4, 0.0, 0.0)
    wb = spec.worldbody
    wb.add_light(
        name="key",
        pos=(0.4, -0.5, 2.0),
        dir=(0.0, 0.25, -1.0),
        diffuse=(0.6, 0.6, 0.6),
        castshadow=False,
    )
    wb.add_geom(
        name="floor",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=(3, 3, 0.1),
        pos=(0, 0, FLOOR_Z),
        rgba=(0.45, 0.47, 0.5, 1),
    )
    return spec


def wood_texture(size: int = 512, seed: int = 11) -> np.ndarray:
    """A procedural light-wood texture (RGB uint8): grain along x plus blotches, so colour
    based tracking (RGB-D odometry, feature matching) has something to hold on to."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, size)[:, None]
    x = np.linspace(0, 1, size)[None, :]
    low = np.zeros((size, size))
    for k in (3, 7, 15):  # smooth value noise at a few scales, tileable by construction
        a, b = rng.uniform(0, 2 * np.pi, 2)
        low += np.sin(2 * np.pi * k * x + a) * np.cos(2 * np.pi * k * y + b) / k
    grain = np.sin(2 * np.pi * (40 * y + 2.5 * low + 0.3 * np.sin(2 * np.pi * 2 * x)))
    speck = rng.normal(0, 1, (size, size))
    shade = 0.82 + 0.07 * grain + 0.12 * low + 0.03 * speck
    base = np.array([0.78, 0.63, 0.45])
    return np.clip(shade[..., None] * base * 255, 0, 255).astype(np.uint8)


def add_table(spec: mujoco.MjSpec, cfg: LabConfig) -> None:
    img = wood_texture()
    tex = spec.add_texture(
        name="wood",
        type=mujoco.mjtTexture.mjTEXTURE_2D,
        width=img.shape[1],
        height=img.shape[0],
        nchannel=3,
    )
    tex.data = img.tobytes()
    mat = spec.add_material(name="wood", texuniform=True, texrepeat=(2.0, 2.0))
    mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = "wood"
    mat.specular, mat.shininess = 0.1, 0.1
    sx, sy = (TABLE_X[1] - TABLE_X[0]) / 2, (TABLE_Y[1] - TABLE_Y[0]) / 2
    spec.worldbody.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=(sx, sy, TABLE_THICKNESS / 2),
        pos=(TABLE_X[0] + sx, TABLE_Y[0] + sy, -TABLE_THICKNESS / 2),
        material="wood",
        friction=(cfg.table_friction, 0.005, 0.0001),
        contype=1,
        conaffinity=3,
    )  # objects and the robot (contype 2) land on it


def _box_inertia(mass: float, ext: np.ndarray) -> np.ndarray:
    a, b, c = ext**2
    return mass / 12.0 * np.array([b + c, a + c, a + b])


def add_objects(spec: mujoco.MjSpec, cfg: LabConfig) -> None:
    for o in cfg.objects:
        pos, quat = _mj_pos_quat(o.pose)
        body = spec.worldbody.add_body(name=o.name, pos=pos, quat=quat)
        body.add_freejoint(name=f"{o.name}_free")
        solref = contact_solref(o.restitution, cfg.contact_timeconst, cfg.timestep)
        common = dict(
            friction=(o.friction, 0.005, 0.0001),
            solref=solref,
            priority=1,
            condim=4,
            contype=1,
            conaffinity=3,
        )
        if o.shape == "box":
            ext = np.asarray(o.size, float)
            body.add_geom(
                name=o.name, type=mujoco.mjtGeom.mjGEOM_BOX, size=ext / 2, rgba=o.rgba, **common
            )
            inertia = _box_inertia(o.mass, ext)
        elif o.shape == "cylinder":
            r, h = o.size
            body.add_geom(
                name=o.name,
                type=mujoco.mjtGeom.mjGEOM_CYLINDER,
                size=(r, h / 2, 0),
                rgba=o.rgba,
                **common,
            )
            inertia = o.mass * np.array([(3 * r * r + h * h) / 12] * 2 + [r * r / 2])
        else:
            scale = float(o.size[0]) if o.size else 1.0
            full, parts = mesh_files(o.mesh)
            spec.add_mesh(name=f"{o.name}_visual", file=str(full), scale=(scale,) * 3)
            body.add_geom(
                name=o.name,
                type=mujoco.mjtGeom.mjGEOM_MESH,
                meshname=f"{o.name}_visual",
                rgba=o.rgba,
                contype=0,
                conaffinity=0,
                group=1,
            )
            for i, p in enumerate(parts):
                spec.add_mesh(name=f"{o.name}_part{i}", file=str(p), scale=(scale,) * 3)
                body.add_geom(
                    name=f"{o.name}_col{i}",
                    type=mujoco.mjtGeom.mjGEOM_MESH,
                    meshname=f"{o.name}_part{i}",
                    group=3,
                    rgba=(0, 0, 0, 0),
                    **common,
                )
            m = trimesh.load(full, force="mesh")
            assert isinstance(m, trimesh.Trimesh)
            m.apply_scale(scale)
            # Uniform density about the bounding-box centre; the COM offset shifts the mass.
            inertia = np.diag(m.moment_inertia) * (o.mass / m.volume)
        body.explicitinertial = True
        body.mass = o.mass
        body.ipos = np.asarray(o.com_offset, float)
        body.inertia = inertia


def add_cameras(spec: mujoco.MjSpec, cfg: LabConfig) -> None:
    for c in cfg.cameras:
        parent = spec.worldbody if c.kind == "fixed" else spec.body(c.mount_body)
        if parent is None:
            raise LabError(f"lab camera {c.name!r}: mount body {c.mount_body!r} not in scene")
        T = pose_to_matrix(c.pose)
        T[:3, :3] = T[:3, :3] @ R_CV_MJ
        p = matrix_to_pose(T)
        parent.add_camera(name=c.name, pos=p[:3], quat=quat_xyzw_to_wxyz(p[3:]), fovy=FOVY_DEG)


def add_joint_actuators(spec: mujoco.MjSpec, cfg: LabConfig, joints: tuple[str, ...]) -> None:
    jc, ac = cfg.joints, cfg.actuators
    if jc is None or ac is None:
        raise LabError(f"lab scene {cfg.scene!r}: config needs 'joints' and 'actuators'")
    for arr in (jc.damping, jc.frictionloss, jc.armature, ac.kp, ac.kv, ac.force_limit):
        if len(arr) != len(joints):
            raise LabError(
                f"lab scene {cfg.scene!r}: per-joint arrays need {len(joints)} "
                f"values, got {len(arr)}"
            )
    for i, name in enumerate(joints):
        j = spec.joint(name)
        j.damping = (jc.damping[i], 0.0, 0.0)  # MuJoCo 4: polynomial, linear term first
        j.frictionloss = jc.frictionloss[i]
        j.armature = jc.armature[i]
        a = spec.add_actuator(name=f"{name}_motor", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        a.set_to_motor()
        a.ctrllimited = True
        a.ctrlrange = (-ac.force_limit[i], ac.force_limit[i])
