"""Record: play a library motion on a connected robot and keep what happened.

    motion = plan_motion(client, "chirp", amplitude=0.1, duration=6)   # preview: motion.t/.command
    traj = run_to_end(play_motion(client, motion))                      # the robot moves
    tid = run_to_end(record_job(project, client, motion))               # ... into the project

Works on any robot reached through the protocol (`RobotClient`): the virtual lab or a
hardware agent. The plan is checked against the limits the robot reports before anything
moves; the robot's own envelope still guards every command. While the motion plays, the
state stream is recorded; afterwards the agent's log adds the commands as the workbench
requested them (`robot/command_requested`), next to `robot/command` (what the envelope let
through to the actuators, which a twin replays), and the plan itself at the robot's sample
times (`robot/command_planned`). Cancel (closing the job) and errors leave the robot
stopped (held). A robot link that drops mid-motion ends it as an error naming the drop, even
when the client has reconnected meanwhile (a new session: nothing is saved, nothing resumes).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.workflows.record_camera import CameraCapture
from devices.errors import DeviceError
from devices.robots import excitation
from devices.robots.client import RobotClient
from devices.robots.motion import Motion, MotionError
from devices.robots.motion_stream import MotionStopped, MotionStream
from devices.trajectory import Trajectory
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress
from resources.project import Project

log = logging.getLogger(__name__)

PRE_S, POST_S = 0.3, 0.6  # hold before / after the motion, recorded


class RecordingStopped(TwinbenchError):
    """The operator stopped the motion (the robot is held; nothing was saved)."""


def motion_names() -> list[str]:
    """Every motion the library can plan (joint motions, then pushes)."""
    return [*excitation.EXCITATIONS, "push"]


def plan_motion(client: RobotClient, name: str, **params: Any) -> Motion:
    """Plan library motion `name` from the robot's current pose, inside the limits and
    envelope settings it reports. `push` needs `target_xy` (m, base frame) and uses the
    robot's kinematics (twins/pushes.py). Raises MotionError naming what does not fit."""
    info = client.info
    if info is None:
        raise DeviceError(f"robot at {client.address}: not connected")
    q0 = client.latest_state().joint_pos
    try:
        safety = client.status().get("safety")
    except DeviceError as exc:  # an agent that does not report it: the robot's own limits
        log.info(
            "robot %s reports no envelope settings (%s); planning on its limits", info.name, exc
        )
        safety = None
    if name == "push":
        # pybullet (55 ms): only a push plans in the twin; the `record` command loads this module
        from twins.pushes import plan_push

        return plan_push(info, q0, safety, **params)
    return excitation.plan(name, info, q0, safety, **params)


def play_motion(
    client: RobotClient,
    motion: Motion,
    pre_s: float = PRE_S,
    post_s: float = POST_S,
    send_hz: float | None = None,
    stop_event: threading.Event | None = None,
    camera: str | None = None,
    camera_path: Path | None = None,
) -> Job[Trajectory]:
    """Job: play `motion` through the protocol while recording the state stream; returns
    the recording (source real). The robot is stopped at the end, on error and on cancel.
    `stop_event` (a Stop button) is checked before every command: once set, no further
    command is sent, the robot is stopped and RecordingStopped is raised. With `camera`,
    that camera's frames are written to `camera_path` (.db3) meanwhile, and the channel
    `camera/<name>/frame_index` gives each sample's frame in it."""
    info = client.info
    if info is None:
        raise DeviceError(f"robot at {client.address}: not connected")
    # checked against the robot's limits and envelope before anything moves (MotionError)
    stream = MotionStream(
        client,
        motion,
        rate_hz=send_hz,
        pre_s=pre_s,
        post_s=post_s,
        stop_event=stop_event,
        stop_when_done=False,  # stopped below, once the agent's log is read
    )
    capture: CameraCapture | None = None
    if camera is not None:
        if camera_path is None:
            raise MotionError(f"recording camera '{camera}' needs a file to write to")
        capture = CameraCapture(client, camera, camera_path)
    try:
        with contextlib.ExitStack() as stack:
            if capture is not None:
                stack.enter_context(capture)
            rec = stack.enter_context(client.recording())
            try:
                for p in stream.play():
                    if p.fraction is not None and p.fraction < 1.0:  # (always a fraction)
                        yield p
            except MotionStopped as exc:
                raise RecordingStopped(f"{exc}, nothing saved") from None
            msgs = list(rec)
        raw = _agent_commands(client, len(msgs) + int(info.control_rate_hz))
    finally:
        _stop(client, f"recording '{motion.name}' ended")
    sent, t_robot_start = stream.sent, stream.t_robot_start
    traj = _assemble(client, motion, msgs, raw, t_robot_start, sent)
    if capture is not None:
        traj = traj.with_channels(
            channels={
                **dict(traj.channels),
                f"camera/{camera}/frame_index": capture.frame_index(traj.t),
            },
            units={**dict(traj.units), f"camera/{camera}/frame_index": "1"},
            meta={**dict(traj.meta), **capture.summary(float(traj.t[0]), float(traj.t[-1]))},
        )
    yield Progress(1.0, f"{motion.name}: recorded {len(traj)} states")
    return traj


