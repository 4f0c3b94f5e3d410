"""TwinSpec + values -> a PyBullet world in its own DIRECT client (docs/ARCHITECTURE.md §4; PyBullet's
`changeDynamics` can silently ignore a value, docs/TRAPS.md).

Every value written is read back (getDynamicsInfo / getPhysicsEngineParameters) and a
mismatch is a TwinError naming the parameter. PyBullet offers no read-back for joint
damping, joint friction (a zero-velocity motor) or PD gains (the built-in PD plugin); those
are checked by physics tests instead (tests/twins/test_builder.py). The world is
deterministic from `reset()`, which restores the state saved right after building.

Frames: PyBullet reports and resets a base by its centre-of-mass frame; `TwinWorld` speaks
body frames (the spec's object poses) and converts at this border.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial.transform import Rotation

from devices.poses import matrix_to_pose, pose_to_matrix
from twins import sleeping
from twins.actuators import configure_joints, hold_initial
from twins.contacts import body_values
from twins.engine import connect_direct, pb
from twins.errors import TwinError
from twins.inertia import principal_axes
from twins.spec import ObjectSpec, TwinSpec
from twins.urdf import loadable_urdf

ROBOT_GROUP = 4  # collision filter bit of the robot's links (PyBullet: 1 dynamic, 2 static)
STATIC_GROUP = 2
_DYN = {
    "mass": 0,
    "friction": 1,
    "restitution": 5,
    "rolling_friction": 6,
    "spinning_friction": 7,
    "contact_damping": 8,
    "contact_stiffness": 9,
}


@dataclass(frozen=True)
class BodyRef:
    """A built body: PyBullet id and the T_body_com transform used for pose conversion."""

    name: str
    body_id: int
    T_body_com: np.ndarray
    T_com_body: np.ndarray


def _check(param: str, wrote: Any, got: Any, rtol: float = 1e-5, atol: float = 1e-9) -> None:
    w, g = np.asarray(wrote, float), np.asarray(got, float)
    if w.shape != g.shape or not np.allclose(w, g, rtol=rtol, atol=atol):
        raise TwinError(
            f"parameter '{param}': wrote {np.round(w, 9).tolist()} but PyBullet "
            f"reports {np.round(g, 9).tolist()} (value ignored by the engine)"
        )


class TwinWorld:
    """A built twin. Use as a context manager or call `close()`; one DIRECT client each."""

    def __init__(self, spec: TwinSpec, values: Mapping[str, float] | None = None) -> None:
        self.spec = spec
        self.values = spec.params.validate(values)
        self.cid = connect_direct()
        self.notes: list[str] = []
        self.bodies: dict[str, BodyRef] = {}
        self.robot_id: int | None = None
        self.joint_index: dict[str, int] = {}
        self.link_index: dict[str, int] = {}
        self.sleepers: list[str] = []  # objects at rest at the start: asleep after reset
        self._woken: set[str] = set()  # sleepers woken since (kept awake until reset)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        if self.cid is not None and self.cid >= 0:
            try:
                pb.disconnect(physicsClientId=self.cid)
            except pb.error:
                pass
            self.cid = -1

    def __enter__(self) -> TwinWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "cid", -1) >= 0:
            self.close()

    @property
    def dt(self) -> float:
        return float(self.values["sim.time_step"])

    def reset(self) -> None:
        """Back to the state saved after building (deterministic start of every rollout).

        restoreState keeps the contact manifolds (and their warm-start impulses) of the
        previous rollout, so bodies are first moved apart and collision detection run to drop
        every manifold: the next step starts exactly like the first one after building."""
        sleeping.wake_all(self)
        sleeping.put_to_sleep(self, self._initial_state, self.sleepers)
        self._woken = set()
        hold_initial(self)

    def flush_contacts(self) -> None:
        cid = self.cid
        for i in range(pb.getNumBodies(physicsClientId=cid)):
            bid = pb.getBodyUniqueId(i, physicsClientId=cid)
            pb.resetBasePositionAndOrientation(
                bid, (1e3 * (i + 1), 1e3, 1e3), (0, 0, 0, 1), physicsClientId=cid
            )
        pb.performCollisionDetection(physicsClientId=cid)

    def save_state(self) -> int:
        return int(pb.saveState(physicsClientId=self.cid))

    def restore_state(self, state_id: int) -> None:
        """Restore a saved state with fresh contacts (see `reset`). Objects are awake and
        stay awake until the next `reset` (whether they rest in that state is unknown)."""
        sleeping.wake_all(self)
        self.flush_contacts()
        self._woken = set(self.sleepers)
        pb.restoreState(state_id, physicsClientId=self.cid)

    # -- build ---------------------------------------------------------------------------
    def _build(self) -> None:
        v, cid = self.values, self.cid
        dt, sub, it = v["sim.time_step"], int(v["sim.substeps"]), int(v["sim.solver_iterations"])
        # With substeps PyBullet splits fixedTimeStep into numSubSteps internal steps.
        # deterministicOverlappingPairs costs ~20 % of step rate but without it two rollouts
        # from the same restored state differ (tests/twins/test_builder.py).
        pb.setPhysicsEngineParameter(
            fixedTimeStep=dt,
            numSubSteps=sub if sub > 1 else 0,
            numSolverIterations=it,
            deterministicOverlappingPairs=1,
            physicsClientId=cid,
        )
        pb.setGravity(0, 0, -v["sim.gravity"], physicsClientId=cid)
        got = pb.getPhysicsEngineParameters(physicsClientId=cid)
        _check("sim.time_step", dt, got["fixedTimeStep"])
        _check("sim.solver_iterations", it, got["numSolverIterations"])
        _check("sim.gravity", -v["sim.gravity"], got["gravityAccelerationZ"])
        if sub > 1:
            _check("sim.substeps", sub, got["numSubSteps"])
        env = self.spec.environment
        if env.ground:
            col = pb.createCollisionShape(pb.GEOM_PLANE, physicsClientId=cid)
            gid = pb.createMultiBody(0, col, -1, [0, 0, env.ground_z], physicsClientId=cid)
            self.bodies["ground"] = BodyRef("ground", gid, np.eye(4), np.eye(4))
            self._material(gid, -1, "env.ground")
        for obj in self.spec.objects:
            self._object(obj, obj.prefix)
        if env.table is not None:  # after the objects: see the note in _object
            self._object(env.table, "env.table")
        if self.spec.robot is not None:
            self._robot()
        hold_initial(self)
        self._initial_state = self.save_state()
        # objects at rest at the start sleep until touched (twins/sleeping.py)
        settled = sleeping.resting(self) if self.spec.object_sleeping else {}
        snap = {n: p for n, p in settled.items() if p is not None}
        for n, (pos, orn) in snap.items():
            b = self.bodies[n].body_id
            pb.resetBasePositionAndOrientation(b, pos, orn, physicsClientId=self.cid)
            pb.resetBaseVelocity(b, (0, 0, 0), (0, 0, 0), physicsClientId=self.cid)
        if snap:
            pb.removeState(self._initial_state, physicsClientId=self.cid)
            self._initial_state = self.save_state()
        self.sleepers = list(settled)
        self.reset()

    def _material(self, body: int, link: int, prefix: str) -> None:
        v = self.values
        want = {k: v[f"{prefix}.{k}"] for k in _DYN if k != "mass" and f"{prefix}.{k}" in v}
        # a contact pair's μ and e: the object takes the pair's value, the surface 1.0
        paired = body_values(self.spec.params, v, prefix)
        want.update(paired)
        kw: dict[str, float] = {}
        if "friction" in want:
            kw["lateralFriction"] = want["friction"]
        for k, arg in (
            ("rolling_friction", "rollingFriction"),
            ("spinning_friction", "spinningFriction"),
            ("restitution", "restitution"),
            ("contact_stiffness", "contactStiffness"),
            ("contact_damping", "contactDamping"),
        ):
            if k in want:
                kw[arg] = want[k]
        pb.changeDynamics(
            body, link, linearDamping=0.0, angularDamping=0.0, **kw, physicsClientId=self.cid
        )
        info = pb.getDynamicsInfo(body, link, physicsClientId=self.cid)
        for k, val in want.items():
            what = f"{prefix}.{k}" + (" (set by its contact pair)" if k in paired else "")
            _check(what, val, info[_DYN[k]])

    def _object(self, obj: ObjectSpec, prefix: str) -> None:
        cid, sh = self.cid, obj.shape
        frame = {
            "collisionFramePosition": sh.collision_pose[:3],
            "collisionFrameOrientation": sh.collision_pose[3:],
            "physicsClientId": cid,
        }
        if sh.kind == "box":
            col = pb.createCollisionShape(pb.GEOM_BOX, halfExtents=sh.size, **frame)
        elif sh.kind == "cylinder":
            col = pb.createCollisionShape(
                pb.GEOM_CYLINDER, radius=sh.size[0], height=sh.size[1], **frame
            )
        elif sh.kind == "sphere":
            col = pb.createCollisionShape(pb.GEOM_SPHERE, radius=sh.size[0], **frame)
        else:
            files = []
            for h in sh.hulls:
                f = self.spec.resolve(h)
                if not f.is_file():
                    raise TwinError(f"object '{obj.name}': collision hull file {f} is missing")
                files.append(str(f))
            col = pb.createCollisionShapeArray(
                [pb.GEOM_MESH] * len(files), fileNames=files, physicsClientId=cid
            )
        if col < 0:
            raise TwinError(f"object '{obj.name}': PyBullet could not create its collision shape")
        Ib = np.asarray(obj.inertia_per_kg).reshape(3, 3)
        diag, R = principal_axes(Ib)
        T_body_com = np.eye(4)
        T_body_com[:3, :3] = R
        T_body_com[:3, 3] = obj.com
        com_pose = matrix_to_pose(T_body_com)
        if obj.static:
            mass = 0.0
        elif obj.mass_from == "mass":
            mass = self.values[f"{prefix}.mass"]
        else:
            mass = self.values[f"{prefix}.density"] * obj.volume
        pose = np.asarray(obj.pose)
        bid = pb.createMultiBody(
            mass, col, -1, pose[:3], pose[3:], com_pose[:3], com_pose[3:], physicsClientId=cid
        )
        if bid < 0:
            raise TwinError(f"object '{obj.name}': PyBullet could not create the body")
        self.bodies[obj.name] = BodyRef(obj.name, bid, T_body_com, np.linalg.inv(T_body_com))
        if not obj.static:
            pname = f"{prefix}.{obj.mass_from}"
            pb.changeDynamics(bid, -1, mass=mass, physicsClientId=cid)
            pb.changeDynamics(
                bid, -1, localInertiaDiagonal=(diag * mass).tolist(), physicsClientId=cid
            )
            info = pb.getDynamicsInfo(bid, -1, physicsClientId=cid)
            _check(pname, mass, info[0])
            _check(f"{pname} (inertia)", diag * mass, info[2])
            _check(f"{prefix} (centre of mass)", obj.com, info[3], atol=1e-6)
        self._material(bid, -1, prefix)

    def _robot(self) -> None:
        r, cid, v = self.spec.robot, self.cid, self.values
        assert r is not None
        path = self.spec.resolve(r.urdf)
        loadable, notes = loadable_urdf(path)
        self.notes += [n for n in notes if n not in r.notes] + list(r.notes)
        # No visual meshes: nothing reads PyBullet's visual shapes (the 3D views draw the
        # URDF's meshes themselves, twins/view.py), and parsing a Panda's took 50-180 ms of a
        # build (10-16 without) with the GIL held, the window waiting on a deploy prediction.
        flags = (
            pb.URDF_USE_INERTIA_FROM_FILE
            | pb.URDF_MAINTAIN_LINK_ORDER
            | pb.URDF_IGNORE_VISUAL_SHAPES
        )
        try:
            rid = pb.loadURDF(
                str(loadable),
                r.base_pose[:3],
                r.base_pose[3:],
                useFixedBase=r.fixed_base,
                flags=flags,
                physicsClientId=cid,
            )
        except pb.error as exc:
            raise TwinError(f"{path}: PyBullet cannot load this URDF ({exc})") from None
        self.robot_id = rid
        # Self-collision is off (no URDF_USE_SELF_COLLISION), yet the ~17 overlapping link
        # pairs of an arm would still enter the broad phase and be rejected one by one every
        # step: a collision group of its own keeps them out (~4 % of a Panda replay). A fixed
        # base also keeps PyBullet's static group so it stays out of pairs with static bodies.
        for li in range(-1, pb.getNumJoints(rid, physicsClientId=cid)):
            group = ROBOT_GROUP | (STATIC_GROUP if li == -1 and r.fixed_base else 0)
            pb.setCollisionFilterGroupMask(rid, li, group, -1 & ~group, physicsClientId=cid)
        if r.fixed_base:  # bolted down: its base touching the table must not push the arm
            for env in ("ground", "table"):
                if env in self.bodies:
                    pb.setCollisionFilterPair(
                        rid, self.bodies[env].body_id, -1, -1, 0, physicsClientId=cid
                    )
        self.link_index[pb.getBodyInfo(rid, physicsClientId=cid)[0].decode()] = -1
        for j in range(pb.getNumJoints(rid, physicsClientId=cid)):
            info = pb.getJointInfo(rid, j, physicsClientId=cid)
            self.joint_index[info[1].decode()] = j
            self.link_index[info[12].decode()] = j
        for js in r.joints:
            if js.name not in self.joint_index:
                raise TwinError(f"{path}: joint '{js.name}' named by the twin is not in the URDF")
        armature = {
            self.joint_index[j.name]: (j.name, v[f"robot.joints.{j.name}.armature"])
            for j in r.joints
        }
        for ln in r.links:
            if ln not in self.link_index:
                raise TwinError(f"{path}: link '{ln}' named by the twin is not in the URDF")
            li = self.link_index[ln]
            if li == -1 and r.fixed_base:
                raise TwinError(
                    f"parameter 'robot.links.{ln}.mass': the fixed base link does "
                    "not move and cannot take a mass in PyBullet"
                )
            info0 = pb.getDynamicsInfo(rid, li, physicsClientId=cid)
            m0, diag0 = info0[0], np.asarray(info0[2])
            m = v[f"robot.links.{ln}.mass"]
            diag = diag0 * (m / m0) if m0 > 0 else diag0
            jname, arm = armature.get(li, ("", 0.0))
            if arm > 0:
                jinfo = pb.getJointInfo(rid, li, physicsClientId=cid)
                if jinfo[2] == pb.JOINT_PRISMATIC:
                    raise TwinError(
                        f"parameter 'robot.joints.{jname}.armature': armature is "
                        "modelled for revolute joints only"
                    )
                axis = Rotation.from_quat(info0[4]).inv().apply(np.asarray(jinfo[13]))
                diag = diag + arm * axis**2
            # Order matters: a mass change makes PyBullet recompute the inertia (§9 trap).
            pb.changeDynamics(rid, li, mass=m, physicsClientId=cid)
            pb.changeDynamics(rid, li, localInertiaDiagonal=diag.tolist(), physicsClientId=cid)
            got = pb.getDynamicsInfo(rid, li, physicsClientId=cid)
            _check(f"robot.links.{ln}.mass", m, got[0])
            _check(
                f"robot.links.{ln}.mass (inertia)" if not arm else f"robot.joints.{jname}.armature",
                diag,
                got[2],
            )
        for jspec in r.joints:
            if (
                v[f"robot.joints.{jspec.name}.armature"] > 0
                and self._link_name(self.joint_index[jspec.name]) not in r.links
            ):
                raise TwinError(
                    f"parameter 'robot.joints.{jspec.name}.armature': the joint's "
                    "child link has no mass parameter"
                )
        for li in range(-1, pb.getNumJoints(rid, physicsClientId=cid)):
            pb.changeDynamics(
                rid,
                li,
                linearDamping=0.0,
                angularDamping=0.0,
                lateralFriction=v["robot.material.friction"],
                restitution=v["robot.material.restitution"],
                physicsClientId=cid,
            )
            got = pb.getDynamicsInfo(rid, li, physicsClientId=cid)
            _check("robot.material.friction", v["robot.material.friction"], got[1])
            _check("robot.material.restitution", v["robot.material.restitution"], got[5])
        configure_joints(self)

    def _link_name(self, index: int) -> str:
        return next(n for n, i in self.link_index.items() if i == index)

    # -- state I/O -------------------------------------------------------------------------
    def object_pose(self, name: str) -> np.ndarray:
        """Body-frame pose (7,) of an object in the world."""
        b = self.bodies[name]
        pos, orn = pb.getBasePositionAndOrientation(b.body_id, physicsClientId=self.cid)
        return matrix_to_pose(pose_to_matrix([*pos, *orn]) @ b.T_com_body)

    def robot_contacts(self, name: str) -> list[tuple[str, float]]:
        """The robot's links touching object `name` now: (link name, contact height z, m)
        per contact point (on the robot's side)."""
        if self.robot_id is None:
            return []
        cps = pb.getContactPoints(
            self.robot_id, self.bodies[name].body_id, physicsClientId=self.cid
        )
        return [(self._link_name(c[3]), float(c[5][2])) for c in cps]

    def set_object_pose(self, name: str, pose: np.ndarray, twist: np.ndarray | None = None) -> None:
        """Place an object by its body-frame pose; twist = (vx, vy, vz, wx, wy, wz) of the com."""
        b = self.bodies[name]
        if name in self.sleepers and name not in self._woken:  # at rest no more
            sleeping.wake(self, [name])
            self._woken.add(name)
        T = pose_to_matrix(pose) @ b.T_body_com
        com = matrix_to_pose(T)
        pb.resetBasePositionAndOrientation(b.body_id, com[:3], com[3:], physicsClientId=self.cid)
        if twist is not None:
            pb.resetBaseVelocity(b.body_id, twist[:3], twist[3:], physicsClientId=self.cid)

    def joint_ids(self, names: list[str] | tuple[str, ...] | None = None) -> list[int]:
        names = names if names is not None else [j.name for j in self.spec.robot.joints]  # type: ignore[union-attr]
        try:
            return [self.joint_index[n] for n in names]
        except KeyError as exc:
            raise TwinError(f"robot has no joint {exc}") from None

    def joint_state(self, names: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(positions, velocities) of the robot joints (all twin joints by default)."""
        if self.robot_id is None:
            return np.zeros(0), np.zeros(0)
        st = pb.getJointStates(self.robot_id, self.joint_ids(names), physicsClientId=self.cid)
        return np.array([s[0] for s in st]), np.array([s[1] for s in st])

    def set_joint_state(
        self, pos: np.ndarray, vel: np.ndarray | None = None, names: list[str] | None = None
    ) -> None:
        ids = self.joint_ids(names)
        vel = np.zeros(len(ids)) if vel is None else vel
        for i, q, qd in zip(ids, pos, vel, strict=True):
            pb.resetJointState(self.robot_id, i, float(q), float(qd), physicsClientId=self.cid)

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            pb.stepSimulation(physicsClientId=self.cid)
