"""The fit's objective: what one candidate parameter vector costs against the recordings.

`Space` maps ParamSet values to the optimiser's normalised u in [0, 1] (log where the prior
is); recordings are checked against the twin (`check_recording`), cut into `windows`, each
replayed from its own recorded state; `evaluate` scores one candidate in a worker (failed
simulations become an `Outcome` with no residuals, never an exception); `rmse`/`replay_rmse`
report errors in each channel's own units. twins/fit/steps.py drives the search over it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.poses import drop_spin
from devices.trajectory import Trajectory
from twins.errors import RecordingMismatch, TwinError
from twins.object_motion import lost_rows, with_initial_object_state
from twins.spec import COMMAND_UNITS, TwinSpec

POSE_UNIT = "xyz_m+quat_xyzw"
PENALTY = 1e6  # loss of a failed simulation (normalised losses are O(1))
FAILED_RESIDUAL = 1e3  # residual value standing in for a failed window in least squares


@dataclass(frozen=True)
class Space:
    """u in [0, 1]^n <-> physical values, log where the prior is log. `tied` parameters
    follow a fitted one (one latency for every actuator of a robot)."""

    names: tuple[str, ...]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    log: NDArray[np.bool_]
    tied: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def of(
        cls,
        spec: TwinSpec,
        names: Sequence[str],
        bounds: Mapping[str, tuple[float, float]] | None = None,
        tie: Mapping[str, Sequence[str]] | None = None,
    ) -> Space:
        """The search space of `names`; `bounds` narrow a parameter's search range (it
        must lie within the parameter's own bounds); `tie` maps a fitted parameter to
        others that take its value."""
        if not names:
            raise TwinError("fit: choose at least one parameter")
        dup = {n for n in names if list(names).count(n) > 1}
        if dup:
            raise TwinError(f"fit: parameters listed twice: {sorted(dup)}")
        ps = [spec.params[n] for n in names]  # TwinError names an unknown parameter
        bounds = dict(bounds or {})
        extra = [n for n in bounds if n not in names]
        if extra:
            raise TwinError(f"fit: bounds given for parameters not being fitted: {extra}")
        lows, highs = [], []
        for p in ps:
            lo, hi = bounds.get(p.name, (p.low, p.high))
            lo, hi = float(lo), float(hi)
            if lo < p.low or hi > p.high:
                raise TwinError(
                    f"fit: search range [{lo:g}, {hi:g}] {p.unit} of '{p.name}' leaves its "
                    f"bounds [{p.low:g}, {p.high:g}] {p.unit}"
                )
            if hi <= lo:
                raise TwinError(f"fit: parameter '{p.name}' has no range to search")
            if p.prior in ("loguniform", "lognormal") and lo <= 0:
                raise TwinError(f"fit: '{p.name}' has a log prior; its search range needs low > 0")
            lows.append(lo)
            highs.append(hi)
        tied = []
        for src, dsts in (tie or {}).items():
            if src not in names:
                raise TwinError(f"fit: '{src}' is tied to others but is not being fitted")
            for d in dsts:
                spec.params[d]  # TwinError names an unknown parameter
                if d in names:
                    raise TwinError(f"fit: '{d}' is tied to '{src}' and fitted as well")
            tied.append((src, tuple(dsts)))
        return cls(
            tuple(names),
            np.array(lows),
            np.array(highs),
            np.array([p.prior in ("loguniform", "lognormal") for p in ps]),
            tuple(tied),
        )

    def to_x(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        u = np.clip(np.asarray(u, dtype=float), 0.0, 1.0)
        lin = self.low + u * (self.high - self.low)
        lg = np.exp(
            np.log(np.maximum(self.low, 1e-300))
            + u * (np.log(np.maximum(self.high, 1e-300)) - np.log(np.maximum(self.low, 1e-300)))
        )
        return np.clip(np.where(self.log, lg, lin), self.low, self.high)

    def to_u(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        x = np.asarray(x, dtype=float)
        lin = (x - self.low) / (self.high - self.low)
        with np.errstate(divide="ignore", invalid="ignore"):
            lg = (np.log(x) - np.log(self.low)) / (np.log(self.high) - np.log(self.low))
        return np.clip(np.where(self.log, lg, lin), 0.0, 1.0)

    def values(self, u: NDArray[np.float64]) -> dict[str, float]:
        """Fitted values only (what a fit reports)."""
        return dict(zip(self.names, (float(v) for v in self.to_x(u)), strict=True))

    def all_values(self, u: NDArray[np.float64]) -> dict[str, float]:
        """Fitted values plus the parameters tied to them (what a simulation needs)."""
        out = self.values(u)
        for src, dsts in self.tied:
            out.update({d: out[src] for d in dsts})
        return out


# -- recordings: checks and windows -------------------------------------------------------------
# what each actuator model is, and what a command unit is, in words for refusals
_MODEL_WORDS = {
    "servo": "position servos",
    "pd": "position PD controllers",
    "torque": "torque (effort) inputs",
    "dc_motor": "DC motors driven by voltage",
}
_UNIT_WORDS = {
    "rad": "positions",
    "m": "positions",
    "N*m": "torques",
    "N": "forces",
    "V": "voltages",
    "rad/s": "velocities",
    "m/s": "velocities",
}


def check_recording(spec: TwinSpec, traj: Trajectory, label: str = "", twin: str = "") -> None:
    """RecordingMismatch (a TwinError) naming the recording (`label`, else its meta name),
    the twin (`twin`, e.g. its artifact id, else its name) and what does not fit: another
    robot's joints (names or count), commands for joints the twin does not actuate, or
    commands in a unit its actuators cannot take (a torque recording in a position-servo
    twin: every replay would fail). Checked before anything is imported or fitted."""
    name = label or str(traj.meta.get("name", "recording"))
    tw = twin or spec.name
    if spec.robot is None:
        if any(c.startswith("robot/") for c in traj.channels):
            raise RecordingMismatch(
                f"recording '{name}' has robot channels but twin '{tw}' has no robot"
            )
        return
    twin_joints = [j.name for j in spec.robot.joints]
    names = traj.meta.get("joint_names")
    if names is not None:
        other = [str(j) for j in names if str(j) not in twin_joints]
        if other:
            raise RecordingMismatch(
                f"recording '{name}' is from another robot than twin '{tw}': its joints "
                f"{list(names)} are not the twin's {twin_joints} (unknown: {other})"
            )
    if "robot/joint_pos" in traj.channels:
        n = traj["robot/joint_pos"].shape[1]
        if n > len(twin_joints) or (names is not None and n != len(names)):
            raise RecordingMismatch(
                f"recording '{name}' is from another robot than twin '{tw}': it has "
                f"{n} joint columns, the twin {len(twin_joints)} joints {twin_joints}"
            )
    acted = [a.joint for a in spec.robot.actuators]
    for cmd in traj.meta.get("command_joints", []) or []:
        if str(cmd) not in acted:
            raise RecordingMismatch(
                f"recording '{name}' commands joint '{cmd}', which twin '{tw}' does "
                f"not actuate (actuated: {acted})"
            )
    if "robot/command" in traj.channels:
        _check_command_units(spec, traj, name, tw)


LIMIT_TOL = 1e-3  # rad (or m): encoder noise of a joint resting on its stop is not a warning


def limit_excursions(
    spec: TwinSpec, traj: Trajectory, label: str = "", twin: str = ""
) -> list[str]:
    """Warnings, one per joint, where the recorded joint positions leave the twin's joint
    limits by more than `LIMIT_TOL`: the joint, how far past which limit, when and for how
    many samples, and the recording. The twin's joint stops at its limit (PyBullet enforces
    the URDF's), so a fit would read the difference as dynamics: wrong limits in the URDF,
    another robot's calibration or an encoder offset. [] when the recording stays inside."""
    if spec.robot is None or "robot/joint_pos" not in traj.channels or len(traj) == 0:
        return []
    name = label or str(traj.meta.get("name", "recording"))
    tw = twin or spec.name
    q = np.asarray(traj["robot/joint_pos"], dtype=float)
    joints = {j.name: j for j in spec.robot.joints}
    names = [str(j) for j in traj.meta.get("joint_names") or list(joints)[: q.shape[1]]]
    out = []
    for col, jn in enumerate(names[: q.shape[1]]):
        js = joints.get(jn)
        if js is None or js.lower is None or js.upper is None:
            continue
        unit = "m" if js.kind == "prismatic" else "rad"
        x = q[:, col]
        over, under = x - js.upper, js.lower - x
        past = np.maximum(over, under)
        bad = np.flatnonzero(past > LIMIT_TOL)
        if bad.size == 0:
            continue
        k = int(bad[np.argmax(past[bad])])
        side, lim = ("upper", js.upper) if over[k] >= under[k] else ("lower", js.lower)
        out.append(
            f"recording '{name}': joint '{jn}' goes {past[k]:.4g} {unit} past its {side} "
            f"limit in twin '{tw}' ({lim:.4g} {unit}; at {x[k]:.4g} {unit}, t = "
            f"{float(traj.t[k] - traj.t[0]):.3f} s; {bad.size} of {len(x)} samples outside): "
            "the twin's joint stops at its limit, so a fit reads the difference as dynamics; "
            "check the twin's URDF limits and the recording's joint calibration"
        )
    return out


