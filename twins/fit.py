"""Fit twin parameters to recordings (system identification), with honest uncertainty.

`fit_steps(spec, recordings, config, executor)` is a generator: it yields plain
`(fraction, message, partial)` tuples (twins/ cannot import app/; app/workflows/fit.py wraps
them as `Progress`) and returns a `FitResult`. Cancel = `close()` between yields; every
yield's `partial["checkpoint"]` lets `fit_steps(..., resume=checkpoint)` continue.

- **Parameters** are dotted names from the twin's ParamSet, searched in a normalised space
  u in [0, 1]: linear between the bounds, logarithmic where the prior is log.
- **Objective**: weighted mean squared discrepancy over chosen channels, each divided by
  the spread (std) of the recorded channel — or, with `scales="noise"`, by its sensor
  noise (twins/fit_channels.py) — so joint angles, efforts and object poses can be mixed;
  pose channels compare position (m) and rotation (rotation-vector of the relative
  rotation, rad). Time alignment: each recording is cut into windows of `window_s` seconds,
  each replayed from its own recorded initial state (multiple shooting: a pendulum's
  open-loop replay diverges after a swing or two), and sim is sampled at the recording's
  own timestamps; a constant delay is the actuators' `latency` parameter (every actuator
  model has one; include `robot.actuators.<joint>.latency` in `params` to fit it).
- **Point estimate**: CMA-ES (`cma`) in u-space, then a Levenberg-style least-squares
  polish (scipy `least_squares`, trust region, in rounds so the job can yield), with a
  central-difference Jacobian computed in parallel through the executor.
- **Failed simulations** (TwinError such as an exploded twin, any exception, NaN) count
  as failed samples with a penalty loss; the fit goes on and reports how many failed
  (each CMA-ES generation's `partial` carries the last failure's message, `last_error`).
  Whether a fit whose replays mostly failed is a fit at all is the caller's judgement
  (app/workflows/fit.py: it is not, and is not saved).
- **Validation**: recordings (or, with one recording, every `1/validation`-th window) the
  optimiser never sees; RMSE per channel before and after is reported.
- **Posterior**: Laplace approximation at the optimum (twins/posterior.py; its curvature
  checked by 2n replays at the interval's own scale), or sampled by
  SMC — kernel ABC on the replay residuals, started from the Laplace approximation
  (`posterior="smc"`, twins/fit_posterior.py). SBI (NPE on summary statistics) is to come.

The objective itself (parameter space, windows, replay, residuals) is twins/objective.py;
its public names are re-exported here for callers of the fit.
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
from twins.fit_channels import channel_scales, noise_level
from twins.fit_latency import latency_candidates
from twins.fit_posterior import (
    channel_masks,
    latency_resolution,
    smc_posterior_steps,
    with_identifiability,
)
from twins.objective import (
    FAILED_RESIDUAL,
    Outcome,
    Problem,
    Space,
    check_recording,
    evaluate,
    limit_excursions,
    replay_rmse,
    residual_blocks,
    residual_size,
    rmse,
    rotation_lengths,
    windows,
)
from twins.posterior import (
    ParamPosterior,
    curvature_probes,
    curvature_scale,
    laplace,
    laplace_covariance,
)
from twins.spec import TwinSpec

FD_STEP = 0.01  # central-difference step in normalised units (1 % of the range)
STALL_TOL = 0.01  # CMA-ES stalls when its best loss improves less than this share

Step = tuple[float | None, str, Any]


@dataclass(frozen=True)
class FitConfig:
    """What to fit and how hard to try. `budget`: CMA-ES objective evaluations (each
    replays every training window once); `polish_rounds`: least-squares rounds (each about
    2n + 2 evaluations). `validation`: share of windows held out when there are no
    validation recordings. `stall_generations`: stop CMA-ES early when its best loss has
    improved less than 1 % over that many generations (None: run the whole budget);
    `tie`: parameters that take the value of a fitted one."""

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
    tie: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    stall_generations: int | None = None
    posterior: str = "laplace"  # or "smc": sampled (twins/fit_posterior.py), `particles` of them
    particles: int = 64
    scales: str = "spread"  # or "noise": each channel divided by its sensor noise (fit_channels.py)
    # pose channels: "rad" adds rotation residuals (rad) to position residuals (m) as they
    # are; "gyration" first multiplies them by the object's radius of gyration, so both are
    # metres of the body's displacement (objective.rotation_lengths); "position" fits the
    # positions only (orientation errors are still reported)
    pose_rotation: str = "rad"
    # a coarse global stage before CMA-ES: this many scrambled-Sobol points over the whole
    # search box, seeded; CMA-ES starts from the best of them and the start (0: none)
    global_samples: int = 0

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
            "tie": {k: list(v) for k, v in self.tie.items()},
            "stall_generations": self.stall_generations,
            "posterior": self.posterior,
            "particles": self.particles,
            "scales": self.scales,
            "pose_rotation": self.pose_rotation,
            "global_samples": self.global_samples,
        }


# -- the normalised parameter space ------------------------------------------------------------


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
    """(name, weight, scale) per channel with a positive weight (twins/fit_channels.py)."""
    return channel_scales(windows_, config.channels, config.scales)


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
    if config.posterior not in ("laplace", "smc"):
        raise TwinError(f"fit: posterior '{config.posterior}' is not one of laplace, smc")
    notes: list[str] = []
    for r in (*recordings, *validation):
        check_recording(spec, r)
        notes += limit_excursions(spec, r)  # warned, then fitted as asked
    space = Space.of(spec, config.params, config.bounds, config.tie)
    # the longest delay any candidate can have: windows carry that much command history
    lead = max(
        [spec.params[n].high for n in space.names if n.endswith(".latency")]
        + [p.nominal for n, p in spec.params.items() if n.endswith(".latency")]
        + [0.0]
    )
    train_w, val_w = _split(recordings, validation, config, lead + 0.01)
    chans = _channels(train_w + val_w, config)
    if config.pose_rotation not in ("rad", "gyration", "position"):
        raise TwinError(
            f"fit: pose_rotation '{config.pose_rotation}' is not one of rad, gyration, position"
        )
    rot = rotation_lengths(spec, [c for c, _, _ in chans]) if config.pose_rotation != "rad" else ()
    if config.pose_rotation == "position":  # orientation reported, not fitted
        rot = tuple((c, 0.0) for c, _ in rot)
    train = Problem(spec, space, tuple(train_w), chans, rot)
    val = Problem(spec, space, tuple(val_w), chans, rot) if val_w else None
    if spec.robot is not None and not any(n.endswith(".latency") for n in space.names):
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
    g_evals = 0
    if config.global_samples > 0 and not resume:
        # coarse global stage: a local search from the start can settle in the wrong
        # basin (restitution and friction trade off against each other in a bounce)
        from scipy.stats import qmc

        m2 = 1 << max(int(math.ceil(math.log2(config.global_samples))), 0)
        pts = qmc.Sobol(n, scramble=True, seed=config.seed).random(m2)[: config.global_samples]
        outs = run(list(pts))
        g_evals = len(outs)
        losses = [o.loss for o in outs]
        k = int(np.argmin(losses))
        if losses[k] < best_loss:
            best_u, best_loss = np.asarray(pts[k], dtype=float), losses[k]
            mean_u = best_u.copy()
        rec = {
            "stage": "global",
            "evals": counters["evals"],
            "best_loss": best_loss,
            "failed": counters["failed"],
            "best": space.values(best_u),
        }
        history.append(rec)
        yield (None, f"global stage ({len(pts)} points): loss {best_loss:.4g}", rec)
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
    polish = config.polish_rounds * 2 * (2 * n + 1)
    total = g_evals + budget + polish + 1 + 2 * n  # + curvature probes

    def fraction() -> float:
        return min((counters["evals"] - done_before - 1) / total, 0.99)

    if budget > 0:
        # cma needs two dimensions; a one-parameter fit carries a dummy coordinate that
        # the objective ignores
        pad = 1 if n == 1 else 0
        start = list(mean_u) + [0.5] * pad
        es = cma.CMAEvolutionStrategy(start, sigma, opts)
        gen = 0
        bests: list[float] = []
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
                # the start's and the global stage's evaluations are not CMA budget
                "evals": counters["evals"] - 1 - g_evals,
                "history": history,
            }
            yield (
                fraction(),
                f"CMA-ES gen {gen}: loss {best_loss:.4g} ({counters['failed']} failed)",
                {**rec, "checkpoint": checkpoint, "last_error": last_error[0][:300]},
            )
            bests.append(best_loss)
            k_ago = config.stall_generations
            if k_ago and len(bests) > k_ago and best_loss > (1 - STALL_TOL) * bests[-1 - k_ago]:
                notes.append(
                    f"CMA-ES stopped after generation {gen}: the best loss improved less than "
                    f"{STALL_TOL:.0%} over {k_ago} generations (the polish takes over)"
                )
                break
    scan = latency_candidates(space, train_w, best_u)  # basins of the latency (fit_latency.py)
    for u, o in zip(scan, run(scan) if scan else [], strict=True):
        if o.loss < best_loss:
            best_u, best_loss = u, o.loss
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
    yield (0.99, f"uncertainty ({config.posterior}) and validation", None)
    final = run([best_u])[0]
    J = J_cache.get(best_u.tobytes())
    if J is None:
        J = jacobian(best_u)
    r_final, blocks, masks = res_of(final), residual_blocks(train), channel_masks(train)
    # the Gauss-Newton curvature checked at the interval's own scale (2n replays): a loss
    # flatter or more jagged there than its local slope says gets a wider interval
    cov_u = laplace_covariance(np.nan_to_num(J), r_final, blocks, masks)[0]
    probes, steps = curvature_probes(best_u, np.sqrt(np.clip(np.diag(cov_u), 0.0, None)))
    outs = run(probes)
    probe_loss = np.array(
        [o.loss if o.residuals is not None else np.nan for o in outs], dtype=float
    ).reshape(n, 2)
    var_scale = curvature_scale(np.nan_to_num(J), r_final, steps, probe_loss)
    for name, k in zip(space.names, var_scale, strict=True):
        if k > 2.0:
            notes.append(
                f"{name}: the loss is flatter at its interval's scale than its local slope "
                f"says; interval widened x{math.sqrt(k):.1f}"
            )
    posterior = laplace(
        space.names,
        best_u,
        J,
        r_final,
        space.to_x,
        seed=config.seed,
        history=history,
        blocks=blocks,
        channels=masks,
        var_scale=var_scale,
    )
    if config.posterior == "smc":
        before = counters["evals"]
        posterior, smc_run = yield from smc_posterior_steps(
            run, posterior, best_u, J, res_of(final), residual_blocks(train), space.to_x,
            config.particles, config.seed,
        )  # fmt: skip
        notes.append(
            f"posterior: SMC, {config.particles} particles, {smc_run.stages} stages, "
            f"{counters['evals'] - before} replays, acceptance {smc_run.acceptance:.2f}"
        )
    else:
        posterior = latency_resolution(posterior, spec)
    posterior = with_identifiability(posterior, J, notes)
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


__all__ = [
    "FitConfig",
    "FitResult",
    "Space",
    "check_recording",
    "evaluate",
    "fit",
    "fit_steps",
    "limit_excursions",
    "noise_level",
    "replay_rmse",
    "rmse",
    "windows",
]
