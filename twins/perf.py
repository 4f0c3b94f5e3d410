"""A bare PyBullet world with the same bodies as a twin, for step-rate comparisons.

Same robot URDF and initial pose, same collision shapes and object poses, PyBullet's
default engine settings, no read-back, no actuator models, no determinism settings."""

from __future__ import annotations

import time
from collections.abc import Callable

import pybullet as pb

from twins.spec import TwinSpec


class BareWorld:
    def __init__(self, spec: TwinSpec) -> None:
        self.cid = cid = pb.connect(pb.DIRECT)
        pb.setGravity(0, 0, -9.81, physicsClientId=cid)
        pb.setPhysicsEngineParameter(fixedTimeStep=spec.params["sim.time_step"].nominal,
                                     physicsClientId=cid)
        statics = []
        bodies = [*spec.objects] + ([spec.environment.table] if spec.environment.table else [])
        for o in bodies:
            sh = o.shape
            kw = {"collisionFramePosition": sh.collision_pose[:3],
                  "collisionFrameOrientation": sh.collision_pose[3:], "physicsClientId": cid}
            if sh.kind == "box":
                col = pb.createCollisionShape(pb.GEOM_BOX, halfExtents=sh.size, **kw)
            elif sh.kind == "cylinder":
                col = pb.createCollisionShape(pb.GEOM_CYLINDER, radius=sh.size[0],
                                              height=sh.size[1], **kw)
            elif sh.kind == "sphere":
                col = pb.createCollisionShape(pb.GEOM_SPHERE, radius=sh.size[0], **kw)
            else:
                col = pb.createCollisionShapeArray(
                    [pb.GEOM_MESH] * len(sh.hulls),
                    fileNames=[str(spec.resolve(h)) for h in sh.hulls], physicsClientId=cid)
            bid = pb.createMultiBody(0.0 if o.static else 0.2, col, -1, o.pose[:3], o.pose[3:],
                                     physicsClientId=cid)
            if o.static:
                statics.append(bid)
        if spec.robot is not None:
            from twins.urdf import loadable_urdf

            path, _ = loadable_urdf(spec.resolve(spec.robot.urdf))
            rid = pb.loadURDF(str(path), spec.robot.base_pose[:3], spec.robot.base_pose[3:],
                              useFixedBase=spec.robot.fixed_base,
                              flags=pb.URDF_USE_INERTIA_FROM_FILE, physicsClientId=cid)
            ids = [i for i in range(pb.getNumJoints(rid, physicsClientId=cid))
                   if pb.getJointInfo(rid, i, physicsClientId=cid)[2] != pb.JOINT_FIXED]
            q0 = list(spec.robot.initial_joint_pos) or [0.0] * len(ids)
            for i, q in zip(ids, q0, strict=False):
                pb.resetJointState(rid, i, q, physicsClientId=cid)
            for s in statics:
                pb.setCollisionFilterPair(rid, s, -1, -1, 0, physicsClientId=cid)
            pb.setJointMotorControlArray(rid, ids[:len(q0)], pb.POSITION_CONTROL,
                                         targetPositions=q0, physicsClientId=cid)

    def step(self, n: int) -> None:
        cid = self.cid
        for _ in range(n):
            pb.stepSimulation(physicsClientId=cid)

    def close(self) -> None:
        pb.disconnect(physicsClientId=self.cid)


def step_rate(step: Callable[[int], None], n: int) -> float:
    """Steps per second of `step(n)`."""
    t0 = time.perf_counter()
    step(n)
    return n / (time.perf_counter() - t0)
