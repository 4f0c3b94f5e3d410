"""Primitives when they fit, a concavity-budgeted decomposition otherwise: checked on the lab
scene's own objects (true sizes) and on scan-like meshes (rounded edges, noise, open base)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trimesh
from scipy.spatial import ConvexHull

from twins.decompose import decompose
from twins.make import mesh_object
from twins.primitives import PRIMITIVE_TOL_M, fit_primitive
from twins.scan_input import lab_scene_objects

IDENTITY = (0, 0, 0, 0, 0, 0, 1)


def _lab(name: str) -> trimesh.Trimesh:
    return {o.name: o for o in lab_scene_objects()}[name].mesh


def _scan_like(mesh: trimesh.Trimesh, noise_m: float, seed: int = 0) -> trimesh.Trimesh:
    """Subdivided, vertices jittered along their normals (a TSDF surface's noise)."""
    m = mesh.subdivide_to_size(0.004)
    rng = np.random.default_rng(seed)
    v = m.vertices + m.vertex_normals * rng.normal(0, noise_m, (len(m.vertices), 1))
    return trimesh.Trimesh(v, m.faces)


def test_lab_box_and_cylinder_fit_their_true_sizes() -> None:
    box = fit_primitive(_lab("box"))
    assert box is not None and box.kind == "box"
    assert sorted(2 * np.asarray(box.size)) == pytest.approx([0.05, 0.05, 0.08], abs=5e-4)
    cyl = fit_primitive(_lab("cylinder"))
    assert cyl is not None and cyl.kind == "cylinder"
    assert cyl.size == pytest.approx((0.035, 0.09), abs=5e-4)
    assert box.rms_m < 1e-3 and cyl.rms_m < 1e-3  # sampling: about 0.5 mm on exact meshes
    ball = fit_primitive(trimesh.creation.icosphere(subdivisions=3, radius=0.04))
    assert (
        ball is not None and ball.kind == "sphere" and ball.size[0] == pytest.approx(0.04, abs=5e-4)
    )


def test_scan_like_primitives_still_fit_and_the_u_block_does_not() -> None:
    box = fit_primitive(_scan_like(_lab("box"), 0.001))
    assert box is not None and box.kind == "box", box
    assert sorted(2 * np.asarray(box.size)) == pytest.approx([0.05, 0.05, 0.08], abs=0.003)
    cyl = fit_primitive(_scan_like(_lab("cylinder"), 0.001))
    assert cyl is not None and cyl.kind == "cylinder"
    assert cyl.size == pytest.approx((0.035, 0.09), abs=0.003)
    assert fit_primitive(_lab("u_block")) is None
    assert fit_primitive(_scan_like(_lab("u_block"), 0.001)) is None


def test_u_block_decomposition_keeps_the_gap(tmp_path: Path) -> None:
    u = _lab("u_block")
    dec = decompose(u, "u_block")
    assert 2 <= len(dec.hulls) <= 8 and dec.excess <= 0.05

    def inside(p: tuple[float, float, float]) -> bool:
        return any(
            np.all(ConvexHull(h.vertices).equations @ np.r_[p, 1.0] <= 1e-9) for h in dec.hulls
        )

    assert not inside((0.0, 0.01, 0.0))  # the gap of the U
    assert inside((0.0, -0.03, 0.0)) and inside((0.045, 0.02, 0.0))
    obj, _, notes = mesh_object("u_block", u, IDENTITY, tmp_path)
    assert obj.shape.kind == "mesh" and len(obj.shape.hulls) == len(dec.hulls)
    (note,) = [n for n in notes if dec.method in n]
    assert "closest is a box" in note and "mm RMS" in note and "over the 3 mm" in note, note


def test_mesh_object_becomes_a_primitive_with_its_fit_error(tmp_path: Path) -> None:
    obj, _, notes = mesh_object("can", _scan_like(_lab("cylinder"), 0.001), IDENTITY, tmp_path)
    assert obj.shape.kind == "cylinder" and obj.shape.hulls == ()
    assert obj.shape.size == pytest.approx((0.035, 0.09), abs=0.003)
    (note,) = [n for n in notes if "collides as a cylinder" in n]
    assert "mm RMS" in note
    rms_mm = float(note.split("surface fit error ")[1].split(" mm")[0])
    assert 0 < rms_mm <= PRIMITIVE_TOL_M * 1000
