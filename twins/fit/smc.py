"""Sequential Monte Carlo over a fit's parameters: kernel ABC on the replay residuals.

The twin is deterministic, so approximate Bayesian computation with a Gaussian kernel on the
distance between a replay and the recording — the mean squared (normalised) residual
`loss(u)` — targets

    p(u | data)  ∝  prior(u) · exp(-m_eff · loss(u) / (2 s²))

where `s²` is the residual variance at the best fit (the noise level: the final kernel
bandwidth) and `m_eff` the number of residuals discounted for their autocorrelation (samples
of one trajectory are not independent). The prior is the bounds' uniform prior in the
normalised space [0, 1]ⁿ (log-uniform for log parameters).

Starting from the prior would take dozens of tempering stages for a sharp posterior (each a
round of simulations), so the sampler starts from a widened, heavy-tailed `q` (a Student t with the Laplace
approximation's centre and covariance) and moves the particles along the bridge
`q^(1-β) · p^β`, β from 0 to 1 in steps chosen to keep the effective sample size at half the
particles, with resampling and random-walk Metropolis moves at each stage. What the Laplace
approximation gets wrong — skew near a bound, curved ridges between trading-off
parameters, a log parameter's asymmetry — the particles correct; what it gets right costs
a few stages. Every candidate is one call of `logp` on a batch (run through the fit's
executor, so the moves run in parallel).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from resources.jobs import Job, Progress, run_to_end

# batch of normalised points (k, n) -> log target (k,), -inf where a simulation failed
LogTarget = Callable[[NDArray[np.float64]], NDArray[np.float64]]
# The start is a Student t (this many degrees of freedom) around the Laplace estimate: its
# heavy tails reach where a Gaussian approximation is too light (near a bound, along a
# curved ridge), so the importance weights stay bounded.
T_DF = 4.0


@dataclass(frozen=True)
class SmcResult:
    """Equally weighted particles (N, n) in the normalised space, with what it took."""

    particles: NDArray[np.float64]
    logp: NDArray[np.float64]
    stages: int
    evaluations: int
    acceptance: float  # mean Metropolis acceptance over the moves
    betas: tuple[float, ...]


def _student_t(
    rng: np.random.Generator, mean: NDArray[np.float64], cov: NDArray[np.float64], size: int
) -> NDArray[np.float64]:
    z = rng.multivariate_normal(np.zeros(len(mean)), cov, size=size, check_valid="ignore")
    return np.asarray(mean + z / np.sqrt(rng.chisquare(T_DF, size) / T_DF)[:, None])


def _truncated_start(
    rng: np.random.Generator, mean: NDArray[np.float64], cov: NDArray[np.float64], k: int
) -> NDArray[np.float64]:
    """k draws of the start distribution inside the unit box (rejection, topped up with
    clipping)."""
    out: list[NDArray[np.float64]] = []
    for _ in range(50):
        x = _student_t(rng, mean, cov, 4 * k)
        out.extend(x[np.all((x >= 0.0) & (x <= 1.0), axis=1)])
        if len(out) >= k:
            return np.asarray(out[:k])
    extra = _student_t(rng, mean, cov, k - len(out))
    return np.asarray(out + list(np.clip(extra, 0.0, 1.0)))


def _ess(logw: NDArray[np.float64]) -> float:
    w = np.exp(logw - logw.max())
    return float(w.sum() ** 2 / max((w**2).sum(), 1e-300))


def _next_beta(beta: float, dlog: NDArray[np.float64], target_ess: float) -> float:
    """The largest step from `beta` whose incremental weights (Δβ · dlog) keep the ESS."""
    ok = np.isfinite(dlog)
    d = np.where(ok, dlog, -np.inf)
    if _ess(np.where(ok, (1.0 - beta) * d, -np.inf)) >= target_ess:
        return 1.0
    lo, hi = 0.0, 1.0 - beta
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if _ess(np.where(ok, mid * d, -np.inf)) >= target_ess:
            lo = mid
        else:
            hi = mid
    return beta + max(lo, 1e-6)


def _resample(rng: np.random.Generator, logw: NDArray[np.float64]) -> NDArray[np.intp]:
    """Systematic resampling."""
    w = np.exp(logw - logw.max())
    w /= w.sum()
    n = len(w)
    pos = (rng.random() + np.arange(n)) / n
    return np.minimum(np.searchsorted(np.cumsum(w), pos), n - 1)


def smc_steps(
    logp: LogTarget,
    mean: NDArray[np.float64],
    cov: NDArray[np.float64],
    n_particles: int = 64,
    moves: int = 3,
    widen: float = 2.0,
    seed: int = 0,
    max_stages: int = 20,
) -> Job[SmcResult]:
    """Sample `logp` (on the unit box) from the Gaussian start a Student t around `mean` with scale `widen² cov`.
    Yields Progress (fraction done: the bridge's β) after each stage; returns the particles."""
    rng = np.random.default_rng(seed)
    n = len(mean)
    cov_q = widen**2 * np.asarray(cov, dtype=float) + 1e-12 * np.eye(n)
    prec_q = np.linalg.inv(cov_q)

    def logq(x: NDArray[np.float64]) -> NDArray[np.float64]:
        d = x - mean
        q = np.einsum("ij,jk,ik->i", d, prec_q, d)
        return np.asarray(-0.5 * (T_DF + n) * np.log1p(q / T_DF), dtype=float)

    x = _truncated_start(rng, np.asarray(mean, dtype=float), cov_q, n_particles)
    lp = logp(x)
    lq = logq(x)
    evals = n_particles
    beta, betas = 0.0, [0.0]
    logw = np.zeros(n_particles)
    accepted = proposed = 0
    yield Progress(0.0, f"SMC: {n_particles} particles from the Laplace start")
    for stage in range(1, max_stages + 1):
        dlog = lp - lq
        new_beta = _next_beta(beta, dlog, 0.5 * n_particles) if stage < max_stages else 1.0
        logw = np.where(np.isfinite(dlog), (new_beta - beta) * dlog, -np.inf)
        beta = new_beta
        betas.append(beta)
        idx = _resample(rng, logw)
        x, lp, lq = x[idx], lp[idx], lq[idx]
        # random-walk Metropolis on the bridge target, scaled to the particles' spread
        c = np.cov(x.T).reshape(n, n) * (2.38**2 / n) + 1e-10 * np.eye(n)
        for _ in range(moves):
            y = x + rng.multivariate_normal(np.zeros(n), c, size=n_particles)
            inside = np.all((y >= 0.0) & (y <= 1.0), axis=1)
            lpy = np.full(n_particles, -np.inf)
            if inside.any():
                lpy[inside] = logp(y[inside])
                evals += int(inside.sum())
            lqy = logq(y)
            cur = beta * lp + (1 - beta) * lq
            new = np.where(np.isfinite(lpy), beta * lpy + (1 - beta) * lqy, -np.inf)
            with np.errstate(invalid="ignore"):
                acc = np.log(rng.random(n_particles)) < new - np.where(
                    np.isfinite(cur), cur, -np.inf
                )
            acc &= np.isfinite(new)
            x = np.where(acc[:, None], y, x)
            lp, lq = np.where(acc, lpy, lp), np.where(acc, lqy, lq)
            accepted += int(acc.sum())
            proposed += n_particles
        yield Progress(
            beta, f"SMC stage {stage}: β {beta:.3g}, acceptance {accepted / proposed:.2f}"
        )
        if beta >= 1.0:
            break
    return SmcResult(x, lp, len(betas) - 1, evals, accepted / max(proposed, 1), tuple(betas))


def smc(
    logp: LogTarget, mean: Sequence[float], cov: NDArray[np.float64], **kw: object
) -> SmcResult:
    """`smc_steps` run to its end."""
    return run_to_end(smc_steps(logp, np.asarray(mean, dtype=float), cov, **kw))  # type: ignore[arg-type]
