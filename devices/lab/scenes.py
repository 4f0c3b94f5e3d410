"""Registry of lab scenes (explicit dict, MuJoCo-Playground style).

Each `Scene` has `default_config()` -> LabConfig (the hidden truth) and `build(config)` ->
MjSpec; `build_model(name, config)` compiles it. Frames: the world is the robot base frame
(panda_link0 at the origin); the table top is the plane z = 0.

    from devices.lab.scenes import SCENES, build_model
    model = build_model("panda_table")          # default truth
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import mujoco
import numpy as np
from scipy.spatial.transform import Rotation

from devices.lab import panda
from devices.lab.board import add_board, default_board_pose
from devices.lab.config import (
    ActuatorConfig,
    BoardConfig,
    CameraConfig,
    JointsConfig,
    LabConfig,
    LabError,
    ObjectConfig,
    PendulumConfig,
)
from devices.lab.parts import (
    add_cameras,
    add_joint_actuators,
    add_objects,
    add_table,
    as_pose,
    base_spec,
    look_at,
    yaw_pose,
)
from devices.poses import matrix_to_pose
from devices.robots.wire.robot_types import JointLimits
from resources import path as resource_path


@dataclass(frozen=True)
class Scene:
    """One registered lab scene."""

    name: str
    description: str
    default_config: Callable[[], LabConfig]
    build: Callable[[LabConfig], mujoco.MjSpec]
    joint_names: tuple[str, ...]
    nominal_limits: Callable[[], JointLimits]
    robot_description: str = ""  # resource key of the robot model ("" = none)
    tool_body: str = ""  # forward_kinematics() reports this body's origin


# --- panda_table -------------------------------------------------------------------------


def _tabletop_objects() -> tuple[ObjectConfig, ...]:
    return (
        ObjectConfig(
            "box",
            "box",
            (0.08, 0.05, 0.05),
            yaw_pose(0.56, -0.2, 0.025, 20.0),
            mass=0.25,
            friction=0.45,
            restitution=0.1,
            com_offset=(0.006, -0.003, 0.0),
            rgba=(0.85, 0.25, 0.2, 1.0),
        ),
        ObjectConfig(
            "cylinder",
            "cylinder",
            (0.035, 0.09),
            yaw_pose(0.48, 0.2, 0.045, 0.0),
            mass=0.3,
            friction=0.6,
            restitution=0.2,
            com_offset=(0.0, 0.0, -0.01),
            rgba=(0.2, 0.4, 0.85, 1.0),
        ),
        ObjectConfig(
            "u_block",
            "mesh",
            (1.0,),
            yaw_pose(0.66, 0.02, 0.025, -30.0),
            mass=0.4,
            friction=0.35,
            restitution=0.05,
            com_offset=(0.01, 0.0, 0.0),
            rgba=(0.25, 0.7, 0.3, 1.0),
            mesh="u_block",
        ),
    )


def _fixed_camera() -> CameraConfig:
    return CameraConfig("fixed", "fixed", look_at((1.0, 0.2, 0.45), (0.56, 0.0, 0.03)))


def _wrist_camera() -> CameraConfig:
    # CAD guess: 60 mm in front of the hand, 35 mm up, tilted 10 deg towards the fingers.
    R = np.column_stack(
        [
            (0, 1, 0),
            (-math.cos(0.1745), 0, -math.sin(0.1745)),
            (-math.sin(0.1745), 0, math.cos(0.1745)),
        ]
    )
    T = np.eye(4)
    T[:3, :3] = R
    T[:3, 3] = (0.06, 0.0, 0.035)
    nominal = as_pose(matrix_to_pose(T))
    dT = np.eye(4)  # the real mount is off by a few mm and about a degree
    dT[:3, :3] = Rotation.from_euler("xyz", (0.6, -0.5, 0.4), degrees=True).as_matrix()
    dT[:3, 3] = (0.0015, -0.002, 0.001)
    true = as_pose(matrix_to_pose(T @ dT))
    return CameraConfig("wrist", "wrist", true, mount_body=panda.HAND_BODY, nominal_pose=nominal)


def panda_table_config() -> LabConfig:
    return LabConfig(
        scene="panda_table",
        timestep=0.002,
        control_rate_hz=250.0,
        latency_s=0.004,
        joint_pos_noise=2e-4,
        joint_vel_noise=2e-3,
        effort_noise=0.05,
        joints=JointsConfig(
            damping=(0.8, 0.8, 0.7, 0.7, 0.3, 0.25, 0.15),
            frictionloss=(0.6, 0.6, 0.5, 0.5, 0.25, 0.2, 0.15),
            armature=(0.12, 0.12, 0.1, 0.1, 0.05, 0.05, 0.04),
        ),
        actuators=ActuatorConfig(
            kp=(550, 550, 500, 500, 200, 120, 50),
            kv=(45, 45, 40, 40, 20, 15, 8),
            force_limit=(80, 80, 80, 80, 11, 11, 11),
            gravity_compensation=True,
        ),
        initial_joint_pos=panda.READY_POSE,
        objects=_tabletop_objects(),
        cameras=(_fixed_camera(), _wrist_camera()),
        seed=1,
    )


def build_panda_table(cfg: LabConfig) -> mujoco.MjSpec:
    spec = base_spec(cfg, panda.panda_spec())
    spec.compiler.discardvisual = False  # keep our visual-only geoms (the U-block mesh)
    for b in spec.bodies:
        if b.name in panda.ROBOT_BODIES:
            b.gravcomp = 1.0 if cfg.actuators and cfg.actuators.gravity_compensation else 0.0
    spec.body("panda_link1").sleep = mujoco.mjtSleepPolicy.mjSLEEP_NEVER  # arm tree root
    for g in spec.geoms:
        if g.parent.name in panda.ROBOT_BODIES:  # robot: no self-collision, hits the world
            g.contype, g.conaffinity = 2, 0
            g.rgba = (
                (0.92, 0.92, 0.92, 1.0) if "finger" not in g.parent.name else (0.2, 0.2, 0.2, 1.0)
            )
    add_table(spec, cfg)
    add_joint_actuators(spec, cfg, panda.JOINT_NAMES)
    add_objects(spec, cfg)
    if cfg.board is not None:
        add_board(spec, cfg.board)
    add_cameras(spec, cfg)
    return spec


def panda_calib_config() -> LabConfig:
    """panda_table's robot and cameras (same truth), a ChArUco board instead of objects.

    The board (7x5, 30 mm squares, 22 mm markers, DICT_5X5_100) lies where
    reconstruction's calibration expects it: corner at (0.33, 0.075), x along the base x.
    """
    base = panda_table_config()
    board = BoardConfig(
        pose=default_board_pose((0.435, 0.0), (7, 5), 0.03),
        squares=(7, 5),
        square_length=0.03,
        marker_length=0.022,
    )
    return dataclasses.replace(base, scene="panda_calib", objects=(), board=board, seed=4)


# --- objects_table -----------------------------------------------------------------------


def objects_table_config() -> LabConfig:
    return LabConfig(
        scene="objects_table",
        timestep=0.002,
        objects=_tabletop_objects(),
        cameras=(_fixed_camera(),),
        seed=2,
    )


def build_objects_table(cfg: LabConfig) -> mujoco.MjSpec:
    spec = base_spec(cfg)
    add_table(spec, cfg)
    add_objects(spec, cfg)
    add_cameras(spec, cfg)
    return spec


# --- pendulum ----------------------------------------------------------------------------

PENDULUM_JOINT = "pendulum_joint"


def pendulum_config() -> LabConfig:
    return LabConfig(
        scene="pendulum",
        timestep=0.001,
        control_rate_hz=500.0,
        latency_s=0.006,
        joint_pos_noise=1e-3,
        joint_vel_noise=1e-2,
        effort_noise=0.01,
        joints=JointsConfig(damping=(0.05,), frictionloss=(0.08,), armature=(0.0,)),
        actuators=ActuatorConfig(
            kp=(20.0,), kv=(1.0,), force_limit=(2.2,)
        ),  # datasheet (info) says 2.5
        initial_joint_pos=(0.0,),
        pendulum=PendulumConfig(),
        seed=3,
    )


def build_pendulum(cfg: LabConfig) -> mujoco.MjSpec:
    p = cfg.pendulum or PendulumConfig()
    spec = base_spec(cfg)
    spec.worldbody.add_geom(
        name="support",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=(0.03, 0.05, 0.03),
        pos=(0, -0.08, p.pivot_height),
        rgba=(0.3, 0.3, 0.3, 1),
        contype=0,
        conaffinity=0,
    )
    # Angle 0 hangs straight down; positive rotates the bob towards +x (about +y).
    body = spec.worldbody.add_body(name="pendulum", pos=(0, 0, p.pivot_height))
    body.sleep = mujoco.mjtSleepPolicy.mjSLEEP_NEVER  # torque commands must always act
    body.add_joint(name=PENDULUM_JOINT, type=mujoco.mjtJoint.mjJNT_HINGE, axis=(0, 1, 0))
    body.add_geom(
        name="rod",
        type=mujoco.mjtGeom.mjGEOM_CAPSULE,
        size=(0.006, 0, 0),
        fromto=(0, 0, 0, 0, 0, -p.length),
        rgba=(0.6, 0.6, 0.6, 1),
        contype=0,
        conaffinity=0,
    )
    body.add_geom(
        name="bob",
        type=mujoco.mjtGeom.mjGEOM_SPHERE,
        size=(p.bob_radius, 0, 0),
        pos=(0, 0, -p.length),
        rgba=(0.85, 0.3, 0.2, 1),
        contype=0,
        conaffinity=0,
    )
    body.explicitinertial = True
    body.mass = p.bob_mass
    body.ipos = (0, 0, -p.length)
    body.inertia = (0.4 * p.bob_mass * p.bob_radius**2,) * 3
    add_joint_actuators(spec, cfg, (PENDULUM_JOINT,))
    add_cameras(spec, cfg)
    return spec


def _pendulum_limits() -> JointLimits:
    return JointLimits(np.array([-1e3]), np.array([1e3]), np.array([30.0]), np.array([2.5]))


SCENES: dict[str, Scene] = {
    "panda_table": Scene(
        "panda_table",
        "Franka Panda (closed gripper as pusher) over a table "
        "with a box, a cylinder and a U-shaped block; fixed + wrist camera",
        panda_table_config,
        build_panda_table,
        panda.JOINT_NAMES,
        panda.nominal_limits,
        panda.URDF_KEY,
        panda.TOOL_BODY,
    ),
    "panda_calib": Scene(
        "panda_calib",
        "panda_table's robot and cameras with a ChArUco "
        "board on the table (hand-eye / camera calibration)",
        panda_calib_config,
        build_panda_table,
        panda.JOINT_NAMES,
        panda.nominal_limits,
        panda.URDF_KEY,
        panda.TOOL_BODY,
    ),
    "pendulum": Scene(
        "pendulum",
        "torque-driven single pendulum (like the real simple pendulum data set)",
        pendulum_config,
        build_pendulum,
        (PENDULUM_JOINT,),
        _pendulum_limits,
    ),
    "objects_table": Scene(
        "objects_table",
        "the tabletop objects alone (toss / slide)",
        objects_table_config,
        build_objects_table,
        (),
        lambda: JointLimits(*(np.zeros(0) for _ in range(4))),
    ),
}


def get_scene(name: str) -> Scene:
    try:
        return SCENES[name]
    except KeyError:
        raise LabError(f"unknown lab scene {name!r}; known: {sorted(SCENES)}") from None


def build_model(name: str, cfg: LabConfig | None = None) -> mujoco.MjModel:
    """Compile scene `name` with config `cfg` (default: the scene's default_config())."""
    scene = get_scene(name)
    cfg = cfg or scene.default_config()
    if cfg.scene != name:
        raise LabError(f"lab config is for scene {cfg.scene!r}, not {name!r}")
    cfg.validate()
    try:
        return scene.build(cfg).compile()
    except ValueError as exc:
        raise LabError(f"lab scene {name!r}: MuJoCo could not compile it: {exc}") from exc


def default_config_path(name: str):  # noqa: ANN201 - Path
    """resources/lab/<scene>.json: the scene's default truth as a file (for `lab serve`)."""

    return resource_path("lab", f"{get_scene(name).name}.json")


def write_default_configs() -> None:
    """Rewrite resources/lab/<scene>.json from every scene's default_config()."""
    for name, scene in SCENES.items():
        scene.default_config().save(default_config_path(name))


if __name__ == "__main__":
    write_default_configs()
