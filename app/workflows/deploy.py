"""Deploy: a trained policy onto a connected robot, predicted first, recorded always.

    plan = plan_deploy(project, client, policy_id)        # spec checked, shadow run in the twin
    res = run_to_end(deploy_job(project, client, plan))   # upload, run, record -> artifacts
    fit_id = run_to_end(refit_job(project, res.trajectory_id))   # "Send to Real2Sim"

1. `check_robot(spec, info)`: the policy's spec against what the robot reports (joint names,
   control rate, command mode, observation terms its agent's policy runner provides);
   PolicyError naming every difference, before anything is uploaded.
2. `shadow_run`: the policy's ONNX model in the twin it was trained in, from the robot's
   measured joint positions to the deployment goal: predicted success, final error and
   joint curves.
   A push policy (observing `object_pose`) needs an `ObjectSource` (the robot's camera
   through the object tracker, app/workflows/object_feed.py): the object's pose now is the
   shadow run's start, and the goal is drawn around it (or given).
3. `deploy_job`: upload, run inside the agent's envelope with its start ramp, stream
   command vs measured as progress, stop at the end, on the Stop button, on error or
   cancel (the robot is always left stopped), and save what happened: a `trajectory`
   artifact (inputs: the policy) and a `run` artifact (run.json: success by the task's
   criterion on the measured state, predicted vs real; inputs: policy, trajectory). For a
   push policy a feeder thread streams the tracked object pose to the agent from before
   the start to the end (the agent stops the policy when tracking goes stale or lost); the
   outcome is judged on the last good tracked pose, and the streamed poses are saved with
   the run (object_poses.npz) with the feed's numbers (frames, lost, pose age).
4. `refit_request` / `refit_job`: the run's recording added to the recordings of the fit the
   twin came from, fitted again with that fit's settings (a new `fit` artifact).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.jobs import Job, Progress
from app.project import Project, ProjectError
from app.workflows.object_feed import (
    ObjectPoseFeeder,
    ObjectSource,
    object_source,
    save_poses,
    start_feed,
    track_now,
)
from app.workflows.train import load_policy
from app.workflows.twin import load_twin
from devices.errors import DeviceError
from devices.robots.client import RobotClient
from devices.robots.driver import RobotInfo
from devices.robots.policy_runner import OBS_TERMS as AGENT_TERMS
from policies.errors import PolicyError
from policies.policy import Policy
from policies.spec import PolicySpec
from policies.tasks import get_task, task_config
from policies.tasks.base import TaskConfig
from resources import atomic
from twins.spec import TwinSpec

log = logging.getLogger(__name__)

SETTLE_VEL = 0.01  # rad/s: the robot counts as stopped below this on every joint
SETTLE_S = 1.5  # longest wait for the robot to come to rest after a stop


def check_robot(spec: PolicySpec, info: RobotInfo) -> None:
    """PolicyError naming every way this robot cannot run this policy as trained."""
    problems = []
    if tuple(info.joint_names) != spec.joints:
        problems.append(
            f"joints: policy {list(spec.joints)}, robot {info.name} {list(info.joint_names)}"
        )
    if abs(info.control_rate_hz - spec.control_rate_hz) > 0.05 * spec.control_rate_hz:
        problems.append(
            f"control rate: policy trained at {spec.control_rate_hz:g} Hz, robot runs at "
            f"{info.control_rate_hz:g} Hz (train it for this robot with "
            f"`train … --set control_rate_hz={info.control_rate_hz:g}`)"
        )
    if spec.action_mode not in info.command_modes:
        problems.append(
            f"command mode: policy commands {spec.action_mode}, robot takes "
            f"{list(info.command_modes)}"
        )
    supported = tuple(info.meta.get("policy_observations", AGENT_TERMS))
    missing = [t for t in spec.observation if t not in supported]
    if missing:
        problems.append(
            f"observations: the robot's agent does not provide {missing} (it provides "
            f"{list(supported)})"
        )
    if "target" in spec.observation and (spec.target is None or len(spec.target) != spec.n):
        problems.append(f"target: the policy observes 'target' but carries no {spec.n} values")
    if problems:
        raise PolicyError(
            f"policy does not fit robot {info.name}; nothing was uploaded: " + "; ".join(problems)
        )


@dataclass
class Shadow:
    """The twin's prediction of one deployment (from the robot's measured state)."""

    t: NDArray[np.float64]  # s since the policy started
    joint_pos: NDArray[np.float64]  # (len(t), n) predicted measured joints
    command: NDArray[np.float64]  # (len(t), n) predicted commands
    success: bool
    final_error: float
    stopped: str = ""
    unit: str = "rad"  # of final_error: rad (reach, largest joint error), m (push, object)


@dataclass
class DeployPlan:
    """Everything checked and predicted before the robot moves."""

    policy_id: str
    policy: Policy
    spec: PolicySpec  # with this deployment's goal
    task: str
    config: TaskConfig
    twin_id: str
    start: NDArray[np.float64]
    goal: NDArray[np.float64]
    shadow: Shadow
    robot: str = ""
    objects: ObjectSource | None = None  # where the object poses come from (push)
    object_start: NDArray[np.float64] | None = None  # tracked pose at planning (7,)

    def summary(self) -> str:
        s = self.shadow
        return (
            f"twin {self.twin_id} predicts {'success' if s.success else 'FAILURE'}: final "
            f"error {s.final_error:.3f} {s.unit} after "
            f"{float(s.t[-1]) if len(s.t) else 0.0:.1f} s"
        )


@dataclass
class DeployResult:
    trajectory_id: str
    run_id: str
    outcome: dict[str, Any] = field(default_factory=dict)


def final_error(
    task: str,
    goal: NDArray[np.float64],
    q: NDArray[np.float64],
    object_pose: NDArray[np.float64] | None = None,
) -> float:
    """The task's success measure: reach, the largest joint error (rad) of joint state `q`;
    push, the object's distance (m) from the goal (x, y), from its tracked pose."""
    if task == "reach":
        return float(np.max(np.abs(np.asarray(q, float) - goal)))
    if task == "push":
        if object_pose is None:
            raise PolicyError("deploy: a push is judged on the object's pose; none was tracked")
        return float(np.linalg.norm(np.asarray(object_pose, float)[:2] - goal[:2]))
    raise PolicyError(f"deploy: task '{task}' has no success measure for real runs")


