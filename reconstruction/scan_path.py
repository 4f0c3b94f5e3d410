"""Camera view planning for a wrist-camera scan: orbit targets, views tilted about a given
axis (the rotation a hand-eye calibration lacks) and numeric IK over any forward-kinematics
function (the robot's own model; nothing robot-specific here)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import least_squares
from scipy.spatial.transform import Rotation

FK = Callable[[NDArray[np.float64]], NDArray[np.float64]]  # joint_pos -> T_base_hand
LIMIT_CLEARANCE = 0.2  # rad: solve_view keeps joints this far inside their limits if it can
LIMIT_WEIGHT = 0.02  # ... traded against residuals of 10 x metres and unit-vector change


def look_at(
    eye: NDArray[np.floating], target: NDArray[np.floating], up: Sequence[float] = (0.0, 0.0, 1.0)
) -> NDArray[np.float64]:
    """T_base_camera of an OpenCV camera (z forward, y down) at `eye` looking at `target`."""
    e, t = np.asarray(eye, float), np.asarray(target, float)
    z = (t - e) / np.linalg.norm(t - e)
    x = np.cross(z, np.asarray(up, float))
    if np.linalg.norm(x) < 1e-6:
        x = np.cross(z, [1.0, 0.0, 0.0])
    x /= np.linalg.norm(x)
    T = np.eye(4)
    T[:3, 0], T[:3, 1], T[:3, 2], T[:3, 3] = x, np.cross(z, x), z, e
    return T


def orbit_targets(
    center: Sequence[float],
    distance: float,
    elevation_deg: float,
    n: int,
    azimuth_deg: tuple[float, float] = (-60.0, 60.0),
    base_azimuth_deg: float = 180.0,
) -> list[NDArray[np.float64]]:
    """`n` camera poses on an arc around `center` at `distance` m, looking at it."""
    c = np.asarray(center, float)
    el = np.radians(elevation_deg)
    out = []
    for a in np.radians(base_azimuth_deg + np.linspace(*azimuth_deg, n)):
        eye = c + distance * np.array([np.cos(el) * np.cos(a), np.cos(el) * np.sin(a), np.sin(el)])
        out.append(look_at(eye, c))
    return out


def tilted_views(
    cameras: Sequence[NDArray[np.float64]],
    axis: NDArray[np.float64] | Sequence[float],
    centre: Sequence[float],
    angles_deg: Sequence[float],
    min_elevation_deg: float = 25.0,
) -> list[tuple[int, NDArray[np.float64]]]:
    """Camera poses (T_base_camera) turned by each of `angles_deg` about the base-frame
    direction `axis` through `centre`, from each of `cameras` in turn (spread over the list:
    first, last, middle, ...), every angle before the next camera; those whose eye stays
    at least `min_elevation_deg` above `centre`'s horizon, looking down. Each comes with
    the index of the camera it was turned from.

    A camera that looked at `centre` still does, from the same distance; the wrist turns by
    the angle about `axis`, as a hand-eye calibration lacking that rotation needs."""
    a = np.asarray(axis, float)
    a = a / np.linalg.norm(a)
    c = np.asarray(centre, float)
    order = _spread_order(len(cameras))
    out = []
    for i in order:
        for ang in angles_deg:
            R = Rotation.from_rotvec(np.radians(ang) * a).as_matrix()
            T = np.eye(4)
            T[:3, :3] = R @ cameras[i][:3, :3]
            T[:3, 3] = c + R @ (cameras[i][:3, 3] - c)
            up = T[:3, 3] - c
            elevation = np.degrees(np.arcsin(np.clip(up[2] / max(np.linalg.norm(up), 1e-9), -1, 1)))
            if elevation >= min_elevation_deg and T[2, 2] < 0:
                out.append((i, T))
    return out


def _spread_order(n: int) -> list[int]:
    """0..n-1 with far-apart indices first: 0, n-1, the middle, then halving the gaps."""
    order: list[int] = []
    for k in [0, n - 1] + [int(round(f * (n - 1))) for f in _halvings(n)]:
        if 0 <= k < n and k not in order:
            order.append(k)
    return order + [k for k in range(n) if k not in order]


def _halvings(n: int) -> list[float]:
    out, step = [], 0.5
    while step * (n - 1) >= 0.5:
        out += [f * step for f in range(1, int(1 / step), 2)]
        step /= 2
    return out


def solve_view(
    fk: FK,
    q0: NDArray[np.float64],
    T_base_camera: NDArray[np.float64],
    T_hand_camera: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    roll_free: bool = True,
) -> tuple[NDArray[np.float64], float, float]:
    """Joint positions putting the camera at `T_base_camera` (roll about the optical axis
    free if `roll_free`). Returns (q, position error m, viewing-axis error deg)."""
    lower, upper = np.asarray(lower, float), np.asarray(upper, float)
    room = np.minimum(LIMIT_CLEARANCE, (upper - lower) / 4)

    def resid(q: NDArray[np.float64]) -> NDArray[np.float64]:
        Tc = fk(q) @ T_hand_camera
        dp = Tc[:3, 3] - T_base_camera[:3, 3]
        # a weak push out of the last `room` before each limit: the arm's redundancy (and a
        # free roll) usually reaches the view from further inside, and a wrist parked at its
        # limit overshot past it when a loaded machine's control ran late (robot stopped)
        near = np.maximum(room - (q - lower), 0) + np.maximum(room - (upper - q), 0)
        keep = LIMIT_WEIGHT * near / room
        if roll_free:
            dz = Tc[:3, 2] - T_base_camera[:3, 2]
            return np.concatenate([dp * 10, dz, keep])
        dr = Rotation.from_matrix(Tc[:3, :3] @ T_base_camera[:3, :3].T).as_rotvec()
        return np.concatenate([dp * 10, dr, keep])

    sol = least_squares(resid, np.clip(q0, lower, upper), bounds=(lower, upper), xtol=1e-10)
    Tc = fk(sol.x) @ T_hand_camera
    pos_err = float(np.linalg.norm(Tc[:3, 3] - T_base_camera[:3, 3]))
    ang = float(np.degrees(np.arccos(np.clip(Tc[:3, 2] @ T_base_camera[:3, 2], -1, 1))))
    return sol.x, pos_err, ang
