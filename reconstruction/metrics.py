"""Accuracy of reconstructed meshes against reference geometry (benchmarks and tests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import trimesh
from scipy.optimize import linear_sum_assignment
from scipy.spatial import cKDTree


def surface_distances(
    a: trimesh.Trimesh, b: trimesh.Trimesh, n: int = 30000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(distances a->b, distances b->a) between area-uniform surface samples, metres."""
    rng = np.random.default_rng(seed)
    pa = _sample(a, n, rng)
    pb = _sample(b, n, rng)
    return cKDTree(pb).query(pa)[0], cKDTree(pa).query(pb)[0]


def _sample(m: trimesh.Trimesh, n: int, rng: np.random.Generator) -> np.ndarray:
    area = m.area_faces
    face = rng.choice(len(area), n, p=area / area.sum())
    r = rng.random((n, 2))
    flip = r.sum(1) > 1
    r[flip] = 1 - r[flip]
    tri = m.triangles[face]
    return tri[:, 0] + r[:, :1] * (tri[:, 1] - tri[:, 0]) + r[:, 1:] * (tri[:, 2] - tri[:, 0])


def chamfer_fscore(
    a: trimesh.Trimesh, b: trimesh.Trimesh, tau: float = 0.005
) -> tuple[float, float]:
    """Symmetric mean Chamfer distance (m) and F-score at `tau` (m)."""
    d1, d2 = surface_distances(a, b)
    p, r = float((d1 < tau).mean()), float((d2 < tau).mean())
    f = 0.0 if p + r == 0 else 2 * p * r / (p + r)
    return float((d1.mean() + d2.mean()) / 2), f


def match_objects(
    found: Sequence[trimesh.Trimesh], truth: Mapping[str, trimesh.Trimesh], max_dist: float = 0.06
) -> list[tuple[int, str]]:
    """Pairs (found index, truth name) by footprint-centre distance (Hungarian)."""
    names = list(truth)
    if not found or not names:
        return []
    C = np.array(
        [
            [np.linalg.norm(f.bounds.mean(0)[:2] - truth[n].bounds.mean(0)[:2]) for n in names]
            for f in found
        ]
    )
    rows, cols = linear_sum_assignment(C)
    return [(int(r), names[c]) for r, c in zip(rows, cols, strict=True) if C[r, c] < max_dist]


def absolute_trajectory_error(est: np.ndarray, truth: np.ndarray) -> tuple[float, np.ndarray]:
    """ATE (TUM): RMS of camera position errors after the rigid alignment (rotation +
    translation, no scale; Umeyama/Horn) of `est` onto `truth`, both (N, 4, 4) or (N, 3).
    Returns (RMS m, the 4x4 alignment applied to `est`)."""
    A = np.asarray(est, float)
    B = np.asarray(truth, float)
    A = A[:, :3, 3] if A.ndim == 3 else A
    B = B[:, :3, 3] if B.ndim == 3 else B
    if len(A) != len(B) or len(A) < 3:
        raise ValueError(f"ATE needs >= 3 matching positions, got {len(A)} and {len(B)}")
    ma, mb = A.mean(axis=0), B.mean(axis=0)
    U, _, Vt = np.linalg.svd((A - ma).T @ (B - mb))
    d = np.sign(np.linalg.det(Vt.T @ U.T))
    R = Vt.T @ np.diag([1.0, 1.0, d]) @ U.T
    t = mb - R @ ma
    err = A @ R.T + t - B
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = R, t
    return float(np.sqrt((err**2).sum(axis=1).mean())), T