def shadow_run(
    task: str,
    twin: TwinSpec,
    config: TaskConfig,
    policy: Policy,
    start: NDArray[np.float64],
    goal: NDArray[np.float64],
    object_start: NDArray[np.float64] | None = None,
) -> Shadow:
    """The policy in the nominal twin from joint state `start` (and, for a push, the
    object at its tracked pose `object_start`) to goal `goal` (joints, or object x, y)."""
    base = get_task(task).env
    start, goal = np.asarray(start, float), np.asarray(goal, float)

    class FromRobot(base):  # type: ignore[valid-type,misc]
        def _place(self, rng: np.random.Generator) -> None:
            super()._place(rng)
            if object_start is not None:
                self.world.set_object_pose(self._obj, np.asarray(object_start, float))
                self.goal = goal.copy()
            else:
                self.target = goal.copy()
            self.world.set_joint_state(start, None, list(self.joints))

    env = FromRobot(twin, config, None, 0)
    try:
        obs, _ = env.reset(seed=0)
        ts, qs, cs = [0.0], [env.q.copy()], [env.q.copy()]
        info: dict[str, Any] = {}
        while True:
            obs, _, term, trunc, info = env.step(policy.act(obs))
            ts.append(env.t)
            qs.append(env.q.copy())
            cs.append(env.cmd.copy())
            if term or trunc:
                break
        obj = env.world.object_pose(env._obj) if object_start is not None else None
        return Shadow(
            np.array(ts),
            np.array(qs),
            np.array(cs),
            bool(info.get("is_success", False)),
            final_error(task, goal, env.q, obj),
            str(info.get("stopped", "")),
            "m" if object_start is not None else "rad",
        )
    finally:
        env.close()


