"""The depth range chosen from the data (reconstruction/depth_range.py), on analytic frames: a
plane seen at a grazing angle from 0.5 to 3 m, with stereo-like noise sigma = k z^2."""

from __future__ import annotations

import numpy as np

from devices.frames import Intrinsics, RGBDFrame
from reconstruction.depth_range import choose_depth_range, depth_noise_profile

H, W = 240, 424


def _floor(k: float, seed: int = 0) -> RGBDFrame:
    """A plane whose inverse depth runs linearly over the rows (0.5 m at the bottom, 3 m at
    the top), with Gaussian depth noise of sigma = k z^2, in 0.1 mm units."""
    inv = np.linspace(1 / 3.0, 2.0, H)[:, None] * np.ones((1, W))
    z = 1.0 / inv
    z = z + np.random.default_rng(seed).standard_normal(z.shape) * k * z * z
    intr = Intrinsics(W, H, 306.7, 306.7, W / 2 - 0.5, H / 2 - 0.5)
    return RGBDFrame(
        np.zeros((H, W, 3), np.uint8),
        np.clip(np.rint(z / 1e-4), 0, 65535).astype(np.uint16),
        1e-4,
        intr,
        0.0,
    )


def test_noise_profile_recovers_the_sensor_noise() -> None:
    k = 0.0052  # a D435 at 424x240 (f 307 px, subpixel 0.08, baseline 50 mm)
    z, sigma = depth_noise_profile([_floor(k)])
    assert len(z) >= 20 and z.min() < 0.7 and z.max() > 2.7
    truth = k * z * z
    assert np.all(np.abs(sigma / truth - 1) < 0.15), np.round(sigma / truth, 3)


def test_range_ends_where_the_noise_passes_a_centimetre() -> None:
    k = 0.0052
    lo, hi = choose_depth_range([_floor(k)])
    assert abs(hi - np.sqrt(0.01 / k)) < 0.08  # 1.39 m
    assert 0.35 <= lo <= 0.5  # 0.8 x the nearest surfaces (~0.5 m)


def test_quiet_depth_keeps_the_far_surfaces() -> None:
    lo, hi = choose_depth_range([_floor(0.0005)])  # 4.5 mm at 3 m: never over 1 cm
    # 1.15 x the 90th percentile of the depth (2.33 m)
    z = 1.0 / np.linspace(1 / 3.0, 2.0, H)
    assert abs(hi - 1.15 * np.percentile(z, 90)) < 0.05
    assert hi > 2.2  # not cut at 1.4 m as the noisy camera is
