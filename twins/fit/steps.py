"""Fit twin parameters to recordings (system identification), with honest uncertainty.

`fit_steps(spec, recordings, config, executor)` is a job (resources/jobs.py): it yields
`Progress` and returns a `FitResult`. Cancel = `close()` between yields; every
yield's `partial["checkpoint"]` lets `fit_steps(..., resume=checkpoint)` continue.

- **Parameters** are dotted names from the twin's ParamSet, searched in a normalised space
  u in [0, 1]: linear between the bounds, logarithmic where the prior is log.
- **Objective**: weighted mean squared discrepancy over chosen channels, each divided by
  the spread (std) of the recorded channel — or, with `scales="noise"`, by its sensor
  noise (twins/fit/channels.py) — so joint angles, efforts and object poses can be mixed;
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
- **Posterior**: Laplace approximation at the optimum (twins/fit/posterior.py; its curvature
  checked by 2n replays at the interval's own scale), or sampled by
  SMC — kernel ABC on the replay residuals, started from the Laplace approximation
  (`posterior="smc"`, twins/fit/posterior_stage.py). SBI (NPE on summary statistics) is to
  come.

The objective itself (parameter space, windows, replay, residuals) is twins/fit/objective.py;
the package (`twins.fit`) exports its public names for callers of the fit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devices.trajectory import Trajectory
from resources.jobs import Job, Progress, run_to_end
from twins.errors import TwinError
from twins.executor import Executor, SerialExecutor
from twins.fit.channels import channel_scales
from twins.fit.objective import (
    Outcome,
    Problem,
    Space,
    check_recording,
    limit_excursions,
    residual_blocks,
    rmse,
    rotation_lengths,
    windows,
)
from twins.fit.posterior import (
    ParamPosterior,
    laplace,
)
from twins.fit.posterior_stage import (
    channel_masks,
    latency_resolution,
    smc_posterior_steps,
    with_identifiability,
)
from twins.fit.search import FitSearch
from twins.spec import TwinSpec


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
    posterior: str = "laplace"  # or "smc": sampled (fit/posterior_stage.py), `particles` of them
    particles: int = 64
    scales: str = "spread"  # or "noise": each channel divided by its sensor noise (fit/channels.py)
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
    """(name, weight, scale) per channel with a positive weight (twins/fit/channels.py)."""
    return channel_scales(windows_, config.channels, config.scales)


def fit_steps(
    spec: TwinSpec,
    recordings: Sequence[Trajectory],
    config: FitConfig,
    executor: Executor | None = None,
    validation: Sequence[Trajectory] = (),
    resume: Mapping[str, Any] | None = None,
) -> Job[FitResult]:
    """The fit as a job (see the module docstring; its stages are twins/fit/search.py).
    Raises TwinError for a bad choice of parameters, channels or recordings before any
    simulation runs."""
    t_start = time.perf_counter()
    notes: list[str] = []
    space, train_w, train, val = _problems(spec, recordings, validation, config, notes)
    s = FitSearch(space, train, config, executor or SerialExecutor(), notes, resume)
    start_out = yield from s.start(len(train_w))
    val_before = rmse(s.run([s.u0], val)[0]) if val else {}
    yield from s.global_stage()
    s.plan_total()
    yield from s.cmaes()
    s.latency_scan(train_w)
    yield from s.polish()
    yield Progress(0.99, f"uncertainty ({config.posterior}) and validation")
    final = s.run([s.best_u])[0]
    posterior = yield from _posterior(s, spec, final)
    val_after = rmse(s.run([s.best_u], val)[0]) if val else {}
    if s.failed:
        notes.append(
            f"{s.failed} of {s.evals} simulations failed and were scored as failed samples "
            f"(last: {s.last_error[:200]})"
        )
    result = FitResult(
        config=config,
        start=space.values(s.u0),
        estimate=space.values(s.best_u),
        posterior=posterior,
        train_rmse_before=rmse(start_out),
        train_rmse_after=rmse(final),
        validation_rmse_before=val_before,
        validation_rmse_after=val_after,
        loss_before=start_out.loss,
        loss_after=final.loss,
        evaluations=s.evals,
        rollouts=s.evals * len(train_w),
        failed=s.failed,
        history=tuple(s.history),
        wall_s=round(time.perf_counter() - t_start, 3),
        notes=tuple(notes),
    )
    yield Progress(1.0, f"fit done: loss {start_out.loss:.4g} -> {final.loss:.4g}")
    return result


def _problems(
    spec: TwinSpec,
    recordings: Sequence[Trajectory],
    validation: Sequence[Trajectory],
    config: FitConfig,
    notes: list[str],
) -> tuple[Space, list[Trajectory], Problem, Problem | None]:
    """Check the choice, cut the windows and build the training and validation problems
    (the search space, the windows' command history, the channels and their scales)."""
    if not recordings:
        raise TwinError("fit: choose at least one recording")
    if config.posterior not in ("laplace", "smc"):
        raise TwinError(f"fit: posterior '{config.posterior}' is not one of laplace, smc")
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
    return space, train_w, train, val


def _posterior(s: FitSearch, spec: TwinSpec, final: Outcome) -> Job[ParamPosterior]:
    """Laplace at the optimum (its curvature checked), or SMC started from it; then which
    parameters the data pins down."""
    config, train = s.config, s.train
    r_final, blocks, masks = s.residuals(final), residual_blocks(train), channel_masks(train)
    J, var_scale = s.uncertainty(r_final, blocks, masks)
    posterior = laplace(
        s.space.names,
        s.best_u,
        J,
        r_final,
        s.space.to_x,
        seed=config.seed,
        history=s.history,
        blocks=blocks,
        channels=masks,
        var_scale=var_scale,
    )
    if config.posterior == "smc":
        before = s.evals
        posterior, smc_run = yield from smc_posterior_steps(
            s.run, posterior, s.best_u, J, r_final, blocks, s.space.to_x,
            config.particles, config.seed,
        )  # fmt: skip
        s.notes.append(
            f"posterior: SMC, {config.particles} particles, {smc_run.stages} stages, "
            f"{s.evals - before} replays, acceptance {smc_run.acceptance:.2f}"
        )
    else:
        posterior = latency_resolution(posterior, spec)
    return with_identifiability(posterior, J, s.notes)


def fit(
    spec: TwinSpec,
    recordings: Sequence[Trajectory],
    config: FitConfig,
    executor: Executor | None = None,
    validation: Sequence[Trajectory] = (),
) -> FitResult:
    """`fit_steps` run to the end (scripts and tests)."""
    return run_to_end(fit_steps(spec, recordings, config, executor, validation))
