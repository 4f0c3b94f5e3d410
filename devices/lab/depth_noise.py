"""A D435-like depth error model applied to a perfect rendered depth image (pure numpy).

- Gaussian noise with the stereo RMS error sigma(z) = z^2 * subpixel / (f_px * baseline)
  (Intel's formula: ~2.5 mm at 1 m for f = 640 px, subpixel 0.08 px, baseline 50 mm);
- 1 mm quantization (uint16 with depth_scale 0.001);
- missing depth (0) at depth discontinuities (flying pixels the SDK filters out), with
  probability `edge_dropout` per edge pixel;
- missing depth in stereo shadows: pixels the second viewpoint, `baseline` to the camera's
  +x, cannot see (closer surfaces cover them). That band lies left of near objects, as on a
  D435;
- zero outside [min_depth, max_depth] and where nothing was hit.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def depth_sigma(
    z: ArrayLike, f_px: float, subpixel: float = 0.08, baseline: float = 0.050
) -> NDArray[np.float64]:
    """RMS depth error (m) at depth z (m) for focal length f_px (pixels)."""
    return np.asarray(z, dtype=np.float64) ** 2 * subpixel / (f_px * baseline)


def shadow_mask(z: NDArray[np.float32], f_px: float, baseline: float) -> NDArray[np.bool_]:
    """Pixels (valid z > 0) hidden from a viewpoint `baseline` m to the camera's +x.

    A point at column u lands at u - f*b/z in the second view; it is hidden if some pixel
    to its right (a closer surface) lands at or left of it. A suffix minimum per row does
    this for the whole image at once.
    """
    h, w = z.shape
    valid = z > 0
    u = np.arange(w, dtype=np.float32)[None, :]
    x2 = np.where(valid, u - f_px * baseline / np.where(valid, z, 1.0), np.inf)
    # suffix_min[:, i] = min over j > i of x2[:, j]
    rev = np.minimum.accumulate(x2[:, ::-1], axis=1)[:, ::-1]
    suffix = np.concatenate([rev[:, 1:], np.full((h, 1), np.inf, np.float32)], axis=1)
    return valid & (suffix < x2 - 0.5)


def edge_mask(z: NDArray[np.float32], jump: float) -> NDArray[np.bool_]:
    """Pixels next to a depth jump larger than `jump` m (relative to the nearer side)."""
    m = np.zeros(z.shape, bool)
    dx = np.abs(np.diff(z, axis=1)) > jump
    dy = np.abs(np.diff(z, axis=0)) > jump
    m[:, 1:] |= dx
    m[:, :-1] |= dx
    m[1:, :] |= dy
    m[:-1, :] |= dy
    return m


def apply_depth_noise(
    z_true: NDArray[np.float32],
    f_px: float,
    rng: np.random.Generator,
    *,
    subpixel: float = 0.08,
    baseline: float = 0.050,
    min_depth: float = 0.11,
    max_depth: float = 4.0,
    edge_jump: float = 0.02,
    edge_dropout: float = 0.6,
    depth_scale: float = 0.001,
) -> NDArray[np.uint16]:
    """Perfect depth (m, 0 = nothing hit) -> noisy sensor depth (uint16, depth_scale units)."""
    z = np.where((z_true >= min_depth) & (z_true <= max_depth), z_true, 0).astype(np.float32)
    invalid = shadow_mask(z, f_px, baseline)
    invalid |= edge_mask(z, edge_jump) & (rng.random(z.shape) < edge_dropout)
    sigma = depth_sigma(z, f_px, subpixel, baseline)
    noisy = z + rng.standard_normal(z.shape, dtype=np.float32) * sigma.astype(np.float32)
    out = np.rint(noisy / depth_scale)
    out[invalid | (z <= 0) | (out < 0)] = 0
    return np.clip(out, 0, 65535).astype(np.uint16)
