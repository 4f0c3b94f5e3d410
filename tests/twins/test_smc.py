"""The SMC sampler against targets whose answer is known: a correlated Gaussian reached
from a start that is off-centre, too narrow and uncorrelated, and an exponential piled
against a bound (where a Gaussian approximation puts mass outside the box)."""

from __future__ import annotations

import numpy as np
import pytest

from twins.fit.smc import smc

MEAN = np.array([0.5, 0.4])
STD = np.array([0.05, 0.03])
RHO = 0.8
COV = np.array([[STD[0] ** 2, RHO * STD[0] * STD[1]], [RHO * STD[0] * STD[1], STD[1] ** 2]])


def test_recovers_a_correlated_gaussian_from_a_poor_start() -> None:
    prec = np.linalg.inv(COV)
    calls = []

    def logp(x: np.ndarray) -> np.ndarray:
        calls.append(len(x))
        d = x - MEAN
        return -0.5 * np.einsum("ij,jk,ik->i", d, prec, d)

    res = smc(logp, [0.56, 0.44], np.diag([0.02**2, 0.02**2]), n_particles=600, moves=4, seed=3)
    x = res.particles
    assert x.shape == (600, 2) and res.betas[-1] == 1.0
    assert np.allclose(x.mean(axis=0), MEAN, atol=0.008), x.mean(axis=0)
    assert np.allclose(x.std(axis=0), STD, rtol=0.15), x.std(axis=0)
    assert np.asarray(np.corrcoef(x.T))[0, 1] == pytest.approx(RHO, abs=0.08)
    # 90 % intervals of the marginals hold the exact ones
    for i in range(2):
        lo, hi = np.quantile(x[:, i], [0.05, 0.95])
        assert lo == pytest.approx(MEAN[i] - 1.645 * STD[i], abs=0.4 * STD[i])
        assert hi == pytest.approx(MEAN[i] + 1.645 * STD[i], abs=0.4 * STD[i])
    assert res.evaluations == sum(calls) and 0.1 < res.acceptance < 0.9


def test_mass_piled_against_a_bound_stays_inside_and_keeps_its_shape() -> None:
    scale = 0.1  # p(x) ∝ exp(-x / 0.1) on [0, 1] (and flat in a second coordinate)

    def logp(x: np.ndarray) -> np.ndarray:
        return -x[:, 0] / scale - 0.5 * ((x[:, 1] - 0.5) / 0.1) ** 2

    res = smc(logp, [0.05, 0.5], np.diag([0.05**2, 0.1**2]), n_particles=600, moves=6, seed=1)
    x = res.particles[:, 0]
    assert x.min() >= 0.0 and x.max() <= 1.0
    # truncated exponential: mean ≈ scale, median = scale·ln 2, 90th percentile = scale·ln 10
    assert x.mean() == pytest.approx(scale, rel=0.12)
    assert np.median(x) == pytest.approx(scale * np.log(2), rel=0.15)
    assert np.quantile(x, 0.9) == pytest.approx(scale * np.log(10), rel=0.15)


def test_failed_simulations_get_no_particles() -> None:
    def logp(x: np.ndarray) -> np.ndarray:
        out = -0.5 * np.sum(((x - 0.5) / 0.05) ** 2, axis=1)
        return np.where(x[:, 0] > 0.55, -np.inf, out)  # "blew up" beyond 0.55

    res = smc(logp, [0.5, 0.5], np.diag([0.05**2, 0.05**2]), n_particles=300, seed=2)
    assert np.all(res.particles[:, 0] <= 0.55)
    assert np.all(np.isfinite(res.logp))


@pytest.mark.slow
def test_fit_samples_the_posterior_of_a_trading_off_pair() -> None:
    """The fit's SMC posterior on a Qube chirp with hidden values: the arm's resistance and
    the pendulum's mass trade off (both scale the arm's response). The particles hold the
    truth in their 90 % intervals, lie along that ridge, agree in width with the Laplace
    approximation on this near-Gaussian problem, and cost the replays the notes say."""
    from tests.twins.test_fit import TRUTH, _recording
    from twins.executor import LocalExecutor
    from twins.fit import FitConfig, fit
    from twins.rigs import qube_twin

    names = ("robot.actuators.arm.resistance", "robot.links.pendulum_link.mass")
    truth = {n: TRUTH[n] for n in names} | {"robot.actuators.arm.latency": 0.0}
    spec = qube_twin()
    rec = _recording(truth, seconds=1.0)
    kw = dict(params=names, window_s=0.5, budget=30, polish_rounds=2, seed=0)
    with LocalExecutor(2) as ex:
        lap = fit(spec, [rec], FitConfig(**kw), ex).posterior  # type: ignore[arg-type]
        res = fit(spec, [rec], FitConfig(**kw, posterior="smc", particles=32), ex)  # type: ignore[arg-type]
    post = res.posterior
    assert post.method == "smc-abc" and post.samples.shape == (32, 2)
    for n in names:
        lo, hi = post.interval90[n]
        assert lo <= truth[n] <= hi, (n, truth[n], (lo, hi))
        assert post.identifiable[n], post.why[n]
        w_smc, w_lap = hi - lo, lap.interval90[n][1] - lap.interval90[n][0]
        assert 0.4 < w_smc / w_lap < 2.5, (n, w_smc, w_lap)
    assert post.correlation[0, 1] < -0.8
    note = next(x for x in res.notes if x.startswith("posterior: SMC"))
    assert "32 particles" in note and res.failed == 0
