"""Spec factories: a robot from any URDF, objects from primitives or meshes, the table, and
the parameter ranges Twinbench uses by default (design calls, documented per parameter)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import trimesh

from twins.contacts import PAIR_KEYS, SURFACES, pair_name
from twins.decompose import decompose, hull, write_hulls
from twins.engine import connect_direct, pb
from twins.errors import TwinError
from twins.inertia import mesh_mass_props, primitive_mass_props
from twins.params import Param, ParamSet
from twins.primitives import closest_primitive, primitive_tolerance
from twins.spec import (
    IDENTITY_POSE,
    ActuatorSpec,
    EnvironmentSpec,
    JointSpec,
    ObjectSpec,
    RobotSpec,
    Shape,
    TwinSpec,
    param,
)
from twins.urdf import UrdfJoint, loadable_urdf, read_urdf

DEFAULT_TIME_STEP = 1.0 / 240.0
# The effort limit an actuator starts at when the URDF gives none (N*m, or N for a prismatic
# joint). A missing `effort` and `effort="0"` both mean "none given": CAD exporters (the
# SolidWorks URDF exporter, Onshape's) write effort="0" velocity="0" on every joint, and
# makers put it on passive and fixed joints, where no motor limits anything; a motor that
# could give no torque at all would be a joint without an actuator, which the twin models
# as such (`actuated`). PyBullet reads it the same way (twins/urdf.py's loadable copy drops
# a limit <= 0). The assumed value is said in the twin's build notes, never silently.
DEFAULT_EFFORT = 100.0


def sim_params(
    time_step: float = DEFAULT_TIME_STEP,
    substeps: int = 1,
    solver_iterations: int = 50,
    gravity: float = 9.81,
) -> list[Param]:
    """Solver settings are parameters because restitution and contact stiffness depend on
    them (docs/TRAPS.md); they are saved with the twin."""
    return [
        param("sim.time_step", "s", time_step, 1e-4, 0.02, doc="physics step (control period)"),
        param("sim.substeps", "1", substeps, 1, 20, integer=True, doc="solver substeps per step"),
        param("sim.solver_iterations", "1", solver_iterations, 1, 500, integer=True),
        param("sim.gravity", "m/s^2", gravity, 9.7, 9.9, doc="magnitude, along -z"),
    ]


def material_params(
    prefix: str,
    friction: float = 0.5,
    restitution: float = 0.1,
    stiffness: float = 1e5,
    damping: float = 1e3,
    compliant: bool = False,
) -> list[Param]:
    """Friction coefficients are unitless Coulomb ratios. Compliant contacts add stiffness
    and damping per contact point, combined in series between the two bodies (PyBullet turns
    them into ERP/CFM, stable for any value, but it keeps about
    twice the contact points and steps about half as fast as its default rigid contacts)."""
    ps = [
        param(f"{prefix}.friction", "1", friction, 0.0, 2.0),
        # 0 = off (PyBullet adds no rolling/spinning constraints then; they cost step rate)
        param(f"{prefix}.rolling_friction", "m", 0.0, 0.0, 0.05),
        param(f"{prefix}.spinning_friction", "m", 0.0, 0.0, 0.05),
        param(f"{prefix}.restitution", "1", restitution, 0.0, 1.0),
    ]
    if compliant:
        ps += [
            param(f"{prefix}.contact_stiffness", "N/m", stiffness, 1e2, 1e8, "lognormal"),
            param(f"{prefix}.contact_damping", "N*s/m", damping, 1e-1, 1e6, "loguniform"),
        ]
    return ps


def _log_range(
    name: str, unit: str, nominal: float, lo_f: float = 0.1, hi_f: float = 10.0, floor: float = 1e-9
) -> Param:
    nominal = max(nominal, floor)
    return param(name, unit, nominal, nominal * lo_f, nominal * hi_f, "lognormal")


def actuator_params(
    joint: str,
    model: str,
    effort: float | None,
    kind: str,
    inertia: float = 0.1,
    time_step: float = DEFAULT_TIME_STEP,
) -> list[Param]:
    """Default ranges. PD: critically damped at wn = 0.3 / dt for the joint's inertia
    (kp = I wn^2, kd = 2 I wn) — the stiffest an explicit PD integrates stably at that step.
    DC motor: a small servo (the Qube: 8.4 ohm, 0.042 V*s/rad)."""
    pre = f"robot.actuators.{joint}"
    unit_t = "N" if kind == "prismatic" else "N*m"
    effort = float(effort) if effort and effort > 0 else DEFAULT_EFFORT
    lat = param(f"{pre}.latency", "s", 0.0, 0.0, 0.1, doc="command delay")
    if model == "servo":
        return [
            param(
                f"{pre}.bandwidth",
                "1/s",
                30.0,
                0.5,
                2000.0,
                "loguniform",
                doc="position error corrected per second (capped at 1/dt)",
            ),
            param(
                f"{pre}.velocity_gain",
                "1",
                1.0,
                0.5,
                1.0,
                doc="1 = pure first-order servo; below 0.5 it oscillates",
            ),
            param(f"{pre}.effort_limit", unit_t, effort, 0.01 * effort, 3 * effort),
            lat,
        ]
    if model == "pd":
        wn = 0.3 / time_step
        kp = float(max(inertia, 1e-4) * wn * wn)
        ang = "m" if kind == "prismatic" else "rad"
        return [
            _log_range(f"{pre}.kp", f"{unit_t}/{ang}", kp, 0.01, 10),
            _log_range(f"{pre}.kd", f"{unit_t}*s/{ang}", 2 * kp / wn, 0.01, 10),
            param(f"{pre}.effort_limit", unit_t, effort, 0.01 * effort, 3 * effort),
            param(
                f"{pre}.gravity_compensation",
                "1",
                0.0,
                0.0,
                1.0,
                doc="share of the gravity torque the controller adds (1: a Franka)",
            ),
            lat,
        ]
    if model == "torque":
        return [
            param(f"{pre}.gain", "1", 1.0, 0.5, 1.5, doc="applied / commanded"),
            param(
                f"{pre}.bias",
                unit_t,
                0.0,
                -0.2 * effort,
                0.2 * effort,
                doc="added to every command",
            ),
            param(f"{pre}.effort_limit", unit_t, effort, 0.01 * effort, 3 * effort),
            lat,
        ]
    if model == "dc_motor":
        return [
            _log_range(f"{pre}.resistance", "ohm", 8.4, 0.25, 4),
            _log_range(f"{pre}.k_emf", "V*s/rad", 0.042, 0.25, 4),
            param(f"{pre}.gear_ratio", "1", 1.0, 1.0, 1000.0),
            param(f"{pre}.voltage_limit", "V", 12.0, 0.1, 100.0),
            lat,
        ]
    raise TwinError(f"joint '{joint}': unknown actuator model '{model}'")


def robot_from_urdf(
    urdf: str,
    path: Path,
    base_pose: Sequence[float] = IDENTITY_POSE,
    actuator: str = "servo",
    name: str | None = None,
    fixed_base: bool = True,
    initial_joint_pos: Sequence[float] = (),
    notes: Sequence[str] = (),
    joints: Sequence[str] | None = None,
    time_step: float = DEFAULT_TIME_STEP,
    actuated: Sequence[str] | None = None,
) -> tuple[RobotSpec, list[Param]]:
    """A RobotSpec for the URDF at `path` (referenced in the spec as `urdf`), with joint and
    link-mass parameters for every movable joint (or only `joints`) and an `actuator`-model
    actuator on each of `actuated` (default: all of them; the rest are passive)."""
    info = read_urdf(path)
    movable = [j for j in info.movable if joints is None or j.name in joints]
    if joints is not None and len(movable) != len(joints):
        raise TwinError(
            f"{path}: joints {sorted(set(joints) - {j.name for j in movable})} "
            "are not movable joints of this robot"
        )
    params: list[Param] = [
        *material_params("robot.material")[:1],
        param("robot.material.restitution", "1", 0.0, 0.0, 1.0),
    ]
    jspecs = []
    acted = {j.name for j in movable} if actuated is None else set(actuated)
    for j in movable:
        kind = "continuous" if j.kind == "continuous" else j.kind
        limited = j.lower is not None and j.upper is not None and j.lower < j.upper
        jspecs.append(
            JointSpec(j.name, kind, j.lower if limited else None, j.upper if limited else None)
        )
        pre = f"robot.joints.{j.name}"
        u = "N" if kind == "prismatic" else "N*m"
        ang = "m" if kind == "prismatic" else "rad"
        params += [
            param(f"{pre}.damping", f"{u}*s/{ang}", j.damping, 0.0, max(10 * j.damping, 5.0)),
            *(
                []
                if actuator == "servo" and j.name in acted
                else [param(f"{pre}.friction", u, j.friction, 0.0, max(10 * j.friction, 5.0))]
            ),
            param(
                f"{pre}.armature",
                "kg*m^2" if ang == "rad" else "kg",
                0.0,
                0.0,
                1.0,
                doc="rotor inertia reflected through the gear",
            ),
        ]
        if j.name in acted:
            params += actuator_params(j.name, actuator, j.effort, kind)
            if not (j.effort and j.effort > 0):
                notes = [*notes, _no_effort_note(j.name, u)]
    if actuator == "pd":
        inertias = joint_inertias(
            path, fixed_base, [j.name for j in movable], initial_joint_pos or [0.0] * len(movable)
        )
        params = [q for q in params if not q.name.startswith("robot.actuators.")]
        for j in movable:
            if j.name in acted:
                params += actuator_params(
                    j.name, actuator, j.effort, j.kind, inertias[j.name], time_step
                )
    # a fixed base does not move: PyBullet gives it mass 0, and a mass written there breaks
    # the arm's dynamics, so it gets no parameter; nor do links welded to it by fixed joints.
    # A URDF rooted at `world` (ROS / Gazebo descriptions) is the robot fixed to the world
    # frame: its base is welded to that root, and the twin is the same as the robot alone's.
    still = _welded_to_root(info.joints, info.link_masses) if fixed_base else set()
    links = tuple(ln for ln, m in info.link_masses.items() if m > 0 and ln not in still)
    for ln in links:
        m = info.link_masses[ln]
        params.append(param(f"robot.links.{ln}.mass", "kg", m, 0.2 * m, 5 * m, "lognormal"))
    spec = RobotSpec(
        urdf=urdf,
        name=name or info.name,
        base_pose=tuple(base_pose),
        fixed_base=fixed_base,
        joints=tuple(jspecs),
        actuators=tuple(ActuatorSpec(j.name, actuator) for j in jspecs if j.name in acted),
        links=links,
        initial_joint_pos=tuple(initial_joint_pos),
        notes=tuple(notes),
    )
    return spec, params


def _welded_to_root(joints: Sequence[UrdfJoint], links: Mapping[str, float]) -> set[str]:
    """The root link(s) of a URDF and every link fixed to them through fixed joints only."""
    children = {j.child for j in joints}
    out = {ln for ln in links if ln not in children}
    grew = True
    while grew:
        new = {j.child for j in joints if j.kind == "fixed" and j.parent in out} - out
        out |= new
        grew = bool(new)
    return out


def _no_effort_note(joint: str, unit: str) -> str:
    what = "force" if unit == "N" else "torque"
    return (
        f"joint '{joint}': no effort limit in the URDF (effort missing or 0); "
        f"robot.actuators.{joint}.effort_limit starts at {DEFAULT_EFFORT:g} {unit} (range "
        f"{0.01 * DEFAULT_EFFORT:g}-{3 * DEFAULT_EFFORT:g}): set it to the motor's rated "
        f"{what}, or fit it"
    )


def joint_inertias(
    path: Path, fixed_base: bool, joints: list[str], q0: Sequence[float]
) -> dict[str, float]:
    """Diagonal of the joint-space mass matrix at q0 (kg*m^2 or kg) for each joint."""
    loadable, _ = loadable_urdf(path)
    cid = connect_direct()
    try:
        rid = pb.loadURDF(
            str(loadable),
            useFixedBase=fixed_base,
            flags=pb.URDF_USE_INERTIA_FROM_FILE,
            physicsClientId=cid,
        )
        names: dict[str, int] = {}
        movable: list[int] = []
        for i in range(pb.getNumJoints(rid, physicsClientId=cid)):
            info = pb.getJointInfo(rid, i, physicsClientId=cid)
            if info[2] != pb.JOINT_FIXED:
                names[info[1].decode()] = len(movable)
                movable.append(i)
        q = [0.0] * len(movable)
        for name, v in zip(joints, q0, strict=True):
            q[names[name]] = float(v)
        M = np.asarray(pb.calculateMassMatrix(rid, q, physicsClientId=cid))
        return {n: float(M[names[n], names[n]]) for n in joints}
    except pb.error as exc:
        raise TwinError(f"{path}: PyBullet cannot load this URDF ({exc})") from None
    finally:
        pb.disconnect(physicsClientId=cid)


def _body_params(
    prefix: str, static: bool, mass_from: str, value: float, material: dict[str, float] | None
) -> list[Param]:
    m = material or {}
    ps = material_params(
        prefix, friction=m.get("friction", 0.5), restitution=m.get("restitution", 0.1)
    )
    if static:
        return ps
    if mass_from == "mass":
        if not value > 0:
            raise TwinError(f"{prefix}: mass must be positive, got {value} kg")
        return [param(f"{prefix}.mass", "kg", value, 0.2 * value, 5 * value, "lognormal"), *ps]
    if not value > 0:
        raise TwinError(f"{prefix}: density must be positive, got {value} kg/m^3")
    return [param(f"{prefix}.density", "kg/m^3", value, 0.2 * value, 5 * value, "lognormal"), *ps]


def primitive_object(
    name: str,
    kind: str,
    size: Sequence[float],
    pose: Sequence[float],
    mass: float | None = None,
    density: float | None = None,
    static: bool = False,
    rgba: Sequence[float] = (0.8, 0.5, 0.2, 1),
    material: dict[str, float] | None = None,
    prefix: str | None = None,
) -> tuple[ObjectSpec, list[Param]]:
    """A box (half extents), cylinder (radius, length) or sphere (radius) object."""
    shape = Shape(kind, tuple(size))
    mp = primitive_mass_props(kind, shape.size)
    mass_from = "density" if density is not None else "mass"
    value = density if density is not None else (mass if mass is not None else 0.1)
    obj = ObjectSpec(
        name,
        shape,
        tuple(pose),
        static,
        mass_from,
        mp.volume,
        mp.com,
        tuple(mp.inertia_per_kg.reshape(-1)),
        tuple(rgba),
    )
    return obj, _body_params(prefix or obj.prefix, static, mass_from, float(value), material)


def mesh_object(
    name: str,
    mesh: trimesh.Trimesh,
    pose: Sequence[float],
    folder: Path,
    mass: float | None = None,
    density: float | None = 500.0,
    open_mesh: str = "hull",
    rgba: Sequence[float] = (0.3, 0.6, 0.8, 1),
    source: str = "",
    max_hulls: int = 8,
    support: Sequence[float] | None = None,
    observed: np.ndarray | None = None,
) -> tuple[ObjectSpec, list[Param], list[str]]:
    """An object from a mesh in its body frame: writes `objects/<name>.obj` and its convex
    hulls into `folder` (the twin folder) and returns the spec, params and notes.
    `support`: the plane (a, b, c, d) in the body frame the object rests on (a scan's
    table), `observed`: the points the scan saw (body frame): a primitive is then fitted to
    the observed surface (twins/primitives.py)."""
    mp = mesh_mass_props(mesh, f"object '{name}'", open_mesh)
    sub = Path(folder) / "objects"
    sub.mkdir(parents=True, exist_ok=True)
    mesh.export(sub / f"{name}.obj")
    notes = list(mp.notes)
    near = closest_primitive(mesh, support=support, observed=observed)
    tol = primitive_tolerance(mesh)
    prim = near if near is not None and near.rms_m <= tol else None
    if prim is not None:
        shape = Shape(prim.kind, prim.size, f"objects/{name}.obj", (), tuple(prim.pose))
        notes.append(f"object '{name}': collides as a {prim.describe()}")
    else:
        hull_src = mesh if mesh.is_watertight else hull(mesh.vertices)
        dec = decompose(hull_src, f"object '{name}'", max_hulls=max_hulls)
        hull_files = write_hulls(dec.hulls, sub, name)
        shape = Shape("mesh", (), f"objects/{name}.obj", tuple(f"objects/{h}" for h in hull_files))
        why = f"no primitive within the {tol * 1000:.1f} mm tolerance" + (
            f" (closest is a {near.describe()})" if near is not None else ""
        )
        if len(dec.hulls) > 1 or mesh.is_watertight:
            notes.append(f"object '{name}': {why}; {dec.describe()}")
        else:
            notes.append(
                f"object '{name}': {why}; the mesh is open, so it collides as one convex hull "
                "(concavities of an open mesh cannot be decomposed reliably)"
            )
    mass_from = "mass" if mass is not None else "density"
    obj = ObjectSpec(
        name,
        shape,
        tuple(pose),
        False,
        mass_from,
        mp.volume,
        mp.com,
        tuple(mp.inertia_per_kg.reshape(-1)),
        tuple(rgba),
        source,
    )
    value = float(mass if mass is not None else density)  # type: ignore[arg-type]
    return obj, _body_params(obj.prefix, False, mass_from, value, None), notes


def table_box(
    half_extents: Sequence[float], top_center: Sequence[float], friction: float = 0.5
) -> tuple[ObjectSpec, list[Param]]:
    """A static table box whose top face is centred at `top_center`."""
    hx, hy, hz = (float(v) for v in half_extents)
    x, y, z = (float(v) for v in top_center)
    return primitive_object(
        "table",
        "box",
        (hx, hy, hz),
        (x, y, z - hz, 0, 0, 0, 1),
        static=True,
        rgba=(0.72, 0.6, 0.45, 1),
        material={"friction": friction},
        prefix="env.table",
    )


def assemble(
    name: str,
    robot: tuple[RobotSpec, list[Param]] | None = None,
    objects: Sequence[tuple[ObjectSpec, list[Param]]] = (),
    table: tuple[ObjectSpec, list[Param]] | None = None,
    ground: bool = True,
    ground_z: float = 0.0,
    sim: list[Param] | None = None,
    meta: dict | None = None,
    base_dir: Path | None = None,
    contact_model: str = "rigid",
    stiffness: float = 1e5,
    damping: float = 1e3,
) -> TwinSpec:
    """Put the pieces and their parameters together into a TwinSpec. With
    `contact_model="compliant"` every body gets contact stiffness and damping parameters."""
    params: list[Param] = list(sim or sim_params())
    if robot is not None:
        params += robot[1]
    for _, ps in objects:
        params += ps
    if table is not None:
        params += table[1]
    if ground:
        params += material_params("env.ground")
    if contact_model == "compliant":
        bodies = (
            [o.prefix for o, _ in objects]
            + (["env.table"] if table else [])
            + (["env.ground"] if ground else [])
        )
        params += [
            q
            for b in bodies
            for q in material_params(b, stiffness=stiffness, damping=damping, compliant=True)[4:]
        ]
    env = EnvironmentSpec(ground, table[0] if table else None, ground_z)
    return TwinSpec(
        name,
        ParamSet(params),
        robot[0] if robot else None,
        env,
        tuple(o for o, _ in objects),
        dict(meta or {}),
        base_dir,
        contact_model,
    )


def with_contact_pair(
    spec: TwinSpec,
    obj: str,
    surface: str = "ground",
    friction: float = 0.5,
    restitution: float = 0.1,
) -> TwinSpec:
    """`spec` with object `obj`'s contact against the `surface` (ground or table) given by
    its own μ and e (`contacts.<obj>.<surface>.friction|restitution`, twins/contacts.py)
    instead of the two bodies' friction and restitution, which PyBullet multiplies; those
    body parameters leave the twin."""
    from dataclasses import replace

    if surface not in SURFACES:
        raise TwinError(f"contact pair: surface '{surface}' is not one of {', '.join(SURFACES)}")
    spec.object(obj)  # TwinError names an unknown object
    drop = {f"{pre}.{k}" for pre in (f"objects.{obj}", SURFACES[surface]) for k in PAIR_KEYS}
    kept = [p for n, p in spec.params.items() if n not in drop]
    pair = [
        param(pair_name(obj, surface, "friction"), "1", friction, 0.0, 2.0, doc="μ of the pair"),
        param(
            pair_name(obj, surface, "restitution"), "1", restitution, 0.0, 1.0, doc="e of the pair"
        ),
    ]
    return replace(spec, params=ParamSet([*kept, *pair]))
