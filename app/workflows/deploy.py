"""Deploy: a trained policy onto a connected robot, predicted first, recorded always.

    plan = plan_deploy(project, client, policy_id)        # spec checked, shadow run in the twin
    res = run_to_end(deploy_job(project, client, plan))   # upload, run, record -> artifacts
    fit_id = run_to_end(refit_job(project, res.trajectory_id))   # close_loop: "Send to Real2Sim"

1. `check_robot(spec, info)`: the policy's spec against what the robot reports (joint names,
   control rate, command mode, observation terms its agent's policy runner provides);
   PolicyError naming every difference, before anything is uploaded.
2. `shadow_run`: the policy's ONNX model in the twin it was trained in, from the robot's
   measured joint positions to the deployment goal: predicted success, final error and
   joint curves.
   A push policy (observing `object_pose`) needs an `ObjectSource` (the robot's camera
   through the object tracker, reconstruction/pose_feeder.py): the object's pose now is the
   shadow run's start, and the goal is drawn around it (or given).
3. `deploy_job`: upload, run inside the agent's envelope with its start ramp, stream
   command vs measured as progress, stop at the end, on the Stop button, on error or
   cancel (the robot is always left stopped), and save what happened: a `trajectory`
   artifact (inputs: the policy) and a `run` artifact (run.json: success by the task's
   criterion on the measured state, predicted vs real; inputs: policy, trajectory). For a
   push policy a feeder thread streams the tracked object pose to the agent from before
   the start to the end (the agent stops the policy when tracking goes stale or lost); the
   outcome is judged on the last good tracked pose, and the streamed poses are saved with
   the run (object_poses.npz) with the feed's numbers (frames, lost, pose age). The saved
   recording runs from the first to the last commanded sample (`commanded_part`), so no
   NaN command reaches a refit. A link that drops (even one that reconnects at once: a new
   session) ends the run as a failure whose `ended` names the drop.
4. `refit_request` / `refit_job` (app/workflows/close_loop.py): the run's recording added to
   the recordings of the fit the twin came from, fitted again with that fit's settings.

Steps 1 and 2 live in app/workflows/deploy_plan.py, step 3 here.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.workflows.deploy_plan import DeployPlan, Shadow, check_robot, final_error, robot_surface
from devices.errors import DeviceError
from devices.robots.client import RobotClient
from devices.trajectory import COMMAND_DELAY, Trajectory
from policies.errors import PolicyError
from reconstruction.object_tracks import add_object_tracks
from reconstruction.pose_feeder import (
    ObjectPoseFeeder,
    feed_tracks,
    save_poses,
    start_feed,
)
from resources import atomic
from resources.jobs import Job, Progress
from resources.project import Project

log = logging.getLogger(__name__)

SETTLE_VEL = 0.01  # rad/s: the robot counts as stopped below this on every joint
SETTLE_S = 1.5  # longest wait for the robot to come to rest after a stop


@dataclass
class DeployResult:
    trajectory_id: str
    run_id: str
    outcome: dict[str, Any] = field(default_factory=dict)


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
    client.take_control()  # first: nobody else may swap the policy in between
    client.upload_policy(plan.policy.onnx, plan.spec.to_dict())
    feeder = None
    if plan.objects is not None:
        try:
            surface = robot_surface(plan.objects, client)
            feeder = start_feed(client, plan.objects, str(plan.spec.object), plan.spec, surface)
        except DeviceError:
            _stop(client, f"deploy {plan.policy_id}: no object pose")
            raise
    ended, seen, running = "cancelled", 0, False
    live: dict[str, list[Any]] = {"t": [], "measured": [], "command": []}
    rec: list[dict[str, Any]] = []
    t_start = float("nan")
    saved: DeployResult | None = None
    session = client.epoch  # a reconnect mid-run is a new session: the run ends there
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
                    client.check(session)
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
    traj, modes = commanded_part(traj, modes)
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
    if feeder is not None and feeder.stats.poses:  # the object as the agent saw it
        traj = add_object_tracks(feed_tracks(feeder.stats, [str(plan.spec.object)]), traj)
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


def commanded_part(traj: Trajectory, modes: list[str]) -> tuple[Trajectory, list[str]]:
    """The recording from the first to the last sample with a command (with its `modes`).

    Before the policy's first tick and after the robot stopped, nothing was commanded and
    `robot/command` is NaN: a twin cannot replay those samples (a fit scores every such
    window as failed), so they are cut off. Inside the run a tick whose policy output came
    late sent nothing and the actuators kept the previous command (PROTOCOL.md, Policies):
    those samples are given that command. The meta says what was done (`command_trim`)."""
    if "robot/command" not in traj.channels or len(traj) == 0:
        return traj, modes
    cmd = np.asarray(traj["robot/command"], dtype=float)
    sent = np.all(np.isfinite(cmd), axis=1)
    if not sent.any():
        return traj, modes  # nothing reached the actuators: kept whole, judged as is
    first = int(np.argmax(sent))
    last = len(sent) - 1 - int(np.argmax(sent[::-1]))
    keep = slice(first, last + 1)
    chans = {k: np.asarray(v)[keep].copy() for k, v in traj.channels.items()}
    held = int(np.sum(~sent[keep]))
    for name in ("robot/command", COMMAND_DELAY):
        if name in chans:
            chans[name] = _hold_last(chans[name])
    trim = {"head": first, "tail": len(sent) - 1 - last, "held": held}
    meta = {**dict(traj.meta), "command_trim": trim}
    out = Trajectory(traj.t[keep].copy(), chans, dict(traj.units), traj.source, meta)
    return out, modes[keep]


def _hold_last(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """Rows with a NaN take the previous complete row (the first row is complete)."""
    ok = np.all(np.isfinite(a), axis=1)
    idx = np.where(ok, np.arange(len(a)), 0)
    np.maximum.accumulate(idx, out=idx)
    return np.asarray(a[idx])


def _write_shadow(path: Any, s: Shadow) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, t=s.t, joint_pos=s.joint_pos, command=s.command)


# -- close the loop ------------------------------------------------------------------------
