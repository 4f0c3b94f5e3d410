"""Free objects in recordings: the initial state a replay starts from, and which samples of a
tracked object a fit may use.

An object tossed, slid or released (with or without a robot) starts moving before the
recording's first sample, so a replay needs its velocity as well as its pose. Both come
from one curve through the first samples: in free fall a ballistic curve (known gravity)
over the whole flight before the first contact, otherwise a quadratic in time (sliding under
constant friction is quadratic) over the samples it explains, and the same through the
rotation vectors relative to the first orientation. A velocity component that the
sample noise could explain (under 3 standard errors) is taken as zero, so an object at rest
stays at rest. Samples a tracker flagged lost (`objects/<name>/track_quality` column 1) are
not used, here or in a fit's residuals.

The estimate travels in the trajectory's meta as `object_twist0` = {name: [vx, vy, vz, wx,
wy, wz]} (m/s, rad/s, world frame, velocity of the object frame's origin; components
under MIN_SPEED / MIN_SPIN or 3 standard errors are zero: released from rest), and whether
it starts in free fall with a measured velocity as `object_falling0`; `replay` starts the
object with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.spatial.transform import Rotation

from devices.poses import POSE_UNIT
from devices.trajectory import Trajectory

TWIST_KEY = "object_twist0"
FALLING_KEY = "object_falling0"  # {name: True when it starts in free fall}
GRAVITY = 9.81
FIT_SPAN_S = 0.1  # seconds of samples the initial state is fitted over ...
FIT_MIN_SAMPLES = 6  # ... but at least this many samples
FIT_MAX_SPAN_S = 0.4
# Slower than this an object counts as released from rest: sampling a simulation on a
# coarser grid than its physics step alone fakes about 0.02 m/s (and a start velocity
# changes every bounce after it)
MIN_SPEED = 0.05  # m/s
MIN_SPIN = 0.1  # rad/s


def object_names(traj: Trajectory) -> list[str]:
    """Objects with a pose channel in `traj`."""
    return [
        c.split("/")[1]
        for c in traj.channels
        if c.startswith("objects/") and c.endswith("/pose") and traj.units.get(c) == POSE_UNIT
    ]


def tracked_mask(traj: Trajectory, name: str) -> NDArray[np.bool_]:
    """(T,) True where object `name`'s pose is a measurement (not flagged lost)."""
    q = traj.channels.get(f"objects/{name}/track_quality")
    if q is None or q.shape[1] < 2:
        return np.ones(len(traj), bool)
    return np.asarray(q[:, 1] < 0.5)


