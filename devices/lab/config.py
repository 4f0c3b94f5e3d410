"""Lab configs: the hidden truth of a virtual-lab scene, as frozen dataclasses and JSON.

A `LabConfig` holds everything the lab uses to be "reality": object mass, friction,
restitution and centre-of-mass offset; joint damping, friction (MuJoCo `frictionloss`) and
armature; actuator PD gains and force limits; command latency; joint sensor noise; camera
intrinsics, true poses and depth-noise settings. Only the lab and benchmarks read it (from
the file the lab was started with); nothing in it travels through `LabDriver.info()` or
states.

Units are SI; poses are xyz (m) + quaternion xyzw, as in devices/poses.py.

Restitution -> MuJoCo: contacts are soft springs, solref = (timeconst, dampratio). The
textbook map for a linear spring, e = exp(-zeta*pi/sqrt(1 - zeta^2)), does not hold for
MuJoCo's contact model (zeta = 1 still bounces ~0.1), so `restitution_to_dampratio` uses
a table measured by drop tests (box and cylinder landing flat at 1.4-2 m/s, timestep 2 ms;
tests/devices/lab/test_sim.py re-checks it). The contact's time constant is
max(contact_timeconst, 2 * timestep / zeta), which keeps the spring stiffness
~1/(timeconst*zeta)^2 stable for bouncy objects. Achieved restitution depends a little on
impact speed (about +-0.05); the configurable range is [0, 0.85]. Objects carry contact
priority 1, so their friction, solref and solimp govern their contacts with the table and
the robot.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from devices.errors import DeviceError
from resources.atomic import write_text

Pose = tuple[float, float, float, float, float, float, float]


class LabError(DeviceError):
    """The virtual lab could not be built, configured or driven (message names the part)."""


@dataclass(frozen=True)
class ObjectConfig:
    """One free tabletop object; its frame origin is its bounding-box centre.

    shape "box": size = full extents (x, y, z); "cylinder": size = (radius, height);
    "mesh": size = (scale,) and `mesh` names resources/lab/meshes/<mesh>.obj (visual, may be
    non-convex) with convex collision parts <mesh>_part<i>.obj.
    """

    name: str
    shape: str
    size: tuple[float, ...]
    pose: Pose
    mass: float
    friction: float = 0.5
    restitution: float = 0.0
    com_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rgba: tuple[float, float, float, float] = (0.8, 0.3, 0.2, 1.0)
    mesh: str = ""


@dataclass(frozen=True)
class JointsConfig:
    """Per-joint passive dynamics (arrays as tuples of length n_joints)."""

    damping: tuple[float, ...]  # N*m*s/rad (viscous)
    frictionloss: tuple[float, ...]  # N*m (Coulomb, MuJoCo frictionloss)
    armature: tuple[float, ...]  # kg*m^2 (reflected rotor inertia)


@dataclass(frozen=True)
class ActuatorConfig:
    """The joint controller's true behaviour: tau = kp*(q_ref-q) + kv*(qd_ref-qd), clamped."""

    kp: tuple[float, ...]  # N*m/rad
    kv: tuple[float, ...]  # N*m*s/rad (also the velocity-mode gain)
    force_limit: tuple[float, ...]  # N*m, symmetric
    gravity_compensation: bool = False  # the controller cancels gravity (as a Franka does)


@dataclass(frozen=True)
class CameraConfig:
    """A RealSense-D435-like camera. `pose` is T_parent_camera in the OpenCV convention
    (x right, y down, z forward); parent is the world for "fixed", the mount body for "wrist".
    """

    name: str
    kind: str  # "fixed" | "wrist"
    pose: Pose
    mount_body: str = ""  # wrist cameras: the body they are screwed to
    nominal_pose: Pose | None = None  # wrist cameras: the CAD hand-eye guess (not truth)
    focal_px_720: float = 920.0  # focal length at 1280x720; scales with image height
    subpixel: float = 0.08  # stereo matching error, px
    baseline_m: float = 0.050  # stereo baseline (also the shadow viewpoint offset)
    min_depth_m: float = 0.11
    max_depth_m: float = 4.0
    edge_jump_m: float = 0.02  # depth discontinuity that invalidates a pixel
    edge_dropout: float = 0.6  # probability an edge pixel reads zero


@dataclass(frozen=True)
class BoardConfig:
    """A printed ChArUco board lying on the table (OpenCV's CharucoBoard layout).

    `pose` is T_world_board: origin at the outer corner of the first square (the
    top-left of the printed pattern, inside the white margin), x along the `squares[0]`
    columns, y along the rows, z = x cross y, i.e. into the table: OpenCV's board frame.
    The layout is not secret (a user knows their board); the pose is truth.
    """

    pose: Pose
    squares: tuple[int, int] = (7, 5)
    square_length: float = 0.04  # m
    marker_length: float = 0.03  # m
    dictionary: str = "DICT_5X5_100"
    margin: float = 0.02  # white border around the pattern, m


