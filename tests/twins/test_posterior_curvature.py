"""The Laplace curvature checked at the interval's scale (twins/fit/posterior.py
`curvature_probes`/`curvature_scale`): a smooth least-squares loss keeps its interval, a
loss whose local slope is a ripple on a flat trend gets it widened to the trend's."""

from __future__ import annotations

import numpy as np

from twins.fit.posterior import CURVATURE_SCALE_MAX, curvature_probes, curvature_scale, laplace

T = np.linspace(0.0, 1.0, 200)


def _jacobian(res, u: np.ndarray, h: float = 1e-4) -> np.ndarray:  # type: ignore[no-untyped-def]
    cols = []
    for i in range(len(u)):
        e = np.zeros_like(u)
        e[i] = h
        cols.append((res(u + e) - res(u - e)) / (2 * h))
    return np.stack(cols, axis=1)


def _scale(res, u: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    J, r = _jacobian(res, u), res(u)
    std = np.full(len(u), 0.01)
    pts, steps = curvature_probes(u, std)
    losses = np.array([np.mean(res(p) ** 2) for p in pts]).reshape(len(u), 2)
    return curvature_scale(J, r, steps, losses)


def test_a_smooth_least_squares_loss_keeps_its_curvature() -> None:
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, 0.05, (2, T.size))
    u0 = np.array([0.4, 0.7])

    def res(u: np.ndarray) -> np.ndarray:  # two signals, linear in the parameters
        return np.concatenate([(u[0] - u0[0]) * T + noise[0], (u[1] - u0[1]) * T**2 + noise[1]])

    k = _scale(res, u0)
    np.testing.assert_allclose(k, 1.0, atol=1e-6)


def test_a_ripple_on_a_flat_trend_widens_that_parameter_only() -> None:
    u0 = np.array([0.5, 0.5])
    noise = np.random.default_rng(1).normal(0.0, 0.01, 2 * T.size)

    def res(u: np.ndarray) -> np.ndarray:
        d = u - u0
        # parameter 0: a trend of slope 0.1 with a ripple whose slope at u0 is 2 (x20);
        # parameter 1: smooth, slope 1
        return np.concatenate([(0.1 * d[0] + 0.01 * np.sin(200 * d[0])) * T, d[1] * T]) + noise

    k = _scale(res, u0)
    # probed 0.03 away (the ripple's sin(6) ~ -0.28, so the trend and the ripple partly
    # cancel): the local curvature (2.1^2) overstates the probed rise by ~100x or more
    assert k[0] > 50.0 and k[0] <= CURVATURE_SCALE_MAX
    assert abs(k[1] - 1.0) < 1e-6
    J, r = _jacobian(res, u0), res(u0)
    post = laplace(("rippled", "smooth"), u0, J, r, lambda v: np.asarray(v), n_samples=0)
    wide = laplace(
        ("rippled", "smooth"), u0, J, r, lambda v: np.asarray(v), n_samples=0, var_scale=k
    )
    ratio = (wide.interval90["rippled"][1] - wide.interval90["rippled"][0]) / (
        post.interval90["rippled"][1] - post.interval90["rippled"][0]
    )
    assert ratio > 5.0
    assert wide.interval90["smooth"] == post.interval90["smooth"]
