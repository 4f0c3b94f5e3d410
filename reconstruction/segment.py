"""Table plane (seeded RANSAC) and object clusters (DBSCAN on downsampled points above it).

Points and colours come in and go out as numpy arrays; Open3D is used inside only. The plane
is `n . p + d = 0` with `n` pointing up, out of the table; a point's height is `n . p + d`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import open3d as o3d
from numpy.typing import NDArray
from scipy.cluster.vq import kmeans2
from scipy.spatial import ConvexHull, Delaunay, QhullError

from reconstruction.errors import ReconstructionError


@dataclass(frozen=True)
class Plane:
    normal: NDArray[np.float64]  # (3,) unit, pointing away from the table top
    d: float  # n . p + d = 0

    def height(self, p: NDArray[np.floating]) -> NDArray[np.float64]:
        return np.asarray(p, dtype=float) @ self.normal + self.d

    def project(self, p: NDArray[np.floating]) -> NDArray[np.float64]:
        p = np.asarray(p, dtype=float)
        return p - np.outer(self.height(p), self.normal)

    def basis(self) -> NDArray[np.float64]:
        """(3, 3) columns x, y, z=normal of a frame in the plane (x as close to world x)."""
        z = self.normal
        ref = np.array([1.0, 0, 0]) if abs(z[0]) < 0.9 else np.array([0, 1.0, 0])
        x = ref - z * (ref @ z)
        x /= np.linalg.norm(x)
        return np.column_stack([x, np.cross(z, x), z])

    def to_list(self) -> list[float]:
        return [*map(float, self.normal), float(self.d)]

    @classmethod
    def from_list(cls, v: list[float]) -> Plane:
        return cls(np.asarray(v[:3], dtype=float), float(v[3]))


@dataclass
class Cluster:
    points: NDArray[np.float64]  # (N, 3) downsampled points of this object
    colors: NDArray[np.uint8]  # (N, 3)
    warnings: list[str] = field(default_factory=list)

    def footprint_centre(self, plane: Plane) -> NDArray[np.float64]:
        """Centre of the points' bounding box in the table plane, half-way up."""
        B = plane.basis()
        uv = self.points @ B[:, :2]
        mid = (uv.min(0) + uv.max(0)) / 2
        h = plane.height(self.points)
        return plane.project((B[:, :2] @ mid)[None])[0] + plane.normal * float(h.max()) / 2


def _cloud(
    points: NDArray[np.floating], colors: NDArray[np.uint8] | None
) -> o3d.geometry.PointCloud:
    pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(points, dtype=np.float64)))
    if colors is not None:
        pc.colors = o3d.utility.Vector3dVector(np.asarray(colors, dtype=np.float64) / 255.0)
    return pc


def downsample(
    points: NDArray[np.floating], colors: NDArray[np.uint8] | None, voxel: float
) -> tuple[NDArray[np.float64], NDArray[np.uint8]]:
    """Voxel-grid downsample (DBSCAN on a large cloud can exhaust memory: docs/TRAPS.md)."""
    pc = _cloud(points, colors).voxel_down_sample(voxel)
    p = np.asarray(pc.points)
    c = (
        (np.asarray(pc.colors) * 255).round().astype(np.uint8)
        if pc.has_colors()
        else np.full((len(p), 3), 180, np.uint8)
    )
    return p, c


def fit_table_plane(
    points: NDArray[np.floating],
    seed: int = 0,
    distance: float = 0.006,
    up: NDArray[np.floating] | None = None,
    voxel: float = 0.006,
    max_tilt_deg: float = 25.0,
    iterations: int = 2000,
) -> tuple[Plane, float]:
    """The table plane: the largest plane facing `up` (the largest plane if `up` is None).

    Deterministic for a given seed (Open3D's RANSAC draws from its global generator, which
    is seeded here). Returns the plane and its inlier fraction; raises ReconstructionError
    if no plane is found.
    """
    p, _ = downsample(points, None, voxel)
    if len(p) < 100:
        raise ReconstructionError(
            f"only {len(p)} surface points: too few to find the table "
            "(is the depth scale right? is the table in view?)"
        )
    up_v = None if up is None else np.asarray(up, float) / np.linalg.norm(up)
    remaining = p
    for _ in range(4):
        if len(remaining) < 100:
            break
        o3d.utility.random.seed(seed)
        model, inliers = _cloud(remaining, None).segment_plane(
            distance_threshold=distance, ransac_n=3, num_iterations=iterations
        )
        n = np.asarray(model[:3], float)
        norm = np.linalg.norm(n)
        n, d = n / norm, float(model[3]) / norm
        if up_v is not None and n @ up_v < 0 or up_v is None and d < 0:
            n, d = -n, -d  # without `up`, orient towards the origin of the world (camera side)
        if up_v is None or np.degrees(np.arccos(np.clip(n @ up_v, -1, 1))) <= max_tilt_deg:
            return Plane(n, float(d)), len(inliers) / len(p)
        remaining = np.delete(remaining, inliers, axis=0)
    raise ReconstructionError(
        "no table plane facing up found (tilt limit "
        f"{max_tilt_deg} deg); is the camera pose/calibration right?"
    )


