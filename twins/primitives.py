"""Recognise meshes that are boxes, cylinders or spheres, so the twin collides with the exact
primitive (several times cheaper to simulate than hull sets, and no faceting).

A fit is judged by how far apart the two surfaces are, both ways: points sampled on the mesh
to the primitive's surface (exact distance) and points sampled on the primitive to the mesh
(nearest of many mesh samples). A scanned box with rounded, noisy edges is within a few
millimetres of its box everywhere; a U-block is not (its gap lies centimetres inside the
box that encloses it), so it stays a mesh and is decomposed (twins/decompose.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import trimesh
from numpy.typing import NDArray

from devices.poses import matrix_to_pose

# Largest RMS surface distance (m) for a mesh to become a primitive: about what a 4 mm
# TSDF scan of a real box or can deviates from it (rounded edges, noise, closed bottom).
PRIMITIVE_TOL_M = 0.003
_SAMPLES = 4000


@dataclass(frozen=True)
class PrimitiveFit:
    """The best primitive for a mesh. `size`: half extents (box), (radius, length)
    (cylinder, axis = z of `pose`) or (radius,) (sphere); `pose`: the primitive's frame in
    the mesh frame (xyz + quat xyzw); `rms_m` / `max_m`: RMS and 95th-percentile distance
    between the two surfaces (m)."""

    kind: str
    size: tuple[float, ...]
    pose: NDArray[np.float64]
    rms_m: float
    max_m: float

    def describe(self) -> str:
        return (
            f"{self.kind} {np.round(np.asarray(self.size), 4).tolist()} m, surface fit "
            f"error {self.rms_m * 1000:.1f} mm RMS ({self.max_m * 1000:.1f} mm at the 95th "
            "percentile)"
        )


def _box_distance(p: NDArray[np.float64], half: NDArray[np.float64]) -> NDArray[np.float64]:
    """|signed distance| of points (box frame) to the surface of a box of half extents."""
    q = np.abs(p) - half
    outside = np.linalg.norm(np.maximum(q, 0.0), axis=1)
    inside = np.minimum(np.max(q, axis=1), 0.0)
    return np.abs(outside + inside)


def _cylinder_distance(p: NDArray[np.float64], r: float, length: float) -> NDArray[np.float64]:
    """|signed distance| of points (cylinder frame, axis z) to a cylinder's surface."""
    d = np.column_stack([np.linalg.norm(p[:, :2], axis=1) - r, np.abs(p[:, 2]) - length / 2])
    outside = np.linalg.norm(np.maximum(d, 0.0), axis=1)
    inside = np.minimum(np.max(d, axis=1), 0.0)
    return np.abs(outside + inside)


def _axis_frame(T_mesh_box: NDArray[np.float64], axis: int) -> NDArray[np.float64]:
    """T_mesh_box with its z rotated onto box axis `axis` (PyBullet cylinders run along z)."""
    if axis == 2:
        return T_mesh_box
    z = np.zeros(3)
    z[axis] = 1.0
    x = np.zeros(3)
    x[[i for i in range(3) if i != axis][0]] = 1.0
    R = np.eye(4)
    R[:3, :3] = np.column_stack([x, np.cross(z, x), z])
    return T_mesh_box @ R


