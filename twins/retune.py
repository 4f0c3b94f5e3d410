"""Change parameter values of a built twin in place, where PyBullet allows it.

Building a Panda twin costs about 90 ms (PyBullet parses the arm's meshes every time) and a
5 s replay about 70 ms, so live tuning that rebuilds on every slider move cannot redraw
within 100 ms. Most parameters a person tunes by eye — friction, restitution, masses and
densities, joint damping and friction, armature, actuator gains and latency, gravity — are
engine values that `changeDynamics` sets on the existing bodies. `retune(world, values)`
writes those (reading each one back, as the builder does) and returns True; for anything
else (time step, substeps, solver iterations, geometry) it changes nothing and returns
False, and the caller builds a new world.

A retuned world must replay exactly as a freshly built one at the same values
(tests/twins/test_retune.py checks that on the Panda + objects twin). Objects found at rest
at build time sleep at the start; after a retune the rest check runs again and a change in
which objects rest (or where they settle) asks for a rebuild too.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy.spatial.transform import Rotation

from twins import sleeping
from twins.actuators import configure_joints
from twins.builder import TwinWorld, _check
from twins.contacts import SURFACES, parse
from twins.engine import pb
from twins.inertia import principal_axes

MATERIAL_KEYS = (
    "friction",
    "restitution",
    "rolling_friction",
    "spinning_friction",
    "contact_stiffness",
    "contact_damping",
)
# parameters whose change needs a new world (step size and solver shape the rest check,
# the sleep set-up and every saved state)
REBUILD = ("sim.time_step", "sim.substeps", "sim.solver_iterations")


def _kind(name: str) -> str | None:
    """Which in-place writer handles parameter `name` (None: rebuild)."""
    parts = name.split(".")
    last = parts[-1]
    if name in REBUILD:
        return None
    if name == "sim.gravity":
        return "gravity"
    if parts[0] == "objects" and len(parts) == 3:
        if last in ("mass", "density"):
            return "object_mass"
        if last in MATERIAL_KEYS:
            return "object_material"
    if parts[0] == "env" and len(parts) == 3 and last in MATERIAL_KEYS:
        return "env_material"
    if parts[0] == "contacts" and len(parts) == 4:
        return "contact_pair"  # twins/contacts.py: the object's and the surface's values
    if parts[:2] == ["robot", "material"]:
        return "robot_material"
    if parts[:2] == ["robot", "links"] and last == "mass":
        return "robot_inertia"
    if parts[:2] == ["robot", "joints"] and last == "armature":
        return "robot_inertia"
    if parts[:2] == ["robot", "joints"] and last in ("damping", "friction"):
        return "joints"
    if parts[:2] == ["robot", "actuators"]:
        return "joints"  # read by Actuators at replay; back-EMF damping by configure_joints
    return None


def can_retune(world: TwinWorld, values: Mapping[str, float]) -> bool:
    """Whether every parameter that differs from the world's values can change in place."""
    changed = [n for n, v in values.items() if world.values.get(n) != float(v)]
    return all(_kind(n) is not None for n in changed)


def retune(world: TwinWorld, values: Mapping[str, float]) -> bool:
    """Set `values` (validated by the twin's ParamSet) on `world` in place and reset it.
    Returns False, leaving the world unchanged, when a rebuild is needed. Raises TwinError
    (naming the parameter) for a bad value or one the engine did not take."""
    new = world.spec.params.validate({**world.values, **values})
    changed = {n for n, v in new.items() if world.values[n] != v}
    if not changed:
        return True
    kinds = {_kind(n) for n in changed}
    if None in kinds or not _armature_ok(world, changed):
        return False
    if world.spec.object_sleeping and _rest_sensitive(world, changed):
        return False
    old = dict(world.values)
    world.values = new
    try:
        _apply(world, old, kinds, changed)
        touches_rest = kinds & {"object_mass", "object_material"}
        if world.spec.object_sleeping and touches_rest and not _same_rest(world):
            _apply(world, new, kinds, changed, back_to=old)
            world.values = old
            world.reset()
            return False
        world.reset()
    except BaseException:
        world.values = old
        raise
    return True


def _rest_sensitive(world: TwinWorld, changed: set[str]) -> bool:
    """Whether the change may move where a resting object starts: the builder lets an
    object that is not quite at rest settle first and starts it there, at a pose that
    depends on gravity, the table's material and the object's own mass and material. Such
    changes take the rebuild path."""
    if any(n == "sim.gravity" or n.startswith(("env.", "contacts.")) for n in changed):
        return True
    world.reset()
    for o in world.spec.objects:
        if o.static or o.name not in world.sleepers:
            continue
        moved = not np.allclose(world.object_pose(o.name), np.asarray(o.pose), rtol=0, atol=1e-9)
        if moved and any(n.startswith(o.prefix + ".") for n in changed):
            return True
    return False


def _same_rest(world: TwinWorld) -> bool:
    """Objects that started where the spec puts them still rest there at the new values
    (the builder's probe, run again from the start), and no other object comes to rest."""
    world.reset()
    settled = sleeping.resting(world)
    return sorted(settled) == sorted(world.sleepers) and all(p is None for p in settled.values())


