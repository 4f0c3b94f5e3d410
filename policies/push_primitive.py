"""`push_ik`: a closed-loop pushing primitive that reads only the agent's observation
(joints, the tracked object pose, the goal) and exports to ONNX as it is.

Per control tick, from the observed joints it computes the tool point's position and
orientation (forward kinematics of the robot's serial chain, twins/chain.py) and their
Jacobian, picks a tool target from where the tool is relative to the object and the goal,
and turns the tool's velocity towards it into joint deltas by damped least squares:

- behind the object, in the corridor on the line goal->object (within `align_tol`
  sideways), and low: push — target `lead` m into the object along that line (less near
  the goal: at most `overshoot` past the point where the object would sit on the goal),
  at most `v_push` m/s;
- in the corridor but high: descend there to `z_push` (the corridor widens to 3 x
  `align_tol` as the tool gets lower, so a tool that drifts a little while descending
  does not climb back up);
- elsewhere: go to the pre-push point `standoff` m behind the object's contact point at
  `z_hover`, lifting first when low (sideways speed grows with height), at most `v_travel`;
- once the object is within `stop_tol` of the goal, wherever the tool is: hold still.

The tool's z axis leans `TILT` from straight down towards the push and its x axis (the
hand's narrow side) lies along it (`k_rot`), so the fingertips lead the hand; the corridor
ends `DEPTH` behind the pre-push point (a tool far behind on the line travels there first
instead of descending where it is). Joint velocities dq from the damped least-squares
solve (conjugate gradients, a fixed number of iterations, so numpy and the exported ONNX
run the same arithmetic), plus a posture pull `K_NULL` (joints towards the middle of their
ranges) projected on the null space of the tool's motion, become a delta action
dq * `lead_s` / scale, scaled down as a whole (direction kept) when a joint would exceed 1.
The 13 searched parameters live in R^13 and map to their ranges by a logistic, so CEM can
search them unconstrained; every geometric or speed parameter is tuned in the twin it was
trained in: a twin with wrong friction or actuator response tunes them wrong.

The same math runs on numpy (CEM rollouts, float32) and on torch (export), through the
small `_Ops` adapters below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.robots.wire.policy_spec import PolicySpec
from policies.errors import PolicyError

# name, low, high, default (the hand-set start of the search)
PARAMS: tuple[tuple[str, float, float, float], ...] = (
    ("lead_s", 0.02, 0.4, 0.1),  # s: joint delta = joint velocity * lead_s
    ("v_travel", 0.1, 0.8, 0.4),  # m/s
    ("v_push", 0.02, 0.3, 0.1),  # m/s
    ("k_pos", 2.0, 20.0, 6.0),  # 1/s: tool velocity per m of error
    ("z_push", 0.01, 0.07, 0.03),  # m above the table top (tool point)
    ("z_hover", 0.1, 0.22, 0.15),  # m
    ("standoff", 0.01, 0.1, 0.04),  # m behind the contact point
    ("contact", 0.025, 0.07, 0.045),  # m: object centre to tool point at contact
    ("lead", 0.005, 0.08, 0.03),  # m: push target into the object
    ("overshoot", -0.04, 0.04, 0.0),  # m past the goal the pusher may aim
    ("align_tol", 0.004, 0.04, 0.015),  # m sideways off the push line still in the corridor
    ("stop_tol", 0.0, 0.025, 0.012),  # m: object this close to the goal -> hold
    ("k_rot", 0.3, 10.0, 3.0),  # 1/s: tool axes towards the push's lean and heading
)
NAMES = tuple(p[0] for p in PARAMS)
DAMPING = 1e-3  # lambda^2 of the damped least squares (m^2, rad^2)
CG_ITERS = 10
LOW_BAND = 0.03  # m above z_push that still counts as "low"
WIDEN = 2.0  # the corridor is (1 + WIDEN) x align_tol wide at z_push, align_tol at z_hover
DEPTH = 0.03  # m: the corridor ends this far behind the pre-push point
# The tool leans TILT towards the push (its z axis from straight down towards the push
# direction, about the hand's long y axis) so the closed fingertips lead: upright, the
# Panda hand's housing (3.2 cm either side of the axis in hand x, fingers 1.05 cm) meets a
# tall object 2.1 cm ahead of the fingers, on the object's top rim, where MuJoCo and
# PyBullet disagree whether it rides or tips (docs/BENCHMARKS.md, bench sim2real); at
# 20 deg the housing stays ~8 mm behind the fingertips, which push low on the side (30 deg
# runs the Panda's joint 6 into its limit near the base).
TILT = math.radians(20.0)
SIN_TILT, COS_TILT = math.sin(TILT), math.cos(TILT)
EZ = np.array([0.0, 0.0, 1.0])
# 1/s: joint velocity towards the middle of its range per half range off it, in the null
# space of the tool's motion (a 7-joint arm's elbow): it keeps the yaw that holds the
# hand's narrow side on the push from winding joints 1 and 3 against each other
K_NULL = 2.0


def n_params() -> int:
    return len(PARAMS)


def to_values(x: Sequence[float] | NDArray[np.float64]) -> dict[str, float]:
    """Search vector (R^13) -> named parameter values in their ranges."""
    xv = np.asarray(x, float)
    if xv.shape != (len(PARAMS),):
        raise PolicyError(f"primitive 'push_ik' takes {len(PARAMS)} parameters, got {xv.size}")
    s = 1.0 / (1.0 + np.exp(-xv))
    return {n: float(lo + (hi - lo) * si) for (n, lo, hi, _), si in zip(PARAMS, s, strict=True)}


def from_values(values: dict[str, float]) -> NDArray[np.float64]:
    """Named values -> search vector (clipped just inside the ranges)."""
    out = []
    for n, lo, hi, d in PARAMS:
        f = (float(values.get(n, d)) - lo) / (hi - lo)
        f = min(max(f, 1e-4), 1 - 1e-4)
        out.append(np.log(f / (1 - f)))
    return np.array(out)


def initial_mean() -> NDArray[np.float64]:
    return from_values({n: d for n, _, _, d in PARAMS})


@dataclass(frozen=True)
class ChainConsts:
    """The tool's serial chain as float32 arrays (twins.chain.SerialChain)."""

    R0: NDArray[np.float32]  # (k, 3, 3)
    p0: NDArray[np.float32]  # (k, 3)
    K: NDArray[np.float32]  # (k, 3, 3) skew of the axis
    axis: NDArray[np.float32]  # (k, 3)
    index: tuple[int, ...]  # joint index per step, -1 fixed
    mid: NDArray[np.float32]  # (n,) middle of each joint's range (0 without limits)
    inv_half: NDArray[np.float32]  # (n,) 1 / half its range (0 without limits)

    @classmethod
    def of(cls, chain: Any) -> ChainConsts:
        R0 = np.stack([s.T0[:3, :3] for s in chain.steps]).astype(np.float32)
        p0 = np.stack([s.T0[:3, 3] for s in chain.steps]).astype(np.float32)
        ax = np.stack([s.axis for s in chain.steps]).astype(np.float32)
        K = np.stack(
            [np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]]) for a in ax]
        ).astype(np.float32)
        mid, inv_half = posture(chain)
        return cls(
            R0,
            p0,
            K,
            ax,
            tuple(int(s.index) for s in chain.steps),
            mid.astype(np.float32),
            inv_half.astype(np.float32),
        )


