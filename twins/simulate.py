"""Replay recorded commands in a twin, and run policies forward (docs/ARCHITECTURE.md §1, §4).

`replay` starts from the recording's first robot and object state (objects with the
velocity their first samples show, twins/object_motion.py) and drives the robot with
its `robot/command` channel, open loop, through the twin's actuator and latency models. The
loop is lean on purpose (a fit runs it thousands of times): commands are precomputed per
physics step, PyBullet is called only when a command changes (servo targets) or every step
for torque-like actuators, and states are read only at the recording's sample times.
Samples fall on the nearest physics step (at most dt/2 away). A recording that says when
each command reached the robot's controller (`robot/command_delay`) has each command
applied from then (plus the twin's latency) rather than from its sample time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from devices.poses import POSE_UNIT, matrix_to_pose
from devices.trajectory import COMMAND_DELAY, Trajectory
from twins import sleeping
from twins.actuators import Actuators, step_commands
from twins.builder import TwinWorld
from twins.engine import pb
from twins.errors import TwinError
from twins.object_motion import FALLING_KEY, TWIST_KEY, start_twist, with_initial_object_state
from twins.spec import TwinSpec

MAX_JOINT_VEL = 1e3  # rad/s (or m/s): beyond this a twin has exploded
MAX_OBJECT_DIST = 1e2  # m from the origin


def _names(meta: Mapping[str, Any], key: str, n: int, fallback: list[str], what: str) -> list[str]:
    names = meta.get(key)
    if names is not None:
        names = [str(x) for x in names]
        if len(names) != n:
            raise TwinError(
                f"trajectory meta '{key}' lists {len(names)} joints but {what} has {n} columns"
            )
        return names
    if n > len(fallback):
        raise TwinError(
            f"{what} has {n} columns but the twin has only {len(fallback)} "
            f"candidate joints ({', '.join(fallback)})"
        )
    return fallback[:n]


def command_joints(spec: TwinSpec, traj: Trajectory) -> list[str]:
    """Joint names of the `robot/command` columns (meta 'command_joints', else
    'joint_names' when the widths agree, else the twin's actuated joints in order)."""
    assert spec.robot is not None
    n = traj["robot/command"].shape[1]
    acted = [a.joint for a in spec.robot.actuators]
    if "command_joints" in traj.meta:
        return _names(traj.meta, "command_joints", n, acted, "robot/command")
    jn = traj.meta.get("joint_names")
    if jn is not None and len(jn) == n and all(str(j) in acted for j in jn):
        return [str(j) for j in jn]
    return _names({}, "", n, acted, "robot/command")


def command_times(traj: Trajectory) -> np.ndarray:
    """When each `robot/command` row reached the robot's controller: `t + robot/command_delay`
    where the recording has it (rows without a delay: their sample time), kept
    non-decreasing; the sample times `t` otherwise (the command is taken to act at once)."""
    t = np.asarray(traj.t, float)
    if COMMAND_DELAY not in traj.channels:
        return t
    d = np.asarray(traj[COMMAND_DELAY], float)[:, 0]
    return np.maximum.accumulate(t + np.where(np.isfinite(d), d, 0.0))


@lru_cache(maxsize=256)
def _rotation_of(T_bytes: bytes) -> np.ndarray:
    """The quaternion (xyzw) of a 4x4 transform given as bytes: a body's fixed centre-of-mass
    offset, converted once (scipy's conversion costs ~0.5 ms a call, 3 objects x every
    replay)."""
    q = matrix_to_pose(np.frombuffer(T_bytes, dtype=float).reshape(4, 4))[3:]
    q.setflags(write=False)
    return q


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`np.cross` of 3-vectors (broadcast over rows) with the same operations, without its
    axis bookkeeping (it costs more than the products on a replay's few hundred rows)."""
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    return np.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


def _com_to_body(pos: np.ndarray, quat: np.ndarray, T_com_body: np.ndarray) -> np.ndarray:
    """Body-frame poses (K, 7) from centre-of-mass poses (K, 3) + (K, 4) xyzw, in plain
    numpy (scipy's Rotation costs more than the rest of a replay's bookkeeping)."""
    c = _rotation_of(np.ascontiguousarray(T_com_body, dtype=float).tobytes())
    u, w = quat[:, :3], quat[:, 3:]
    v = np.asarray(T_com_body[:3, 3], float)
    uv = _cross(u, v)
    p = pos + v + 2 * w * uv + 2 * _cross(u, uv)
    cu, cw = c[:3], c[3]
    q = np.concatenate([w * cu + cw * u + _cross(u, cu), cw * w - (u @ cu)[:, None]], axis=1)
    q[q[:, 3] < 0] *= -1
    return np.concatenate([p, q], axis=1)


def _check_finite(
    t: np.ndarray,
    q: np.ndarray,
    qd: np.ndarray,
    joints: list[str],
    objs: dict[str, np.ndarray],
    twin: str,
) -> None:
    """TwinError naming the body that left the physical range first, and when."""
    first: list[tuple[int, str]] = []
    for i, name in enumerate(joints):
        bad = ~np.isfinite(q[:, i]) | ~np.isfinite(qd[:, i]) | (np.abs(qd[:, i]) > MAX_JOINT_VEL)
        if bad.any():
            k = int(np.argmax(bad))
            first.append(
                (k, f"joint '{name}' at t={t[k]:.4f} s (q={q[k, i]:.4g}, qd={qd[k, i]:.4g})")
            )
    for name, P in objs.items():
        bad = ~np.all(np.isfinite(P), axis=1) | (np.linalg.norm(P[:, :3], axis=1) > MAX_OBJECT_DIST)
        if bad.any():
            k = int(np.argmax(bad))
            first.append(
                (
                    k,
                    f"object '{name}' at t={t[k]:.4f} s (position "
                    f"{np.round(P[k, :3], 3).tolist()} m)",
                )
            )
    if first:
        what = min(first, key=lambda x: x[0])[1]
        raise TwinError(
            f"twin '{twin}' exploded: {what}; lower sim.time_step, raise "
            "sim.substeps or soften gains and damping"
        )


def replay(spec: TwinSpec, values: Mapping[str, float] | None, real: Trajectory) -> Trajectory:
    """Build the twin, replay `real`'s commands from its initial state, return a sim
    Trajectory on the same time base (TwinError on explosion or mismatched channels)."""
    if TWIST_KEY not in real.meta:  # free objects start as the first samples say
        real = with_initial_object_state(real)
    with TwinWorld(spec, values) as world:
        return replay_in(world, real)


def replay_in(world: TwinWorld, real: Trajectory) -> Trajectory:
    """`replay` in an already built world (reset first: every rollout starts the same)."""
    spec = world.spec
    real.check_finite(f"trajectory replayed in twin '{spec.name}'")
    world.reset()
    t = np.asarray(real.t)
    joints = [j.name for j in spec.robot.joints] if spec.robot else []
    _start_from_recording(world, real, joints)
    # the command schedule, one row per physics step
    steps = int(round((t[-1] - t[0]) / world.dt))
    rec_step = np.clip(np.rint((t - t[0]) / world.dt).astype(int), 0, steps)
    plan = _CommandPlan.of(world, real, t, steps) if "robot/command" in real.channels else None
    run = _run_and_record(world, joints, plan, rec_step.tolist(), steps)
    objs = {n: _com_to_body(*run.objects[n], world.bodies[n].T_com_body) for n in run.objects}
    _check_finite(t, run.Q, run.QD, joints, objs, spec.name)
    channels: dict[str, np.ndarray] = {}
    units: dict[str, str] = {}
    if joints:
        channels["robot/joint_pos"], channels["robot/joint_vel"] = run.Q, run.QD
        unit = {"prismatic": ("m", "m/s")}
        kind = spec.robot.joints[0].kind if spec.robot is not None else "revolute"
        units["robot/joint_pos"], units["robot/joint_vel"] = unit.get(kind, ("rad", "rad/s"))
    meta = {
        "twin": spec.name,
        "replay_of": dict(real.meta).get("name", ""),
        "joint_names": joints,
        "params": dict(world.values),
        "time_step": world.dt,
    }
    if plan is not None:
        bank = plan.bank
        if len(bank.pd) or len(bank.tq):
            channels["robot/joint_effort"] = plan.efforts(joints, rec_step, steps, run)
            units["robot/joint_effort"] = "N*m"
        channels["robot/command"] = real["robot/command"]
        units["robot/command"] = real.units.get("robot/command", "")
        meta["command_joints"] = bank.joints
    for n, P in objs.items():
        channels[f"objects/{n}/pose"] = P
        units[f"objects/{n}/pose"] = POSE_UNIT
    return Trajectory(t, channels, units, "sim", meta)


def _start_from_recording(world: TwinWorld, real: Trajectory, joints: list[str]) -> None:
    """The recording's first sample as the world's state: joints, and each recorded object
    placed (with the twist it was thrown with, when the recording carries one)."""
    spec = world.spec
    if joints and "robot/joint_pos" in real.channels:
        st_names = _names(
            real.meta, "joint_names", real["robot/joint_pos"].shape[1], joints, "robot/joint_pos"
        )
        q0 = real["robot/joint_pos"][0]
        qd0 = real["robot/joint_vel"][0] if "robot/joint_vel" in real.channels else None
        world.set_joint_state(q0, qd0, st_names)
    obj_names = [o.name for o in spec.objects]
    twists = dict(real.meta.get(TWIST_KEY) or {})
    falling = dict(real.meta.get(FALLING_KEY) or {})
    g = float(world.values.get("sim.gravity", 9.81))
    # sleepers about to be placed wake together: one throw-away step for all of them, not
    # one each (twins/sleeping.py; a wake step costs a saved state)
    sleeping.wake_asleep(world, [n for n in obj_names if f"objects/{n}/pose" in real.channels])
    for name in obj_names:
        ch = f"objects/{name}/pose"
        if ch in real.channels:
            tw, p0 = twists.get(name), real[ch][0]
            com = None
            if tw is not None:
                T_bc = world.bodies[name].T_body_com
                com = start_twist(p0, tw, T_bc, bool(falling.get(name)), g, world.dt)
            world.set_object_pose(name, p0, com)


@dataclass
class _CommandPlan:
    """The recorded commands as the actuators will apply them, per physics step (latency
    and hold before the first command included); `changed`: the steps where they change."""

    bank: Actuators
    U_ext: np.ndarray
    u_steps: np.ndarray
    changed: np.ndarray
    tau_steps: np.ndarray

    @classmethod
    def of(cls, world: TwinWorld, real: Trajectory, t: np.ndarray, steps: int) -> _CommandPlan:
        spec, dt = world.spec, world.dt
        if spec.robot is None:
            raise TwinError(f"twin '{spec.name}' has no robot but the trajectory has commands")
        cj = command_joints(spec, real)
        bank = Actuators(world, cj)
        bank.units_ok(real.units.get("robot/command", ""))
        q_now, _ = world.joint_state(cj)
        U_ext = np.vstack([bank.hold_command(q_now), real["robot/command"]])
        ts = t[0] + np.arange(steps) * dt
        u_steps = step_commands(command_times(real), U_ext, ts, dt, bank.latency)
        changed = np.ones(steps, dtype=bool)
        changed[1:] = np.any(u_steps[1:] != u_steps[:-1], axis=1)
        return cls(bank, U_ext, u_steps, changed, bank.torques(u_steps))

    def efforts(
        self, joints: list[str], rec_step: np.ndarray, steps: int, run: _Recorded
    ) -> np.ndarray:
        """Joint efforts at the samples: the actuator model's, except PD joints, which
        report the torque they applied over the last step (as a robot does)."""
        bank, K = self.bank, len(rec_step)
        at = np.clip(rec_step - 1, 0, max(steps - 1, 0))
        u_at = self.u_steps[at] if steps else self.U_ext[[0] * K]
        sel = [joints.index(j) for j in bank.joints]
        eff = np.stack([bank.effort(u_at[i], run.Q[i, sel], run.QD[i, sel]) for i in range(K)])
        if run.PDT is not None:
            ok = np.isfinite(run.PDT[:, 0])
            eff[np.ix_(ok, bank.pd)] = run.PDT[ok]
        return eff


@dataclass
class _Recorded:
    """What a replay sampled: joint positions and velocities, each object's centre of mass
    (position, quaternion) and the PD joints' applied torques (None without PD joints)."""

    Q: np.ndarray
    QD: np.ndarray
    objects: dict[str, tuple[np.ndarray, np.ndarray]]
    PDT: np.ndarray | None


def _run_and_record(
    world: TwinWorld,
    joints: list[str],
    plan: _CommandPlan | None,
    rec_at: list[int],
    steps: int,
) -> _Recorded:
    """Step the world `steps` times, applying the plan's commands where they change and
    sampling the state after the steps `rec_at` names (the hot loop of every replay)."""
    spec, cid, rid = world.spec, world.cid, world.robot_id
    jids = world.joint_ids(joints) if joints else []
    obj_names = [o.name for o in spec.objects]
    K = len(rec_at)
    Q, QD = np.zeros((K, len(jids))), np.zeros((K, len(jids)))
    com_pos = {n: np.zeros((K, 3)) for n in obj_names}
    com_orn = {n: np.zeros((K, 4)) for n in obj_names}
    bodies = {n: world.bodies[n].body_id for n in obj_names}
    get_js, get_base, step = pb.getJointStates, pb.getBasePositionAndOrientation, pb.stepSimulation
    bank = plan.bank if plan is not None else None

    body_ids = list(bodies.values())
    # what PyBullet returns per recorded sample, converted to arrays once after the run
    js_rows: list[Any] = []
    base_rows: list[Any] = []

    # PD joints report the torque they applied over the last step (as a robot does), not
    # one recomputed from the state after it
    PDT = np.full((K, len(bank.pd)), np.nan) if bank is not None and len(bank.pd) else None

    def record(k: int) -> None:
        if PDT is not None and bank is not None and bank.last_pd_tau is not None:
            PDT[k] = bank.last_pd_tau
        if jids:
            js_rows.append(get_js(rid, jids, physicsClientId=cid))
        if body_ids:
            base_rows.append([get_base(b, physicsClientId=cid) for b in body_ids])

    changed_at = plan.changed.tolist() if plan is not None else []  # plain bools: cheaper
    k = 0
    while k < K and rec_at[k] == 0:
        record(k)
        k += 1
    per_step = bank is not None and bank.needs_per_step
    # servo-only commands (the common arm case): targets prepared once, one call per change
    fast = bank is not None and not per_step
    if fast:
        assert bank is not None and plan is not None
        set_motors, sv_ids, mode = pb.setJointMotorControlArray, bank.sv_ids, pb.POSITION_CONTROL
        targets = plan.u_steps[:, bank.sv].tolist()
        zeros = [0.0] * len(sv_ids)
        kp, kd, force = bank.sv_kp, bank.sv_kd, bank.sv_force
    for s in range(steps):
        if fast:
            if changed_at[s]:
                set_motors(
                    rid,
                    sv_ids,
                    mode,
                    targetPositions=targets[s],
                    targetVelocities=zeros,
                    positionGains=kp,
                    velocityGains=kd,
                    forces=force,
                    physicsClientId=cid,
                )
        elif bank is not None and plan is not None:
            if changed_at[s]:
                bank.apply(plan.u_steps[s], plan.tau_steps[s])
            if per_step:
                bank.before_step()
        step(physicsClientId=cid)
        while k < K and rec_at[k] == s + 1:
            record(k)
            k += 1
    if js_rows:
        Q[:k] = [[j[0] for j in st] for st in js_rows]
        QD[:k] = [[j[1] for j in st] for st in js_rows]
    for i, name in enumerate(bodies):
        if base_rows:
            com_pos[name][:k] = [r[i][0] for r in base_rows]
            com_orn[name][:k] = [r[i][1] for r in base_rows]
    return _Recorded(Q, QD, {n: (com_pos[n], com_orn[n]) for n in obj_names}, PDT)


Policy = Callable[[float, Mapping[str, np.ndarray]], np.ndarray]


def rollout(
    world: TwinWorld,
    policy: Policy,
    duration: float,
    control_rate_hz: float,
    unit: str = "rad",
    joints: list[str] | None = None,
    reset: bool = True,
) -> Trajectory:
    """Run `policy(t, obs) -> command` in closed loop at `control_rate_hz` for `duration`
    seconds. obs holds `robot/joint_pos`, `robot/joint_vel` and `objects/<name>/pose`.
    Commands pass through the actuator models, each joint's latency included."""
    spec = world.spec
    if reset:
        world.reset()
    joints = joints or [a.joint for a in spec.robot.actuators] if spec.robot else []
    bank = Actuators(world, joints)
    bank.units_ok(unit)
    per_ctrl = max(1, int(round(1.0 / (control_rate_hz * world.dt))))
    n_ctrl = int(round(duration * control_rate_hz))
    history_t: list[float] = []
    history_u: list[np.ndarray] = []
    T, Q, QD, U = [], [], [], []
    P: dict[str, list[np.ndarray]] = {o.name: [] for o in spec.objects}
    now = 0.0
    q0, _ = world.joint_state(joints)
    current = bank.hold_command(q0)
    for c in range(n_ctrl):
        q, qd = world.joint_state()
        obs = {"robot/joint_pos": q, "robot/joint_vel": qd}
        for name in P:
            obs[f"objects/{name}/pose"] = world.object_pose(name)
            P[name].append(obs[f"objects/{name}/pose"])
        u = np.asarray(policy(now, obs), dtype=float).reshape(-1)
        if u.shape != (len(joints),) or not np.all(np.isfinite(u)):
            raise TwinError(
                f"policy returned {u.tolist()} at t={now:.3f} s; expected "
                f"{len(joints)} finite values for {joints}"
            )
        T.append(now)
        Q.append(q)
        QD.append(qd)
        U.append(u)
        history_t.append(now)
        history_u.append(u)
        for _ in range(per_ctrl):
            eff = current.copy()
            for j in range(len(joints)):
                i = (
                    int(
                        np.searchsorted(
                            np.asarray(history_t) + bank.latency[j], now + 1e-9, side="right"
                        )
                    )
                    - 1
                )
                if i >= 0:
                    eff[j] = history_u[i][j]
            if c == 0 or not np.array_equal(eff, current) or bank.needs_per_step:
                bank.apply(eff)
                current = eff
            if bank.needs_per_step:
                bank.before_step()
            world.step()
            now += world.dt
    t = np.asarray(T)
    objs = {n: np.asarray(v) for n, v in P.items()}
    jn = [j.name for j in spec.robot.joints] if spec.robot else []
    _check_finite(t, np.asarray(Q), np.asarray(QD), jn, objs, spec.name)
    channels = {
        "robot/joint_pos": np.asarray(Q),
        "robot/joint_vel": np.asarray(QD),
        "robot/command": np.asarray(U),
    }
    units = {"robot/joint_pos": "rad", "robot/joint_vel": "rad/s", "robot/command": unit}
    for n, arr in objs.items():
        channels[f"objects/{n}/pose"] = arr
        units[f"objects/{n}/pose"] = POSE_UNIT
    return Trajectory(
        t,
        channels,
        units,
        "sim",
        {
            "twin": spec.name,
            "joint_names": jn,
            "command_joints": joints,
            "control_rate_hz": control_rate_hz,
        },
    )
