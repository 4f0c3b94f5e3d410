"""Recognise meshes that are boxes, cylinders or spheres, so the twin collides with the exact
primitive (several times cheaper to simulate than hull sets, and no faceting).

A fit is judged by how far apart the two surfaces are, both ways: points sampled on the mesh
to the primitive's surface (exact distance) and points sampled on the primitive to the mesh
(nearest of many mesh samples). A scanned box with rounded, noisy edges is within a few
millimetres of its box everywhere; a U-block is not (its gap lies centimetres inside the
box that encloses it), so it stays a mesh and is decomposed (twins/decompose.py).

A scanned object resting on a table was never seen from below: its mesh is closed there by
the scan (a flat bottom and a skirt of snapped, filled triangles a centimetre or so high,
reconstruction/objects.py), and that skirt flares. When the support plane is known (the
segmentation's table, in the mesh frame) the fit uses the observed surface only: upright
boxes and cylinders are fitted to the side walls above the skirt (box sides: the median of
the wall points facing each side; cylinder: a Huber-weighted circle fit) and the top, then
extruded down to the plane; the surface distance ignores the bottom and the skirt. Given
the points the scan observed (its scene mesh around the object), mesh surface far from all
of them (hole filling across a side the camera never saw, often caved in by a centimetre or
more) is left out of the fit and of the distance too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import trimesh
from numpy.typing import NDArray

from devices.poses import matrix_to_pose

# Largest RMS surface distance (m) for a mesh to become a primitive: about what a 4 mm
# TSDF scan of a real box or can deviates from it (rounded edges, noise, closed bottom).
PRIMITIVE_TOL_M = 0.003
# ... or this share of the mesh's bounding-box diagonal, whichever is larger: a scan's error
# grows with the object (a room-scale scan fuses at 8-12 mm voxels; a real filing cabinet
# fused from motion-capture poses lies 5.5 mm RMS from its box, 0.5 % of its 1.1 m)
PRIMITIVE_REL_TOL = 0.0075
# Height above the support plane (m) below which a scanned object's surface is the scan's
# closing, not observed: the scan snaps open edges within 3.5 voxels (14 mm at 4 mm) onto
# the table and fills the rest (reconstruction/objects.py)
SKIRT_M = 0.015
# Largest gap (m) between the mesh's lowest points and the support plane for the object to
# count as resting on it
REST_TOL_M = 0.01
# A mesh point over this far (m; or twice the observed points' spacing) from every point the
# scan observed was made up by closing the mesh (hole filling across a side never seen)
OBSERVED_M = 0.003
_SAMPLES = 4000
_FACING_DEG = 25  # a wall point belongs to a box side when its normal is this close to it
_HUBER_M = 0.002  # Huber scale of the circle fit: about a scan's surface noise
# An upright box needs every side well supported: at least _MIN_SIDE of the samples facing
# it within a MAD of _SIDE_MAD_M, each the same distance outside the top's edge within
# _SIDE_AGREE_M when the top is seen (at least _MIN_TOP points on it); see _box_sides
_MIN_SIDE = 20
_SIDE_MAD_M = 0.0012
_MIN_TOP = 50
_SIDE_AGREE_M = 0.0015
_BOX_RIM_M = 0.008
_MAX_RIM_M = 0.0042
# On a support plane a shape fitted to the whole mesh (a lying can, a tilted box: sized from
# the closed mesh too) replaces the upright fit only when this much closer: on the observed
# surface alone an oversized box can score as well as the right one (measured: 7 mm too
# wide, 1.71 vs 1.76 mm RMS)
_UPRIGHT_FIRST = 0.7


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
    on_support: bool = False  # fitted to the observed surface, down to the support plane
    seen: float = 1.0  # share of the mesh's surface the scan observed (the rest it closed)

    def describe(self) -> str:
        how = (
            " (fitted to the observed surface above the support plane and extruded down to it)"
            if self.on_support
            else ""
        )
        unseen = (
            f"; {100 * (1 - self.seen):.0f} % of the mesh was closed by the scan, not seen, "
            "and is not judged"
            if self.seen < 0.995
            else ""
        )
        mm = np.asarray(self.size) * 1000
        dims = (
            " x ".join(f"{2 * v:.1f}" for v in mm)
            if self.kind == "box"
            else f"r {mm[0]:.1f} x {mm[1]:.1f}"
            if self.kind == "cylinder"
            else f"r {mm[0]:.1f}"
        )
        return (
            f"{self.kind} {dims} mm{how}, surface fit "
            f"error {self.rms_m * 1000:.1f} mm RMS ({self.max_m * 1000:.1f} mm at the 95th "
            f"percentile){unseen}"
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
) -> list[tuple[str, tuple[float, ...], NDArray[np.float64]]]:
    """(kind, size, T_mesh_primitive) for each shape, from the mesh's oriented bounds."""
    T, _ = trimesh.bounds.oriented_bounds(mesh)  # T maps mesh -> box frame (its axes)
    local = trimesh.transform_points(pts, T)
    # extents from percentiles, not the extreme points: a noisy scan's outliers would
    # inflate them (each face of a box or cap of a can holds over 2 % of the samples)
    lo, hi = np.percentile(local, 2, axis=0), np.percentile(local, 98, axis=0)
    ext, mid = hi - lo, (hi + lo) / 2
    local = local - mid
    T_mesh_box = np.linalg.inv(T) @ trimesh.transformations.translation_matrix(mid)
    out = [("box", tuple(float(e / 2) for e in ext), T_mesh_box)]
    for ax in range(3):
        others = [i for i in range(3) if i != ax]
        length = float(ext[ax])
        radial = np.linalg.norm(local[:, others], axis=1)
        side = np.abs(local[:, ax]) < 0.4 * length  # side wall only: caps sit at +-length/2
        if side.sum() < 20:
            continue
        r = float(np.median(radial[side]))
        out.append(("cylinder", (r, length), _axis_frame(T_mesh_box, ax)))
    out += _sphere(pts)
    return out