def _check_command_units(spec: TwinSpec, traj: Trajectory, name: str, tw: str) -> None:
    """The recording's command unit against what each commanded joint's actuator takes
    (twins/spec.py COMMAND_UNITS; the replay refuses the same, twins/actuators.py)."""
    # pybullet + trimesh (0.3-0.6 s, importtime): twins.fit itself loads without physics
    from twins.simulate import command_joints

    assert spec.robot is not None
    try:
        joints = command_joints(spec, traj)
    except TwinError as exc:
        raise RecordingMismatch(f"recording '{name}' against twin '{tw}': {exc}") from None
    unit = str(traj.units.get("robot/command", "") or "")
    mode = traj.meta.get("command_mode")
    how = f", command mode '{mode}'" if mode else ""
    if not unit:
        raise RecordingMismatch(
            f"recording '{name}': its robot/command channel has no unit{how}, so twin "
            f"'{tw}' cannot tell positions from torques; give the unit in the mapping"
        )
    models: dict[str, list[str]] = {}
    for j in joints:
        a = spec.robot.actuator(j)
        if a is not None and unit not in COMMAND_UNITS[a.model]:
            models.setdefault(a.model, []).append(j)
    if not models:
        return
    what = _UNIT_WORDS.get(unit, "commands")
    parts = [
        f"{', '.join(js)} with {_MODEL_WORDS.get(m, m)} ('{m}' actuators take "
        f"{' or '.join(COMMAND_UNITS[m])})"
        for m, js in models.items()
    ]
    fit_in = [repr(m) for m, units in COMMAND_UNITS.items() if unit in units]
    raise RecordingMismatch(
        f"recording '{name}' commands {what} ({unit}{how}) but twin '{tw}' drives joints "
        f"{'; '.join(parts)}: every replay of it would fail. Match it with a twin whose "
        f"joints take {unit} (actuator model {' or '.join(fit_in) or 'none'}), or record "
        "the robot in the command mode its twin models"
    )