def plan_deploy(
    project: Project,
    client: RobotClient,
    policy_id: str,
    target: Sequence[float] | None = None,
    goal_seed: int = 0,
    objects: ObjectSource | None = None,
    object_goal: Sequence[float] | None = None,
) -> DeployPlan:
    """Check the policy against the robot and predict the run in its twin. The goal is
    `target` (joint values, rad) or one drawn from the task's goal distribution; for a
    push, `object_goal` (x, y in m) or one drawn around the object's tracked pose, which
    `objects` (the camera through the tracker) gives."""
    info = client.info
    if info is None:
        raise DeviceError(f"robot at {client.address}: not connected")
    policy = load_policy(project, policy_id)
    task = str(policy.record.get("task", ""))
    twin_id, twin = load_twin(project, policy.record.get("twin_id"))
    config = task_config(task, policy.record.get("task_config", {}))
    spec = policy.spec
    if "object_pose" in spec.observation:
        return _plan_push(project, client, policy_id, policy, task, twin_id, twin, config,
                          goal_seed, objects, object_goal)  # fmt: skip
    if target is not None:
        goal = np.asarray(target, float)
        if goal.shape != (spec.n,):
            raise PolicyError(
                f"deploy: --target has {goal.size} values, policy {policy_id} drives {spec.n} "
                f"joints {list(spec.joints)}"
            )
    elif "target" in spec.observation:
        env = get_task(task).env(twin, config, None, goal_seed)
        try:
            env.reset(seed=goal_seed)
            goal = np.asarray(env.target, float).copy()
        finally:
            env.close()
    else:
        goal = np.zeros(spec.n)
    spec = spec.with_goal(target=goal.tolist()) if "target" in spec.observation else spec
    check_robot(spec, info)
    lo, hi = info.limits.lower, info.limits.upper
    if np.any(goal < lo) or np.any(goal > hi):
        j = int(np.argmax(np.maximum(lo - goal, goal - hi)))
        raise PolicyError(
            f"deploy: goal {goal[j]:.3f} rad for {info.joint_names[j]} is outside robot "
            f"{info.name}'s limits [{lo[j]:.3f}, {hi[j]:.3f}]"
        )
    start = client.latest_state().joint_pos.copy()
    shadow = shadow_run(task, twin, config, policy, start, goal)
    return DeployPlan(
        policy_id, policy, spec, task, config, twin_id, start, goal, shadow, info.name
    )


def _plan_push(
    project: Project,
    client: RobotClient,
    policy_id: str,
    policy: Policy,
    task: str,
    twin_id: str,
    twin: TwinSpec,
    config: TaskConfig,
    goal_seed: int,
    objects: ObjectSource | None,
    object_goal: Sequence[float] | None,
) -> DeployPlan:
    info = client.info
    assert info is not None
    spec = policy.spec
    name = str(spec.object)
    if objects is None:  # the calibrated fixed camera of the scan the twin came from
        try:
            objects = object_source(project, twin_id, [name], robot_description=info.description)
        except DeviceError as exc:
            raise PolicyError(
                f"deploy: policy {policy_id} observes object '{name}' and no camera is known "
                f"to see it ({exc})"
            ) from None
    if name not in {m.name for m in objects.models}:
        raise PolicyError(
            f"deploy: policy {policy_id} pushes '{name}', the object source tracks "
            f"{[m.name for m in objects.models]}"
        )
    check_robot(spec, info)  # before the camera is even opened
    if twin.object(name).shape.kind == "cylinder":  # as the twin observed it in training
        objects = dataclasses.replace(objects, spinless=(*objects.spinless, name))
    obj0 = track_now(client, objects, name)
    if object_goal is not None:
        goal = np.asarray(object_goal, float).reshape(-1)[:2]
        if goal.shape != (2,) or not np.all(np.isfinite(goal)):
            raise PolicyError("deploy: the object goal must be two finite numbers (x, y in m)")
    else:  # the task's goal distribution, drawn around where the object is now
        env = get_task(task).env(twin, config, None, goal_seed)
        try:
            env.reset(seed=goal_seed)
            drawn = np.asarray(env.deploy_spec.object_goal, float)
            placed = np.asarray(env.world.object_pose(name), float)[:2]
        finally:
            env.close()
        goal = obj0[:2] + (drawn - placed)
    spec = spec.with_goal(object_goal=goal.tolist())
    check_robot(spec, info)
    start = client.latest_state().joint_pos.copy()
    shadow = shadow_run(task, twin, config, policy, start, goal, obj0)
    return DeployPlan(
        policy_id, policy, spec, task, config, twin_id, start, goal, shadow, info.name,
        objects, obj0,
    )  # fmt: skip