def table_hull(points: NDArray[np.floating], plane: Plane, tol: float = 0.006) -> Delaunay | None:
    """2D (plane coordinates) Delaunay of the table inliers' convex hull, for inside tests."""
    p = np.asarray(points, float)
    on = p[np.abs(plane.height(p)) < tol]
    if len(on) < 10:
        return None
    uv = on @ plane.basis()[:, :2]
    try:
        hull = ConvexHull(uv)
        return Delaunay(uv[hull.vertices])
    except QhullError:
        return None


def cluster_objects(
    points: NDArray[np.floating],
    colors: NDArray[np.uint8],
    plane: Plane,
    min_height: float = 0.008,
    max_height: float = 0.35,
    voxel: float = 0.004,
    eps: float = 0.012,
    min_points: int = 10,
    min_cluster: int = 60,
    exclude: Sequence[tuple[NDArray[Any], NDArray[Any]]] | None = None,
    split_by_color: bool = True,
) -> list[Cluster]:
    """Objects standing on the table, as clusters of points above the plane.

    `exclude` is a list of axis-aligned boxes (lo, hi) in the world frame whose points are
    ignored (the robot). Touching objects of clearly different colours are split; a cluster
    that still looks like several objects carries a warning.
    """
    p, c = downsample(points, colors, voxel)
    h = plane.height(p)
    keep = (h > min_height) & (h < max_height)
    hull = table_hull(p, plane)
    if hull is not None:
        keep &= hull.find_simplex(p @ plane.basis()[:, :2]) >= 0
    for lo, hi in exclude or []:
        keep &= ~np.all((p >= np.asarray(lo)) & (p <= np.asarray(hi)), axis=1)
    p, c = p[keep], c[keep]
    if len(p) < min_cluster:
        return []
    labels = np.asarray(
        _cloud(p, None).cluster_dbscan(eps=eps, min_points=min_points, print_progress=False)
    )
    clusters: list[Cluster] = []
    for lab in range(labels.max() + 1 if len(labels) else 0):
        m = labels == lab
        if m.sum() < min_cluster:
            continue
        parts = _split_by_color(p[m], c[m], eps, min_cluster) if split_by_color else None
        if parts:
            clusters.extend(parts)
        else:
            clusters.append(Cluster(p[m], c[m]))
    for cl in clusters:
        sol = _footprint_solidity(cl.points, plane, voxel)
        if sol < 0.6 and not cl.warnings:
            cl.warnings.append(
                f"footprint solidity {sol:.2f}: may be several touching objects "
                "or one non-convex object"
            )
    clusters.sort(key=lambda cl: -len(cl.points))
    return clusters


def _split_by_color(
    p: NDArray[np.float64], c: NDArray[np.uint8], eps: float, min_cluster: int
) -> list[Cluster] | None:
    """Two touching objects of clearly different colour -> two clusters (None if not)."""
    if len(p) < 2 * min_cluster:
        return None
    cf = c.astype(np.float64) + 1.0
    chroma = cf / cf.sum(axis=1, keepdims=True)  # shading-invariant colour
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "one of the clusters is empty": one colour
        centers, lab = kmeans2(chroma[:, :2], 2, seed=np.random.default_rng(0), minit="++")
    if not np.isfinite(centers).all():
        return None
    if np.linalg.norm(centers[0] - centers[1]) < 0.12 or min(np.bincount(lab, minlength=2)) < max(
        min_cluster, 0.1 * len(p)
    ):
        return None
    out = []
    for k in (0, 1):
        sub = p[lab == k]
        sl = np.asarray(
            _cloud(sub, None).cluster_dbscan(eps=eps, min_points=5, print_progress=False)
        )
        if sl.max() < 0:
            return None
        main = np.bincount(sl[sl >= 0]).argmax()
        if (sl == main).sum() < 0.8 * len(sub):
            return None  # colour groups are not spatially coherent: one multicoloured object
        out.append(
            Cluster(
                sub[sl == main],
                c[lab == k][sl == main],
                ["touching another object: separated by colour"],
            )
        )
    return out


def _footprint_solidity(p: NDArray[np.float64], plane: Plane, voxel: float) -> float:
    """Occupied footprint area / convex hull area (1 for a box or cylinder seen from above)."""
    uv = p @ plane.basis()[:, :2]
    try:
        hull_area = ConvexHull(uv).volume
    except QhullError:
        return 1.0
    cell = 2 * voxel
    occ = len(np.unique(np.floor(uv / cell).astype(np.int64), axis=0)) * cell * cell
    return float(min(occ / max(hull_area, 1e-12), 1.0))