def windows(traj: Trajectory, window_s: float | None, lead_s: float = 0.0) -> list[Trajectory]:
    """`traj` cut into consecutive windows of `window_s` seconds, each with time from 0
    (windows with fewer than 5 samples are dropped); the whole recording when None. Each
    window keeps the commands of the `lead_s` seconds before it in its meta
    (`command_before_t` relative to the window start, `command_before_u`), so a delayed
    actuator sees the commands it would have seen on the real robot."""
    # pybullet + trimesh (0.3-0.6 s, importtime): twins.fit itself loads without physics
    from twins.simulate import command_times

    if window_s is None or window_s <= 0 or window_s >= traj.duration:
        return [with_initial_object_state(traj)]
    out = []
    t0 = float(traj.t[0])
    starts = np.arange(t0, float(traj.t[-1]), window_s)
    has_cmd = "robot/command" in traj.channels
    for a in starts:
        m = (traj.t >= a) & (traj.t < a + window_s + 1e-9)
        if m.sum() < 5:
            continue
        ta = float(traj.t[m][0])
        meta = {**dict(traj.meta), "window_start_s": ta - t0}
        if has_cmd and lead_s > 0:  # their switch times (when they reached the robot)
            before = (traj.t >= ta - lead_s - 1e-9) & (traj.t < ta)
            meta["command_before_t"] = (command_times(traj)[before] - ta).tolist()
            meta["command_before_u"] = traj["robot/command"][before].tolist()
        chans = {k: v[m] for k, v in traj.channels.items()}
        i0 = int(np.flatnonzero(m)[0])
        for name in ("robot/joint_pos", "robot/joint_vel"):
            if name in chans and i0 > 0:
                chans[name] = chans[name].copy()
                chans[name][0] = _local_fit(traj.t, traj[name], i0)
        seg = Trajectory(
            traj.t[m] - ta,
            chans,
            dict(traj.units),
            traj.source,
            meta,
        )
        out.append(with_initial_object_state(seg))  # free objects start moving
    return out