def _armature_ok(world: TwinWorld, changed: set[str]) -> bool:
    """Armature goes on the joint's child link, which needs a mass parameter; the builder
    explains when it has none, so such a change takes the rebuild path."""
    r = world.spec.robot
    for n in changed:
        parts = n.split(".")
        if parts[:2] == ["robot", "joints"] and parts[-1] == "armature":
            li = world.joint_index.get(parts[2])
            if r is None or li is None or world._link_name(li) not in r.links:
                return False
    return True


def _apply(
    world: TwinWorld,
    old: Mapping[str, float],
    kinds: set[str | None],
    changed: set[str],
    back_to: Mapping[str, float] | None = None,
) -> None:
    """Write the changed groups; with `back_to`, restore those values instead."""
    if back_to is not None:
        prev = dict(world.values)
        world.values = dict(back_to)
        old = prev
    cid, v = world.cid, world.values
    if "gravity" in kinds:
        pb.setGravity(0, 0, -v["sim.gravity"], physicsClientId=cid)
        got = pb.getPhysicsEngineParameters(physicsClientId=cid)
        _check("sim.gravity", -v["sim.gravity"], got["gravityAccelerationZ"])
    for o in world.spec.objects:
        pre = o.prefix
        if o.static or o.name not in world.bodies:
            continue
        bid = world.bodies[o.name].body_id
        if any(n.startswith(pre + ".") and _kind(n) == "object_mass" for n in changed):
            mass = v[f"{pre}.mass"] if o.mass_from == "mass" else v[f"{pre}.density"] * o.volume
            diag, _ = principal_axes(np.asarray(o.inertia_per_kg).reshape(3, 3))
            pb.changeDynamics(bid, -1, mass=mass, physicsClientId=cid)
            pb.changeDynamics(
                bid, -1, localInertiaDiagonal=(diag * mass).tolist(), physicsClientId=cid
            )
            info = pb.getDynamicsInfo(bid, -1, physicsClientId=cid)
            _check(f"{pre}.{o.mass_from}", mass, info[0])
        if any(n.startswith(pre + ".") and _kind(n) == "object_material" for n in changed):
            world._material(bid, -1, pre)
    if "contact_pair" in kinds:
        for obj, surface, _ in parse(changed).values():
            for body, pre in ((obj, f"objects.{obj}"), (surface, SURFACES[surface])):
                if body in world.bodies:
                    world._material(world.bodies[body].body_id, -1, pre)
    if "env_material" in kinds:
        for body, pre in (("ground", "env.ground"), ("table", "env.table")):
            if body in world.bodies and any(n.startswith(pre + ".") for n in changed):
                world._material(world.bodies[body].body_id, -1, pre)
    rid = world.robot_id
    if rid is None or world.spec.robot is None:
        return
    if "robot_material" in kinds:
        for li in range(-1, pb.getNumJoints(rid, physicsClientId=cid)):
            pb.changeDynamics(
                rid,
                li,
                lateralFriction=v["robot.material.friction"],
                restitution=v["robot.material.restitution"],
                physicsClientId=cid,
            )
            got = pb.getDynamicsInfo(rid, li, physicsClientId=cid)
            _check("robot.material.friction", v["robot.material.friction"], got[1])
            _check("robot.material.restitution", v["robot.material.restitution"], got[5])
    if "robot_inertia" in kinds:
        _robot_inertia(world, old)
    if "joints" in kinds:
        configure_joints(world)


def _robot_inertia(world: TwinWorld, old: Mapping[str, float]) -> None:
    """Link masses and joint armature: the builder scales the URDF's inertia with the mass
    and adds armature about the joint axis; undo the old values, apply the new ones."""
    r, cid, v, rid = world.spec.robot, world.cid, world.values, world.robot_id
    assert r is not None and rid is not None
    joint_of = {world.joint_index[j.name]: j.name for j in r.joints}
    for ln in r.links:
        li = world.link_index[ln]
        info = pb.getDynamicsInfo(rid, li, physicsClientId=cid)
        m_old, diag = info[0], np.asarray(info[2], float)
        m_new = v[f"robot.links.{ln}.mass"]
        jname = joint_of.get(li, "")
        axis2 = np.zeros(3)
        if jname:
            jinfo = pb.getJointInfo(rid, li, physicsClientId=cid)
            axis = Rotation.from_quat(info[4]).inv().apply(np.asarray(jinfo[13]))
            axis2 = axis**2
        a_old = old.get(f"robot.joints.{jname}.armature", 0.0) if jname else 0.0
        a_new = v.get(f"robot.joints.{jname}.armature", 0.0) if jname else 0.0
        base = diag - a_old * axis2
        base = base * (m_new / m_old) if m_old > 0 else base
        new_diag = base + a_new * axis2
        if m_new == m_old and np.allclose(new_diag, diag, rtol=0, atol=0):
            continue
        pb.changeDynamics(rid, li, mass=m_new, physicsClientId=cid)
        pb.changeDynamics(rid, li, localInertiaDiagonal=new_diag.tolist(), physicsClientId=cid)
        got = pb.getDynamicsInfo(rid, li, physicsClientId=cid)
        _check(f"robot.links.{ln}.mass", m_new, got[0])
        _check(f"robot.links.{ln}.mass (inertia)", new_diag, got[2], rtol=1e-4)
