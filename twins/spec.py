"""`TwinSpec`: robot, environment, objects, actuators, sim settings and their `ParamSet`.

The spec holds structure (which bodies, joints, shapes, files) as plain data and every
tunable number as a `Param` in `spec.params`, named by convention:

```
sim.time_step  sim.substeps  sim.solver_iterations  sim.gravity
robot.links.<link>.mass            robot.material.friction  robot.material.restitution
robot.joints.<joint>.damping|friction|armature
robot.actuators.<joint>.bandwidth|velocity_gain|effort_limit|latency (model "servo")
robot.actuators.<joint>.kp|kd|effort_limit|latency            (model "pd")
robot.actuators.<joint>.gain|bias|effort_limit|latency        (model "torque")
robot.actuators.<joint>.resistance|k_emf|gear_ratio|voltage_limit|latency  (model "dc_motor")
objects.<name>.mass|density  objects.<name>.friction|rolling_friction|spinning_friction|
    restitution|contact_stiffness|contact_damping             (same for env.table, env.ground)
contacts.<object>.<ground|table>.friction|restitution   one contact pair's μ and e, in place
    of the two bodies' own values (PyBullet multiplies those; twins/contacts.py)
```

File references (meshes, hulls, URDFs) are relative to the twin folder (`base_dir`),
or `pybullet_data:<path>` / `resources:<path>` for bundled descriptions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from resources import atomic
from resources import path as resource_path
from twins import contacts
from twins.contacts import governed
from twins.errors import TwinError
from twins.params import Param, ParamSet

FORMAT = "twinbench-twin"
FORMAT_VERSION = 1
ACTUATOR_MODELS = ("servo", "pd", "torque", "dc_motor")
SHAPE_KINDS = ("box", "cylinder", "sphere", "mesh")
IDENTITY_POSE = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
ACTUATOR_PARAMS = {
    "servo": ("bandwidth", "velocity_gain", "effort_limit", "latency"),
    "pd": ("kp", "kd", "effort_limit", "latency"),
    "torque": ("gain", "bias", "effort_limit", "latency"),
    "dc_motor": ("resistance", "k_emf", "gear_ratio", "voltage_limit", "latency"),
}
COMMAND_UNITS = {
    "servo": ("rad", "m"),
    "pd": ("rad", "m"),
    "torque": ("N*m", "N"),
    "dc_motor": ("V",),
}
MATERIAL_PARAMS = ("friction", "rolling_friction", "spinning_friction", "restitution")
COMPLIANT_PARAMS = ("contact_stiffness", "contact_damping")
CONTACT_MODELS = ("rigid", "compliant")


def _pose(p: Sequence[float], what: str) -> tuple[float, ...]:
    a = np.asarray(p, dtype=float).reshape(-1)
    if a.shape != (7,) or not np.all(np.isfinite(a)):
        raise TwinError(f"{what}: pose must be 7 finite numbers (xyz + quat xyzw), got {list(p)}")
    n = np.linalg.norm(a[3:])
    if n < 1e-9:
        raise TwinError(f"{what}: pose quaternion is zero")
    a[3:] /= n
    return tuple(float(x) for x in a)


@dataclass(frozen=True)
class JointSpec:
    """A movable robot joint, by its URDF name. Limits in rad (or m); None = unlimited."""

    name: str
    kind: str = "revolute"  # revolute | prismatic | continuous
    lower: float | None = None
    upper: float | None = None


@dataclass(frozen=True)
class ActuatorSpec:
    """Which model drives a joint (see twins/actuators.py): "servo" (PyBullet's implicit
    position servo) or "pd" (explicit PD), both commanded in rad/m; "torque" (N*m/N);
    "dc_motor" (V)."""

    joint: str
    model: str = "servo"

    def __post_init__(self) -> None:
        if self.model not in ACTUATOR_MODELS:
            raise TwinError(
                f"actuator on joint '{self.joint}': model '{self.model}' is not one "
                f"of {ACTUATOR_MODELS}"
            )


@dataclass(frozen=True)
class RobotSpec:
    """A robot from any URDF. `urdf` is `pybullet_data:<path>`, `resources:<path>`, a path
    relative to the twin folder, or an absolute path."""

    urdf: str
    name: str = "robot"
    base_pose: tuple[float, ...] = IDENTITY_POSE
    fixed_base: bool = True
    joints: tuple[JointSpec, ...] = ()
    actuators: tuple[ActuatorSpec, ...] = ()
    links: tuple[str, ...] = ()  # links with a mass parameter
    initial_joint_pos: tuple[float, ...] = ()
    notes: tuple[str, ...] = ()  # what the loader had to fall back on, said once

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_pose", _pose(self.base_pose, "robot base"))
        names = [j.name for j in self.joints]
        for a in self.actuators:
            if a.joint not in names:
                raise TwinError(
                    f"actuator names joint '{a.joint}', which the robot lacks "
                    f"(joints: {', '.join(names)})"
                )
        if self.initial_joint_pos and len(self.initial_joint_pos) != len(self.joints):
            raise TwinError(
                f"robot: initial_joint_pos has {len(self.initial_joint_pos)} values "
                f"for {len(self.joints)} joints"
            )

    def actuator(self, joint: str) -> ActuatorSpec | None:
        return next((a for a in self.actuators if a.joint == joint), None)


@dataclass(frozen=True)
class Shape:
    """Collision geometry. box: size = half extents (3); cylinder: (radius, length along z);
    sphere: (radius,); mesh: `hulls` = convex pieces (OBJ files). `mesh` is the visual mesh
    file (optional for primitives); `collision_pose` places a primitive in the body frame."""

    kind: str
    size: tuple[float, ...] = ()
    mesh: str | None = None
    hulls: tuple[str, ...] = ()
    collision_pose: tuple[float, ...] = IDENTITY_POSE

    def __post_init__(self) -> None:
        if self.kind not in SHAPE_KINDS:
            raise TwinError(f"shape kind '{self.kind}' is not one of {SHAPE_KINDS}")
        need = {"box": 3, "cylinder": 2, "sphere": 1, "mesh": 0}[self.kind]
        size = tuple(float(s) for s in self.size)
        if len(size) != need or any(not np.isfinite(s) or s <= 0 for s in size):
            raise TwinError(f"{self.kind} shape needs {need} positive sizes, got {list(self.size)}")
        if self.kind == "mesh" and (not self.mesh or not self.hulls):
            raise TwinError("mesh shape needs a visual mesh file and at least one collision hull")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "collision_pose", _pose(self.collision_pose, "collision shape"))


@dataclass(frozen=True)
class ObjectSpec:
    """A rigid body. Inertia is `mass * inertia_per_kg` (3x3 about `com`, body frame), so a
    mass or density change keeps the shape's mass distribution. `mass_from` is "mass" (the
    mass is a parameter) or "density" (mass = density * volume)."""

    name: str
    shape: Shape
    pose: tuple[float, ...] = IDENTITY_POSE
    static: bool = False
    mass_from: str = "mass"
    volume: float = 0.0  # m^3
    com: tuple[float, ...] = (0.0, 0.0, 0.0)  # m, body frame
    inertia_per_kg: tuple[float, ...] = (1e-4, 0, 0, 0, 1e-4, 0, 0, 0, 1e-4)  # m^2, row-major
    rgba: tuple[float, ...] = (0.8, 0.5, 0.2, 1.0)
    source: str = ""  # e.g. scan object id

    def __post_init__(self) -> None:
        object.__setattr__(self, "pose", _pose(self.pose, f"object '{self.name}'"))
        if self.mass_from not in ("mass", "density"):
            raise TwinError(f"object '{self.name}': mass_from must be 'mass' or 'density'")
        if self.mass_from == "density" and not self.volume > 0:
            raise TwinError(
                f"object '{self.name}': density needs a positive volume (got {self.volume})"
            )
        Ib = np.asarray(self.inertia_per_kg, dtype=float).reshape(3, 3)
        if not np.all(np.isfinite(Ib)) or np.any(np.linalg.eigvalsh((Ib + Ib.T) / 2) <= 0):
            raise TwinError(f"object '{self.name}': inertia is not positive definite")
        object.__setattr__(self, "inertia_per_kg", tuple(float(x) for x in Ib.reshape(-1)))
        object.__setattr__(self, "com", tuple(float(x) for x in self.com))

    @property
    def prefix(self) -> str:
        return f"objects.{self.name}"


@dataclass(frozen=True)
class EnvironmentSpec:
    """Static surroundings: an infinite ground plane at `ground_z` and an optional table."""

    ground: bool = True
    table: ObjectSpec | None = None
    ground_z: float = 0.0  # m, height of the ground plane


@dataclass(frozen=True)
class TwinSpec:
    """The whole twin. `params` holds every number; `meta` lineage (scan id, parent twin)."""

    name: str
    params: ParamSet
    robot: RobotSpec | None = None
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    objects: tuple[ObjectSpec, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None  # folder the relative file references are relative to
    contact_model: str = "rigid"  # "compliant": per-body contact stiffness and damping
    object_sleeping: bool = True  # objects at rest at the start sleep until touched

    def __post_init__(self) -> None:
        if self.contact_model not in CONTACT_MODELS:
            raise TwinError(f"twin '{self.name}': contact_model must be one of {CONTACT_MODELS}")
        names = [o.name for o in self.objects]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise TwinError(f"twin '{self.name}': object names must be unique ({sorted(dup)})")
        contacts.check(
            self.params,
            names,
            self.environment.ground,
            self.environment.table is not None,
            self.name,
        )
        missing = [n for n in self.required_params() if n not in self.params]
        if missing:
            raise TwinError(
                f"twin '{self.name}': missing parameters {missing[:6]}"
                f"{' ...' if len(missing) > 6 else ''}"
            )

    def required_params(self) -> list[str]:
        """Names the builder will read; each must be in `params`."""
        req = ["sim.time_step", "sim.substeps", "sim.solver_iterations", "sim.gravity"]
        if self.robot is not None:
            req += [f"robot.links.{ln}.mass" for ln in self.robot.links]
            req += [f"robot.material.{k}" for k in ("friction", "restitution")]
            for j in self.robot.joints:
                a = self.robot.actuator(j.name)
                keys = (
                    ("damping", "armature")
                    if a is not None and a.model == "servo"
                    else ("damping", "friction", "armature")
                )
                req += [f"robot.joints.{j.name}.{k}" for k in keys]
            for a in self.robot.actuators:
                req += [f"robot.actuators.{a.joint}.{k}" for k in ACTUATOR_PARAMS[a.model]]
        mat = MATERIAL_PARAMS + (COMPLIANT_PARAMS if self.contact_model == "compliant" else ())
        by_pair = governed(self.params)  # coefficients a contact pair sets (twins/contacts.py)
        bodies = list(self.objects) + ([self.environment.table] if self.environment.table else [])
        for o in bodies:
            pre = "env.table" if o is self.environment.table else o.prefix
            if not o.static:
                req.append(f"{pre}.{o.mass_from}")
            req += [f"{pre}.{k}" for k in mat if k not in by_pair.get(pre, {})]
        if self.environment.ground:
            req += [f"env.ground.{k}" for k in mat if k not in by_pair.get("env.ground", {})]
        return req

    def object(self, name: str) -> ObjectSpec:
        for o in self.objects:
            if o.name == name:
                return o
        raise TwinError(
            f"twin '{self.name}' has no object '{name}' "
            f"(objects: {', '.join(o.name for o in self.objects) or 'none'})"
        )

    def resolve(self, ref: str) -> Path:
        """Absolute path of a file reference (see module docstring)."""
        if ref.startswith("pybullet_data:"):
            import pybullet_data

            return Path(pybullet_data.getDataPath()) / ref.split(":", 1)[1]
        if ref.startswith("resources:"):
            return resource_path(*ref.split(":", 1)[1].split("/"))
        p = Path(ref)
        if not p.is_absolute():
            if self.base_dir is None:
                raise TwinError(f"twin '{self.name}': relative file '{ref}' but no twin folder")
            p = self.base_dir / p
        return p

    def with_values(self, values: Mapping[str, float]) -> TwinSpec:
        """Copy whose nominals are `values` (checked against the bounds)."""
        return replace(self, params=self.params.with_nominals(values))

    def with_object_pose(self, name: str, pose: Sequence[float]) -> TwinSpec:
        """Copy with one object moved (pose xyz + quat xyzw)."""
        self.object(name)
        objs = tuple(replace(o, pose=tuple(pose)) if o.name == name else o for o in self.objects)
        return replace(self, objects=objs)

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return spec_to_json(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], base_dir: Path | None = None) -> TwinSpec:
        return spec_from_json(d, base_dir)

    def save(self, folder: Path) -> Path:
        """Write `twin.json` into `folder` (atomically); returns its path."""
        path = Path(folder) / "twin.json"
        atomic.write_json(path, self.to_json())
        return path

    @classmethod
    def load(cls, folder: Path) -> TwinSpec:
        """Read `folder/twin.json`; TwinError names the file and what is wrong."""
        path = Path(folder) / "twin.json"
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TwinError(f"{path}: no twin here") from None
        except (OSError, ValueError) as exc:
            raise TwinError(f"{path}: unreadable twin file ({exc})") from exc
        try:
            return cls.from_json(d, base_dir=Path(folder))
        except TwinError as exc:
            raise TwinError(f"{path}: {exc}") from exc


def param(
    name: str,
    unit: str,
    nominal: float,
    low: float,
    high: float,
    prior: str = "uniform",
    integer: bool = False,
    doc: str = "",
) -> Param:
    """A `Param` from positional values (the spec factories list dozens of them)."""
    return Param(name, unit, nominal, low, high, prior, integer, doc)


# -- TwinSpec <-> JSON (versioned) ---------------------------------------------------------
def _obj_to_json(o: ObjectSpec) -> dict[str, Any]:
    d = asdict(o)
    d["shape"] = asdict(o.shape)
    return d


def _obj_from_json(d: Mapping[str, Any]) -> ObjectSpec:
    s = d["shape"]
    shape = Shape(
        s["kind"],
        tuple(s.get("size", ())),
        s.get("mesh"),
        tuple(s.get("hulls", ())),
        tuple(s.get("collision_pose", (0, 0, 0, 0, 0, 0, 1))),
    )
    return ObjectSpec(
        name=str(d["name"]),
        shape=shape,
        pose=tuple(d["pose"]),
        static=bool(d.get("static")),
        mass_from=str(d.get("mass_from", "mass")),
        volume=float(d.get("volume", 0.0)),
        com=tuple(d.get("com", (0, 0, 0))),
        inertia_per_kg=tuple(d["inertia_per_kg"]),
        rgba=tuple(d.get("rgba", (0.8, 0.5, 0.2, 1.0))),
        source=str(d.get("source", "")),
    )


def spec_to_json(spec: TwinSpec) -> dict[str, Any]:
    """A JSON-ready dict with `format` and `format_version`."""
    robot = None
    if spec.robot is not None:
        r = spec.robot
        robot = {
            "urdf": r.urdf,
            "name": r.name,
            "base_pose": list(r.base_pose),
            "fixed_base": r.fixed_base,
            "joints": [asdict(j) for j in r.joints],
            "actuators": [asdict(a) for a in r.actuators],
            "links": list(r.links),
            "initial_joint_pos": list(r.initial_joint_pos),
            "notes": list(r.notes),
        }
    env = spec.environment
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": spec.name,
        "contact_model": spec.contact_model,
        "object_sleeping": spec.object_sleeping,
        "meta": dict(spec.meta),
        "params": spec.params.to_json(),
        "robot": robot,
        "environment": {
            "ground": env.ground,
            "ground_z": env.ground_z,
            "table": _obj_to_json(env.table) if env.table else None,
        },
        "objects": [_obj_to_json(o) for o in spec.objects],
    }


def spec_from_json(d: Mapping[str, Any], base_dir: Path | None = None) -> TwinSpec:
    """Inverse of `spec_to_json`; refuses other formats and newer versions clearly."""
    if not isinstance(d, Mapping) or d.get("format") != FORMAT:
        raise TwinError("not a Twinbench twin (format field missing)")
    version = d.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise TwinError(
            f"twin format version {version!r} is not supported (this Twinbench "
            f"reads up to {FORMAT_VERSION})"
        )
    try:
        robot = None
        if d.get("robot"):
            r = d["robot"]
            robot = RobotSpec(
                urdf=str(r["urdf"]),
                name=str(r.get("name", "robot")),
                base_pose=tuple(r["base_pose"]),
                fixed_base=bool(r.get("fixed_base", True)),
                joints=tuple(JointSpec(**j) for j in r.get("joints", [])),
                actuators=tuple(ActuatorSpec(**a) for a in r.get("actuators", [])),
                links=tuple(r.get("links", [])),
                initial_joint_pos=tuple(r.get("initial_joint_pos", [])),
                notes=tuple(r.get("notes", [])),
            )
        env_d = d.get("environment") or {}
        env = EnvironmentSpec(
            bool(env_d.get("ground", True)),
            _obj_from_json(env_d["table"]) if env_d.get("table") else None,
            float(env_d.get("ground_z", 0.0)),
        )
        return TwinSpec(
            name=str(d["name"]),
            params=ParamSet.from_json(d["params"]),
            robot=robot,
            environment=env,
            objects=tuple(_obj_from_json(o) for o in d.get("objects", [])),
            meta=dict(d.get("meta", {})),
            base_dir=base_dir,
            contact_model=str(d.get("contact_model", "rigid")),
            object_sleeping=bool(d.get("object_sleeping", True)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TwinError(f"corrupt twin description ({exc!r})") from exc