class _Worlds:
    """The twin at one candidate's values (every replay resets it), plus a zero-latency
    copy for the delayed-command windows, each made on first need: this process's kept
    world retuned in place when it can be, else built (twins/world_cache.py)."""

    def __init__(self, spec: TwinSpec, values: dict[str, float]) -> None:
        from contextlib import ExitStack

        self.spec, self.values = spec, values
        self._stack = ExitStack()
        self._world: Any = None
        self._zero: Any = None

    @property
    def world(self) -> Any:
        # pybullet + trimesh (0.3-0.6 s, importtime): twins.fit itself loads without physics
        from twins.world_cache import world_at

        if self._world is None:
            self._world = self._stack.enter_context(world_at(self.spec, self.values))
        return self._world

    @property
    def zero_latency(self) -> Any:
        # pybullet + trimesh (0.3-0.6 s, importtime): twins.fit itself loads without physics
        from twins.world_cache import world_at

        if self._zero is None:
            lat = {n: 0.0 for n in self.values if n.endswith(".latency")}
            zero = world_at(self.spec, {**self.values, **lat}, "zero-latency")
            self._zero = self._stack.enter_context(zero)
        return self._zero

    def __enter__(self) -> _Worlds:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)  # type: ignore[arg-type]


def _local_fit(t: NDArray[np.float64], x: NDArray[np.float64], i0: int, k: int = 5) -> Any:
    """Value at t[i0] of a quadratic fitted to the 2k + 1 samples around it: a window's
    initial state with the sensor noise averaged out (noise in the initial state would
    otherwise propagate through the whole window and bias the fit)."""
    lo, hi = max(i0 - k, 0), min(i0 + k + 1, len(t))
    if hi - lo < 4:
        return x[i0]
    dt = t[lo:hi] - t[i0]
    A = np.stack([np.ones_like(dt), dt, dt * dt], axis=1)
    coef, *_ = np.linalg.lstsq(A, x[lo:hi], rcond=None)
    return coef[0]


def _latencies(spec: TwinSpec, values: Mapping[str, float], w: Trajectory) -> list[float]:
    # pybullet + trimesh (0.3-0.6 s, importtime): twins.fit itself loads without physics
    from twins.simulate import command_joints

    if spec.robot is None or "robot/command" not in w.channels:
        return []
    return [values.get(f"robot.actuators.{j}.latency", 0.0) for j in command_joints(spec, w)]