def _stop(client: RobotClient, reason: str) -> None:
    """Stop (hold) the robot; never raises (used in finally)."""
    try:
        if client.connected:
            client.stop(reason)
    except DeviceError as exc:
        log.warning("could not stop the robot after recording: %s", exc)


def _agent_commands(client: RobotClient, last: int) -> dict[str, NDArray[Any]] | None:
    """The agent's log of requested commands (None when the robot does not provide it)."""
    try:
        return client.get_log(last=last)
    except DeviceError as exc:
        log.info("robot at %s gives no command log (%s)", client.address, exc)
        return None


def _assemble(
    client: RobotClient,
    motion: Motion,
    msgs: list[dict[str, Any]],
    raw: Mapping[str, NDArray[Any]] | None,
    t_start_guess: float,
    sent: int,
) -> Trajectory:
    """State messages + agent log -> the recording, from the first commanded state on."""
    if not msgs:
        raise DeviceError(f"robot at {client.address}: no state received while recording")
    traj = client.states_to_trajectory(msgs)
    cmd = traj["robot/command"]
    has = np.all(np.isfinite(cmd), axis=1)
    if not has.any():
        raise DeviceError(
            f"robot at {client.address}: no command reached the actuators during "
            f"'{motion.name}' (events: {[e.get('message') for e in list(client.events)[-3:]]})"
        )
    first = int(np.argmax(has))
    keep = np.zeros(len(traj), dtype=bool)
    keep[first:] = True
    keep &= has | (np.arange(len(traj)) < first)  # after a stop the command is gone: cut there
    last = first + int(np.argmin(keep[first:])) if not keep[first:].all() else len(traj)
    t_cut = float(traj.t[last]) if last < len(traj) else None
    traj = traj.slice_time(float(traj.t[first]), float(traj.t[last - 1]))
    t = traj.t
    chans = dict(traj.channels)
    units = dict(traj.units)
    unit = "rad" if motion.mode == "position" else "N*m"
    units["robot/command"] = unit
    requested = None
    if raw is not None and "t" in raw and "raw" in raw:
        idx = np.searchsorted(raw["t"], t)
        idx = np.clip(idx, 0, max(len(raw["t"]) - 1, 0))
        if len(raw["t"]) and np.all(np.abs(raw["t"][idx] - t) < 1e-6):
            requested = np.asarray(raw["raw"][idx], float)
            if np.all(np.isfinite(requested)):
                chans["robot/command_requested"] = requested
                units["robot/command_requested"] = unit
    t0 = _align(
        t, requested if requested is not None else chans["robot/command"], motion, t_start_guess
    )
    if t_cut is not None and t_cut < t0 + motion.duration:
        raise DeviceError(
            f"robot at {client.address}: '{motion.name}' was cut short after "
            f"{max(t_cut - t0, 0.0):.2f} s of {motion.duration:.2f} s: the robot stopped "
            f"({_stop_reason(msgs, t_cut)}); it is held, nothing was saved"
        )
    chans["robot/command_planned"] = motion.at(t - t0)
    units["robot/command_planned"] = unit
    acted = [m.get("acted") or [] for m in msgs if traj.t[0] <= m["t"] <= traj.t[-1]]
    acted_names = sorted({a for lst in acted for a in lst})
    meta = {
        **dict(traj.meta),
        "motion": motion.name,
        "motion_params": {k: v for k, v in motion.params.items()},
        "motion_start_t": t0,
        "motion_duration_s": motion.duration,
        "command_mode": motion.mode,
        "command_joints": list(motion.joint_names),
        "commands_sent": sent,
        "safety_acted_ticks": int(sum(1 for lst in acted if lst)),
        "safety_acted": acted_names,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "robot_info": client.info.to_dict() if client.info is not None else {},
    }
    return Trajectory(t, chans, units, "real", meta)


