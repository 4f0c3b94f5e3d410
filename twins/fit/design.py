"""The next recording to make: rank candidate motions by expected information gain.

D-optimal experiment design at the current estimate. Each candidate motion (a planned joint
command from the excitation library) is replayed in the twin at the estimate; that
simulated recording is cut into the fit's windows (twins/fit/objective.py) and the Jacobian `J`
of its residuals with respect to the fitted parameters (normalised u in [0, 1], log where
the prior is) is taken by central differences. With measurement noise `sigma` per channel
its Fisher information is `F = JᵀJ / sigma²` (J already divides by sigma). The information
already in hand, `I0`, comes from the recordings the fit used, computed the same way, plus
a weak prior: the uniform prior's variance in u, 1/12, as `12·I`. A candidate scores

    gain = log det(I0 + F) - log det(I0)        (nats; 0 = teaches nothing new)

and per parameter the share by which its standard deviation would shrink,
`1 - sqrt([(I0 + F)⁻¹]_ii / [I0⁻¹]_ii)`. A motion that never moves what a parameter acts
on has a zero Jacobian column for it, so that parameter gains nothing from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.robots.excitation import EXCITATIONS, plan
from devices.robots.motion import Motion, MotionError
from devices.robots.wire.robot_types import JointLimits, RobotInfo
from devices.trajectory import Trajectory
from twins.errors import TwinError
from twins.executor import Executor, SerialExecutor
from twins.fit.objective import Problem, Space, evaluate, windows
from twins.spec import TwinSpec

PRIOR_INFO = 12.0  # 1 / variance of a uniform prior on [0, 1]
FD_STEP = 0.02  # central-difference step in u (2 % of a parameter's range)
DEFAULT_SIGMA = {"robot/joint_pos": 1e-3}  # rad: encoder noise + what the twin cannot model
OBJECT_SIGMA = 3e-3  # m (and rad) of a tracked object pose
DESIGN_RATE_HZ = 50.0  # recordings are compared at this rate (all of them: same weighting)
DEFAULT_VELOCITY_LIMIT = 2.0  # rad/s, when neither robot nor recording reports one


@dataclass(frozen=True)
class Suggestion:
    """One ranked candidate: its motion, the expected information gain (nats), per-parameter
    std shrink (0 = none, 1 = pinned exactly) and the Fisher information it adds."""

    name: str
    motion: Motion
    gain: float
    shrink: Mapping[str, float]
    information: NDArray[np.float64] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "motion": self.motion.name,
            "params": {k: v for k, v in self.motion.params.items()},
            "duration_s": self.motion.duration,
            "gain_nats": self.gain,
            "std_shrink": dict(self.shrink),
        }


def robot_info_for(spec: TwinSpec, recordings: Sequence[Trajectory] = ()) -> RobotInfo:
    """The robot a design plans for: the `robot_info` a recording carries (written by the
    record workflow), else one made from the twin's joints (velocity limit
    `DEFAULT_VELOCITY_LIMIT`, position commands)."""
    for r in reversed(list(recordings)):
        d = r.meta.get("robot_info")
        if isinstance(d, Mapping):
            return RobotInfo.from_dict(dict(d))
    if spec.robot is None:
        raise TwinError(f"twin '{spec.name}' has no robot; nothing to excite")
    acted = [a.joint for a in spec.robot.actuators]
    joints = [j for j in spec.robot.joints if j.name in acted and j.kind != "prismatic"]
    if not joints:
        raise TwinError(f"twin '{spec.name}': its robot has no actuated revolute joint")
    n = len(joints)
    lo = np.array([j.lower if j.lower is not None else -math.pi for j in joints])
    hi = np.array([j.upper if j.upper is not None else math.pi for j in joints])
    eff = np.array(
        [
            spec.params[f"robot.actuators.{j.name}.effort_limit"].nominal
            if f"robot.actuators.{j.name}.effort_limit" in spec.params
            else 10.0
            for j in joints
        ]
    )
    return RobotInfo(
        spec.robot.name,
        tuple(j.name for j in joints),
        JointLimits(lo, hi, np.full(n, DEFAULT_VELOCITY_LIMIT), eff),
        250.0,
        description=spec.robot.urdf,  # pushes plan on its kinematics (last link as the tool)
    )


def start_pose(
    spec: TwinSpec, info: RobotInfo, recordings: Sequence[Trajectory] = ()
) -> NDArray[np.float64]:
    """Where the next motion starts: where the last recording ended, else the twin's
    initial pose (0 for joints it does not set)."""
    for r in reversed(list(recordings)):
        if "robot/joint_pos" in r.channels and r["robot/joint_pos"].shape[1] == len(
            info.joint_names
        ):
            return np.asarray(r["robot/joint_pos"][-1], float)
    assert spec.robot is not None
    names = [j.name for j in spec.robot.joints]
    init = list(spec.robot.initial_joint_pos) or [0.0] * len(names)
    return np.array([init[names.index(j)] if j in names else 0.0 for j in info.joint_names])


def default_candidates(
    info: RobotInfo,
    start: NDArray[np.float64],
    amplitude: float = 0.1,
    duration: float = 6.0,
    safety: Mapping[str, Any] | None = None,
) -> dict[str, Motion]:
    """The library's candidates: a chirp and a multisine on all joints, and a chirp and a
    step series on each joint alone. Motions that do not fit this robot are left out."""
    out: dict[str, Motion] = {}
    tries: list[tuple[str, str, dict[str, Any]]] = [
        ("chirp", "chirp", {"duration": duration}),
        ("multisine", "multisine", {"duration": duration}),
    ]
    for j in info.joint_names:
        tries.append((f"chirp:{j}", "chirp", {"duration": duration, "joints": j}))
        tries.append((f"steps:{j}", "steps", {"joints": j}))
    for key, name, kw in tries:
        if name not in EXCITATIONS:
            continue
        amp = amplitude if name != "steps" else min(amplitude, 0.05)
        try:
            out[key] = plan(name, info, start, safety, amplitude=amp, **kw)
        except MotionError:
            continue
    return out


def simulate_motion(
    spec: TwinSpec,
    values: Mapping[str, float],
    motion: Motion,
    start: NDArray[np.float64] | None = None,
) -> Trajectory:
    """What the twin at `values` records when `motion` is played from rest at its start
    pose (or `start`): joint positions and velocities, objects, and the command, at
    `DESIGN_RATE_HZ`."""
    # pybullet + trimesh (0.3-0.6 s, importtime): twins.fit itself loads without physics
    from twins.simulate import replay

    t = np.arange(0.0, motion.duration + 1e-9, 1.0 / DESIGN_RATE_HZ)
    cmd = motion.at(t)
    q0 = motion.start if start is None else np.asarray(start, float)
    n = len(motion.joint_names)
    plan_traj = Trajectory(
        t,
        {
            "robot/command": cmd,
            "robot/joint_pos": np.repeat(q0[None, :], len(t), 0),
            "robot/joint_vel": np.zeros((len(t), n)),
        },
        {"robot/command": "rad" if motion.mode == "position" else "N*m", "robot/joint_pos": "rad"},
        "sim",
        {"joint_names": list(motion.joint_names), "command_joints": list(motion.joint_names)},
    )
    sim = replay(spec, dict(values), plan_traj)
    chans = {k: v for k, v in sim.channels.items()}
    jn = [str(j) for j in sim.meta.get("joint_names", [])]
    if jn and len(jn) != n:
        sel = [jn.index(j) for j in motion.joint_names]
        for k in ("robot/joint_pos", "robot/joint_vel"):
            if k in chans:
                chans[k] = chans[k][:, sel]
        chans.pop("robot/joint_effort", None)
    chans["robot/command"] = cmd
    return Trajectory(
        t,
        chans,
        {**dict(sim.units), "robot/command": plan_traj.units["robot/command"]},
        "sim",
        {
            "name": f"design:{motion.name}",
            "joint_names": list(motion.joint_names),
            "command_joints": list(motion.joint_names),
        },
    )


def _on_grid(r: Trajectory) -> Trajectory:
    """A recording resampled to `DESIGN_RATE_HZ` from 0 (so every recording weighs alike)."""
    t = np.arange(float(r.t[0]), float(r.t[-1]) + 1e-9, 1.0 / DESIGN_RATE_HZ)
    out = r.resample(t)
    return out.with_channels(t=t - t[0])


def default_sigma(spec: TwinSpec) -> dict[str, float]:
    """Measurement noise per channel: joint positions `DEFAULT_SIGMA`, and each object's
    pose `OBJECT_SIGMA` (m and rad; the tracker's target accuracy)."""
    return {**DEFAULT_SIGMA, **{f"objects/{o.name}/pose": OBJECT_SIGMA for o in spec.objects}}


def information(
    spec: TwinSpec,
    values: Mapping[str, float],
    params: Sequence[str],
    recordings: Sequence[Trajectory],
    sigma: Mapping[str, float] | None = None,
    window_s: float | None = 1.0,
    executor: Executor | None = None,
) -> NDArray[np.float64]:
    """Fisher information (n, n) about `params` (normalised u) in `recordings`, at `values`:
    JᵀJ of the windowed-replay residuals, each channel divided by its noise `sigma`
    (`default_sigma` when None). A recording contributes the channels it has."""
    n = len(params)
    total = np.zeros((n, n))
    sig = dict(sigma or default_sigma(spec))
    for name, s in sig.items():
        if not s > 0:
            raise TwinError(f"design: noise sigma of '{name}' must be > 0, got {s}")
    groups: dict[tuple[str, ...], list[Trajectory]] = {}
    for r in recordings:
        have = tuple(c for c in sig if c in r.channels)
        if have:
            groups.setdefault(have, []).append(r)
    for chans, recs in groups.items():
        total += _information(
            spec, values, params, recs, {c: sig[c] for c in chans}, window_s, executor
        )
    return total


def _information(
    spec: TwinSpec,
    values: Mapping[str, float],
    params: Sequence[str],
    recordings: Sequence[Trajectory],
    sig: Mapping[str, float],
    window_s: float | None,
    executor: Executor | None,
) -> NDArray[np.float64]:
    at = spec.with_values(dict(values))
    space = Space.of(at, params)
    u = space.to_u(np.array([at.params[n].nominal for n in params]))
    lat = [at.params[n].nominal for n in at.params if n.endswith(".latency")]
    lat += [at.params[n].high for n in params if n.endswith(".latency")]
    lead = max(lat + [0.0]) + 0.01
    ws = tuple(w for r in recordings for w in windows(_on_grid(r), window_s, lead))
    chans = tuple((c, 1.0, float(s)) for c, s in sig.items())
    prob = Problem(at, space, ws, chans)
    pts, steps = [], []
    for i in range(len(params)):
        up, dn = u.copy(), u.copy()
        up[i], dn[i] = min(u[i] + FD_STEP, 1.0), max(u[i] - FD_STEP, 0.0)
        pts += [up, dn]
        steps.append(up[i] - dn[i])
    outs = list((executor or SerialExecutor()).map(evaluate, [(prob, p) for p in pts]))
    cols = []
    for i, name in enumerate(params):
        a, b = outs[2 * i], outs[2 * i + 1]
        if a.residuals is None or b.residuals is None:
            raise TwinError(
                f"design: the twin failed around the estimate while varying '{name}' "
                f"({a.error or b.error})"
            )
        cols.append((a.residuals - b.residuals) / steps[i])
    J = np.stack(cols, 1)
    return np.asarray(J.T @ J)


def _logdet(A: NDArray[np.float64]) -> float:
    sign, val = np.linalg.slogdet(A)
    return float(val) if sign > 0 else -math.inf


def rank(
    spec: TwinSpec,
    values: Mapping[str, float],
    params: Sequence[str],
    candidates: Mapping[str, Motion],
    current: NDArray[np.float64] | None = None,
    sigma: Mapping[str, float] | None = None,
    window_s: float | None = 1.0,
    executor: Executor | None = None,
) -> list[Suggestion]:
    """Candidates best first by D-optimal gain over the information `current` (n, n; e.g.
    `information(...)` of the recordings so far; none when None) plus the weak prior."""
    n = len(params)
    if not candidates:
        raise TwinError("design: no candidate motion fits this robot")
    base = PRIOR_INFO * np.eye(n) + (np.zeros((n, n)) if current is None else np.asarray(current))
    cov0 = np.linalg.inv(base)
    out = []
    for key, motion in candidates.items():
        rec = simulate_motion(spec, values, motion)
        F = information(spec, values, params, [rec], sigma, window_s, executor)
        post = base + F
        cov = np.linalg.inv(post)
        shrink = {
            p: float(1.0 - math.sqrt(max(cov[i, i], 0.0) / cov0[i, i]))
            for i, p in enumerate(params)
        }
        out.append(Suggestion(key, motion, _logdet(post) - _logdet(base), shrink, F))
    out.sort(key=lambda s: s.gain, reverse=True)
    return out