def _replay_window(worlds: _Worlds, values: dict[str, float], w: Trajectory) -> Trajectory:
    """Replay one window; with latency, the delayed commands come from the recording
    (including the commands before the window) on the physics-step grid, and the twin runs
    with zero latency, so a window does not start with `latency` seconds of hold command."""
    # pybullet (55 ms) + trimesh (0.3-0.6 s): twins.fit itself loads without physics
    from twins.actuators import step_commands
    from twins.simulate import command_joints, command_times, replay_in

    spec = worlds.spec
    lats = _latencies(spec, values, w)
    if not any(v > 0 for v in lats):
        return replay_in(worlds.world, w)
    dt = values["sim.time_step"]
    steps = int(round(w.duration / dt))
    ts: NDArray[np.float64] = np.arange(steps + 1, dtype=np.float64) * dt
    U = w["robot/command"]
    bt = np.asarray(w.meta.get("command_before_t", []), dtype=float).reshape(-1)
    bu = np.asarray(w.meta.get("command_before_u", []), dtype=float).reshape(-1, U.shape[1])
    hist_t = np.concatenate([bt, command_times(w)])  # robot/command_delay honoured
    hist_u = np.vstack([bu, U])
    # each step's average of the delayed command (continuous in the latency)
    fine_u = step_commands(hist_t, np.vstack([hist_u[:1], hist_u]), ts, dt, np.asarray(lats))
    chans = {"robot/command": fine_u}
    units = {"robot/command": w.units.get("robot/command", "")}
    for name in ("robot/joint_pos", "robot/joint_vel"):
        if name in w.channels:
            chans[name] = np.repeat(w[name][:1], len(ts), axis=0)
            units[name] = w.units.get(name, "")
    for name in w.channels:
        if name.startswith("objects/") and name.endswith("/pose"):
            chans[name] = np.repeat(w[name][:1], len(ts), axis=0)
            units[name] = w.units.get(name, "")
    cj = command_joints(spec, w)
    fine = Trajectory(ts, chans, units, w.source, {**dict(w.meta), "command_joints": cj})
    sim = replay_in(worlds.zero_latency, fine)
    at = np.clip(np.rint(w.t / dt).astype(int), 0, steps)
    return Trajectory(
        w.t,
        {k: v[at] for k, v in sim.channels.items()},
        dict(sim.units),
        "sim",
        {**dict(sim.meta), "params": dict(values)},
    )