def deploy_job(
    project: Project,
    client: RobotClient,
    plan: DeployPlan,
    duration_s: float | None = None,
    ramp_s: float = 0.5,
    stop_event: threading.Event | None = None,
    start_tol: float = 0.02,
) -> Job[DeployResult]:
    """Job: upload the policy, run it for `duration_s` (default: the task's episode plus the
    ramp), record, save. Progress partials: every sample so far, {"t", "measured", "command"}.
    The Stop button (`stop_event`), a cancel, an agent stop, a non-finite policy output (the
    envelope reports it) or a lost link end the run; the robot is stopped and what happened
    is saved as a failure (a cancel saves too, as 'cancelled')."""
    info = client.info
    if info is None:
        raise DeviceError(f"robot at {client.address}: not connected")
    check_robot(plan.spec, info)
    off = np.abs(client.latest_state().joint_pos - plan.start)
    if float(off.max()) > start_tol:
        j = int(np.argmax(off))
        raise PolicyError(
            f"robot {info.name} moved since the shadow run ({info.joint_names[j]} is "
            f"{off[j]:.3f} rad away); predict again"
        )
    duration = float(duration_s) if duration_s else plan.config.episode_s + ramp_s
    yield Progress(0.0, f"uploading {plan.policy_id} to {info.name}")
    client.upload_policy(plan.policy.onnx, plan.spec.to_dict())
    client.take_control()
    feeder = None
    if plan.objects is not None:
        try:
            feeder = start_feed(client, plan.objects, str(plan.spec.object), plan.spec)
        except DeviceError:
            _stop(client, f"deploy {plan.policy_id}: no object pose")
            raise
    ended, seen, running = "cancelled", 0, False
    live: dict[str, list[Any]] = {"t": [], "measured": [], "command": []}
    rec: list[dict[str, Any]] = []
    t_start = float("nan")
    saved: DeployResult | None = None
    try:
        before = client.latest_status().get("stop_reason")
        with client.recording() as rec:
            client.run_policy(ramp_s=ramp_s)
            t0 = time.monotonic()
            ended = "duration"
            while True:
                now = time.monotonic() - t0
                if stop_event is not None and stop_event.is_set():
                    ended = "operator stop"
                    break
                try:
                    client.check()
                except DeviceError as exc:
                    ended = f"link lost: {exc}"
                    break
                new = list(rec[seen:])
                seen += len(new)
                running = running or any(m.get("mode") == "policy" for m in new)
                if new and not np.isfinite(t_start):
                    t_start = float(new[0]["t"])
                if any("nonfinite" in (m.get("acted") or ()) for m in new):
                    ended = "policy output NaN/inf: stopped by the robot's envelope"
                    yield _samples(live, new, t_start, now, duration)
                    break
                last = new[-1] if new else {}
                if last.get("mode") in ("stopped", "estop") and (
                    running or last.get("stop_reason") != before
                ):  # a stop after the start (one on the first tick never shows 'policy')
                    ended = f"robot stopped: {last.get('stop_reason') or last.get('mode')}"
                    yield _samples(live, new, t_start, now, duration)
                    break
                if now >= duration:
                    break
                if new:
                    yield _samples(live, new, t_start, now, duration)
                time.sleep(0.05)
            if ended == "duration" and not running:  # stopped before its first tick, with
                # the reason it already had (a fault latched while idle): not a finished run
                why = (list(rec)[-1:] or [{}])[0].get("stop_reason") or "stopped"
                ended = f"robot stopped: {why} (the policy never ran)"
            _stop(client, f"deploy {plan.policy_id}: {ended}")
            _settle(client)
    finally:
        _stop(client, f"deploy {plan.policy_id}: {ended}")
        if feeder is not None:
            feeder.close()
        msgs = list(rec)
        if msgs:
            saved = _save(project, client, plan, msgs, ended, duration, ramp_s, feeder)
    if saved is None:
        raise DeviceError(f"robot at {client.address}: no state received during the run")
    yield Progress(1.0, f"{plan.policy_id} on {info.name}: {saved.outcome['result']}")
    return saved


