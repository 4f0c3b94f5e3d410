"""Where every drawn body of a twin is over a trajectory: the poses a 3D view needs to
replay a recording (or its simulation) as a moving robot and objects.

`body_tracks(world, traj, times)` returns body name -> (K, 4, 4) world poses at `times`
(seconds from the trajectory's start), with the body names of `twins.view.drawables`
(`robot/<link>`, object names, `table`). Robot links come from the trajectory's
`robot/joint_pos` through the twin's kinematics (the world's state is overwritten: replays
reset it anyway); objects from their `objects/<name>/pose` channels; bodies a trajectory
does not move stay at the twin's start. The world is left at the last sample's joint
positions (every replay starts with a reset).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from devices.trajectory import Trajectory
from twins.builder import TwinWorld
from twins.engine import pb
from twins.view import poses


def _quat_to_matrices(p: NDArray[np.float64]) -> NDArray[np.float64]:
    """(K, 7) xyz + quat xyzw -> (K, 4, 4)."""
    x, y, z, w = (p[:, 3 + i] for i in range(4))
    n = np.sqrt(x * x + y * y + z * z + w * w)
    n[n == 0] = 1.0
    x, y, z, w = x / n, y / n, z / n, w / n
    T = np.zeros((len(p), 4, 4))
    T[:, 0, 0] = 1 - 2 * (y * y + z * z)
    T[:, 0, 1] = 2 * (x * y - z * w)
    T[:, 0, 2] = 2 * (x * z + y * w)
    T[:, 1, 0] = 2 * (x * y + z * w)
    T[:, 1, 1] = 1 - 2 * (x * x + z * z)
    T[:, 1, 2] = 2 * (y * z - x * w)
    T[:, 2, 0] = 2 * (x * z - y * w)
    T[:, 2, 1] = 2 * (y * z + x * w)
    T[:, 2, 2] = 1 - 2 * (x * x + y * y)
    T[:, :3, 3] = p[:, :3]
    T[:, 3, 3] = 1.0
    return T


def _at(traj: Trajectory, name: str, times: NDArray[np.float64]) -> NDArray[np.float64]:
    """Channel samples nearest to `times` (s from the start): poses are not interpolated
    component-wise, and a ghost one sample off is not visible."""
    t = traj.t - traj.t[0]
    idx = np.clip(np.searchsorted(t, times, side="left"), 0, len(t) - 1)
    prev = np.clip(idx - 1, 0, len(t) - 1)
    idx = np.where(np.abs(t[prev] - times) <= np.abs(t[idx] - times), prev, idx)
    return np.asarray(traj[name][idx])


def start_poses(world: TwinWorld) -> dict[str, NDArray[np.float64]]:
    """Body name -> (4, 4) pose of every drawn body at the twin's start (resets `world`)."""
    world.reset()
    return poses(world)


def body_tracks(
    world: TwinWorld,
    traj: Trajectory,
    times: NDArray[np.float64],
    start: dict[str, NDArray[np.float64]] | None = None,
) -> dict[str, NDArray[np.float64]]:
    """Body name -> (K, 4, 4) world poses at `times` (see the module docstring). `start`:
    `start_poses(world)` when the caller keeps them (saves a reset and the pose reads: a
    live replayer asks for every window after every slider move)."""
    times = np.asarray(times, dtype=float).reshape(-1)
    K = len(times)
    if start is None:
        start = start_poses(world)
    out = {name: np.repeat(T[None], K, axis=0) for name, T in start.items()}
    for o in world.spec.objects:
        ch = f"objects/{o.name}/pose"
        if ch in traj.channels:
            out[o.name] = _quat_to_matrices(_at(traj, ch, times))
    spec, rid, cid = world.spec, world.robot_id, world.cid
    if rid is None or spec.robot is None or "robot/joint_pos" not in traj.channels:
        return out
    Q = _at(traj, "robot/joint_pos", times)
    names = [str(j) for j in traj.meta.get("joint_names", [])] or [
        j.name for j in spec.robot.joints
    ][: Q.shape[1]]
    jids = world.joint_ids(names)
    links = [(n, i) for n, i in world.link_index.items() if i >= 0]
    link_ids = [i for _, i in links]
    P = np.zeros((len(links), K, 7))
    reset, link_states = pb.resetJointState, pb.getLinkStates
    for k, row in enumerate(Q.tolist()):
        for j, q in zip(jids, row, strict=True):
            reset(rid, j, q, 0.0, physicsClientId=cid)
        states = link_states(rid, link_ids, computeForwardKinematics=True, physicsClientId=cid)
        P[:, k] = [(*st[4], *st[5]) for st in states]
    T = _quat_to_matrices(P.reshape(-1, 7)).reshape(len(links), K, 4, 4)  # one call
    for (name, _), T_link in zip(links, T, strict=True):
        out[f"robot/{name}"] = T_link
    return out