# -- one evaluation (runs in a worker) ----------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """Everything a worker needs to score one candidate (picklable). `rotation_m`: per pose
    channel, the length (m) a rotation residual (rad) is multiplied by before it joins the
    position residuals (`rotation_lengths`); a channel not named compares radians as they are."""

    spec: TwinSpec
    space: Space
    windows: tuple[Trajectory, ...]
    channels: tuple[tuple[str, float, float], ...]  # name, weight, scale
    rotation_m: tuple[tuple[str, float], ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        # Trajectory holds read-only mapping proxies, which do not pickle: send plain parts
        plain = tuple(
            (w.t, dict(w.channels), dict(w.units), w.source, dict(w.meta)) for w in self.windows
        )
        return (_problem, (self.spec, self.space, plain, self.channels, self.rotation_m))


def _problem(
    spec: TwinSpec,
    space: Space,
    plain: tuple[tuple[Any, ...], ...],
    channels: tuple[tuple[str, float, float], ...],
    rotation_m: tuple[tuple[str, float], ...] = (),
) -> Problem:
    return Problem(spec, space, tuple(Trajectory(*w) for w in plain), channels, rotation_m)


def rotation_lengths(spec: TwinSpec, channels: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """(pose channel, radius of gyration in m) for each `objects/<name>/pose` channel of an
    object of `spec`: a small rotation θ moves the body's mass points by θ times it, RMS
    (sqrt of the mean of inertia / mass over the three axes: exact for a cube or a sphere,
    the axes' average otherwise). Rotation residuals scaled by it are metres of the body's
    displacement, so position and orientation whiten into one unit instead of adding
    metres to radians."""
    out = []
    for c in channels:
        parts = c.split("/")
        if len(parts) == 3 and parts[0] == "objects" and parts[2] == "pose":
            obj = next((o for o in spec.objects if o.name == parts[1]), None)
            if obj is not None:
                Ib = np.asarray(obj.inertia_per_kg, float).reshape(3, 3)
                out.append((c, float(math.sqrt(np.trace(Ib) / 3))))
    return tuple(out)


def pose_parts(channel: str) -> tuple[str, str]:
    """The names under which a pose channel's position error (m, Euclidean distance) and
    orientation error (rad, the angle of the relative rotation) are reported apart:
    `objects/<name>/position` and `objects/<name>/orientation`."""
    base = channel.rsplit("/", 1)[0]
    return f"{base}/position", f"{base}/orientation"


@dataclass(frozen=True)
class Outcome:
    """Residuals (normalised, weighted) or None when a simulation failed; per-channel sum
    of squared errors in the channel's own units and sample counts; the failure message."""

    residuals: NDArray[np.float64] | None
    sse: Mapping[str, float]
    count: Mapping[str, int]
    error: str = ""

    @property
    def loss(self) -> float:
        if self.residuals is None or not np.all(np.isfinite(self.residuals)):
            return PENALTY
        return float(np.mean(self.residuals**2)) if self.residuals.size else 0.0


def _rotvec_err(qa: NDArray[np.float64], qb: NDArray[np.float64]) -> NDArray[np.float64]:
    """Rotation vectors (K, 3) of qb^-1 qa for quaternion arrays xyzw."""
    va, wa = qa[:, :3], qa[:, 3:]
    vb, wb = -qb[:, :3], qb[:, 3:]
    w = wb * wa - np.sum(vb * va, axis=1, keepdims=True)
    v = wb * va + wa * vb + np.cross(vb, va)
    sign = np.where(w < 0, -1.0, 1.0)
    w, v = w * sign, v * sign
    nv = np.linalg.norm(v, axis=1, keepdims=True)
    ang = 2 * np.arctan2(nv, w)
    with np.errstate(invalid="ignore", divide="ignore"):
        axis = np.where(nv > 1e-12, v / nv, 0.0)
    return np.asarray(axis * ang)


def _channel_error(real: Trajectory, sim: Trajectory, name: str) -> NDArray[np.float64]:
    r = real[name]
    if name not in sim.channels:
        raise TwinError(
            f"channel '{name}' is not simulated by this twin (sim has: {', '.join(sim.channels)})"
        )
    s = sim[name]
    if name.startswith("robot/joint") and s.shape[1] != r.shape[1]:
        jn = [str(j) for j in real.meta.get("joint_names", [])]
        sim_jn = [str(j) for j in sim.meta.get("joint_names", [])]
        s = s[:, [sim_jn.index(j) for j in jn]] if jn else s[:, : r.shape[1]]
    if real.units.get(name) == POSE_UNIT and r.shape[1] == 7:
        if name.split("/")[1] in (real.meta.get("spinless_objects") or ()):
            # symmetric about its z (a cylinder): a camera cannot see its spin

            s = np.array([drop_spin(p) for p in s])
            r = np.array([drop_spin(p) for p in r])
        err = np.hstack([s[:, :3] - r[:, :3], _rotvec_err(s[:, 3:], r[:, 3:])])
        lost = lost_rows(real, name)  # samples the tracker flagged: no evidence
        if lost is not None:
            err[lost] = 0.0
        return err
    return np.asarray(s - r)


def evaluate(task: tuple[Problem, NDArray[np.float64]]) -> Outcome:
    """Replay every window at candidate `u`; never raises (a failure is an Outcome)."""
    prob, u = task
    values = prob.spec.params.validate(prob.space.all_values(u))
    parts: list[NDArray[np.float64]] = []
    sse = {c: 0.0 for c, _, _ in prob.channels}
    count = {c: 0 for c, _, _ in prob.channels}
    rot_m = dict(prob.rotation_m)
    pose = {
        c for c, _, _ in prob.channels if prob.windows and prob.windows[0].units.get(c) == POSE_UNIT
    }
    for c in pose:  # position and orientation errors, each in its own unit
        for k in pose_parts(c):
            sse[k], count[k] = 0.0, 0
    try:
        with _Worlds(prob.spec, values) as worlds:
            for w in prob.windows:
                sim = _replay_window(worlds, values, w)
                for name, weight, scale in prob.channels:
                    e = _channel_error(w, sim, name)
                    if not np.all(np.isfinite(e)):
                        raise TwinError(f"channel '{name}' is not finite in the simulation")
                    sse[name] += float(np.sum(e**2))
                    count[name] += int(e.size)
                    if name in pose and e.shape[1] == 6:
                        used = _used_rows(w, name)
                        pk, ok = pose_parts(name)
                        sse[pk] += float(np.sum(e[used, :3] ** 2))
                        sse[ok] += float(np.sum(e[used, 3:] ** 2))
                        count[pk] += int(used.sum())
                        count[ok] += int(used.sum())
                        if name in rot_m:
                            e = np.hstack([e[:, :3], e[:, 3:] * rot_m[name]])
                    parts.append((e * (math.sqrt(weight) / scale)).reshape(-1))
    except Exception as exc:  # an exploded or unbuildable twin is a failed sample
        return Outcome(None, sse, count, f"{type(exc).__name__}: {exc}")
    r = np.concatenate(parts) if parts else np.zeros(0)
    return Outcome(r, sse, count)


def _used_rows(w: Trajectory, name: str) -> NDArray[np.bool_]:
    """Rows of a pose channel that are evidence (not flagged lost by the tracker)."""
    lost = lost_rows(w, name)
    return np.ones(len(w), bool) if lost is None else ~lost


def residual_size(prob: Problem) -> int:
    n = 0
    for w in prob.windows:
        for name, _, _ in prob.channels:
            width = w[name].shape[1]
            n += len(w) * (6 if w.units.get(name) == POSE_UNIT and width == 7 else width)
    return n


def residual_blocks(prob: Problem) -> list[slice]:
    """The slice of the residual vector each window fills."""
    out, k = [], 0
    for w in prob.windows:
        n = 0
        for name, _, _ in prob.channels:
            width = w[name].shape[1]
            n += len(w) * (6 if w.units.get(name) == POSE_UNIT and width == 7 else width)
        out.append(slice(k, k + n))
        k += n
    return out


def rmse(out: Outcome) -> dict[str, float]:
    """Per-channel RMSE in the channel's own units (NaN when the simulation failed)."""
    return {
        c: (
            math.sqrt(out.sse[c] / out.count[c])
            if out.residuals is not None and out.count[c]
            else float("nan")
        )
        for c in out.sse
    }


def replay_rmse(
    spec: TwinSpec,
    recordings: Sequence[Trajectory],
    window_s: float | None = 1.0,
    values: Mapping[str, float] | None = None,
    channels: Sequence[str] = ("robot/joint_pos",),
) -> dict[str, float]:
    """Per-channel RMSE (channel units) of the twin at `values` (its nominals when None)
    over windowed replays of `recordings`, the same measure a fit minimises: how twin
    versions compare on held-out recordings. NaN when a simulation fails. A pose channel
    also reports its position error (Euclidean, m) and orientation error (angle, rad) apart,
    under `pose_parts`' names."""
    for r in recordings:
        check_recording(spec, r)
    at = spec.with_values(values or {})
    vals = at.params.nominal()
    lead = max([v for n, v in vals.items() if n.endswith(".latency")] + [0.0]) + 0.01
    ws = tuple(w for r in recordings for w in windows(r, window_s, lead))
    nothing = Space((), np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool))  # all nominal
    prob = Problem(at, nothing, ws, tuple((c, 1.0, 1.0) for c in channels))
    return rmse(evaluate((prob, np.zeros(0))))


# -- the result -------------------------------------------------------------------------------