def _samples(
    live: dict[str, list[Any]], new: list[dict[str, Any]], t0: float, now: float, total: float
) -> Progress:
    """Append `new` states to the run's live lists; the partial is those (growing) lists,
    so a reader that skips progress records still sees every sample (t from the start)."""
    for m in new:
        live["t"].append(float(m["t"]) - t0)
        live["measured"].append(list(m["joint_pos"]))
        live["command"].append(list(m["command"]) if m.get("command") is not None else None)
    return Progress(min(now / total, 0.99), f"running {now:.1f} / {total:.1f} s", live)


def _stop(client: RobotClient, reason: str) -> None:
    """Stop (hold) the robot; never raises (used in finally)."""
    try:
        if client.connected:
            client.stop(reason)
    except DeviceError as exc:
        log.warning("could not stop the robot after deploying: %s", exc)


def _settle(client: RobotClient) -> None:
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end:
        try:
            st = client.latest_state()
        except DeviceError:
            return
        if float(np.max(np.abs(st.joint_vel))) < SETTLE_VEL:
            return
        time.sleep(0.02)


def _save(
    project: Project,
    client: RobotClient,
    plan: DeployPlan,
    msgs: list[dict[str, Any]],
    ended: str,
    duration: float,
    ramp_s: float,
    feeder: ObjectPoseFeeder | None = None,
) -> DeployResult:
    traj = client.states_to_trajectory(msgs)
    modes, last_t = [], -np.inf  # one per trajectory sample (repeated timestamps dropped)
    for m in msgs:
        if m["t"] > last_t:
            modes.append(str(m.get("mode")))
            last_t = m["t"]
    ran = [i for i, m in enumerate(modes) if m == "policy"]
    t_run = float(traj.t[ran[0]]) if ran else float(traj.t[0])
    q_end = traj["robot/joint_pos"][ran[-1] if ran else -1]
    obj_end, feed = None, {}
    if feeder is not None:
        last = feeder.last_good(str(plan.spec.object))
        obj_end = last[1] if last is not None else plan.object_start
        feed = feeder.stats.summary()
    err = final_error(plan.task, plan.goal, q_end, obj_end)
    unit = plan.shadow.unit
    tol = float(getattr(plan.config, "success_tol", 0.05))
    success = ended == "duration" and err < tol
    acted = sorted({a for m in msgs for a in (m.get("acted") or ())})
    outcome = {
        "result": "success" if success else "failure",
        "safety_acted": acted,
        "ended": ended,
        "success": success,
        "final_error": err,
        "success_tol": tol,
        "predicted_success": plan.shadow.success,
        "predicted_final_error": plan.shadow.final_error,
        "error_gap": err - plan.shadow.final_error,
        "goal": plan.goal.tolist(),
        "start": plan.start.tolist(),
        "duration_s": duration,
        "ramp_s": ramp_s,
        "policy_started_t": t_run,
        "robot": plan.robot,
        "twin": plan.twin_id,
        "task": plan.task,
        "unit": unit,
    }
    if feeder is not None:
        outcome.update(
            object=plan.spec.object,
            object_start=None if plan.object_start is None else plan.object_start.tolist(),
            object_end=None if obj_end is None else np.asarray(obj_end).tolist(),
            object_feed=feed,
        )
    traj = traj.with_channels(meta={**dict(traj.meta), "deploy": outcome})
    with project.new_artifact(
        "trajectory",
        inputs=[plan.policy_id],
        settings={"deploy": plan.policy_id, "robot": plan.robot, "device": client.address},
        summary=f"{plan.task} policy {plan.policy_id} on {plan.robot}: {outcome['result']} "
        f"({ended}), final error {err:.3f} {unit}",
    ) as folder:
        traj.save(folder)
    tid = project.artifacts("trajectory")[-1].id
    outcome["trajectory"] = tid
    with project.new_artifact(
        "run",
        inputs=[plan.policy_id, tid],
        settings={"kind": "real-deployment", "robot": plan.robot, "ended": ended},
        summary=f"{plan.policy_id} on {plan.robot}: {outcome['result']}, final error "
        f"{err:.3f} {unit} (twin predicted {plan.shadow.final_error:.3f})",
    ) as folder:
        atomic.write_json(folder / "run.json", outcome)
        atomic.write_with(folder / "shadow.npz", lambda p: _write_shadow(p, plan.shadow))
        if feeder is not None:
            atomic.write_with(folder / "object_poses.npz", lambda p: save_poses(p, feeder))
    return DeployResult(tid, project.artifacts("run")[-1].id, outcome)


