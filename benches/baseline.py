"""The `bench twin` baseline: a bare PyBullet world with the same bodies as a twin, for
step-rate comparisons (shipped because the bench ships, and here because PyBullet lives only
in twins/).

Same robot URDF and initial pose; same collision shapes, poses, masses, centres of mass and
inertias of the objects; PyBullet's default materials; no read-back, no actuator models.
Engine settings: `settings="twin"` uses the twin's (solver iterations,
deterministicOverlappingPairs, the robot's collision group, its servo gains and effort
limits, resting objects asleep: here the plain PyBullet way, by letting them fall asleep
during a 2.5 s warm-up before the state is saved), so the ratio measures the twin's own
overhead; `settings="default"` is PyBullet out of the box (default servo gains, no
deterministic pairs, nothing sleeps), to show what those settings cost or save."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from scipy.spatial.transform import Rotation

from twins.builder import ROBOT_GROUP, STATIC_GROUP
from twins.engine import connect_direct, pb
from twins.inertia import principal_axes
from twins.sleeping import SLEEP_SPEED, SLEEP_TIMEOUT_S
from twins.spec import Shape, TwinSpec
from twins.urdf import loadable_urdf


class BareWorld:
    def __init__(self, spec: TwinSpec, settings: str = "twin") -> None:
        if settings not in ("twin", "default"):
            raise ValueError(f"BareWorld settings must be 'twin' or 'default', not {settings!r}")
        self.cid = cid = connect_direct()
        twin = settings == "twin"
        _configure_engine(cid, spec, twin)
        statics, movers = _add_bodies(cid, spec)
        if spec.robot is not None:
            self._add_robot(spec, statics, twin)
        self.dt = spec.params["sim.time_step"].nominal
        self.movers = movers
        if twin and spec.object_sleeping and movers:
            self._let_objects_fall_asleep()
        self._start = pb.saveState(physicsClientId=cid)

    def _add_robot(self, spec: TwinSpec, statics: list[int], twin: bool) -> None:
        """The robot's URDF at its initial pose, held there by position control; it never
        collides with the static bodies, and with `twin` it takes the twin's collision groups
        and servo gains."""

        assert spec.robot is not None
        cid = self.cid
        path, _ = loadable_urdf(spec.resolve(spec.robot.urdf))
        rid = pb.loadURDF(
            str(path),
            spec.robot.base_pose[:3],
            spec.robot.base_pose[3:],
            useFixedBase=spec.robot.fixed_base,
            flags=pb.URDF_USE_INERTIA_FROM_FILE,
            physicsClientId=cid,
        )
        ids = [
            i
            for i in range(pb.getNumJoints(rid, physicsClientId=cid))
            if pb.getJointInfo(rid, i, physicsClientId=cid)[2] != pb.JOINT_FIXED
        ]
        q0 = list(spec.robot.initial_joint_pos) or [0.0] * len(ids)
        for i, q in zip(ids, q0, strict=False):
            pb.resetJointState(rid, i, q, physicsClientId=cid)
        for s in statics:
            pb.setCollisionFilterPair(rid, s, -1, -1, 0, physicsClientId=cid)
        if twin:  # the twin's collision groups (twins/builder.py)
            for li in range(-1, pb.getNumJoints(rid, physicsClientId=cid)):
                g = ROBOT_GROUP | (STATIC_GROUP if li == -1 and spec.robot.fixed_base else 0)
                pb.setCollisionFilterGroupMask(rid, li, g, -1 & ~g, physicsClientId=cid)
        self.robot_id, self.joint_ids = rid, ids[: len(q0)]
        self._gains: dict[str, list[float]] = _twin_servo_gains(spec, len(q0)) if twin else {}
        pb.setJointMotorControlArray(
            rid,
            self.joint_ids,
            pb.POSITION_CONTROL,
            targetPositions=q0,
            **self._gains,
            physicsClientId=cid,
        )

    def _let_objects_fall_asleep(self) -> None:
        """The twin's resting objects sleep: here the plain PyBullet way, by enabling sleep and
        letting them settle for 1.25 sleep timeouts before the start state is saved."""

        for b in self.movers:
            pb.changeDynamics(
                b,
                -1,
                activationState=pb.ACTIVATION_STATE_ENABLE_SLEEPING,
                sleepThreshold=SLEEP_SPEED**2,
                physicsClientId=self.cid,
            )
        self.step(int(1.25 * SLEEP_TIMEOUT_S / self.dt))

    def reset(self) -> None:
        pb.restoreState(self._start, physicsClientId=self.cid)

    def step(self, n: int) -> None:
        cid = self.cid
        for _ in range(n):
            pb.stepSimulation(physicsClientId=cid)

    def replay(self, t: np.ndarray, commands: np.ndarray) -> np.ndarray:
        """The plainest replay loop that reads what a twin replay returns: at each sample
        set position targets, step to the next sample, read the joints and the objects'
        poses. Returns joint positions (K, n)."""
        cid, rid, ids, movers = self.cid, self.robot_id, self.joint_ids, self.movers
        pb.restoreState(self._start, physicsClientId=cid)
        steps = np.diff(np.rint((t - t[0]) / self.dt).astype(int), prepend=0)
        out = np.zeros((len(t), len(ids)))
        poses = np.zeros((len(t), len(movers), 7))
        for k in range(len(t)):
            for _ in range(steps[k]):
                pb.stepSimulation(physicsClientId=cid)
            out[k] = [s[0] for s in pb.getJointStates(rid, ids, physicsClientId=cid)]
            for i, b in enumerate(movers):
                p, q = pb.getBasePositionAndOrientation(b, physicsClientId=cid)
                poses[k, i, :3], poses[k, i, 3:] = p, q
            pb.setJointMotorControlArray(
                rid,
                ids,
                pb.POSITION_CONTROL,
                targetPositions=commands[k].tolist(),
                **self._gains,
                physicsClientId=cid,
            )
        return out

    def close(self) -> None:
        pb.disconnect(physicsClientId=self.cid)


def _configure_engine(cid: int, spec: TwinSpec, twin: bool) -> None:
    """Gravity and the twin's time step; with `twin`, also its solver iterations and
    deterministic overlapping pairs (PyBullet's defaults otherwise)."""
    pb.setGravity(0, 0, -9.81, physicsClientId=cid)
    pb.setPhysicsEngineParameter(
        fixedTimeStep=spec.params["sim.time_step"].nominal, physicsClientId=cid
    )
    if twin:
        pb.setPhysicsEngineParameter(
            numSolverIterations=int(spec.params["sim.solver_iterations"].nominal),
            deterministicOverlappingPairs=1,
            physicsClientId=cid,
        )


def _add_bodies(cid: int, spec: TwinSpec) -> tuple[list[int], list[int]]:
    """The ground plane, the objects and the table, as the twin has them (shapes, poses,
    masses, centres of mass, inertias) with PyBullet's default materials: (static body ids,
    moving body ids)."""
    statics, movers = [], []
    if spec.environment.ground:
        plane = pb.createCollisionShape(pb.GEOM_PLANE, physicsClientId=cid)
        statics.append(
            pb.createMultiBody(0, plane, -1, [0, 0, spec.environment.ground_z], physicsClientId=cid)
        )
    vals = spec.params.nominal()
    bodies = [*spec.objects] + ([spec.environment.table] if spec.environment.table else [])
    for o in bodies:
        mass = (
            0.0
            if o.static
            else (
                vals[f"{o.prefix}.mass"]
                if o.mass_from == "mass"
                else vals[f"{o.prefix}.density"] * o.volume
            )
        )
        diag, R = principal_axes(np.asarray(o.inertia_per_kg).reshape(3, 3))
        q = Rotation.from_matrix(R).as_quat()
        col = _collision_shape(cid, spec, o.shape)
        bid = pb.createMultiBody(
            mass, col, -1, o.pose[:3], o.pose[3:], o.com, q, physicsClientId=cid
        )
        if mass > 0:
            pb.changeDynamics(
                bid, -1, localInertiaDiagonal=(diag * mass).tolist(), physicsClientId=cid
            )
        if o.static:
            statics.append(bid)
        else:
            movers.append(bid)
    return statics, movers


def _collision_shape(cid: int, spec: TwinSpec, sh: Shape) -> int:
    """One object's collision shape (box, cylinder, sphere or its convex hulls) at its
    collision pose."""
    kw = {
        "collisionFramePosition": sh.collision_pose[:3],
        "collisionFrameOrientation": sh.collision_pose[3:],
        "physicsClientId": cid,
    }
    if sh.kind == "box":
        return pb.createCollisionShape(pb.GEOM_BOX, halfExtents=sh.size, **kw)
    if sh.kind == "cylinder":
        return pb.createCollisionShape(pb.GEOM_CYLINDER, radius=sh.size[0], height=sh.size[1], **kw)
    if sh.kind == "sphere":
        return pb.createCollisionShape(pb.GEOM_SPHERE, radius=sh.size[0], **kw)
    return pb.createCollisionShapeArray(
        [pb.GEOM_MESH] * len(sh.hulls),
        fileNames=[str(spec.resolve(h)) for h in sh.hulls],
        physicsClientId=cid,
    )


def _twin_servo_gains(spec: TwinSpec, n_joints: int) -> dict[str, list[float]]:
    """The twin's position/velocity gains and effort limits for the first `n_joints` joints,
    when every one of them is a servo; {} (PyBullet's defaults) otherwise."""
    r, nom = spec.robot, spec.params.nominal()
    assert r is not None
    names = [j.name for j in r.joints]
    pre = [f"robot.actuators.{n}" for n in names[:n_joints]]
    if not all(
        r.actuator(n) is not None and r.actuator(n).model == "servo"  # type: ignore[union-attr]
        for n in names[:n_joints]
    ):
        return {}
    dt = nom["sim.time_step"]
    return {
        "positionGains": [min(nom[f"{p}.bandwidth"] * dt, 1.0) for p in pre],
        "velocityGains": [nom[f"{p}.velocity_gain"] for p in pre],
        "forces": [nom[f"{p}.effort_limit"] for p in pre],
    }


def step_rate(step: Callable[[int], None], n: int) -> float:
    """Steps per second of `step(n)`."""
    t0 = time.perf_counter()
    step(n)
    return n / (time.perf_counter() - t0)
