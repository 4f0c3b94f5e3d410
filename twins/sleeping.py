"""Resting objects sleep until something touches them (TwinSpec.object_sleeping).

Three boxes resting on a table cost PyBullet about as much as the whole Panda (their contacts
are solved every step although nothing moves); asleep they cost nothing. Bullet wakes a
sleeping body when an awake body (the robot, a moving object) touches it, and puts a body to
sleep after it has moved less than `SLEEP_SPEED` for `SLEEP_TIMEOUT_S` seconds.

Determinism from `TwinWorld.reset()` needs care, because PyBullet saves none of Bullet's
sleep state: the per-body sleep timer is not restored (and ACTIVATION_STATE_SLEEP is only
honoured once it has run out), a sleeping body ignores a velocity or pose set before the
next step, and its broad-phase box does not follow `resetBasePositionAndOrientation`, so
after parting bodies (`TwinWorld.flush_contacts`) it would keep stale contacts and be
missed by moving bodies. So a reset wakes everything with one throw-away step
(`wake_all`), parts the bodies, restores, and puts the sleepers to sleep at home with one
zero-gravity step of 2 x the timeout while the robot and other objects are parked away
(`put_to_sleep`); the same at every reset. Which objects may sleep is decided once, at
build time, by `resting`: a resting object starts from the pose it settles at (if more
than SNAP from the spec's); an object that moves at the start (falls, slides) stays awake
and never sleeps (its timer could not be made deterministic).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from twins.engine import pb

if TYPE_CHECKING:
    from twins.builder import TwinWorld

SLEEP_TIMEOUT_S = 2.0  # btMultiBody's sleep timeout (PyBullet 3.2.x does not expose it)
SLEEP_SPEED = 0.01  # m/s (and rad/s): Bullet's default is 0.22 (on |v|^2 + |w|^2),
#                           which would freeze an object rolling slowly for 2 s
REST_PROBE_S = 0.2  # the start-up check for objects at rest
REST_TOL_M = 2e-3  # an object that moves more than this in the probe is not at rest
REST_TOL_RAD = 2e-2
SNAP_M = 1e-4  # a resting object further than this from its start starts settled
SNAP_RAD = 1e-3


def set_sleeping(world: TwinWorld, body: int, can_sleep: bool, wake: bool = True) -> None:
    state = (
        pb.ACTIVATION_STATE_ENABLE_SLEEPING if can_sleep else pb.ACTIVATION_STATE_DISABLE_SLEEPING
    )
    pb.changeDynamics(
        body, -1, activationState=state, sleepThreshold=SLEEP_SPEED**2, physicsClientId=world.cid
    )
    if wake:
        pb.changeDynamics(
            body, -1, activationState=pb.ACTIVATION_STATE_WAKE_UP, physicsClientId=world.cid
        )


def dynamic_objects(world: TwinWorld) -> list[str]:
    return [o.name for o in world.spec.objects if not o.static]


Settled = dict[str, tuple[tuple[float, ...], tuple[float, ...]] | None]


def resting(world: TwinWorld) -> Settled:
    """Objects at rest at the start, with the centre-of-mass pose (pos, quat) they settle at
    where it is more than SNAP from the start (None: they start where they are).

    The world runs REST_PROBE_S seconds from its current state, everything awake, robot
    holding. At rest: moved at most REST_TOL from the start (convex hulls rest about 1 mm
    higher than the mesh: PyBullet's collision margin) and still over the probe's last
    quarter (under 1 mm/s). Leaves the world in the state it found."""
    names = dynamic_objects(world)
    if not names:
        return {}
    cid = world.cid
    for n in names:
        set_sleeping(world, world.bodies[n].body_id, False)
    state = world.save_state()
    start = {n: world.object_pose(n) for n in names}
    n_probe = max(4, int(round(REST_PROBE_S / world.dt)))
    world.step(n_probe - n_probe // 4)
    late = {n: world.object_pose(n) for n in names}
    world.step(n_probe // 4)
    out: Settled = {}
    for n in names:
        p = world.object_pose(n)
        dq = abs(float(np.dot(p[3:], start[n][3:])))
        angle = 2 * np.arccos(min(1.0, dq))
        still = np.linalg.norm(p[:3] - late[n][:3]) <= 1e-3 * (n_probe // 4) * world.dt
        if np.linalg.norm(p[:3] - start[n][:3]) <= REST_TOL_M and angle <= REST_TOL_RAD and still:
            b = world.bodies[n].body_id
            if np.linalg.norm(p[:3] - start[n][:3]) > SNAP_M or angle > SNAP_RAD:
                pos, orn = pb.getBasePositionAndOrientation(b, physicsClientId=cid)
                out[n] = (tuple(pos), tuple(orn))
            else:
                out[n] = None
    world.flush_contacts()
    pb.restoreState(state, physicsClientId=cid)
    pb.removeState(state, physicsClientId=cid)
    return out


def wake_all(world: TwinWorld) -> None:
    """Every object awake and unable to sleep, by one throw-away step (the caller restores a
    state afterwards). Needed before parting the bodies: a sleeping body's broad-phase box
    is not moved with it, so it would keep stale contacts and be missed after a restore."""
    names = dynamic_objects(world)
    for n in names:
        set_sleeping(world, world.bodies[n].body_id, False)
    if names and world.spec.object_sleeping:
        pb.stepSimulation(physicsClientId=world.cid)


def put_to_sleep(world: TwinWorld, state: int, sleepers: list[str]) -> None:
    """Restore `state` with `sleepers` asleep at their poses in it, their timers run out.

    With the robot and the other objects parted, the sleepers at home run one zero-gravity
    step of 2 x the timeout (their broad-phase boxes and contacts with the static bodies
    are made there, the same at every reset); then `state` is restored."""
    cid = world.cid
    world.flush_contacts()
    pb.restoreState(state, physicsClientId=cid)
    if not sleepers:
        return
    far = 0
    for name, ref in world.bodies.items():
        if name not in sleepers and name in dynamic_objects(world):
            far += 1
            pb.resetBasePositionAndOrientation(
                ref.body_id, (1e3 * far, -1e3, 1e3), (0, 0, 0, 1), physicsClientId=cid
            )
    if world.robot_id is not None:
        pb.resetBasePositionAndOrientation(
            world.robot_id, (-1e3, -1e3, 1e3), (0, 0, 0, 1), physicsClientId=cid
        )
    for n in sleepers:
        b = world.bodies[n].body_id
        set_sleeping(world, b, True)
        pb.resetBaseVelocity(b, (0, 0, 0), (0, 0, 0), physicsClientId=cid)
    v = world.values
    pb.setGravity(0, 0, 0, physicsClientId=cid)
    pb.setPhysicsEngineParameter(fixedTimeStep=2 * SLEEP_TIMEOUT_S, physicsClientId=cid)
    pb.stepSimulation(physicsClientId=cid)
    pb.setPhysicsEngineParameter(fixedTimeStep=v["sim.time_step"], physicsClientId=cid)
    pb.setGravity(0, 0, -v["sim.gravity"], physicsClientId=cid)
    pb.restoreState(state, physicsClientId=cid)


def wake(world: TwinWorld, names: list[str]) -> None:
    """Wake `names` now and keep them awake until the next reset. A sleeping body ignores a
    velocity or pose set before the next step (PyBullet's ACTIVATION_STATE_WAKE_UP takes
    effect only then), so one step runs and the state is restored (contacts keep that
    step's warm-start impulses; sleep timers run one step on: deterministic, not exact)."""
    cid = world.cid
    state = world.save_state()
    for n in names:
        set_sleeping(world, world.bodies[n].body_id, False)
    pb.stepSimulation(physicsClientId=cid)
    pb.restoreState(state, physicsClientId=cid)
    pb.removeState(state, physicsClientId=cid)


def wake_asleep(world: TwinWorld, names: list[str]) -> None:
    """`wake` those of `names` that sleep now (sleepers not woken since the last reset),
    all with one step, and mark them woken: placing several objects after a reset then
    costs one throw-away step and one saved state, not one each."""
    asleep = [n for n in names if n in world.sleepers and n not in world._woken]
    if asleep:
        wake(world, asleep)
        world._woken.update(asleep)