def _sphere(pts: NDArray[np.float64]) -> list[tuple[str, tuple[float, ...], NDArray[np.float64]]]:
    """Algebraic least squares |p|^2 = 2 c.p + (r^2 - |c|^2); [] when degenerate."""
    A = np.column_stack([2 * pts, np.ones(len(pts))])
    sol, *_ = np.linalg.lstsq(A, (pts**2).sum(axis=1), rcond=None)
    c = sol[:3]
    r2 = float(sol[3] + c @ c)
    if r2 <= 0:
        return []
    Ts = np.eye(4)
    Ts[:3, 3] = c
    return [("sphere", (float(np.sqrt(r2)),), Ts)]


def _distance(
    kind: str, size: tuple[float, ...], T: NDArray[np.float64], pts: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Distances of `pts` (mesh frame) to the surface of a primitive at T_mesh_primitive."""
    local = trimesh.transform_points(pts, np.linalg.inv(T))
    if kind == "box":
        return _box_distance(local, np.asarray(size, float))
    if kind == "cylinder":
        return _cylinder_distance(local, size[0], size[1])
    return np.asarray(np.abs(np.linalg.norm(local, axis=1) - size[0]), float)


def _support_frame(mesh: trimesh.Trimesh, support: Sequence[float]) -> NDArray[np.float64] | None:
    """T_mesh_support for a plane (a, b, c, d) in the mesh frame: z = the plane's normal
    towards the mesh, origin = the mesh's centroid dropped onto the plane. None when the
    mesh does not rest on the plane (its lowest point over REST_TOL_M from it)."""
    n = np.asarray(support[:3], float)
    s = float(np.linalg.norm(n))
    if s < 1e-9:
        return None
    n, d = n / s, float(support[3]) / s
    v = np.asarray(mesh.vertices, float)
    h = v @ n + d
    if np.median(h) < 0:
        n, d, h = -n, -d, -h
    if abs(float(h.min())) > REST_TOL_M:
        return None
    x = np.cross(n, [0.0, 0.0, 1.0] if abs(n[2]) < 0.9 else [1.0, 0.0, 0.0])
    x /= np.linalg.norm(x)
    T = np.eye(4)
    T[:3, 0], T[:3, 1], T[:3, 2] = x, np.cross(n, x), n
    c = v.mean(axis=0)
    T[:3, 3] = c - (c @ n + d) * n
    return T


def _normals(
    pts: NDArray[np.float64], face_normals: NDArray[np.float64], dense: Any, tree: Any
) -> NDArray[np.float64]:
    """Surface normals at `pts` from the local plane through their 30 nearest dense samples
    (about 3 mm around), signed as the faces they lie on: a noisy scan's single triangles
    tilt by tens of degrees, the surface around them does not."""
    _, idx = tree.query(pts, k=30)
    nb = np.asarray(dense, float)[idx]
    nb = nb - nb.mean(axis=1, keepdims=True)
    _, vecs = np.linalg.eigh(np.einsum("nki,nkj->nij", nb, nb))
    n = vecs[:, :, 0]
    flip = np.einsum("ij,ij->i", n, np.asarray(face_normals, float)) < 0
    n[flip] = -n[flip]
    return np.asarray(n, float)


def _circle(p: NDArray[np.float64]) -> tuple[NDArray[np.float64], float]:
    """Centre and radius of a circle through 2-D points: algebraic fit, then Gauss-Newton on
    the geometric residuals with Huber weights (a scan's stray points pull it little)."""
    A = np.column_stack([2 * p, np.ones(len(p))])
    sol, *_ = np.linalg.lstsq(A, (p**2).sum(axis=1), rcond=None)
    c, r = sol[:2], float(np.sqrt(max(sol[2] + sol[:2] @ sol[:2], 1e-12)))
    for _ in range(15):
        dp = p - c
        ri = np.maximum(np.linalg.norm(dp, axis=1), 1e-9)
        e = ri - r
        w = np.sqrt(np.minimum(1.0, _HUBER_M / np.maximum(np.abs(e), 1e-12)))
        J = np.column_stack([-dp / ri[:, None], -np.ones(len(p))])
        step, *_ = np.linalg.lstsq(J * w[:, None], -e * w, rcond=None)
        c, r = c + step[:2], r + float(step[2])
        if np.abs(step).max() < 1e-7:
            break
    return c, abs(r)


def _upright(
    pts: NDArray[np.float64], normals: NDArray[np.float64], T_ms: NDArray[np.float64]
) -> tuple[list[tuple[str, tuple[float, ...], NDArray[np.float64]]], bool]:
    """An upright box and cylinder standing on the support plane (frame T_ms), fitted to the
    observed surface: the top's median height and the side walls above the skirt; and
    whether no box was made because a side was poorly supported (see _box_sides)."""
    q = trimesh.transform_points(pts, np.linalg.inv(T_ms))
    nq = normals @ T_ms[:3, :3]
    h = q[:, 2]
    hmax = float(np.percentile(h, 99))
    top_pts = (nq[:, 2] > 0.9) & (h > 0.5 * hmax)
    top = float(np.median(h[top_pts])) if top_pts.sum() >= 20 else hmax
    skirt = min(SKIRT_M, 0.3 * top)
    walls = (np.abs(nq[:, 2]) < 0.3) & (h > skirt) & (h < top - min(0.01, 0.2 * top))
    if walls.sum() < 30 or top <= 0:
        return [], False
    w2 = q[walls, :2]
    n2 = nq[walls, :2] / np.maximum(np.linalg.norm(nq[walls, :2], axis=1, keepdims=True), 1e-12)
    out: list[tuple[str, tuple[float, ...], NDArray[np.float64]]] = []
    # box: the wall normals' direction modulo 90 degrees gives the yaw; each side sits at the
    # median of the wall points facing it (a rounded edge's or a flared skirt's points do not)
    theta = float(np.angle(np.exp(4j * np.arctan2(n2[:, 1], n2[:, 0])).sum())) / 4
    R2 = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    uv, nuv = w2 @ R2, n2 @ R2
    top_uv = q[top_pts, :2] @ R2 if top_pts.sum() >= _MIN_TOP else None
    # the rim a ~4 mm TSDF leaves, or more for a large object scanned coarser
    diag = float(np.linalg.norm(np.ptp(q, axis=0)))
    sides, poor = _box_sides(uv, nuv, top_uv, max(_MAX_RIM_M, PRIMITIVE_REL_TOL * diag))
    half = None if sides is None else (sides[:, 0] - sides[:, 1]) / 2
    if sides is not None and half is not None and np.all(half > 0):
        Tb = np.eye(4)
        Tb[:2, :2] = R2
        Tb[:2, 3] = R2 @ sides.mean(axis=1)
        Tb[2, 3] = top / 2
        out.append(("box", (float(half[0]), float(half[1]), top / 2), T_ms @ Tb))
    c, r = _circle(w2)
    Tc = np.eye(4)
    Tc[:2, 3], Tc[2, 3] = c, top / 2
    out.append(("cylinder", (r, top), T_ms @ Tc))
    return out, poor


def _box_sides(
    uv: NDArray[np.float64],
    nuv: NDArray[np.float64],
    top_uv: NDArray[np.float64] | None,
    max_rim: float = 0.0042,
) -> tuple[NDArray[np.float64] | None, bool]:
    """Positions of an upright box's four sides, [axis, (+, -)], from the wall points `uv`
    (box axes, normals `nuv`), checked against the top's points `top_uv`; None when the
    scan does not hold a box's size.

    Each side is the median of the points facing it, and must be well supported: at least
    _MIN_SIDE points within a MAD of _SIDE_MAD_M (a flat, well-seen wall: 0.1-0.4 mm). A
    side the scan saw only at grazing angles is not (lab scans: 25-32 points, scattered or
    bulging outwards, the box 3-8 mm too wide or narrow), and nothing else places it: on one
    such scan the top's edge there was right, on another it bulged 3.5 mm out with the side.
    With the top seen, each side must also stand the same distance outside the top's edge
    (the rim the TSDF rounds, 2.2-2.8 mm at 4 mm voxels) within _SIDE_AGREE_M: a side that
    sits tight but offset is not believed either; nor are walls standing over `max_rim`
    outside the top's edge (a lab scan fused all four 3.4 mm out, rims 3.3-5.8 mm, the box
    56.8 x 84.8 mm at 1.1 mm RMS and 2.1 mm Chamfer; rims of 2.2-3.5 mm came with sizes
    within 1 mm). Returns (sides or None, whether the object
    looks like a box whose size the scan does not hold: a side poorly supported, or rims
    that disagree while all within _BOX_RIM_M; a lying can's caps and flanks also face four
    ways, but its flanks stand far outside its narrow top)."""
    sides = np.full((2, 2), np.nan)
    for ax in range(2):
        for k, sgn in enumerate((1.0, -1.0)):
            facing = sgn * nuv[:, ax] > np.cos(np.radians(_FACING_DEG))
            if facing.sum() < _MIN_SIDE:
                return None, True
            x = uv[facing, ax]
            sides[ax, k] = np.median(x)
            if 1.4826 * float(np.median(np.abs(x - sides[ax, k]))) > _SIDE_MAD_M:
                return None, True
    if top_uv is not None:
        edges = np.column_stack(
            [np.percentile(top_uv, 99, axis=0), np.percentile(top_uv, 1, axis=0)]
        )  # [axis, (+, -)]
        rim = np.array([1.0, -1.0]) * (sides - edges)
        if np.abs(rim - np.median(rim)).max() > _SIDE_AGREE_M:
            # rims of a few mm all round: a box with a side out of place; a lying can's
            # flanks stand ~r sin(65 deg) outside its narrow top (20 mm at r 35 mm)
            return None, bool(np.abs(rim).max() <= _BOX_RIM_M)
        if rim.max() > max_rim:
            return None, True  # walls fused outside the top's edge: the scan bulged
    return sides, False


def _primitive_mesh(kind: str, size: tuple[float, ...]) -> trimesh.Trimesh:
    if kind == "box":
        return trimesh.creation.box(extents=[2 * s for s in size])
    if kind == "cylinder":
        return trimesh.creation.cylinder(radius=size[0], height=size[1], sections=48)
    return trimesh.creation.icosphere(subdivisions=3, radius=size[0])


def primitive_tolerance(mesh: trimesh.Trimesh) -> float:
    """Largest RMS surface distance (m) for `mesh` to become a primitive: PRIMITIVE_TOL_M or
    PRIMITIVE_REL_TOL of its bounding-box diagonal, whichever is larger."""
    return max(PRIMITIVE_TOL_M, PRIMITIVE_REL_TOL * float(np.linalg.norm(mesh.extents)))


def fit_primitive(
    mesh: trimesh.Trimesh,
    tol: float | None = None,
    seed: int = 0,
    support: Sequence[float] | None = None,
    observed: NDArray[np.float64] | None = None,
) -> PrimitiveFit | None:
    """The box, cylinder or sphere whose surface lies closest to the mesh's, when its RMS
    surface distance (both ways, see the module docstring) is at most `tol` m (default:
    `primitive_tolerance(mesh)`); else None.
    `support`: the plane (a, b, c, d) the object rests on, in the mesh frame (a scanned
    object's table); `observed`: points the scan actually saw (its scene mesh's vertices
    around the object, mesh frame). Then only the observed surface counts. An open mesh
    counts its holes against the fit (scans are closed before they get here)."""
    best = closest_primitive(mesh, seed, support, observed)
    tol = primitive_tolerance(mesh) if tol is None else tol
    return best if best is not None and best.rms_m <= tol else None


def closest_primitive(
    mesh: trimesh.Trimesh,
    seed: int = 0,
    support: Sequence[float] | None = None,
    observed: NDArray[np.float64] | None = None,
) -> PrimitiveFit | None:
    """The best-fitting box, cylinder or sphere whatever its error (None for an empty or
    degenerate mesh, or too little of it observed): what `fit_primitive` compares with its
    tolerance. With `support` (see there) upright shapes stand on the plane, and the surface
    distance leaves out the bottom and the scan's closing skirt (a mesh not resting on the
    plane ignores it); with `observed`, mesh surface over OBSERVED_M from every observed
    point (closed by the scan's hole filling) is left out of the fit and of the distance,
    both ways: a primitive's point whose nearest mesh point is such surface is not judged."""
    from scipy.spatial import cKDTree

    if len(mesh.faces) < 4 or mesh.area <= 0:
        return None
    rng = np.random.default_rng(seed)
    pts, fidx = trimesh.sample.sample_surface(mesh, _SAMPLES, seed=int(rng.integers(1 << 31)))
    pts = np.asarray(pts, float)
    dense, _ = trimesh.sample.sample_surface(mesh, 4 * _SAMPLES, seed=int(rng.integers(1 << 31)))
    dense = np.asarray(dense, float)
    tree = cKDTree(dense)
    seen_pts, seen_dense = np.ones(len(pts), bool), np.ones(len(dense), bool)
    if observed is not None and len(observed) >= 100:
        obs = np.asarray(observed, float)
        otree = cKDTree(obs)
        some = obs[rng.choice(len(obs), min(len(obs), 2000), replace=False)]
        spacing = float(np.median(otree.query(some, k=2)[0][:, 1]))
        reach = max(OBSERVED_M, 2 * spacing)  # sparse points: judged by their own spacing
        seen_pts = otree.query(pts, distance_upper_bound=reach)[0] <= reach
        seen_dense = otree.query(dense, distance_upper_bound=reach)[0] <= reach
    T_ms = None if support is None else _support_frame(mesh, support)
    upright: list[tuple[str, tuple[float, ...], NDArray[np.float64]]] = []
    skirt = -np.inf
    if T_ms is None:
        cands, keep = _candidates(mesh, pts), seen_pts
    else:
        normals = _normals(pts, mesh.face_normals[fidx], dense, tree)
        upright, poor_side = _upright(pts[seen_pts], normals[seen_pts], T_ms)
        h = (pts - T_ms[:3, 3]) @ T_ms[:3, 2]
        skirt = min(SKIRT_M, 0.3 * float(np.percentile(h, 99)))
        keep = seen_pts & (h > skirt)
        # no upright box because a side was poorly or never seen (_box_sides): a shape
        # fitted to the whole mesh, closed surface and all, is no better evidence of the
        # object's size (a bulged 80 x 50 x 50 mm box passed as a lying can, r 28 mm at
        # 2.6 mm RMS); refused by its top's edge alone it may be a lying can, not a box
        no_box = bool(upright) and not any(c[0] == "box" for c in upright)
        general = [
            c
            for c in _candidates(mesh, pts)
            if c[0] != "sphere" and not poor_side and not (no_box and c[0] == "box")
        ]
        cands = upright + general + _sphere(pts[keep])
    if keep.sum() < 100:
        return None
    seen = pts[keep]
    best: PrimitiveFit | None = None
    for i, (kind, size, T) in enumerate(cands):
        prim = _primitive_mesh(kind, size)
        ppts, _ = trimesh.sample.sample_surface(prim, _SAMPLES, seed=int(rng.integers(1 << 31)))
        ppts = trimesh.transform_points(np.asarray(ppts, float), T)
        if T_ms is not None:
            ppts = ppts[(ppts - T_ms[:3, 3]) @ T_ms[:3, 2] > skirt]
        d_prim, nearest = tree.query(ppts)
        both = np.concatenate([_distance(kind, size, T, seen), d_prim[seen_dense[nearest]]])
        fit = PrimitiveFit(
            kind,
            size,
            matrix_to_pose(T),
            float(np.sqrt(np.mean(both**2))),
            float(np.percentile(both, 95)),
            T_ms is not None and i < len(upright),
            float(seen_pts.mean()),
        )
        bar = 1.0 if best is None or fit.on_support or not best.on_support else _UPRIGHT_FIRST
        if best is None or fit.rms_m < best.rms_m * bar:
            best = fit
    return best
