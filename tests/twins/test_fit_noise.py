"""The fit's noise model: channel scales from the sensor noise, and intervals that count
correlated residuals honestly (checked against known noise and by coverage over many
simulated data sets of a problem with a known answer)."""

from __future__ import annotations

import numpy as np

from devices.trajectory import Trajectory
from twins.fit import FitConfig, noise_level, windows
from twins.fit.posterior import Z90, correlation_time, laplace
from twins.fit.steps import _channels


def _ar1(rng: np.random.Generator, n: int, rho: float, cols: int) -> np.ndarray:
    e = rng.standard_normal((n, cols))
    out = np.empty_like(e)
    out[0] = e[0] / np.sqrt(1 - rho * rho)
    for k in range(1, n):
        out[k] = rho * out[k - 1] + e[k]
    return out * np.sqrt(1 - rho * rho)  # unit variance


def test_noise_level_finds_the_sensor_noise_under_smooth_motion() -> None:
    rng = np.random.default_rng(3)
    t = np.arange(0, 3, 0.004)
    motion = 0.3 * np.sin(2 * np.pi * 0.8 * t)[:, None] + 0.1 * np.sin(2 * np.pi * 1.3 * t)[:, None]
    for sigma in (2e-4, 0.05):
        data = motion * np.ones((1, 4)) + sigma * rng.standard_normal((len(t), 4))
        assert abs(noise_level(data) - sigma) / sigma < 0.1


def test_noise_scales_weigh_a_precise_channel_by_its_noise_not_its_spread() -> None:
    rng = np.random.default_rng(4)
    t = np.arange(0, 2, 0.004)
    pos = np.sin(2 * np.pi * t)[:, None] + 2e-4 * rng.standard_normal((len(t), 2))
    eff = 4 * np.cos(2 * np.pi * t)[:, None] + 0.05 * rng.standard_normal((len(t), 2))
    w = Trajectory(
        t,
        {"robot/joint_pos": pos, "robot/joint_effort": eff},
        {"robot/joint_pos": "rad", "robot/joint_effort": "N*m"},
    )
    chans = {"robot/joint_pos": 1.0, "robot/joint_effort": 1.0}
    spread = dict((n, s) for n, _, s in _channels([w], FitConfig(params=("x",), channels=chans)))
    noise = dict(
        (n, s)
        for n, _, s in _channels([w], FitConfig(params=("x",), channels=chans, scales="noise"))
    )
    assert abs(spread["robot/joint_pos"] - np.std(pos)) < 1e-9
    assert abs(noise["robot/joint_pos"] - 2e-4) / 2e-4 < 0.15
    assert abs(noise["robot/joint_effort"] - 0.05) / 0.05 < 0.15


def test_correlation_time_sees_time_correlation_across_interleaved_joints() -> None:
    """Residuals laid out samples x joints, flattened: lag 1 is a sibling joint, the time
    neighbour is 7 away. AR(1) in time with rho has correlation time (1 + rho) / (1 - rho)."""
    rng = np.random.default_rng(5)
    rho = 0.8
    blocks, parts, k = [], [], 0
    for _ in range(16):
        r = _ar1(rng, 250, rho, 7).reshape(-1)
        parts.append(r)
        blocks.append(slice(k, k + r.size))
        k += r.size
    r = np.concatenate(parts)
    tau = correlation_time(r, blocks)
    assert 0.75 * 9.0 < tau < 1.3 * 9.0
    white = rng.standard_normal(r.size)
    assert correlation_time(white, blocks) < 1.5


def test_laplace_intervals_cover_the_truth_with_correlated_residuals() -> None:
    """y = a x + b + AR(1) noise, fitted by least squares, 300 data sets: the 90 % interval
    of a (from the Jacobian and the residuals alone) holds the truth about 90 % of the time;
    without the correlation time it would hold it far less often."""
    rng = np.random.default_rng(6)
    n_win, k = 8, 200
    t = np.linspace(0, 1, k)
    x = np.concatenate([np.sin(2 * np.pi * (1.5 + w) * t) for w in range(n_win)])
    blocks = [slice(w * k, (w + 1) * k) for w in range(n_win)]
    J = np.stack([x, np.ones_like(x)], axis=1)  # d r / d (a, b), normalised units
    truth = np.array([0.4, 0.6])
    hits, narrow_hits = 0, 0
    for _ in range(300):
        e = 0.05 * np.concatenate([_ar1(rng, k, 0.9, 1)[:, 0] for _ in range(n_win)])
        y = J @ truth + e
        u, *_ = np.linalg.lstsq(J, y, rcond=None)
        r = J @ u - y
        post = laplace(("a", "b"), u, J, r, lambda v: np.asarray(v), n_samples=0, blocks=blocks)
        lo, hi = post.interval90["a"]
        hits += lo <= truth[0] <= hi
        s_white = np.sqrt(r @ r / (r.size - 2) * np.linalg.inv(J.T @ J)[0, 0])
        narrow_hits += abs(u[0] - truth[0]) <= Z90 * s_white
    assert 0.8 <= hits / 300 <= 0.99
    assert narrow_hits / 300 < 0.6


def test_channel_masks_split_the_residuals_by_channel() -> None:
    """Each channel's residuals, unscaled, add up to that channel's squared error."""
    from tests.twins.test_fit import TRUTH, _recording
    from twins.fit import Problem, Space
    from twins.fit.objective import evaluate
    from twins.fit.posterior_stage import channel_masks
    from twins.rigs import qube_twin

    spec = qube_twin()
    rec = _recording(TRUTH, seconds=1.0)
    cfg = FitConfig(params=tuple(TRUTH), channels={"robot/joint_pos": 1.0, "robot/joint_vel": 0.5})
    wins = windows(rec, 0.5)
    prob = Problem(spec, Space.of(spec, cfg.params), tuple(wins), _channels(wins, cfg))
    out = evaluate((prob, np.full(3, 0.4)))
    assert out.residuals is not None
    masks = channel_masks(prob)
    assert len(masks) == 2 and not np.any(masks[0] & masks[1])
    assert int(masks[0].sum() + masks[1].sum()) == out.residuals.size
    for m, (name, weight, scale) in zip(masks, prob.channels, strict=True):
        sse = float(np.sum(out.residuals[m] ** 2)) * scale**2 / weight
        assert abs(sse - out.sse[name]) <= 1e-9 * max(out.sse[name], 1.0)


def test_channels_that_disagree_widen_the_interval_to_hold_the_truth() -> None:
    """Two channels see slope a; the second through a model error (it reads 1.3 a). The
    joint fit lands between; its noise-only interval misses a, the channels' disagreement
    widens it to hold a."""
    rng = np.random.default_rng(7)
    x = np.linspace(-1, 1, 400)
    a = 0.5
    y1 = a * x + 0.01 * rng.standard_normal(x.size)
    y2 = 1.3 * a * x + 0.01 * rng.standard_normal(x.size)
    J = np.concatenate([x, x])[:, None]
    y = np.concatenate([y1, y2])
    u, *_ = np.linalg.lstsq(J, y, rcond=None)
    r = J @ u - y
    masks = [np.arange(y.size) < x.size, np.arange(y.size) >= x.size]
    plain = laplace(("a",), u, J, r, lambda v: np.asarray(v), n_samples=0)
    wide = laplace(("a",), u, J, r, lambda v: np.asarray(v), n_samples=0, channels=masks)
    lo, hi = plain.interval90["a"]
    assert not lo <= a <= hi
    lo, hi = wide.interval90["a"]
    assert lo <= a <= hi and hi - lo < 0.5
