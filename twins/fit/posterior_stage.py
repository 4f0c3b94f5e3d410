"""What the fit does after its point estimate: the sampled posterior — SMC (kernel ABC on
the replay residuals, twins/fit/smc.py) started from the fit's Laplace approximation, every
candidate replayed through the fit's executor (`FitConfig(posterior="smc")`, `fit
--posterior smc`) — the latency's step resolution, and the identifiability report merged
into the posterior."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from resources.jobs import Job, Progress
from twins.fit.identifiability import from_jacobian
from twins.fit.objective import POSE_UNIT, Outcome, Problem
from twins.fit.posterior import ParamPosterior, from_samples, laplace_covariance, residual_scale
from twins.fit.smc import SmcResult, smc_steps
from twins.spec import TwinSpec


def smc_posterior_steps(
    run: Callable[[Sequence[NDArray[np.float64]]], list[Outcome]],
    base: ParamPosterior,
    u_star: NDArray[np.float64],
    J: NDArray[np.float64],
    r: NDArray[np.float64],
    blocks: Sequence[slice],
    to_x: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    particles: int = 64,
    seed: int = 0,
) -> Job[tuple[ParamPosterior, SmcResult]]:
    """Sample the fit's posterior. The log target of a candidate u is
    -‖r(u)‖² / (2 s² c): `s²` the residual variance at the fit (inflated for the residuals'
    autocorrelation, as the Laplace part), `c` ≥ 1 the variance inflation the windows'
    scatter asked of the Laplace part (so both answer the same question). A failed replay
    is -inf: no particle lands there."""
    n = len(u_star)
    cov_u, _, _, inflation = laplace_covariance(J, r, blocks)
    s2, _ = residual_scale(r, n, blocks)
    m = r.size

    def logp(U: NDArray[np.float64]) -> NDArray[np.float64]:
        out = np.full(len(U), -np.inf)
        for i, o in enumerate(run(list(U))):
            if o.residuals is not None and o.residuals.size == m:
                sse = float(o.residuals @ o.residuals)
                if np.isfinite(sse):
                    out[i] = -0.5 * sse / (max(s2, 1e-300) * inflation)
        return out

    gen = smc_steps(logp, np.asarray(u_star, dtype=float), cov_u, n_particles=particles, seed=seed)
    history: list[dict[str, Any]] = []
    while True:
        try:
            p = next(gen)
        except StopIteration as stop:
            res: SmcResult = stop.value
            break
        rec = {"stage": "smc", "beta": p.fraction, "message": p.message}
        history.append(rec)
        yield Progress(None, p.message, rec)  # the fraction is the fit's to give
    post = from_samples(base, res.particles, to_x, "smc-abc", history=(*base.history, *history))
    return post, res


def channel_masks(prob: Problem) -> list[NDArray[np.bool_]]:
    """One mask per channel over the residual vector `objective.evaluate` makes for `prob`
    (windows in order, each window's channels in order, samples x columns flattened)."""
    sizes = []
    for w in prob.windows:
        for name, _, _ in prob.channels:
            width = w[name].shape[1]
            sizes.append(len(w) * (6 if w.units.get(name) == POSE_UNIT and width == 7 else width))
    k = len(prob.channels)
    total = int(sum(sizes))
    masks = [np.zeros(total, dtype=bool) for _ in range(k)]
    at = 0
    for i, n in enumerate(sizes):
        masks[i % k][at : at + n] = True
        at += n
    return masks


def latency_resolution(post: ParamPosterior, spec: TwinSpec) -> ParamPosterior:
    """A replay resolves delays to one physics step: every latency in (k dt, (k+1) dt]
    gives the same simulation, so a latency's interval is widened by half a step each side
    and its std by the step's uniform spread (dt / sqrt 12)."""
    dt = spec.params["sim.time_step"].nominal
    std, iv = dict(post.std), dict(post.interval90)
    for n in post.names:
        if n.endswith(".latency") and math.isfinite(std[n]):
            p = spec.params[n]
            std[n] = math.sqrt(std[n] ** 2 + dt * dt / 12)
            lo, hi = iv[n]
            iv[n] = (max(p.low, lo - dt / 2), min(p.high, hi + dt / 2))
    return replace(post, std=std, interval90=iv)


def with_identifiability(
    post: ParamPosterior, J: NDArray[np.float64], notes: list[str]
) -> ParamPosterior:
    """The identifiability report (twins/fit/identifiability.py) from the fit's own final Jacobian
    (no extra simulations) merged into the posterior's flags and reasons; strongly
    correlated pairs go to the notes."""

    rep = from_jacobian(post.names, J)
    ident = {n: bool(post.identifiable[n]) and bool(rep.identifiable[n]) for n in post.names}
    why = {n: "; ".join(w for w in (post.why[n], rep.why[n]) if w) for n in post.names}
    for a, b, c in rep.strong_pairs:
        notes.append(f"{a} and {b} trade off (correlation {c:+.3f}): the data see a mix")
    return replace(post, identifiable=ident, why=why)
