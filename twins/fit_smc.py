"""The fit's sampled posterior: SMC (kernel ABC on the replay residuals, twins/smc.py)
started from the fit's Laplace approximation, every candidate replayed through the fit's
executor. `FitConfig(posterior="smc")` / `fit --posterior smc`."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from twins.objective import Outcome
from twins.posterior import ParamPosterior, from_samples, laplace_covariance, residual_scale
from twins.smc import SmcResult, smc_steps

Step = tuple[float | None, str, Any]


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
) -> Generator[Step, None, tuple[ParamPosterior, SmcResult]]:
    """Sample the fit's posterior. The log target of a candidate u is
    -‖r(u)‖² / (2 s² c): `s²` the residual variance at the fit (inflated for the residuals'
    autocorrelation, as the Laplace part), `c` ≥ 1 the variance inflation the windows'
    scatter asked of the Laplace part (so both answer the same question). A failed replay
    is -inf: no particle lands there."""
    n = len(u_star)
    cov_u, _, _, inflation = laplace_covariance(J, r, blocks)
    s2, _ = residual_scale(r, n)
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
            beta, msg = next(gen)
        except StopIteration as stop:
            res: SmcResult = stop.value
            break
        rec = {"stage": "smc", "beta": beta, "message": msg}
        history.append(rec)
        yield (None, msg, rec)
    post = from_samples(base, res.particles, to_x, "smc-abc", history=(*base.history, *history))
    return post, res
