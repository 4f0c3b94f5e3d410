"""Object pushes for the excitation library: an end-effector path turned into joint commands.

    motion = plan_push(info, start_q, safety, target_xy=(0.56, -0.2), direction=0.0)

The tool (the robot's `ee_link`, tool axis pointing down) goes from the start pose to
`hover` m above a point `standoff` m before the object's centre (against `direction`,
degrees from the base +x axis), descends to `height` m, moves `distance` m along
`direction` at `speed` m/s (pushing the object on the way), lifts back to `hover` and
returns to the start pose. Heights are in the robot base frame (the lab's table top is
z = 0). Joint moves are quintic rest-to-rest profiles sized to the speed and acceleration
limits; the Cartesian parts are solved by damped least squares on the robot's kinematics
(twins/kinematics.py) and interpolated by a C2 spline. The result is checked like every
library motion (devices/robots/excitation.py); an unreachable point is a MotionError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.robots.excitation import PLAN_RATE_HZ
from devices.robots.motion import Limits, Motion, MotionError, limits_for, require_fits
from devices.robots.wire.robot_types import RobotInfo
from twins.errors import TwinError
from twins.kinematics import RobotKinematics

Vec = NDArray[np.float64]
PUSH_DEFAULTS: dict[str, Any] = {
    "target_xy": None,
    "direction": 0.0,
    "speed": 0.05,
    "distance": 0.16,
    "standoff": 0.10,
    "height": 0.03,
    "hover": 0.12,
    "velocity": 0.3,
}
CART_ACCEL = 0.25  # m/s^2 along the Cartesian segments
IK_TOL_M = 2e-3
IK_RATE_HZ = 25.0
DOWN = np.array([0.0, 0.0, -1.0])


def _quintic(q0: Vec, q1: Vec, vmax: Vec, amax: Vec) -> tuple[float, Any]:
    """Rest-to-rest quintic from q0 to q1 within per-joint speed/acceleration; returns the
    duration and s(t) -> joint positions."""
    d = np.abs(q1 - q0)
    T = float(np.max(np.maximum(1.875 * d / vmax, np.sqrt(5.7735 * d / amax)), initial=0.0))
    T = max(T, 0.2)

    def at(t: Vec) -> Vec:
        s = np.clip(t / T, 0.0, 1.0)[:, None]
        return np.asarray(q0 + (q1 - q0) * (10 * s**3 - 15 * s**4 + 6 * s**5))

    return T, at


def _line(p0: Vec, p1: Vec, speed: float) -> tuple[float, Any]:
    """A straight Cartesian segment with a trapezoidal speed profile (accel CART_ACCEL)."""
    L = float(np.linalg.norm(p1 - p0))
    if L < 1e-9:
        return 0.0, lambda t: np.repeat(p0[None, :], len(t), 0)
    ta = speed / CART_ACCEL
    if CART_ACCEL * ta * ta > L:
        ta = math.sqrt(L / CART_ACCEL)
        speed = CART_ACCEL * ta
    tc = (L - CART_ACCEL * ta * ta) / speed
    T = 2 * ta + tc

    def at(t: Vec) -> Vec:
        s = np.clip(t, 0.0, T)
        x = np.where(
            s < ta,
            0.5 * CART_ACCEL * s * s,
            np.where(
                s < ta + tc,
                0.5 * CART_ACCEL * ta * ta + speed * (s - ta),
                L - 0.5 * CART_ACCEL * (T - s) ** 2,
            ),
        )
        return np.asarray(p0 + np.outer(x / L, p1 - p0))

    return T, at


class _IK:
    """Tool position + tool axis down, damped least squares with a numeric Jacobian."""

    def __init__(self, kin: RobotKinematics, link: str, limits: Limits) -> None:
        self.kin, self.link, self.lim = kin, link, limits

    def error(self, q: Vec, p: Vec) -> Vec:
        T = self.kin.link_pose(self.link, q)
        return np.concatenate([p - T[:3, 3], np.cross(T[:3, 2], DOWN)])

    def solve(self, p: Vec, q: Vec) -> tuple[Vec, float]:
        q = q.copy()
        for _ in range(60):
            e = self.error(q, p)
            if np.linalg.norm(e[:3]) < 1e-5 and np.linalg.norm(e[3:]) < 1e-4:
                break
            J = np.stack(
                [(self.error(q, p) - self.error(q + h, p)) / 1e-6 for h in np.eye(len(q)) * 1e-6], 1
            )
            dq = J.T @ np.linalg.solve(J @ J.T + 1e-4 * np.eye(6), e)
            q = np.clip(q + dq, self.lim.lower, self.lim.upper)
        e = self.error(q, p)
        return q, float(np.linalg.norm(e[:3]))


def plan_push(
    info: RobotInfo,
    start: Sequence[float] | Vec,
    safety: Mapping[str, Any] | None = None,
    **params: Any,
) -> Motion:
    """Plan a push (see the module docstring); MotionError names a bad parameter or an
    unreachable point."""
    from scipy.interpolate import CubicSpline

    unknown = set(params) - set(PUSH_DEFAULTS)
    if unknown:
        raise MotionError(
            f"motion 'push': unknown parameter(s) {sorted(unknown)} (known: "
            f"{', '.join(PUSH_DEFAULTS)})"
        )
    p = {**PUSH_DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    if p["target_xy"] is None or len(p["target_xy"]) != 2:
        raise MotionError("motion 'push': give target_xy, the object's centre (x, y) in m")
    if not 0 < float(p["speed"]) <= 0.5:
        raise MotionError(f"motion 'push': speed must be in (0, 0.5] m/s, got {p['speed']}")
    if not 0 < float(p["velocity"]) <= 1:
        raise MotionError(f"motion 'push': velocity must be in (0, 1], got {p['velocity']}")
    if "position" not in info.command_modes:
        raise MotionError(f"motion 'push': robot {info.name} takes no position commands")
    q0 = np.asarray(start, float).reshape(-1)
    limits = limits_for(info, safety)
    link = str(info.meta.get("ee_link") or "")
    try:
        kin = RobotKinematics.from_description(info.description, info.joint_names)
    except TwinError as exc:
        raise MotionError(f"motion 'push': robot {info.name}: {exc}") from None
    try:
        if not link:
            link = max(kin.links, key=lambda k: kin.links[k])
        ik = _IK(kin, link, limits)
        a = math.radians(float(p["direction"]))
        d = np.array([math.cos(a), math.sin(a), 0.0])
        c = np.array([float(p["target_xy"][0]), float(p["target_xy"][1]), 0.0])
        hover, height = float(p["hover"]), float(p["height"])
        A = c - float(p["standoff"]) * d + [0, 0, hover]
        B = A + [0, 0, height - hover]
        C = B + float(p["distance"]) * d
        D = C + [0, 0, hover - height]
        vmax = float(p["velocity"]) * limits.velocity
        qA, err = ik.solve(A, q0)
        if err > IK_TOL_M:
            raise MotionError(
                f"motion 'push': {link} cannot reach {np.round(A, 3).tolist()} m ({err * 1000:.0f} "
                "mm off); choose a target nearer the robot"
            )
        times: list[float] = []
        qs: list[Vec] = []
        T1, move1 = _quintic(q0, qA, vmax, limits.accel)
        tt = np.arange(0.0, T1, 1.0 / IK_RATE_HZ)
        times += list(tt)
        qs += list(move1(tt))
        t_now, q = T1, qA
        for P0, P1, v in ((A, B, 0.05), (B, C, float(p["speed"])), (C, D, 0.05)):
            T, line = _line(P0, P1, v)
            tt = np.arange(0.0, T, 1.0 / IK_RATE_HZ)
            for k, pk in zip(tt, line(tt), strict=True):
                q, err = ik.solve(pk, q)
                if err > IK_TOL_M:
                    raise MotionError(
                        f"motion 'push': {link} cannot reach {np.round(pk, 3).tolist()} m "
                        f"({err * 1000:.0f} mm off) on the way; check target, height, distance"
                    )
                times.append(t_now + k)
                qs.append(q)
            t_now += T
        q, _ = ik.solve(D, q)
        T5, move5 = _quintic(q, q0, vmax, limits.accel)
        tt = np.arange(0.0, T5 + 1e-9, 1.0 / IK_RATE_HZ)
        times += list(t_now + tt)
        qs += list(move5(tt))
        ts = np.asarray(times)
        keep = np.concatenate([[True], np.diff(ts) > 1e-6])  # segment joints: one sample
        Q = np.asarray(qs)[keep]
        Q[-1] = q0
        spline = CubicSpline(ts[keep], Q, axis=0, bc_type="clamped")
        t = np.arange(0.0, ts[keep][-1] + 1e-9, 1.0 / PLAN_RATE_HZ)
        cmd = np.asarray(spline(t))
        cmd[-1] = q0
    finally:
        kin.close()
    params_out = {**p, "target_xy": [float(x) for x in p["target_xy"]], "ee_link": link}
    m = Motion(
        "push",
        params_out,
        t,
        cmd,
        tuple(info.joint_names),
        "position",
        f"push towards {p['direction']:g} deg at {p['speed']:g} m/s",
    )
    require_fits(m, limits)
    return m