def _stop_reason(msgs: list[dict[str, Any]], t_cut: float) -> str:
    """Why the robot stopped taking commands at `t_cut`, from its state stream."""
    for m in msgs:
        if float(m["t"]) >= t_cut - 1e-9 and (m.get("stop_reason") or m.get("mode") != "command"):
            return str(m.get("stop_reason") or f"mode {m.get('mode')}")
    return "no reason given"


def _align(t: NDArray[np.float64], cmd: NDArray[np.float64], motion: Motion, guess: float) -> float:
    """Robot time at which the plan's t=0 was played: the shift (1 ms grid, +-0.15 s around
    `guess`) that best matches the recorded commands to the plan."""
    if not np.isfinite(guess):
        guess = float(t[0])
    shifts = guess + np.arange(-0.15, 0.15 + 1e-9, 0.001)
    moving = np.ptp(motion.command, axis=0) > 0
    if not moving.any():
        return float(guess)
    errs = [float(np.nanmean((cmd[:, moving] - motion.at(t - s)[:, moving]) ** 2)) for s in shifts]
    return float(shifts[int(np.nanargmin(errs))])


def record_job(
    project: Project,
    client: RobotClient,
    motion: Motion,
    summary: str = "",
    inputs: tuple[str, ...] = (),
    stop_event: threading.Event | None = None,
    camera: str | None = None,
) -> Job[str]:
    """Job: `play_motion`, then save the recording as a trajectory artifact; returns its id.
    With `camera`, its frames are saved next to it as `camera.db3`. A cancelled or failed
    motion saves nothing (and leaves the robot stopped)."""
    tmp = Path(tempfile.mkdtemp(prefix=".recording-", dir=project.root)) if camera else None
    try:
        traj = yield from play_motion(
            client,
            motion,
            stop_event=stop_event,
            camera=camera,
            camera_path=tmp / "camera.db3" if tmp is not None else None,
        )
        return _save(project, client, motion, traj, summary, inputs, tmp)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _save(
    project: Project,
    client: RobotClient,
    motion: Motion,
    traj: Trajectory,
    summary: str,
    inputs: tuple[str, ...],
    camera_dir: Path | None,
) -> str:
    info = client.info
    robot = info.name if info is not None else client.address
    settings = {
        "motion": motion.name,
        "motion_params": dict(motion.params),
        "robot": robot,
        "device": client.address,
        "safety_acted_ticks": traj.meta.get("safety_acted_ticks", 0),
    }
    with project.new_artifact(
        "trajectory",
        inputs=list(inputs),
        settings=settings,
        summary=summary or f"{motion.summary()} on {robot} ({len(traj)} states)",
    ) as folder:
        traj.save(folder)
        if camera_dir is not None:
            for f in camera_dir.iterdir():  # the .db3 and its sidecar
                shutil.move(str(f), folder / f.name)
    return project.artifacts("trajectory")[-1].id
