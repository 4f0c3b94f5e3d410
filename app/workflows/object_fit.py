"""Fit a pushed object's parameters (mass as density, friction) from push recordings.

    traj = run_to_end(record_push(client, source, "cylinder", start_pose, tmp, direction=0.0))
    res = fit_object(spec, [traj, ...], "cylinder", budget=40, executor=ex)
    twin = spec.with_values(res.estimate)

A push is the excitation library's `push` (twins/pushes.py, as `record --motion push`
plays it) aimed at the object where the tracker last saw it, played through the robot
protocol with the fixed camera recorded; the camera's frames are then tracked
(reconstruction/track_objects.py: the object's model started at that pose, the robot
masked by its surface at the recorded joints, twins/robot_surface.py) into `objects/<name>/pose` and `track_quality` channels. The object's
pose comes from the camera, never from the robot (a real robot does not know it).

`fit_object` holds every other twin parameter (the robot's fitted joints) at the twin's
values and fits only the object's, on its tracked pose (twins/fit/steps.py, whole-push replays:
`push_part` keeps the part of each recording from just before the object moves); a body
symmetric about its z (a cylinder) is compared without its spin, which a camera cannot
see (recording meta `spinless_objects`), and, when it stood upright throughout, at the
upright orientation (`upright`: the tracker's tilt is noise, and the fit weighs radians
like metres). The fitted values are effective: what makes this twin's contact reproduce
the pushes, not necessarily the object's true mass or friction (the library push's hand
rides on a 9 cm cylinder's top rim, in the lab as in the twin; PyBullet's cylinder tips
where the lab's does not, so its rolling friction is worth fitting too). Restitution is
not fitted: a push at table height has no impact to show it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.workflows.record import plan_motion, play_motion
from devices.poses import drop_spin, pose_to_matrix
from devices.robots.client import RobotClient
from devices.trajectory import Trajectory
from reconstruction.track_objects import read_db3, track_recording
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress
from twins.fit import FitConfig, fit
from twins.fit.objective import with_initial_object_state
from twins.object_motion import tracked_mask
from twins.robot_surface import RobotSurface
from twins.simulate import replay

OBJECT_PARAMS = ("density", "friction")
LEAD_S = 0.4  # recording kept from this long before the object starts to move
MOVED_M = 0.004  # the object counts as moving once this far from where it stood
MAX_TILT_DEG = 10.0  # a spinless object tracked within this of upright stood upright


class ObjectFitError(TwinbenchError):
    """A push recording cannot be used to fit the object (named in the message)."""


def record_push(
    client: RobotClient,
    source: Any,
    name: str,
    start_pose: Sequence[float] | NDArray[np.float64],
    folder: Path,
    **push: Any,
) -> Job[Trajectory]:
    """Job: push object `name` (last seen at `start_pose`, (7,) base frame) with the
    library's push motion (`push`: direction, speed, distance, ... of twins/pushes.py),
    recording `source.camera` (an ObjectSource: camera, models, pose, table, robot
    description) into `folder`; returns the recording with the tracked object's channels
    (meta `spinless_objects` names it when the source drops its spin)."""

    model = next((m for m in source.models if m.name == name), None)
    if model is None:
        raise ObjectFitError(f"camera '{source.camera}': no model of object '{name}' to track")
    pose = np.asarray(start_pose, float)
    motion = plan_motion(client, "push", target_xy=(float(pose[0]), float(pose[1])), **push)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    db3 = folder / "camera.db3"
    yield Progress(0.0, f"pushing {name}: {motion.description}")
    traj = yield from play_motion(client, motion, camera=source.camera, camera_path=db3)
    frames = read_db3(db3)
    frames = [f for i, f in enumerate(frames) if i == 0 or f.timestamp > frames[i - 1].timestamp]
    info = client.info
    assert info is not None
    surface = RobotSurface(source.robot_description or info.description, list(info.joint_names))
    try:
        out = yield from track_recording(
            traj,
            iter(frames),
            source.T_base_camera,
            [replace(model, T_world_object=pose_to_matrix(pose))],
            source.table,
            surface,
            total=len(frames),
        )
    finally:
        surface.close()
    spinless = [name] if name in tuple(source.spinless) else []
    return out.with_channels(meta={**dict(out.meta), "spinless_objects": spinless})


def last_tracked(traj: Trajectory, name: str) -> NDArray[np.float64]:
    """The object's last pose the tracker did not flag lost (ObjectFitError if none)."""

    ch = f"objects/{name}/pose"
    if ch not in traj.channels:
        raise ObjectFitError(f"recording '{traj.meta.get('name', '?')}' has no channel {ch}")
    ok = np.flatnonzero(tracked_mask(traj, name) & np.all(np.isfinite(traj[ch]), axis=1))
    if not len(ok):
        raise ObjectFitError(f"recording '{traj.meta.get('name', '?')}': {name} never tracked")
    return np.asarray(traj[ch][ok[-1]], float)