def posture(chain: Any) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(middle, 1 / half range) of each commanded joint's URDF limits; 0, 0 for a joint
    without limits (the null-space pull leaves it alone)."""
    n = len(chain.joints)
    lo = np.asarray(chain.lower, float) if len(chain.lower) == n else np.full(n, -np.inf)
    hi = np.asarray(chain.upper, float) if len(chain.upper) == n else np.full(n, np.inf)
    ok = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
    mid = np.where(ok, 0.5 * (lo + hi), 0.0)
    inv_half = np.where(ok, 2.0 / np.where(ok, hi - lo, 1.0), 0.0)
    return mid, inv_half


class _NpOps:
    def __init__(self) -> None:
        self.sin, self.cos, self.sqrt, self.where = np.sin, np.cos, np.sqrt, np.where
        self.clip, self.minimum, self.maximum = np.clip, np.minimum, np.maximum
        self.abs = np.abs

    def amax(self, x: Any, axis: int) -> Any:
        return x.max(axis=axis, keepdims=True)

    def c(self, x: Any) -> Any:
        return np.asarray(x, np.float32)

    def stack(self, xs: list[Any], axis: int) -> Any:
        return np.stack(xs, axis)

    def sum(self, x: Any, axis: int) -> Any:
        return x.sum(axis=axis, keepdims=True)

    def eye(self, n: int) -> Any:
        return np.eye(n, dtype=np.float32)

    def zeros_like(self, x: Any) -> Any:
        return np.zeros_like(x)

    def transpose(self, x: Any) -> Any:
        return np.swapaxes(x, -1, -2)


class _TorchOps:
    def __init__(self) -> None:
        import torch

        self.t = torch
        self.sin, self.cos, self.sqrt, self.where = torch.sin, torch.cos, torch.sqrt, torch.where
        self.minimum, self.maximum, self.abs = torch.minimum, torch.maximum, torch.abs

    def c(self, x: Any) -> Any:
        return self.t.as_tensor(np.asarray(x, np.float32))

    def amax(self, x: Any, axis: int) -> Any:
        return self.t.amax(x, dim=axis, keepdim=True)

    def clip(self, x: Any, lo: Any, hi: Any) -> Any:
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
            return self.t.clamp(x, lo, hi)
        return self.t.minimum(self.t.maximum(x, lo), hi)

    def stack(self, xs: list[Any], axis: int) -> Any:
        return self.t.stack(xs, dim=axis)

    def sum(self, x: Any, axis: int) -> Any:
        return x.sum(dim=axis, keepdim=True)

    def eye(self, n: int) -> Any:
        return self.t.eye(n)

    def zeros_like(self, x: Any) -> Any:
        return self.t.zeros_like(x)

    def transpose(self, x: Any) -> Any:
        return x.transpose(-1, -2)


def _cross(ops: Any, a: Any, b: Any) -> Any:
    """Row-wise cross product of (B, 3) arrays."""
    ax, ay, az = a[:, 0:1], a[:, 1:2], a[:, 2:3]
    bx, by, bz = b[:, 0:1], b[:, 1:2], b[:, 2:3]
    return ops.stack(
        [(ay * bz - az * by)[:, 0], (az * bx - ax * bz)[:, 0], (ax * by - ay * bx)[:, 0]], 1
    )


def _cg(ops: Any, A: Any, b: Any) -> Any:
    """y with A y = b (A (B, 6, 6) symmetric positive definite), CG_ITERS conjugate
    gradient steps from 0."""
    y = ops.zeros_like(b)
    r = b
    d = r
    rs = ops.sum(r * r, 1)
    for _ in range(CG_ITERS):
        Ad = (A @ d[:, :, None])[:, :, 0]
        alpha = rs / (ops.sum(d * Ad, 1) + 1e-20)
        y = y + alpha * d
        r = r - alpha * Ad
        rs_new = ops.sum(r * r, 1)
        d = r + (rs_new / (rs + 1e-20)) * d
        rs = rs_new
    return y


def _cg1(A: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """`_cg` for one system in float64 scalars (the numpy actor)."""
    y = np.zeros(6)
    r = b.copy()
    d = r.copy()
    rs = float(r @ r)
    for _ in range(CG_ITERS):
        Ad = A @ d
        alpha = rs / (float(d @ Ad) + 1e-20)
        y += alpha * d
        r -= alpha * Ad
        rs_new = float(r @ r)
        d = r + (rs_new / (rs + 1e-20)) * d
        rs = rs_new
    return y


def push_law(
    ops: Any,
    obs: Any,
    v: dict[str, float],
    chain: ChainConsts,
    sl: dict[str, slice],
    n: int,
    ctrl_dt: float,
    action_scale: float,
) -> Any:
    """Actions (B, n) in [-1, 1] for observations (B, obs_dim); see the module docstring."""
    q = obs[:, sl["joint_pos"]]
    obj = obs[:, sl["object_pose"]]
    goal = obs[:, sl["object_goal"]]
    B1 = q[:, 0:1] * 0.0  # (B, 1) zeros of the right type
    # forward kinematics and the Jacobian's columns
    R = ops.c(np.eye(3))[None] + B1[:, :, None]
    p = B1 + ops.c(np.zeros(3))[None]
    origins, axes, idx = [], [], []
    for k, j in enumerate(chain.index):
        p = p + (R @ ops.c(chain.p0[k])[:, None])[:, :, 0]
        R = R @ ops.c(chain.R0[k])
        if j >= 0:
            origins.append(p)
            axes.append((R @ ops.c(chain.axis[k])[:, None])[:, :, 0])
            idx.append(j)
            th = q[:, j : j + 1][:, :, None]
            K = ops.c(chain.K[k])
            M = (
                ops.c(np.eye(3))
                + ops.sin(th) * K
                + (1.0 - ops.cos(th)) * ops.c(chain.K[k] @ chain.K[k])
            )
            R = R @ M
    zero3 = B1 + ops.c(np.zeros(3))[None]
    cols_p, cols_w = [zero3] * n, [zero3] * n
    for o, a, j in zip(origins, axes, idx, strict=True):
        cols_p[j] = _cross(ops, a, p - o)
        cols_w[j] = a
    J = ops.stack(
        [ops.stack(cols_p, 2)[:, i] for i in range(3)]
        + [ops.stack(cols_w, 2)[:, i] for i in range(3)],
        1,
    )  # (B, 6, n)
    # where the tool should go
    pxy, pz = p[:, 0:2], p[:, 2:3]
    o = obj[:, 0:2]
    dvec = goal - o
    d = ops.sqrt(ops.sum(dvec * dvec, 1) + 1e-12)
    u = dvec / d
    nrm = ops.stack([-u[:, 1], u[:, 0]], 1)
    rel = pxy - o
    s = ops.sum(rel * u, 1)
    c = ops.sum(rel * nrm, 1)
    contact, zp, zh = v["contact"], v["z_push"], v["z_hover"]
    h = ops.clip((pz - zp) / (zh - zp), 0.0, 1.0)
    tol = v["align_tol"] * (1.0 + WIDEN * (1.0 - h))
    deep = s > -(contact + v["standoff"] + DEPTH)
    corridor = (s < -contact + 0.01) & deep & (ops.abs(c) < tol)
    low = pz < zp + LOW_BAND
    done = d < v["stop_tol"]
    push_in = ops.minimum(B1 + v["lead"], d + v["overshoot"])
    push_xy = o + (push_in - contact) * u
    desc_xy = o + ops.minimum(s, B1 - (contact + 0.005)) * u
    pre = o - (contact + v["standoff"]) * u
    travel_xy = pxy + h * (pre - pxy)
    tgt_xy = ops.where(corridor, ops.where(low, push_xy, desc_xy), travel_xy)
    tgt_xy = ops.where(done, pxy, tgt_xy)
    tgt_z = ops.where(corridor, B1 + zp, B1 + zh)
    tgt_z = ops.where(done, pz, tgt_z)
    err = ops.stack([(tgt_xy - pxy)[:, 0], (tgt_xy - pxy)[:, 1], (tgt_z - pz)[:, 0]], 1)
    vel = v["k_pos"] * err
    vmax = ops.where(corridor & low, B1 + v["v_push"], B1 + v["v_travel"])
    speed = ops.sqrt(ops.sum(vel * vel, 1) + 1e-12)
    vel = vel * ops.minimum(B1 + 1.0, vmax / speed)
    # tool z leaning TILT towards the push, tool x (the hand's narrow side) along it
    z_tool, x_tool = R[:, :, 2], R[:, :, 0]
    u3 = ops.stack([u[:, 0], u[:, 1], B1[:, 0]], 1)
    up = B1 + ops.c([0.0, 0.0, 1.0])[None]
    z_des = SIN_TILT * u3 - COS_TILT * up
    sgn = ops.where(ops.sum(x_tool * u3, 1) >= 0.0, B1 + 1.0, B1 - 1.0)
    x_des = sgn * (COS_TILT * u3 + SIN_TILT * up)
    w = v["k_rot"] * (_cross(ops, z_tool, z_des) + _cross(ops, x_tool, x_des))
    e6 = ops.stack([vel[:, i] for i in range(3)] + [w[:, i] for i in range(3)], 1)
    # damped least squares: dq = J^T y, (J J^T + lambda^2 I) y = e6, by conjugate gradients,
    # plus the posture pull z projected on the task's null space: z - J^T (J J^T + ..)^-1 J z
    Jt = ops.transpose(J)
    A = J @ Jt + DAMPING * ops.eye(6)
    z = K_NULL * ops.c(chain.inv_half)[None] * (ops.c(chain.mid)[None] - q)
    # one solve for both: J^T A^-1 e6 + z - J^T A^-1 J z = J^T A^-1 (e6 - J z) + z
    y = _cg(ops, A, e6 - (J @ z[:, :, None])[:, :, 0])
    dq = (Jt @ y[:, :, None])[:, :, 0] + z
    a = dq * (v["lead_s"] / action_scale)
    del ctrl_dt
    return a / ops.maximum(ops.amax(ops.abs(a), 1), B1 + 1.0)  # scaled, not clipped


def check_spec(spec: PolicySpec) -> None:
    need = ("joint_pos", "object_pose", "object_goal")
    if any(t not in spec.observation for t in need):
        raise PolicyError(
            "primitive 'push_ik' needs a task that observes joint_pos, object_pose and "
            f"object_goal (this one observes {list(spec.observation)})"
        )


def actor(spec: PolicySpec, chain: Any, x: Sequence[float] | NDArray[np.float64]) -> Any:
    """numpy actor obs (obs_dim,) -> action (n,): `push_law` for one observation, written
    out in float64 scalars for speed (CEM rollouts); agrees with the exported model to
    float32 rounding (tests/policies/test_push_primitive.py)."""
    check_spec(spec)
    v = to_values(x)
    steps = []
    for st in chain.steps:
        ax = st.axis
        K = np.array([[0, -ax[2], ax[1]], [ax[2], 0, -ax[0]], [-ax[1], ax[0], 0]])
        steps.append(
            (
                st.T0[:3, :3].copy(),
                st.T0[:3, 3].copy(),
                ax.copy(),
                st.index,
                K,
                np.outer(ax, ax),
                np.eye(3) - np.outer(ax, ax),
            )
        )
    sl = spec.slices()
    n, scale = spec.n, spec.action_scale
    eye6 = DAMPING * np.eye(6)
    mid, inv_half = posture(chain)

    def act(obs: NDArray[Any]) -> NDArray[np.float32]:
        ob = np.asarray(obs, np.float64).reshape(-1)
        q = ob[sl["joint_pos"]]
        R = np.eye(3)
        p = np.zeros(3)
        J = np.zeros((6, n))
        cols, axes, origins = [], [], []
        for R0, p0, ax, j, K, aa, ip in steps:
            p = p + R @ p0
            R = R @ R0
            if j >= 0:
                cols.append(j)
                axes.append(R @ ax)
                origins.append(p)
                # Rodrigues: Rot(ax, q) = cos q (I - a a^T) + sin q [a]x + a a^T
                R = R @ (np.cos(q[j]) * ip + np.sin(q[j]) * K + aa)
        A3, D = np.array(axes), p - np.array(origins)
        J[0, cols] = A3[:, 1] * D[:, 2] - A3[:, 2] * D[:, 1]
        J[1, cols] = A3[:, 2] * D[:, 0] - A3[:, 0] * D[:, 2]
        J[2, cols] = A3[:, 0] * D[:, 1] - A3[:, 1] * D[:, 0]
        J[3:, cols] = A3.T
        obj, goal = ob[sl["object_pose"]], ob[sl["object_goal"]]
        pxy, pz, o = p[:2], p[2], obj[:2]
        dv = goal - o
        d = float(np.sqrt(dv @ dv + 1e-12))
        u = dv / d
        nrm = np.array([-u[1], u[0]])
        rel = pxy - o
        s, c = float(rel @ u), float(rel @ nrm)
        contact, zp, zh = v["contact"], v["z_push"], v["z_hover"]
        h = min(max((pz - zp) / (zh - zp), 0.0), 1.0)
        tol = v["align_tol"] * (1.0 + WIDEN * (1.0 - h))
        corridor = -(contact + v["standoff"] + DEPTH) < s < -contact + 0.01 and abs(c) < tol
        low = pz < zp + LOW_BAND
        if d < v["stop_tol"]:
            tgt = p
        elif corridor and low:
            push_in = min(v["lead"], d + v["overshoot"])
            tgt = np.array([*(o + (push_in - contact) * u), zp])
        elif corridor:
            tgt = np.array([*(o + min(s, -(contact + 0.005)) * u), zp])
        else:
            pre = o - (contact + v["standoff"]) * u
            tgt = np.array([*(pxy + h * (pre - pxy)), zh])
        vel = v["k_pos"] * (tgt - p)
        vmax = v["v_push"] if (corridor and low) else v["v_travel"]
        speed = float(np.sqrt(vel @ vel + 1e-12))
        vel = vel * min(1.0, vmax / speed)
        u3 = np.array([u[0], u[1], 0.0])
        z_des = SIN_TILT * u3 - COS_TILT * EZ
        x_des = (COS_TILT * u3 + SIN_TILT * EZ) * (1.0 if R[:, 0] @ u3 >= 0.0 else -1.0)
        w = v["k_rot"] * (np.cross(R[:, 2], z_des) + np.cross(R[:, 0], x_des))
        e6 = np.concatenate([vel, w])
        A = J @ J.T + eye6
        z = K_NULL * inv_half * (mid - q)
        dq = J.T @ _cg1(A, e6 - J @ z) + z
        a = dq * (v["lead_s"] / scale)
        return (a / max(float(np.max(np.abs(a))), 1.0)).astype(np.float32)

    return act


def batch_actor(spec: PolicySpec, chain: Any, x: Sequence[float] | NDArray[np.float64]) -> Any:
    """`push_law` on numpy float32 for a batch (B, obs_dim) (a check on `actor`)."""
    check_spec(spec)
    v, cc, sl = to_values(x), ChainConsts.of(chain), spec.slices()
    ops = _NpOps()

    def act(obs: NDArray[Any]) -> NDArray[np.float32]:
        o = np.asarray(obs, np.float32).reshape(-1, spec.obs_dim)
        return np.asarray(push_law(ops, o, v, cc, sl, spec.n, 0.0, spec.action_scale))

    return act


def torch_module(spec: PolicySpec, chain: Any, x: Sequence[float] | NDArray[np.float64]) -> Any:
    """The primitive as a torch module obs (B, obs_dim) -> action (B, n) for ONNX export."""
    import torch

    check_spec(spec)
    v = to_values(x)
    cc = ChainConsts.of(chain)
    sl = spec.slices()

    class PushIk(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return push_law(_TorchOps(), obs, v, cc, sl, spec.n, 0.0, spec.action_scale)

    return PushIk().eval()
