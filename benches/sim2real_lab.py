"""Pieces of `bench sim2real` (benches/sim2real.py): the lab push twin, the lab's true
values in twin names, and push episodes run in the lab in-process.

Benchmarks may read the lab's truth (devices.lab); the app proper never does.

In-process lab episodes (`lab_episode`) step `LabSim` (MuJoCo, the lab's true physics,
latency and sensor noise) faster than real time and run the policy through the agent's
own pieces: `devices.robots.agent.policy_runner.OnnxPolicy` builds the observation (measured
joints, the newest good object pose from an `ObjectFeed`, the goal) and turns the output
into a command, `SafetyEnvelope` (the robot's default envelope) filters it, and the start
ramp blends it in as the agent does. What differs from the protocol path: the policy's
output is always ready within its tick (no threads), and the object poses come from the
lab's truth at the tracker's measured rate and age (`bench push_deploy`: 15 fps, pose age
~55 ms at the agent), spin dropped, with `track_std_m` noise, instead of from the camera
through the tracker. A run is judged by the lab's true object pose at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from benches.fit_lab import joint_names, lab_twin
from devices.lab.sim import LabSim
from devices.poses import drop_spin
from devices.robots.agent.object_poses import ObjectFeed
from devices.robots.agent.policy_runner import OnnxPolicy
from devices.robots.agent.safety import SafetyEnvelope
from devices.robots.agent.safety_config import default_config
from devices.robots.wire.policy_spec import PolicySpec
from policies.motion_primitives import primitive_actor, task_chain
from policies.randomization import Randomization
from policies.tasks import make_env
from twins.from_scan import PANDA, robot_into, support_in_object, table_from_plane
from twins.make import assemble, mesh_object, sim_params
from twins.scan_input import procedural_scan

OBJECT = "cylinder"
# PyBullet multiplies the two bodies' frictions of a contact; the lab's contacts take the
# object's (priority 1). The table and the robot at 1.0 make the object's friction the
# pair's, as in the lab (at their nominal 0.5 a fitted 0.11 was a pair friction of 0.055)
PAIR_FRICTION = {"env.table.friction": 1.0, "robot.material.friction": 1.0}
Vec = NDArray[np.float64]


def push_twin(folder: Path, cfg: Any) -> Any:
    """The scene's twin (objects and table from the scene description, as `twin build
    --procedural` makes them) with the lab Panda of bench fit: PD actuators with gravity
    compensation, the controller gains, force limits, rotor inertias and held-wrist
    friction a user knows (benches/fit_lab.lab_twin); the table's and the robot's
    friction 1.0 (`PAIR_FRICTION`); every other value nominal."""

    folder = Path(folder)
    robot_spec = lab_twin(folder / "robot_only", cfg)
    sc = procedural_scan()
    objects = []
    for o in sc.objects:
        obj, params, _ = mesh_object(
            o.name,
            o.mesh,
            tuple(o.pose),
            folder,
            density=500.0,
            source=sc.source,
            rgba=o.rgba,
            support=support_in_object(sc.table_plane, o.pose),
            observed=o.observed,
        )
        objects.append((obj, params))
    q0 = tuple(cfg.initial_joint_pos) + (0.0, 0.0)  # the lab's fingers are fixed closed
    robot, rparams, _ = robot_into(
        folder, PANDA, actuator="pd", initial_joint_pos=q0, time_step=float(cfg.timestep)
    )
    spec = assemble(
        "lab-push",
        (robot, rparams),
        objects,
        table_from_plane(sc),
        ground=False,
        sim=sim_params(),
        base_dir=folder,
    )
    known = [robot_spec.params[n] for n in robot_spec.params if n in spec.params]
    spec = replace(spec, params=spec.params.replace(*known))
    spec = spec.with_values({p.name: p.nominal for p in known} | PAIR_FRICTION)
    spec.save(folder)
    return spec


def true_values(cfg: Any, spec: Any) -> dict[str, float]:
    """The lab's truth in the twin's parameter names: joint damping and Coulomb friction,
    command latency, and the pushed object's mass (as density), friction and restitution.
    MuJoCo's contact takes the object's friction (it has contact priority), PyBullet
    multiplies both bodies': the table and the robot get 1.0, the object the lab's value."""

    names = joint_names(cfg)
    out: dict[str, float] = {}
    for i, n in enumerate(names):
        out[f"robot.joints.{n}.damping"] = float(cfg.joints.damping[i])
        out[f"robot.joints.{n}.friction"] = float(cfg.joints.frictionloss[i])
        out[f"robot.actuators.{n}.latency"] = float(cfg.latency_s)
    o = next(o for o in cfg.objects if o.name == OBJECT)
    r, h = spec.object(OBJECT).shape.size
    out[f"objects.{OBJECT}.density"] = float(o.mass / (math.pi * r * r * h))
    out[f"objects.{OBJECT}.friction"] = float(o.friction)
    out[f"objects.{OBJECT}.restitution"] = float(o.restitution)
    out["env.table.friction"] = 1.0
    out["robot.material.friction"] = 1.0
    return {k: v for k, v in out.items() if k in spec.params}


@dataclass(frozen=True)
class LabStart:
    """One episode's initial condition: the object's start pose and the goal (m)."""

    object_start: tuple[float, ...]
    goal: tuple[float, float]
    seed: int


def draw_starts(cfg: Any, n: int, seed: int, task: Any) -> list[LabStart]:
    """`n` starts drawn as the push task draws them (policies/tasks/push.py): the object
    within `object_jitter` of its place in the scene, the goal `goal_distance` away within
    `goal_spread_deg` of straight away from the robot base."""
    rng = np.random.default_rng(seed)
    base = np.asarray(next(o for o in cfg.objects if o.name == OBJECT).pose, float)
    out = []
    for k in range(n):
        pose = base.copy()
        pose[:2] += rng.uniform(-task.object_jitter, task.object_jitter, 2)
        away = math.atan2(pose[1], pose[0])
        ang = away + math.radians(rng.uniform(-task.goal_spread_deg, task.goal_spread_deg))
        d = rng.uniform(*task.goal_distance)
        goal = (pose[0] + d * math.cos(ang), pose[1] + d * math.sin(ang))
        out.append(LabStart(tuple(float(v) for v in pose), goal, seed * 1000 + k))
    return out


def lab_episode(
    cfg: Any,
    onnx: bytes,
    spec: Any,
    start: LabStart,
    episode_s: float,
    success_tol: float,
    ramp_s: float = 0.5,
    camera_hz: float = 15.0,
    pose_age_s: float = 0.055,
    track_std_m: float = 0.001,
    trace: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One push in the lab, in-process (see the module docstring): {"success", "distance"
    (m, true), "stopped" (why the agent's pieces stopped it, "" if it ran to the end)}.
    With `trace`, one `TraceRow` per control tick is appended to it (`lab_row`)."""

    sim = LabSim(cfg.scene, replace(cfg, seed=int(start.seed) % (2**31)))
    info = sim.info()
    sim.set_object(OBJECT, np.asarray(start.object_start, float), np.zeros(3), np.zeros(3))
    sim.run_for(0.1)  # settle on the table
    wire = spec.with_goal(object_goal=start.goal).to_dict()
    aspec = PolicySpec.from_dict(wire, robot_joints=info.joint_names)  # as the agent reads it
    feed = ObjectFeed()
    feed.expect([OBJECT], aspec.object_min_quality)
    policy = OnnxPolicy(onnx, aspec, info, feed)
    env = SafetyEnvelope(info, default_config(info), fk=sim.forward_kinematics)
    per = max(1, int(round(1.0 / (info.control_rate_hz * sim.dt))))
    ticks = int(round((episode_s + ramp_s) * info.control_rate_hz))
    rng = np.random.default_rng(start.seed + 1)
    pending: list[tuple[float, float, Vec]] = []  # (arrival, capture, pose)
    next_frame = sim.time
    stopped = ""
    spinless = next(o for o in cfg.objects if o.name == OBJECT).shape == "cylinder"

    def camera(now: float) -> None:  # frames: true pose, noisy, arriving pose_age_s later
        nonlocal next_frame
        while next_frame <= now + 1e-9:
            pose = sim.truth_object_poses()[OBJECT].copy()
            pose[:3] += rng.normal(0.0, track_std_m, 3)
            pose = drop_spin(pose) if spinless else pose
            pending.append((next_frame + pose_age_s, next_frame, pose))
            next_frame += 1.0 / camera_hz
        while pending and pending[0][0] <= now + 1e-9:
            _, tc, pose = pending.pop(0)
            feed.update(OBJECT, pose.tolist(), tc, 1.0, False, now)

    while feed.good(OBJECT) is None:  # the agent refuses to start without a pose
        camera(sim.time)
        sim.step(per)
    t0 = sim.time
    state = sim.read_state()
    env.start(state)
    prev = state.joint_pos.copy()
    ramp_from = state.joint_pos.copy()
    for _ in range(ticks):
        now = sim.time
        camera(now)
        state = sim.read_state()
        why = feed.stale(OBJECT, state.t, aspec.object_max_age_s, t0)
        if why is not None:
            stopped = why
            break
        raw = policy.raw_output(state)
        cmd = policy.to_command(raw, state)
        a = min(1.0, (now - t0) / ramp_s) if ramp_s > 0 else 1.0
        cmd = ramp_from + a * (cmd - ramp_from)
        res = env.apply("position", cmd, state, prev)
        if res.stop is not None:
            stopped = f"safety: {res.stop}"
            break
        sim.write_command("position", res.command)
        prev = res.command
        sim.step(per)
        if trace is not None:
            trace.append(lab_row(sim, sim.time - t0))
    if stopped:
        sim.hold()
        sim.run_for(0.3)
    final = sim.truth_object_poses()[OBJECT]
    dist = float(np.hypot(final[0] - start.goal[0], final[1] - start.goal[1]))
    return {"success": (not stopped) and dist < success_tol, "distance": dist, "stopped": stopped}


def lab_episodes(job: tuple[Any, bytes, Any, list[LabStart], float, float]) -> list[dict[str, Any]]:
    """`lab_episode` over several starts (module level: an executor job)."""
    cfg, onnx, spec, starts, episode_s, tol = job
    return [lab_episode(cfg, onnx, spec, s, episode_s, tol) for s in starts]


# -- traces: the same push in the twin and in the lab, tick by tick -------------------------
TOOL = "panda_grasptarget"


def _tilt_deg(quat_xyzw: Any) -> float:
    """Angle (deg) of a body's z axis from the vertical."""
    x, y = float(quat_xyzw[0]), float(quat_xyzw[1])
    return math.degrees(math.acos(max(-1.0, min(1.0, 1.0 - 2.0 * (x * x + y * y)))))


def _row(t: float, tool: Any, obj: Any, contacts: list[tuple[str, float]]) -> dict[str, Any]:
    obj = np.asarray(obj, float)
    return {
        "t": float(t),
        "tool": [float(v) for v in tool],
        "object": [float(v) for v in obj[:3]],
        "tilt_deg": _tilt_deg(obj[3:]),
        "contacts": contacts,  # (robot link, contact height m) with the object
    }


def lab_row(sim: Any, t: float) -> dict[str, Any]:
    """The lab's truth after one control tick: the tool point, the object, and the robot
    links touching the object with the contacts' heights."""
    m, d = sim.model, sim.data
    oid = m.body(OBJECT).id
    contacts = []
    for i in range(d.ncon):
        c = d.contact[i]
        b1, b2 = int(m.geom_bodyid[c.geom1]), int(m.geom_bodyid[c.geom2])
        if oid in (b1, b2):
            other = m.body(b2 if b1 == oid else b1).name
            if other.startswith("panda"):
                contacts.append((other, float(c.pos[2])))
    tool = d.xpos[m.body(TOOL).id]
    return _row(t, tool, sim.truth_object_poses()[OBJECT], contacts)


def twin_episode(
    twin: Any,
    task: Any,
    params: Any,
    start: LabStart,
    q0: Any,
    trace: list[dict[str, Any]] | None = None,
    noise: Any = None,
) -> dict[str, Any]:
    """The `push_ik` primitive with search vector `params` pushing from a lab start in
    `twin` (the push task replaying that start: joints at `q0`, the object and the goal
    as in the lab); {"success", "distance", "stopped"}, and with `trace` the same rows as
    `lab_episode`'s, so a twin's push can be set beside the lab's."""

    cond = {"start": list(q0), "object_start": list(start.object_start), "goal": list(start.goal)}
    conf = {**task.to_json(), "replay_starts": [cond], "replay_share": 1.0}
    env = make_env("push", twin, conf, Randomization(noise=noise) if noise else None)
    try:
        chain = task_chain(env)
        act = primitive_actor("push_ik", env.policy_spec, params, chain)
        obs, _ = env.reset(seed=int(start.seed))
        w = env.world
        while True:
            obs, _, term, trunc, info = env.step(act(obs))
            if trace is not None:
                contacts = w.robot_contacts(OBJECT)
                tool = (env._T_world_base @ chain.pose(env.q))[:3, 3]
                trace.append(_row(env.t, tool, w.object_pose(OBJECT), contacts))
            if term or trunc:
                break
        return {
            "success": bool(info.get("is_success", False)),
            "distance": float(info["distance"]),
            "stopped": str(env.stopped),
        }
    finally:
        env.close()


def trace_summary(trace: list[dict[str, Any]]) -> dict[str, Any]:
    """What tells a twin's push from the lab's: the object's largest tilt, the robot links
    that touched it, the contacts' heights (10/50/90 %) and the first contact's time."""
    zs = [z for r in trace for _, z in r["contacts"]]
    links = sorted({n for r in trace for n, _ in r["contacts"]})
    first = next((r["t"] for r in trace if r["contacts"]), None)
    return {
        "max_tilt_deg": round(max((r["tilt_deg"] for r in trace), default=0.0), 1),
        "links": links,
        "contact_z": [round(float(v), 3) for v in np.percentile(zs, [10, 50, 90])] if zs else [],
        "first_contact_s": None if first is None else round(first, 2),
    }
