"""Closing a broken object surface: hole filling, and the voxel remesh last resort, must give
a watertight mesh close to the true solid (a U-shaped block on a table at z = 0)."""

from __future__ import annotations

import numpy as np
import pytest
import trimesh

from reconstruction.metrics import chamfer_fscore
from reconstruction.objects import close_and_clean
from reconstruction.remesh import voxel_remesh
from reconstruction.segment import Plane

TABLE = Plane(np.array([0.0, 0.0, 1.0]), 0.0)


def u_block() -> trimesh.Trimesh:
    """80 x 50 x 60 mm block with a 30 mm wide, 35 mm deep notch from the top, on z = 0."""
    xz = (
        np.array(
            [
                [-40, 0],
                [40, 0],
                [40, 25],
                [15, 25],
                [-15, 25],
                [-40, 25],
                [-40, 60],
                [-15, 60],
                [15, 60],
                [40, 60],
            ],
            dtype=float,
        )
        / 1000
    )
    tri = np.array(
        [[0, 1, 2], [0, 2, 3], [0, 3, 4], [0, 4, 5], [5, 4, 7], [5, 7, 6], [3, 2, 9], [3, 9, 8]]
    )
    m = trimesh.creation.extrude_triangulation(xz, tri, 0.05)
    m.apply_transform(trimesh.transformations.rotation_matrix(np.pi / 2, [1, 0, 0]))
    m.apply_translation((0, 0.025, 0))
    v, f = trimesh.remesh.subdivide_to_size(m.vertices, m.faces, 0.003)
    out = trimesh.Trimesh(v, f)
    if out.volume < 0:
        out.invert()
    return out


def broken_scan(
    rng: np.random.Generator, wall_hole: bool = True, cheese: float = 0.0
) -> trimesh.Trimesh:
    """What a TSDF cut gives, made worse: no bottom, cut 6 mm above the table, a hole in a
    wall, a flap on a non-manifold edge, a floating fragment, 0.4 mm noise and (`cheese`) a
    fraction of faces dropped at random (many small holes with touching rims)."""
    m = u_block()
    c = m.triangles_center
    keep = c[:, 2] > 0.006
    keep &= rng.random(len(c)) >= cheese
    keep &= not wall_hole or ~(
        (np.abs(c[:, 1] - 0.025) < 1e-6)
        & (np.linalg.norm(c[:, [0, 2]] - [0.0, 0.012], axis=1) < 0.009)
    )
    v, f = m.vertices.copy(), m.faces[keep]
    e = f[0, :2]
    flap_tip = v[e].mean(axis=0) + [0.0, 0.0, 0.01]
    fragment = np.array([[0.0, 0.0, 0.07], [0.004, 0.0, 0.07], [0.0, 0.004, 0.071]])
    v = np.vstack([v, flap_tip, fragment])
    n = len(v)
    f = np.vstack([f, [e[0], e[1], n - 4], [n - 3, n - 2, n - 1]])
    v = v + rng.normal(0, 0.0004, v.shape)
    return trimesh.Trimesh(v, f, process=False)


def test_truth_block_is_closed() -> None:
    u = u_block()
    assert u.is_watertight and u.volume == pytest.approx(
        0.08 * 0.05 * 0.06 - 0.03 * 0.05 * 0.035, rel=1e-6
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_close_and_clean_broken_block_is_watertight(seed: int) -> None:
    part = broken_scan(np.random.default_rng(seed))
    _, count = np.unique(part.edges_sorted, axis=0, return_counts=True)
    assert (count > 2).sum() >= 1 and not part.is_watertight  # really broken
    mesh, holes, warnings, method = close_and_clean(part, TABLE, 3000, snap_height=0.014)
    assert mesh.is_watertight and mesh.volume > 0 and len(mesh.faces) <= 3000
    assert holes >= 1
    ch, fs = chamfer_fscore(mesh, u_block())
    assert ch < 0.003 and fs > 0.85, (method, ch, fs, warnings)
    assert method in ("hole filling", "voxel remesh")


@pytest.mark.parametrize("wall_hole", [True, False])
def test_swiss_cheese_surface_is_remeshed(wall_hole: bool) -> None:
    """Hole filling cannot close a surface full of small holes whose rims touch: the voxel
    remesh does, and says so; without the big wall hole the volume is enclosed."""
    part = broken_scan(np.random.default_rng(3), wall_hole=wall_hole, cheese=0.05)
    mesh, _, warnings, method = close_and_clean(part, TABLE, 3000, snap_height=0.014)
    assert method == "voxel remesh" and any("voxel occupancy" in w for w in warnings)
    assert mesh.is_watertight and mesh.volume > 0 and len(mesh.faces) <= 3000
    truth = u_block()
    ch, fs = chamfer_fscore(mesh, truth)
    assert ch < 0.0025 and fs > 0.9, (ch, fs, warnings)
    assert mesh.volume == pytest.approx(truth.volume, rel=0.1)
    assert any("enclosed volume" in w for w in warnings) != wall_hole, warnings


def test_voxel_remesh_recovers_block() -> None:
    part = broken_scan(np.random.default_rng(2))
    mesh, notes = voxel_remesh(part, TABLE, 3000, base_height=0.014)
    assert mesh is not None and mesh.is_watertight and len(mesh.faces) <= 3000
    truth = u_block()
    ch, fs = chamfer_fscore(mesh, truth)
    assert ch < 0.0025 and fs > 0.9, (ch, fs, notes)
    assert mesh.volume == pytest.approx(truth.volume, rel=0.1)
    assert mesh.bounds[0, 2] == pytest.approx(0.0, abs=0.002)  # stands on the table
    assert mesh.bounds[1, 2] == pytest.approx(0.06, abs=0.003)


def test_voxel_remesh_of_nothing() -> None:
    empty = trimesh.Trimesh(np.zeros((0, 3)), np.zeros((0, 3), dtype=np.int64))
    assert voxel_remesh(empty, TABLE)[0] is None
