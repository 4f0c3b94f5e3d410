"""A handheld camera in the lab: a free D435-like camera moved along a hand-like path.

`hand_path()` is the path a person scanning the table would take: an arc around the
workspace at arm's length with the tremor and wander of a hand, a fast turn, and a glance
away from the table and back. `handheld_frames()` renders it with a `LabCamera` held at each
pose (`set_pose`), frames stamped at the path's times; the true poses come back beside the
frames for benchmarks only (frames themselves carry no pose, as from a real camera).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from devices.frames import RGBDFrame


def _look_at(eye: NDArray[np.float64], target: NDArray[np.float64]) -> NDArray[np.float64]:
    """T_world_camera of an OpenCV camera at `eye` looking at `target`, world z up."""
    z = target - eye
    z /= np.linalg.norm(z)
    x = np.cross(z, [0.0, 0.0, 1.0])
    x /= np.linalg.norm(x)
    T = np.eye(4)
    T[:3, 0], T[:3, 1], T[:3, 2], T[:3, 3] = x, np.cross(z, x), z, eye
    return T


def _rot(axis: NDArray[np.float64], angle: float) -> NDArray[np.float64]:
    a = axis / np.linalg.norm(axis)
    K = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K


def hand_path(
    duration_s: float = 8.0,
    fps: float = 30.0,
    seed: int = 0,
    centre: tuple[float, float, float] = (0.55, 0.0, 0.05),
    radius: float = 0.7,
    height: float = 0.5,
    azimuth_deg: tuple[float, float] = (-70.0, 50.0),
    look_away_deg: float = 45.0,
    look_away_s: float = 0.6,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(t (N,), T_world_camera (N, 4, 4)): an arc around `centre` (robot base frame, m) over
    `azimuth_deg`, walked unevenly (a fast turn at two thirds of the way), with hand tremor
    (~8 Hz, ~2 mm / 0.3 deg), slow wander (~2 cm), and a glance `look_away_deg` to the side
    and back lasting `look_away_s` at the middle of the path."""
    rng = np.random.default_rng(seed)
    n = int(round(duration_s * fps))
    t = np.arange(n) / fps
    s = t / duration_s
    # progress along the arc: slow, then a fast turn (3x speed) between 0.6 and 0.75
    speed = 1.0 + 2.0 * np.exp(-(((s - 0.68) / 0.05) ** 2))
    prog = np.cumsum(speed)
    prog = (prog - prog[0]) / (prog[-1] - prog[0])
    az = np.radians(azimuth_deg[0] + (azimuth_deg[1] - azimuth_deg[0]) * prog)
    c = np.asarray(centre, float)

    def wander(amp: float, f_lo: float, f_hi: float, k: int = 3) -> NDArray[np.float64]:
        out = np.zeros((n, 3))
        for _ in range(k):
            f = rng.uniform(f_lo, f_hi)
            ph = rng.uniform(0, 2 * np.pi, 3)
            out += np.sin(2 * np.pi * f * t[:, None] + ph) * rng.uniform(0.5, 1.0, 3)
        return amp * out / k

    pos_noise = wander(0.02, 0.1, 0.4) + wander(0.002, 6.0, 10.0)
    rot_noise = wander(np.radians(0.3), 6.0, 10.0) + wander(np.radians(1.5), 0.2, 0.6)
    t_away = 0.45 * duration_s
    away = np.clip(1 - np.abs(t - t_away) / (look_away_s / 2), 0, 1)
    away = np.sin(away * np.pi / 2) ** 2  # smooth out and back
    T = np.empty((n, 4, 4))
    for i in range(n):
        eye = c + np.array([radius * np.cos(az[i]), radius * np.sin(az[i]), height]) + pos_noise[i]
        Ti = _look_at(eye, c)
        R = Ti[:3, :3]
        # glance away: turn about world z (yaw), then tremor about the camera axes
        R = _rot(np.array([0.0, 0.0, 1.0]), np.radians(look_away_deg) * away[i]) @ R
        for ax in range(3):
            R = R @ _rot(np.eye(3)[ax], rot_noise[i, ax])
        Ti[:3, :3] = R
        T[i] = Ti
    return t, T


def handheld_frames(
    camera: object, t: NDArray[np.float64], T: NDArray[np.float64]
) -> Iterator[tuple[RGBDFrame, NDArray[np.float64]]]:
    """Render `camera` (a LabCamera) held at each pose: (frame stamped t[i] with index i and
    no pose, true T_world_camera as rendered)."""
    try:
        for i in range(len(t)):
            camera.set_pose(T[i])  # type: ignore[attr-defined]
            f = camera.grab()  # type: ignore[attr-defined]
            truth = camera.truth_pose()  # type: ignore[attr-defined]
            yield replace(f, timestamp=float(t[i]), index=i, T_world_camera=None), truth
    finally:
        camera.set_pose(None)  # type: ignore[attr-defined]
