"""Fitting a twin to recordings (system identification), with honest uncertainty, and the
next recording to make.

steps.py (`FitConfig`, `FitResult`, `fit_steps`: the fit as a job; `fit` runs it to the
end) · search.py (its stages: start, Sobol, CMA-ES, latency scan, least-squares polish) ·
objective.py (`Space`, `windows`, replay, residuals, `check_recording`) · channels.py
(channel weights, scales and noise levels) · latency.py (the latency's basins) ·
posterior.py (`ParamPosterior`, the Laplace approximation) · posterior_stage.py (after the
point estimate: SMC posterior, latency resolution, identifiability merged) · smc.py
(kernel-ABC sequential Monte Carlo) · identifiability.py (what the recordings can and
cannot pin down) · design.py (the next recording: D-optimal experiment design). The
executor the fit replays candidates through is twins/executor.py (training uses it too).

What callers use is exported here: `from twins.fit import FitConfig, fit_steps`.
"""

from twins.fit.channels import noise_level
from twins.fit.objective import (
    Problem,
    Space,
    check_recording,
    evaluate,
    limit_excursions,
    replay_rmse,
    rmse,
    windows,
)
from twins.fit.steps import FitConfig, FitResult, fit, fit_steps

__all__ = [
    "FitConfig",
    "FitResult",
    "Problem",
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
