"""Fit twin parameters to recordings (system identification), with honest uncertainty.

`fit_steps(spec, recordings, config, executor)` is a generator: it yields plain
`(fraction, message, partial)` tuples (twins/ cannot import app/; app/workflows/fit.py wraps
them as `Progress`) and returns a `FitResult`. Cancel = `close()` between yields; every
yield's `partial["checkpoint"]` lets `fit_steps(..., resume=checkpoint)` continue.

- **Parameters** are dotted names from the twin's ParamSet, searched in a normalised space
  u in [0, 1]: linear between the bounds, logarithmic where the prior is log.
- **Objective**: weighted mean squared discrepancy over chosen channels, each divided by
  the spread (std) of the recorded channel so joint angles, efforts and object poses can be
  mixed; pose channels compare position (m) and rotation (rotation-vector of the relative
  rotation, rad). Time alignment: each recording is cut into windows of `window_s` seconds,
  each replayed from its own recorded initial state (multiple shooting: a pendulum's
  open-loop replay diverges after a swing or two), and sim is sampled at the recording's
  own timestamps; a constant delay is the actuators' `latency` parameter (every actuator
  model has one; include `robot.actuators.<joint>.latency` in `params` to fit it).
- **Point estimate**: CMA-ES (`cma`) in u-space, then a Levenberg-style least-squares
  polish (scipy `least_squares`, trust region, in rounds so the job can yield), with a
  central-difference Jacobian computed in parallel through the executor.
- **Failed simulations** (TwinError such as an exploded twin, any exception, NaN) count
  as failed samples with a penalty loss; the fit goes on and reports how many failed.
- **Validation**: recordings (or, with one recording, every `1/validation`-th window) the
  optimiser never sees; RMSE per channel before and after is reported.
- **Posterior**: Laplace approximation at the optimum (twins/posterior.py). SBI (NPE on
  summary statistics) and SMC-ABC are to come.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.trajectory import Trajectory
from twins.errors import TwinError
from twins.executor import Executor, SerialExecutor
from twins.posterior import ParamPosterior, laplace
from twins.spec import TwinSpec

POSE_UNIT = "xyz_m+quat_xyzw"
PENALTY = 1e6  # loss of a failed simulation (normalised losses are O(1))
FAILED_RESIDUAL = 1e3  # residual value standing in for a failed window in least squares
FD_STEP = 0.01  # central-difference step in normalised units (1 % of the range)

Step = tuple[float | None, str, Any]


@dataclass(frozen=True)
class FitConfig:
    """What to fit and how hard to try. `budget`: CMA-ES objective evaluations (each
    replays every training window once); `polish_rounds`: least-squares rounds (each about
    2n + 2 evaluations). `validation`: share of windows held out when there are no
    validation recordings."""

    params: tuple[str, ...]
    channels: Mapping[str, float] = field(default_factory=lambda: {"robot/joint_pos": 1.0})
    window_s: float | None = 1.0
    budget: int = 200
    popsize: int | None = None
    sigma0: float = 0.25
    polish_rounds: int = 4
    validation: float = 0.25
    seed: int = 0
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "params": list(self.params),
            "channels": dict(self.channels),
            "window_s": self.window_s,
            "budget": self.budget,
            "popsize": self.popsize,
            "sigma0": self.sigma0,
            "polish_rounds": self.polish_rounds,
            "validation": self.validation,
            "seed": self.seed,
            "bounds": {k: list(v) for k, v in self.bounds.items()},
        }


# -- the normalised parameter space ------------------------------------------------------------
@dataclass(frozen=True)
class Space:
    """u in [0, 1]^n <-> physical values, log where the prior is log."""

    names: tuple[str, ...]
    low: NDArray[np.float64]
    high: NDArray[np.float64]
    log: NDArray[np.bool_]

    @classmethod
    def of(
        cls,
        spec: TwinSpec,
        names: Sequence[str],
        bounds: Mapping[str, tuple[float, float]] | None = None,
    ) -> Space:
        """The search space of `names`; `bounds` narrow a parameter's search range (it
        must lie within the parameter's own bounds)."""
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
        return cls(
            tuple(names),
            np.array(lows),
            np.array(highs),
            np.array([p.prior in ("loguniform", "lognormal") for p in ps]),
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
        return dict(zip(self.names, (float(v) for v in self.to_x(u)), strict=True))


# -- recordings: checks and windows -------------------------------------------------------------
def check_recording(spec: TwinSpec, traj: Trajectory, label: str = "") -> None:
    """TwinError when `traj` is from another robot than the twin (joint names or count)."""
    name = label or str(traj.meta.get("name", "recording"))
    if spec.robot is None:
        if any(c.startswith("robot/") for c in traj.channels):
            raise TwinError(
                f"recording '{name}' has robot channels but twin '{spec.name}' has no robot"
            )
        return
    twin_joints = [j.name for j in spec.robot.joints]
    names = traj.meta.get("joint_names")
    if names is not None:
        other = [str(j) for j in names if str(j) not in twin_joints]
        if other:
            raise TwinError(
                f"recording '{name}' is from another robot than twin '{spec.name}': its joints "
                f"{list(names)} are not the twin's {twin_joints} (unknown: {other})"
            )
    if "robot/joint_pos" in traj.channels:
        n = traj["robot/joint_pos"].shape[1]
        if n > len(twin_joints) or (names is not None and n != len(names)):
            raise TwinError(
                f"recording '{name}' is from another robot than twin '{spec.name}': it has "
                f"{n} joint columns, the twin {len(twin_joints)} joints {twin_joints}"
            )
    for cmd in traj.meta.get("command_joints", []) or []:
        acted = [a.joint for a in spec.robot.actuators]
        if str(cmd) not in acted:
            raise TwinError(
                f"recording '{name}' commands joint '{cmd}', which twin '{spec.name}' does "
                f"not actuate (actuated: {acted})"
            )


def windows(traj: Trajectory, window_s: float | None, lead_s: float = 0.0) -> list[Trajectory]:
    """`traj` cut into consecutive windows of `window_s` seconds, each with time from 0
    (windows with fewer than 5 samples are dropped); the whole recording when None. Each
    window keeps the commands of the `lead_s` seconds before it in its meta
    (`command_before_t` relative to the window start, `command_before_u`), so a delayed
    actuator sees the commands it would have seen on the real robot."""
    if window_s is None or window_s <= 0 or window_s >= traj.duration:
        return [traj]
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
        if has_cmd and lead_s > 0:
            before = (traj.t >= ta - lead_s - 1e-9) & (traj.t < ta)
            meta["command_before_t"] = (traj.t[before] - ta).tolist()
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
        out.append(seg)
    return out


class _Worlds:
    """The twin built once per evaluation (every replay resets it), plus a zero-latency
    copy built on first need for the delayed-command windows."""

    def __init__(self, spec: TwinSpec, values: dict[str, float]) -> None:
        from twins.builder import TwinWorld

        self.spec, self.values = spec, values
        self.world = TwinWorld(spec, values)
        self._zero: Any = None

    @property
    def zero_latency(self) -> Any:
        from twins.builder import TwinWorld

        if self._zero is None:
            lat = {n: 0.0 for n in self.values if n.endswith(".latency")}
            self._zero = TwinWorld(self.spec, {**self.values, **lat})
        return self._zero

    def __enter__(self) -> _Worlds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.world.close()
        if self._zero is not None:
            self._zero.close()


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
    from twins.simulate import command_joints

    if spec.robot is None or "robot/command" not in w.channels:
        return []
    return [values.get(f"robot.actuators.{j}.latency", 0.0) for j in command_joints(spec, w)]


def _replay_window(worlds: _Worlds, values: dict[str, float], w: Trajectory) -> Trajectory:
    """Replay one window; with latency, the delayed commands come from the recording
    (including the commands before the window) on the physics-step grid, and the twin runs
    with zero latency, so a window does not start with `latency` seconds of hold command."""
    from twins.simulate import command_joints, replay_in

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
    hist_t = np.concatenate([bt, w.t])
    hist_u = np.vstack([bu, U])
    fine_u = np.empty((len(ts), U.shape[1]))
    for j, lat in enumerate(lats):
        idx = np.searchsorted(hist_t + lat, ts + 1e-9, side="right") - 1
        fine_u[:, j] = hist_u[np.clip(idx, 0, None), j]
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
    """Everything a worker needs to score one candidate (picklable)."""

    spec: TwinSpec
    space: Space
    windows: tuple[Trajectory, ...]
    channels: tuple[tuple[str, float, float], ...]  # name, weight, scale

    def __reduce__(self) -> tuple[Any, ...]:
        # Trajectory holds read-only mapping proxies, which do not pickle: send plain parts
        plain = tuple(
            (w.t, dict(w.channels), dict(w.units), w.source, dict(w.meta)) for w in self.windows
        )
        return (_problem, (self.spec, self.space, plain, self.channels))


def _problem(
    spec: TwinSpec,
    space: Space,
    plain: tuple[tuple[Any, ...], ...],
    channels: tuple[tuple[str, float, float], ...],
) -> Problem:
    return Problem(spec, space, tuple(Trajectory(*w) for w in plain), channels)


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
        return np.hstack([s[:, :3] - r[:, :3], _rotvec_err(s[:, 3:], r[:, 3:])])
    return np.asarray(s - r)


def evaluate(task: tuple[Problem, NDArray[np.float64]]) -> Outcome:
    """Replay every window at candidate `u`; never raises (a failure is an Outcome)."""
    prob, u = task
    values = prob.spec.params.validate(prob.space.values(u))
    parts: list[NDArray[np.float64]] = []
    sse = {c: 0.0 for c, _, _ in prob.channels}
    count = {c: 0 for c, _, _ in prob.channels}
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
                    parts.append((e * (math.sqrt(weight) / scale)).reshape(-1))
    except Exception as exc:  # an exploded or unbuildable twin is a failed sample
        return Outcome(None, sse, count, f"{type(exc).__name__}: {exc}")
    r = np.concatenate(parts) if parts else np.zeros(0)
    return Outcome(r, sse, count)


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
    versions compare on held-out recordings. NaN when a simulation fails."""
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
@dataclass(frozen=True)
class FitResult:
    """A finished fit: estimate and posterior, errors before and after on the training and
    validation windows, effort spent, history, notes."""

    config: FitConfig
    start: Mapping[str, float]
    estimate: Mapping[str, float]
    posterior: ParamPosterior
    train_rmse_before: Mapping[str, float]
    train_rmse_after: Mapping[str, float]
    validation_rmse_before: Mapping[str, float]
    validation_rmse_after: Mapping[str, float]
    loss_before: float
    loss_after: float
    evaluations: int
    rollouts: int
    failed: int
    history: tuple[Mapping[str, Any], ...]
    wall_s: float
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        def clean(d: Mapping[str, float]) -> dict[str, float | None]:
            return {k: (None if not math.isfinite(v) else v) for k, v in d.items()}

        return {
            "config": self.config.to_json(),
            "start": dict(self.start),
            "estimate": dict(self.estimate),
            "posterior": self.posterior.to_json(),
            "train_rmse_before": clean(self.train_rmse_before),
            "train_rmse_after": clean(self.train_rmse_after),
            "validation_rmse_before": clean(self.validation_rmse_before),
            "validation_rmse_after": clean(self.validation_rmse_after),
            "loss_before": self.loss_before,
            "loss_after": self.loss_after,
            "evaluations": self.evaluations,
            "rollouts": self.rollouts,
            "failed": self.failed,
            "history": [dict(h) for h in self.history],
            "wall_s": self.wall_s,
            "notes": list(self.notes),
        }


# -- the job ----------------------------------------------------------------------------------
def _split(
    recordings: Sequence[Trajectory],
    validation: Sequence[Trajectory],
    config: FitConfig,
    lead_s: float = 0.0,
) -> tuple[list[Trajectory], list[Trajectory]]:
    lead = max(lead_s, 0.0)
    train = [w for r in recordings for w in windows(r, config.window_s, lead)]
    if validation:
        val = [w for r in validation for w in windows(r, config.window_s, lead)]
        return train, val
    if config.validation <= 0 or len(train) < 2:
        return train, []
    every = max(2, int(round(1 / config.validation)))
    val = [w for i, w in enumerate(train) if i % every == every - 1]
    return [w for i, w in enumerate(train) if i % every != every - 1], val


def _channels(
    windows_: Sequence[Trajectory], config: FitConfig
) -> tuple[tuple[str, float, float], ...]:
    out = []
    for name, weight in config.channels.items():
        if weight <= 0:
            continue
        missing = [str(w.meta.get("name", "?")) for w in windows_ if name not in w.channels]
        if missing:
            raise TwinError(f"fit: channel '{name}' is missing from recording {missing[0]}")
        data = np.vstack([w[name] for w in windows_])
        if windows_[0].units.get(name) == POSE_UNIT and data.shape[1] == 7:
            scale = max(float(np.std(data[:, :3])), 1e-3)
        else:
            scale = max(float(np.std(data)), 1e-6)
        out.append((name, float(weight), scale))
    if not out:
        raise TwinError("fit: no channel with a positive weight")
    return tuple(out)


def fit_steps(
    spec: TwinSpec,
    recordings: Sequence[Trajectory],
    config: FitConfig,
    executor: Executor | None = None,
    validation: Sequence[Trajectory] = (),
    resume: Mapping[str, Any] | None = None,
) -> Generator[Step, None, FitResult]:
    """The fit as a job (see the module docstring). Raises TwinError for a bad choice of
    parameters, channels or recordings before any simulation runs."""
    import warnings

    from scipy.optimize import least_squares

    with warnings.catch_warnings():  # cma warns that matplotlib (for its plots) is missing
        warnings.simplefilter("ignore", UserWarning)
        import cma

    t_start = time.perf_counter()
    ex = executor or SerialExecutor()
    if not recordings:
        raise TwinError("fit: choose at least one recording")
    for r in (*recordings, *validation):
        check_recording(spec, r)
    space = Space.of(spec, config.params, config.bounds)
    # the longest delay any candidate can have: windows carry that much command history
    lead = max(
        [spec.params[n].high for n in space.names if n.endswith(".latency")]
        + [p.nominal for n, p in spec.params.items() if n.endswith(".latency")]
        + [0.0]
    )
    train_w, val_w = _split(recordings, validation, config, lead + 0.01)
    chans = _channels(train_w + val_w, config)
    train = Problem(spec, space, tuple(train_w), chans)
    val = Problem(spec, space, tuple(val_w), chans) if val_w else None
    notes: list[str] = []
    if not any(n.endswith(".latency") for n in space.names):
        notes.append("latency not fitted (add robot.actuators.<joint>.latency to fit it)")
    u0 = space.to_u(np.array([spec.params[n].nominal for n in space.names]))
    counters = {"evals": 0, "failed": 0}
    history: list[dict[str, Any]] = list(resume.get("history", [])) if resume else []
    last_error = [""]

    def run(us: Sequence[NDArray[np.float64]], prob: Problem = train) -> list[Outcome]:
        outs = list(ex.map(evaluate, [(prob, np.asarray(u, dtype=float)) for u in us]))
        if prob is train:
            counters["evals"] += len(outs)
            bad = [o for o in outs if o.residuals is None]
            counters["failed"] += len(bad)
            if bad:
                last_error[0] = bad[-1].error
        return outs

    yield (0.0, f"scoring the start on {len(train_w)} windows", None)
    start_out = run([u0])[0]
    loss0 = start_out.loss
    val_before = rmse(run([u0], val)[0]) if val else {}
    best_u, best_loss = u0.copy(), loss0
    mean_u, sigma = u0, config.sigma0
    done_before = 0
    if resume:
        mean_u = np.asarray(resume["mean_u"], dtype=float)
        sigma = float(resume["sigma"])
        best_u = np.asarray(resume["best_u"], dtype=float)
        best_loss = float(resume["best_loss"])
        done_before = int(resume.get("evals", 0))
        counters["evals"] += done_before
    budget = max(config.budget - done_before, 0)
    n = len(space.names)
    opts: dict[str, Any] = {
        "bounds": [0.0, 1.0],
        "seed": config.seed + 1 + done_before,
        "verbose": -9,
        "maxfevals": budget,
        "tolfun": 1e-9,
    }
    if config.popsize:
        opts["popsize"] = config.popsize
    # the progress bar counts the polish too: a round takes up to 6 (2n + 1) evaluations,
    # usually about a third of that
    total = budget + config.polish_rounds * 2 * (2 * n + 1) + 1

    def fraction() -> float:
        return min((counters["evals"] - done_before - 1) / total, 0.99)

    if budget > 0:
        # cma needs two dimensions; a one-parameter fit carries a dummy coordinate that
        # the objective ignores
        pad = 1 if n == 1 else 0
        start = list(mean_u) + [0.5] * pad
        es = cma.CMAEvolutionStrategy(start, sigma, opts)
        gen = 0
        while not es.stop():
            raw = es.ask()
            X = [np.clip(np.asarray(x)[:n], 0.0, 1.0) for x in raw]
            outs = run(X)
            losses = [o.loss for o in outs]
            es.tell(raw, losses)
            k = int(np.argmin(losses))
            if losses[k] < best_loss:
                best_u, best_loss = X[k].copy(), losses[k]
            gen += 1
            rec = {
                "stage": "cmaes",
                "generation": gen,
                "evals": counters["evals"],
                "best_loss": best_loss,
                "gen_best_loss": losses[k],
                "sigma": float(es.sigma),
                "failed": counters["failed"],
                "best": space.values(best_u),
            }
            history.append(rec)
            checkpoint = {
                "mean_u": [float(v) for v in es.mean[:n]],
                "sigma": float(es.sigma),
                "best_u": [float(v) for v in best_u],
                "best_loss": best_loss,
                "evals": counters["evals"] - 1,  # the start's evaluation is not CMA budget
                "history": history,
            }
            yield (
                fraction(),
                f"CMA-ES gen {gen}: loss {best_loss:.4g} ({counters['failed']} failed)",
                {**rec, "checkpoint": checkpoint},
            )
    # least-squares polish in rounds (so the job can yield and be cancelled)
    m = residual_size(train)

    def res_of(o: Outcome) -> NDArray[np.float64]:
        if o.residuals is None or o.residuals.size != m or not np.all(np.isfinite(o.residuals)):
            return np.full(m, FAILED_RESIDUAL)
        return o.residuals

    def jacobian(u: NDArray[np.float64]) -> NDArray[np.float64]:
        pts = []
        steps = []
        for i in range(n):
            hi = min(u[i] + FD_STEP, 1.0)
            lo = max(u[i] - FD_STEP, 0.0)
            up, dn = u.copy(), u.copy()
            up[i], dn[i] = hi, lo
            pts += [up, dn]
            steps.append(hi - lo)
        outs = run(pts)
        J = np.empty((m, n))
        for i in range(n):
            a, b = outs[2 * i], outs[2 * i + 1]
            if a.residuals is None or b.residuals is None:
                J[:, i] = np.nan
            else:
                J[:, i] = (res_of(a) - res_of(b)) / steps[i]
        return J

    J_cache: dict[bytes, NDArray[np.float64]] = {}

    def jac_safe(u: NDArray[np.float64]) -> NDArray[np.float64]:
        key = np.asarray(u).tobytes()
        if key not in J_cache:
            J_cache.clear()
            J_cache[key] = jacobian(np.asarray(u, dtype=float))
        return np.nan_to_num(J_cache[key])

    for rnd in range(config.polish_rounds):
        try:
            sol = least_squares(
                lambda u: res_of(run([u])[0]),
                np.clip(best_u, 1e-9, 1 - 1e-9),
                jac=jac_safe,
                bounds=(0.0, 1.0),
                max_nfev=6,
                method="trf",
                x_scale="jac",
            )
        except (ValueError, np.linalg.LinAlgError) as exc:
            notes.append(f"least-squares polish stopped: {exc}")
            break
        new_loss = float(np.mean(sol.fun**2)) if sol.fun.size else 0.0
        improved = new_loss < best_loss * (1 - 1e-5)
        if new_loss < best_loss:
            best_u, best_loss = np.asarray(sol.x, dtype=float), new_loss
        rec = {
            "stage": "polish",
            "round": rnd + 1,
            "evals": counters["evals"],
            "best_loss": best_loss,
            "failed": counters["failed"],
            "best": space.values(best_u),
        }
        history.append(rec)
        yield (
            fraction(),
            f"least-squares polish {rnd + 1}: loss {best_loss:.4g}",
            rec,
        )
        if not improved:
            break
    yield (0.99, "uncertainty (Laplace) and validation", None)
    final = run([best_u])[0]
    J = J_cache.get(best_u.tobytes())
    if J is None:
        J = jacobian(best_u)
    posterior = laplace(
        space.names,
        best_u,
        J,
        res_of(final),
        space.to_x,
        seed=config.seed,
        history=history,
        blocks=residual_blocks(train),
    )
    posterior = _latency_resolution(posterior, spec)
    val_after = rmse(run([best_u], val)[0]) if val else {}
    if counters["failed"]:
        notes.append(
            f"{counters['failed']} of {counters['evals']} simulations failed and were scored "
            f"as failed samples (last: {last_error[0][:200]})"
        )
    result = FitResult(
        config=config,
        start=space.values(u0),
        estimate=space.values(best_u),
        posterior=posterior,
        train_rmse_before=rmse(start_out),
        train_rmse_after=rmse(final),
        validation_rmse_before=val_before,
        validation_rmse_after=val_after,
        loss_before=loss0,
        loss_after=final.loss,
        evaluations=counters["evals"],
        rollouts=counters["evals"] * len(train_w),
        failed=counters["failed"],
        history=tuple(history),
        wall_s=round(time.perf_counter() - t_start, 3),
        notes=tuple(notes),
    )
    yield (1.0, f"fit done: loss {loss0:.4g} -> {final.loss:.4g}", None)
    return result


def _latency_resolution(post: ParamPosterior, spec: TwinSpec) -> ParamPosterior:
    """A replay resolves delays to one physics step: every latency in (k dt, (k+1) dt]
    gives the same simulation, so a latency's interval is widened by half a step each side
    and its std by the step's uniform spread (dt / sqrt 12)."""
    from dataclasses import replace

    dt = spec.params["sim.time_step"].nominal
    std, iv = dict(post.std), dict(post.interval90)
    for n in post.names:
        if n.endswith(".latency") and math.isfinite(std[n]):
            p = spec.params[n]
            std[n] = math.sqrt(std[n] ** 2 + dt * dt / 12)
            lo, hi = iv[n]
            iv[n] = (max(p.low, lo - dt / 2), min(p.high, hi + dt / 2))
    return replace(post, std=std, interval90=iv)


def fit(
    spec: TwinSpec,
    recordings: Sequence[Trajectory],
    config: FitConfig,
    executor: Executor | None = None,
    validation: Sequence[Trajectory] = (),
) -> FitResult:
    """`fit_steps` run to the end (scripts and tests)."""
    gen = fit_steps(spec, recordings, config, executor, validation)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