def _poly(
    dt: NDArray[np.float64], y: NDArray[np.float64], degree: int
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """Least squares y = c0 + c1 dt + ... + c_degree dt^degree: (coefficients (degree + 1,
    n), standard error of c1, residual RMS) per column."""
    A = np.stack([dt**k for k in range(degree + 1)], axis=1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    res = y - A @ coef
    sigma2 = np.sum(res**2, axis=0) / max(len(dt) - degree - 1, 1)
    cov = np.linalg.pinv(A.T @ A)
    return (
        np.asarray(coef, float),
        np.asarray(np.sqrt(sigma2 * cov[1, 1]), float),
        np.asarray(np.sqrt(np.mean(res**2, axis=0)), float),
    )


def _grow(dt: NDArray[np.float64], y: NDArray[np.float64], degree: int, k0: int) -> int:
    """How many leading samples one curve explains: from k0, add samples while each next
    one lies within max(4 residual RMS, 1.5 mm) of the curve through those before it (a
    bounce or a push ends it)."""
    k = k0
    while k < len(dt):
        coef, _, rms = _poly(dt[:k], y[:k], degree)
        pred = sum(coef[j] * dt[k] ** j for j in range(degree + 1))
        if np.max(np.abs(y[k] - pred) - np.maximum(4 * rms, 0.0015)) > 0:
            break
        k += 1
    return k


def initial_object_state(
    t: NDArray[np.float64], poses: NDArray[np.float64], good: NDArray[np.bool_] | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64], bool] | None:
    """(pose (7,), twist (6,), in free fall) at t[0] from the first usable samples of
    `poses` (T, 7), those where `good` (a start the tracker lost is extrapolated back from
    the curve, at most FIT_SPAN_S); None when fewer than 4 usable samples lie in the first
    FIT_MAX_SPAN_S or the first usable one comes too late. Pose and velocity come from one curve through the first samples (the
    pose of a single noisy sample would start every replay off by its noise): in free fall
    (vertical acceleration within 20 % of gravity's) the ballistic p0 + v t - g t^2 / 2 over
    the whole flight before the first contact, otherwise a quadratic over the samples one
    quadratic explains."""
    t = np.asarray(t, float)
    ok = np.ones(len(t), bool) if good is None else np.asarray(good, bool)
    if not ok.any():
        return None
    t0 = t[np.argmax(ok)]
    back = float(t[0] - t0)  # <= 0: where the curve is read, from the first usable sample
    if back < -FIT_SPAN_S - 1e-9:
        return None
    use = ok & (t <= t0 + FIT_MAX_SPAN_S + 1e-9)
    if use.sum() < 4:
        return None
    dt, P = t[use] - t0, poses[use]
    k0 = max(4, int(np.searchsorted(dt, FIT_SPAN_S, side="right")), FIT_MIN_SAMPLES)
    k0 = min(k0, len(dt))
    coef, _, _ = _poly(dt[:k0], P[:k0, :3], 2)
    falling = bool(abs(2 * coef[2, 2] + GRAVITY) < 0.2 * GRAVITY)
    if falling:  # ballistic: known acceleration, fit v only
        y = P[:, :3] + np.outer(0.5 * GRAVITY * dt**2, [0.0, 0.0, 1.0])
        k = _grow(dt, y, 1, k0)
        coef, v_se, _ = _poly(dt[:k], y[:k], 1)
    else:
        k = _grow(dt, P[:, :3], 2, k0)
        coef, v_se, _ = _poly(dt[:k], P[:k, :3], 2)
    acc = np.array([0.0, 0.0, -GRAVITY]) if falling else 2 * coef[2]
    p0 = coef[0] + coef[1] * back + 0.5 * acc * back**2
    v = coef[1] + acc * back
    R_ref = Rotation.from_quat(P[0, 3:7])
    rv = (R_ref.inv() * Rotation.from_quat(P[:k, 3:7])).as_rotvec()
    rcoef, w_se, _ = _poly(dt[:k], rv, 1 if falling else 2)
    w_body = rcoef[1] + (0.0 if falling else 2 * rcoef[2] * back)
    R0 = R_ref * Rotation.from_rotvec(rcoef[0] + rcoef[1] * back)
    v = np.where(np.abs(v) > np.maximum(3 * v_se, MIN_SPEED), v, 0.0)
    w_body = np.where(np.abs(w_body) > np.maximum(3 * w_se, MIN_SPIN), w_body, 0.0)
    # the free-fall half-step correction only for a start velocity actually measured
    falling = falling and bool(v[2] != 0.0)
    q0 = R0.as_quat()
    return (
        np.concatenate([p0, q0 if q0[3] >= 0 else -q0]),
        np.concatenate([v, R0.apply(w_body)]),
        falling,
    )


def with_initial_object_state(traj: Trajectory) -> Trajectory:
    """`traj` with each object's first pose replaced by the fitted one and its initial twist
    in meta[`object_twist0`] (objects with too few tracked samples keep their first sample
    and start at rest)."""
    names = object_names(traj)
    if not names or len(traj) < 4:
        return traj
    chans = dict(traj.channels)
    twists: dict[str, Any] = dict(traj.meta.get(TWIST_KEY, {}) or {})
    falling: dict[str, Any] = dict(traj.meta.get(FALLING_KEY, {}) or {})
    for n in names:
        ch = f"objects/{n}/pose"
        est = initial_object_state(traj.t, traj[ch], tracked_mask(traj, n))
        if est is None:
            continue
        P = np.array(chans[ch])
        P[0] = est[0]
        chans[ch] = P
        twists[n] = [float(x) for x in est[1]]
        falling[n] = est[2]
    meta = {**dict(traj.meta), TWIST_KEY: twists, FALLING_KEY: falling}
    return traj.with_channels(channels=chans, meta=meta)


def start_twist(
    pose: NDArray[np.float64],
    twist: NDArray[np.float64],
    T_body_com: NDArray[np.float64],
    falling: bool = False,
    gravity: float = GRAVITY,
    dt: float = 0.0,
) -> NDArray[np.float64]:
    """The twist to give an object's centre of mass at the first physics step, from the
    twist of its frame's origin. In free fall, semi-implicit Euler (PyBullet) samples a
    trajectory whose slope at t0 is the start velocity minus g*dt/2: add it back, or every
    toss lands late by that much (millimetres at the first bounce)."""
    R = Rotation.from_quat(np.asarray(pose, float)[3:7]).as_matrix()
    w = np.asarray(twist[3:6], float)
    r = R @ np.asarray(T_body_com, float)[:3, 3]
    v = np.asarray(twist[:3], float) + np.cross(w, r)
    if falling:
        v[2] += 0.5 * gravity * dt
    return np.concatenate([v, w])


def lost_rows(traj: Trajectory, channel: str) -> NDArray[np.bool_] | None:
    """Rows of an object pose channel the tracker flagged lost, or None when none are."""
    if not (channel.startswith("objects/") and channel.endswith("/pose")):
        return None
    bad = ~tracked_mask(traj, channel.split("/")[1])
    return bad if bad.any() else None