@dataclass(frozen=True)
class PendulumConfig:
    """Single torque-driven pendulum: point-like bob (sphere) on a massless rod."""

    length: float = 0.5  # pivot to bob centre, m
    bob_mass: float = 0.55  # kg
    bob_radius: float = 0.035  # m
    pivot_height: float = 1.0  # m above the floor


@dataclass(frozen=True)
class LabConfig:
    """The full truth of one lab scene. Round-trips through JSON (`save`/`load`)."""

    scene: str
    timestep: float = 0.002
    control_rate_hz: float = 250.0
    latency_s: float = 0.0
    joint_pos_noise: float = 0.0  # rad, gaussian std
    joint_vel_noise: float = 0.0  # rad/s
    effort_noise: float = 0.0  # N*m
    joints: JointsConfig | None = None
    actuators: ActuatorConfig | None = None
    initial_joint_pos: tuple[float, ...] = ()
    objects: tuple[ObjectConfig, ...] = ()
    cameras: tuple[CameraConfig, ...] = ()
    pendulum: PendulumConfig | None = None
    board: BoardConfig | None = None
    contact_timeconst: float = 0.01  # s, see module docstring
    table_friction: float = 0.3
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "lab config") -> LabConfig:
        try:
            kw = dict(d)
            if kw.get("joints") is not None:
                kw["joints"] = JointsConfig(**_tuples(kw["joints"]))
            if kw.get("actuators") is not None:
                kw["actuators"] = ActuatorConfig(**_tuples(kw["actuators"]))
            if kw.get("board") is not None:
                kw["board"] = BoardConfig(**_tuples(kw["board"]))
            if kw.get("pendulum") is not None:
                kw["pendulum"] = PendulumConfig(**kw["pendulum"])
            kw["objects"] = tuple(ObjectConfig(**_tuples(o)) for o in kw.get("objects", ()))
            kw["cameras"] = tuple(CameraConfig(**_tuples(c)) for c in kw.get("cameras", ()))
            kw["initial_joint_pos"] = tuple(kw.get("initial_joint_pos", ()))
            cfg = cls(**kw)
        except (TypeError, KeyError, ValueError) as exc:
            raise LabError(f"{source}: not a valid lab config ({exc})") from exc
        cfg.validate(source)
        return cfg

    def validate(self, source: str = "lab config") -> None:
        """Raise LabError naming the parameter if a value is physically meaningless."""
        if not (0 < self.timestep <= 0.01):
            raise LabError(f"{source}: timestep {self.timestep} s must be in (0, 0.01]")
        if self.latency_s < 0:
            raise LabError(f"{source}: latency_s {self.latency_s} must be >= 0")
        if self.contact_timeconst < 2 * self.timestep:
            raise LabError(
                f"{source}: contact_timeconst {self.contact_timeconst} s must be "
                f">= 2 * timestep ({2 * self.timestep} s) for stable contacts"
            )
        for o in self.objects:
            if o.mass <= 0 or o.friction < 0 or not (0 <= o.restitution <= 0.85):
                raise LabError(
                    f"{source}: object {o.name!r}: need mass > 0, friction >= 0, "
                    f"0 <= restitution <= 0.85 (got {o.mass}, {o.friction}, "
                    f"{o.restitution})"
                )
            if o.shape not in ("box", "cylinder", "mesh"):
                raise LabError(f"{source}: object {o.name!r}: unknown shape {o.shape!r}")
        for c in self.cameras:
            if c.kind not in ("fixed", "wrist"):
                raise LabError(f"{source}: camera {c.name!r}: kind must be fixed or wrist")

    def save(self, path: Path) -> None:
        write_text(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> LabConfig:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LabError(f"{path}: cannot read lab config ({exc})") from exc
        return cls.from_dict(d, source=str(path))

    def camera(self, name: str) -> CameraConfig:
        for c in self.cameras:
            if c.name == name:
                return c
        raise LabError(
            f"lab scene {self.scene!r} has no camera {name!r} "
            f"(has {[c.name for c in self.cameras]})"
        )


# Drop-test calibration (see module docstring): dampratio -> measured restitution.
_ZETA = (0.04, 0.06, 0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0)
_E = (
    0.88,
    0.823,
    0.769,
    0.717,
    0.657,
    0.6,
    0.53,
    0.46,
    0.394,
    0.298,
    0.24,
    0.163,
    0.102,
    0.055,
    0.034,
    0.017,
    0.0065,
)


def restitution_to_dampratio(e: float) -> float:
    """MuJoCo contact damping ratio that makes an object bounce back with coefficient e."""
    e = min(max(e, _E[-1]), _E[0])
    # interpolate log(zeta) against e (the table is monotonic: e falls as zeta grows)
    return math.exp(float(np.interp(e, _E[::-1], np.log(_ZETA[::-1]))))


def contact_solref(e: float, timeconst: float, timestep: float) -> tuple[float, float]:
    """MuJoCo solref (timeconst, dampratio) for restitution e (see module docstring)."""
    zeta = restitution_to_dampratio(e)
    return max(timeconst, 2.0 * timestep / zeta), zeta


def _tuples(d: dict[str, Any]) -> dict[str, Any]:
    """JSON lists back to tuples (frozen dataclasses compare and hash by value)."""
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}