def _candidates(
    mesh: trimesh.Trimesh, pts: NDArray[np.float64]
) -> list[tuple[str, tuple[float, ...], NDArray[np.float64], NDArray[np.float64]]]:
    """(kind, size, T_mesh_primitive, distances of `pts` to its surface) for each shape."""
    T, _ = trimesh.bounds.oriented_bounds(mesh)  # T maps mesh -> box frame (its axes)
    local = trimesh.transform_points(pts, T)
    # extents from percentiles, not the extreme points: a noisy scan's outliers would
    # inflate them (each face of a box or cap of a can holds over 2 % of the samples)
    lo, hi = np.percentile(local, 2, axis=0), np.percentile(local, 98, axis=0)
    ext, mid = hi - lo, (hi + lo) / 2
    local = local - mid
    T_mesh_box = np.linalg.inv(T) @ trimesh.transformations.translation_matrix(mid)
    out = [("box", tuple(float(e / 2) for e in ext), T_mesh_box, _box_distance(local, ext / 2))]
    for ax in range(3):
        others = [i for i in range(3) if i != ax]
        length = float(ext[ax])
        radial = np.linalg.norm(local[:, others], axis=1)
        side = np.abs(local[:, ax]) < 0.4 * length  # side wall only: caps sit at +-length/2
        if side.sum() < 20:
            continue
        r = float(np.median(radial[side]))
        Tc = _axis_frame(T_mesh_box, ax)
        loc_c = trimesh.transform_points(pts, np.linalg.inv(Tc))
        out.append(("cylinder", (r, length), Tc, _cylinder_distance(loc_c, r, length)))
    # sphere: algebraic least squares |p|^2 = 2 c.p + (r^2 - |c|^2)
    A = np.column_stack([2 * pts, np.ones(len(pts))])
    sol, *_ = np.linalg.lstsq(A, (pts**2).sum(axis=1), rcond=None)
    c = sol[:3]
    r2 = float(sol[3] + c @ c)
    if r2 > 0:
        rs = float(np.sqrt(r2))
        Ts = np.eye(4)
        Ts[:3, 3] = c
        out.append(("sphere", (rs,), Ts, np.abs(np.linalg.norm(pts - c, axis=1) - rs)))
    return out


def _primitive_mesh(kind: str, size: tuple[float, ...]) -> trimesh.Trimesh:
    if kind == "box":
        return trimesh.creation.box(extents=[2 * s for s in size])
    if kind == "cylinder":
        return trimesh.creation.cylinder(radius=size[0], height=size[1], sections=48)
    return trimesh.creation.icosphere(subdivisions=3, radius=size[0])


def fit_primitive(
    mesh: trimesh.Trimesh, tol: float = PRIMITIVE_TOL_M, seed: int = 0
) -> PrimitiveFit | None:
    """The box, cylinder or sphere whose surface lies closest to the mesh's, when its RMS
    surface distance (both ways, see the module docstring) is at most `tol` m; else None.
    An open mesh counts its holes against the fit (scans are closed before they get here)."""
    best = closest_primitive(mesh, seed)
    return best if best is not None and best.rms_m <= tol else None


def closest_primitive(mesh: trimesh.Trimesh, seed: int = 0) -> PrimitiveFit | None:
    """The best-fitting box, cylinder or sphere whatever its error (None for an empty or
    degenerate mesh): what `fit_primitive` compares with its tolerance."""
    from scipy.spatial import cKDTree

    if len(mesh.faces) < 4 or mesh.area <= 0:
        return None
    rng = np.random.default_rng(seed)
    pts, _ = trimesh.sample.sample_surface(mesh, _SAMPLES, seed=int(rng.integers(1 << 31)))
    pts = np.asarray(pts, float)
    dense, _ = trimesh.sample.sample_surface(mesh, 4 * _SAMPLES, seed=int(rng.integers(1 << 31)))
    tree = cKDTree(np.asarray(dense, float))
    best: PrimitiveFit | None = None
    for kind, size, T, d_mesh in _candidates(mesh, pts):
        prim = _primitive_mesh(kind, size)
        ppts, _ = trimesh.sample.sample_surface(prim, _SAMPLES, seed=int(rng.integers(1 << 31)))
        d_prim, _ = tree.query(trimesh.transform_points(np.asarray(ppts, float), T))
        both = np.concatenate([d_mesh, d_prim])
        fit = PrimitiveFit(
            kind,
            size,
            matrix_to_pose(T),
            float(np.sqrt(np.mean(both**2))),
            float(np.percentile(both, 95)),
        )
        if best is None or fit.rms_m < best.rms_m:
            best = fit
    return best
