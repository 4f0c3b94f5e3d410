"""The depth range of a handheld scan, chosen from the data (`scan --depth-range auto`).

Far surfaces help tracking only while their depth is good: on the real TUM cabinet
(Kinect-class depth) the room behind the cabinet holds the track (ATE 3.2 cm with 0.73-2.8 m,
12 cm with 0.73-2.0 m, measured with the frame-to-model tracker), while on the lab's
D435-like camera at 424x240 the far walls' noise pulls it (ATE 5-14 cm with 0.49-2.37 m,
0.2-0.7 cm with 0.3-1.4 m). The difference is the noise, so the range is cut where the
depth's own pixel-to-pixel noise, measured on the first frame, passes `max_noise_m`.

Noise estimate: along rows and columns, the second difference of *inverse* depth is zero on
any plane (inverse depth is linear in the pixel coordinates there), so what remains is
sensor noise (var = 6 sigma^2) plus edges and curvature, which a median ignores. Per 0.1 m
depth bin, sigma_z = 1.4826 * median(|d2(1/z)|) * z^2 / sqrt(6). Depth that is smoothed or
quantised into steps (Kinect-class sensors, as in the TUM data) reads as quiet here: its
error is spatially correlated and does not scatter ICP's correspondences the way white
stereo noise does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from devices.frames import RGBDFrame

# per-pixel depth noise beyond which far surfaces are left out: a D435-like camera at
# 424x240 passes it near 1.4 m (lab: 10 mm at 1.4 m, 20 mm at 2.0 m, measured)
MAX_NOISE_M = 0.01


def depth_noise_profile(
    frames: Sequence[RGBDFrame], bin_m: float = 0.1, min_samples: int = 300
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(bin centres (m), per-pixel depth noise sigma (m)) of the frames' depth images, for
    0.1 m bins holding at least `min_samples` measurements (see the module docstring)."""
    zs: list[NDArray[np.float64]] = []
    ss: list[NDArray[np.float64]] = []
    for f in frames:
        z = f.depth_m.astype(np.float64)
        for a in (z, z.T):
            left, mid, right = a[:, :-2], a[:, 1:-1], a[:, 2:]
            ok = (left > 0) & (mid > 0) & (right > 0)
            c = mid[ok]
            d2 = 1.0 / left[ok] - 2.0 / c + 1.0 / right[ok]
            zs.append(c)
            ss.append(np.abs(d2) * c * c)
    if not zs or sum(len(z) for z in zs) == 0:
        return np.zeros(0), np.zeros(0)
    z = np.concatenate(zs)
    s = np.concatenate(ss)
    k = np.floor(z / bin_m).astype(np.int64)
    centres: list[float] = []
    sigma: list[float] = []
    for b in np.unique(k):
        m = k == b
        if m.sum() >= min_samples:
            centres.append((b + 0.5) * bin_m)
            sigma.append(1.4826 * float(np.median(s[m])) / np.sqrt(6.0))
    return np.asarray(centres), np.asarray(sigma)


def noise_limit(
    centres: NDArray[np.float64], sigma: NDArray[np.float64], max_noise_m: float
) -> float | None:
    """The depth (m) where the noise first passes `max_noise_m` (linear between bins), or
    None when it never does."""
    over = np.nonzero(sigma > max_noise_m)[0]
    if len(over) == 0:
        return None
    i = int(over[0])
    if i == 0:
        return float(centres[0])
    z0, z1, s0, s1 = centres[i - 1], centres[i], sigma[i - 1], sigma[i]
    return float(z0 + (z1 - z0) * (max_noise_m - s0) / max(s1 - s0, 1e-12))


def choose_depth_range(
    frames: Sequence[RGBDFrame],
    sensor_max_m: float = 4.0,
    max_noise_m: float = MAX_NOISE_M,
) -> tuple[float, float]:
    """Depth range (m) for tracking and fusion from the data: from a little under the nearest
    surfaces to a little past the 90th percentile of the measured depth, but not beyond the
    depth where the per-pixel noise passes `max_noise_m`, and at most `sensor_max_m`."""
    z = np.concatenate([f.depth_m[f.depth > 0][::37] for f in frames]) if frames else np.zeros(0)
    z = z[np.isfinite(z) & (z > 0.05)]
    if len(z) < 100:
        return 0.1, 1.5
    lo = float(max(0.1, 0.8 * np.percentile(z, 1)))
    hi = 1.15 * float(np.percentile(z, 90))
    quiet = noise_limit(*depth_noise_profile(frames), max_noise_m)
    if quiet is not None:
        hi = min(hi, quiet)
    hi = float(np.clip(hi, max(lo + 0.3, 0.5), sensor_max_m))
    return round(lo, 3), round(hi, 3)