def push_part(traj: Trajectory, name: str, lead_s: float = LEAD_S) -> Trajectory:
    """The recording from `lead_s` before object `name` first moves (MOVED_M from its
    first tracked position) to `lead_s` after it last moved (MOVED_M from its last);
    ObjectFitError when it never moved (a missed push)."""

    P = traj[f"objects/{name}/pose"][:, :3]
    ok = tracked_mask(traj, name) & np.all(np.isfinite(P), axis=1)
    if not ok.any():
        raise ObjectFitError(f"recording '{traj.meta.get('name', '?')}': {name} never tracked")
    p0 = P[np.flatnonzero(ok)[0]]
    moved = ok & (np.linalg.norm(P - p0, axis=1) > MOVED_M)
    if not moved.any():
        raise ObjectFitError(
            f"recording '{traj.meta.get('name', '?')}': {name} did not move (the push missed it)"
        )
    t_move = float(traj.t[np.flatnonzero(moved)[0]])
    p1 = P[np.flatnonzero(ok)[-1]]  # ... and until `lead_s` after it came to rest
    going = np.flatnonzero(ok & (np.linalg.norm(P - p1, axis=1) > MOVED_M))
    t_rest = float(traj.t[going[-1]]) if len(going) else float(traj.t[-1])
    return traj.slice_time(
        max(float(traj.t[0]), t_move - lead_s), min(float(traj.t[-1]), t_rest + lead_s)
    )


def upright(
    traj: Trajectory, name: str, pose: Sequence[float], max_tilt_deg: float = MAX_TILT_DEG
) -> Trajectory:
    """`traj` with spinless object `name` (meta `spinless_objects`) held at the upright
    orientation of `pose` (its scan pose, spin dropped) when no tracked sample tilts more
    than `max_tilt_deg` from it: a cylinder that stood on the table throughout. The
    tracker's tilt of such a body is noise (0.5-1.4 deg RMS on the lab's pushes, whose
    truth tilts < 0.5 deg), and the fit weighs radians like metres: left in, that noise
    outweighs the millimetres the object's path tells. The twin's own tilt still counts,
    so a twin that tips the object over is still told it is wrong."""

    ch = f"objects/{name}/pose"
    if name not in (traj.meta.get("spinless_objects") or ()) or ch not in traj.channels:
        return traj
    q_up = drop_spin(np.asarray(pose, float))[3:]
    P = np.array(traj[ch], float)
    ok = tracked_mask(traj, name) & np.all(np.isfinite(P), axis=1)
    cos_half = np.abs(np.array([drop_spin(p)[3:] for p in P[ok]]) @ q_up)
    tilt = np.degrees(2 * np.arccos(np.clip(cos_half, 0.0, 1.0)))
    if len(tilt) and float(tilt.max()) > max_tilt_deg:
        return traj  # it did tip: keep what the camera saw
    P[:, 3:] = q_up
    return traj.with_channels(channels={**dict(traj.channels), ch: P})


def object_config(
    name: str,
    params: Sequence[str] = OBJECT_PARAMS,
    budget: int = 40,
    bounds: Mapping[str, tuple[float, float]] | None = None,
) -> Any:
    """The FitConfig of an object fit: `objects.<name>.<p>` on its pose channel, whole
    replays, CMA-ES over the whole budget (8 a generation), one polish round."""

    return FitConfig(
        params=tuple(f"objects.{name}.{p}" for p in params),
        channels={f"objects/{name}/pose": 1.0},
        window_s=None,
        budget=budget,
        polish_rounds=1,
        seed=0,
        popsize=8,  # contact makes the loss rugged: a wider first look, no early stall
        validation=0.0,
        bounds=dict(bounds or {}),
        stall_generations=None,
    )


def fit_object(
    spec: Any,
    pushes: Sequence[Trajectory],
    name: str,
    params: Sequence[str] = OBJECT_PARAMS,
    budget: int = 40,
    executor: Any = None,
    bounds: Mapping[str, tuple[float, float]] | None = None,
) -> Any:
    """Fit object `name`'s `params` to the push recordings (each cut by `push_part`), every
    other parameter held at `spec`'s values; returns the FitResult (estimate, Laplace
    posterior)."""

    if not pushes:
        raise ObjectFitError(f"fitting {name}: no push recordings")
    up = next((o.pose for o in spec.objects if o.name == name), None)
    parts = [push_part(p, name) for p in pushes]
    if up is not None:
        parts = [upright(p, name, up) for p in parts]
    return fit(spec, parts, object_config(name, params, budget, bounds), executor)


def pose_rmse(spec: Any, values: Mapping[str, float] | None, traj: Trajectory, name: str) -> float:
    """Position RMSE (m) of object `name` replayed in `spec` at `values` over the push part
    of `traj` (tracked samples only): how well a twin predicts a push it was not fitted to."""

    part = with_initial_object_state(push_part(traj, name))
    sim = replay(spec, dict(values or {}), part)
    ch = f"objects/{name}/pose"
    ok = tracked_mask(part, name)
    err = sim[ch][ok, :3] - part[ch][ok, :3]
    return float(np.sqrt(np.mean(np.sum(err**2, axis=1))))