def _write_shadow(path: Any, s: Shadow) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, t=s.t, joint_pos=s.joint_pos, command=s.command)


# -- close the loop ------------------------------------------------------------------------
def refit_request(project: Project, trajectory_id: str) -> tuple[str, list[str], dict[str, Any]]:
    """ "Send to Real2Sim": (twin id, recordings, fit config) of a refit that adds the
    real run `trajectory_id` to the recordings of the fit its policy's twin came from."""
    art = project.artifact(trajectory_id)
    if art.kind != "trajectory":
        raise ProjectError(f"artifact '{trajectory_id}' is a {art.kind}, not a trajectory")
    pols = [i for i in art.inputs if project.artifact(i).kind == "policy"]
    if not pols:
        raise ProjectError(f"trajectory '{trajectory_id}' is not a deployed policy's run")
    twin_id = str(load_policy(project, pols[0]).record.get("twin_id"))
    twin = project.artifact(twin_id)
    fits = [i for i in twin.inputs if project.artifact(i).kind == "fit"]
    fits += [
        a.id
        for a in project.artifacts("fit")
        if a.settings.get("twin") == twin_id and a.settings.get("status") != "cancelled"
    ]
    if not fits:
        raise ProjectError(
            f"twin '{twin_id}' was never fitted: fit it once (choose its parameters) before "
            "sending runs to Real2Sim"
        )
    fit = project.artifact(fits[-1])
    recs = [str(t) for t in fit.settings.get("trajectories", []) if t != trajectory_id]
    return twin_id, [*recs, trajectory_id], dict(fit.settings.get("config", {}))


def refit_job(project: Project, trajectory_id: str, workers: int = 1) -> Job[str]:
    """Job: the refit of `refit_request`; returns the new fit artifact id."""
    from app.workflows.fit import fit_job
    from twins.fit import FitConfig

    twin_id, recs, cfg = refit_request(project, trajectory_id)
    config = FitConfig(
        params=tuple(cfg["params"]),
        channels=dict(cfg.get("channels") or {"robot/joint_pos": 1.0}),
        window_s=cfg.get("window_s", 1.0),
        budget=int(cfg.get("budget", 200)),
        popsize=cfg.get("popsize"),
        sigma0=float(cfg.get("sigma0", 0.25)),
        polish_rounds=int(cfg.get("polish_rounds", 4)),
        validation=float(cfg.get("validation", 0.25)),
        seed=int(cfg.get("seed", 0)),
        bounds={k: (float(v[0]), float(v[1])) for k, v in (cfg.get("bounds") or {}).items()},
        tie={k: tuple(v) for k, v in (cfg.get("tie") or {}).items()},
        stall_generations=cfg.get("stall_generations"),
        posterior=str(cfg.get("posterior", "laplace")),
        particles=int(cfg.get("particles", 64)),
    )
    return (yield from fit_job(project, twin_id, recs, config, workers=workers))
