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
from twins.primitives import PRIMITIVE_TOL_M, closest_primitive, fit_primitive
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
    assert (
        "closest is a box" in note and "mm RMS" in note and "within the 3.0 mm tolerance" in note
    ), note


def test_mesh_object_becomes_a_primitive_with_its_fit_error(tmp_path: Path) -> None:
    obj, _, notes = mesh_object("can", _scan_like(_lab("cylinder"), 0.001), IDENTITY, tmp_path)
    assert obj.shape.kind == "cylinder" and obj.shape.hulls == ()
    assert obj.shape.size == pytest.approx((0.035, 0.09), abs=0.003)
    (note,) = [n for n in notes if "collides as a cylinder" in n]
    assert "mm RMS" in note
    rms_mm = float(note.split("surface fit error ")[1].split(" mm")[0])
    assert 0 < rms_mm <= PRIMITIVE_TOL_M * 1000


def _on_table_with_skirt(mesh: trimesh.Trimesh, seed: int = 0) -> trimesh.Trimesh:
    """A scanned object as the scan closes it (reconstruction/objects.py): standing on the
    plane z = 0, surface noise, and a lower skirt flaring 4 mm outwards over its lowest 12 mm
    (the open edge snapped onto the table and filled)."""
    m = mesh.copy()
    m.apply_translation([0, 0, -m.bounds[0, 2]])
    m = _scan_like(m, 0.0007, seed)
    v = m.vertices.copy()
    xy = v[:, :2] - v[:, :2].mean(axis=0)
    flare = 0.004 * np.clip((0.012 - v[:, 2]) / 0.012, 0, 1) * (v[:, 2] > 1e-3)
    v[:, :2] += xy / np.maximum(np.linalg.norm(xy, axis=1, keepdims=True), 1e-9) * flare[:, None]
    v[:, 2] = np.maximum(v[:, 2], 0.0)
    return trimesh.Trimesh(v, m.faces)


def test_on_a_known_table_the_observed_surface_gives_the_true_size(tmp_path: Path) -> None:
    """The closed, flared lower side widens a whole-mesh fit by millimetres; fitted above the
    skirt and extruded down to the table the box and can come out at their true sizes."""
    table = (0.0, 0.0, 1.0, 0.0)
    box_mesh = _on_table_with_skirt(_lab("box"))
    whole = fit_primitive(box_mesh)
    assert whole is not None and whole.kind == "box" and not whole.on_support
    assert max(2 * np.asarray(whole.size)) > 0.082  # the skirt's flare, measured: 83.5 mm
    box = fit_primitive(box_mesh, support=table)
    assert box is not None and box.kind == "box" and box.on_support
    assert sorted(2 * np.asarray(box.size)) == pytest.approx([0.05, 0.05, 0.08], abs=0.001)
    assert box.pose[2] == pytest.approx(0.025, abs=0.001)  # bottom face on the table
    assert box.rms_m < whole.rms_m
    cyl = fit_primitive(_on_table_with_skirt(_lab("cylinder")), support=table)
    assert cyl is not None and cyl.kind == "cylinder" and cyl.on_support
    assert cyl.size == pytest.approx((0.035, 0.09), abs=0.001)
    # the U-block never becomes a box, however its table is known
    u = _on_table_with_skirt(_lab("u_block"))
    assert fit_primitive(u, support=table) is None
    near = closest_primitive(u, support=table)
    assert near is not None and near.rms_m > 2 * PRIMITIVE_TOL_M
    # a table the mesh does not rest on (5 cm below it) is ignored
    lifted = fit_primitive(box_mesh, support=(0.0, 0.0, 1.0, 0.05))
    assert lifted is not None and not lifted.on_support
    # the twin's notes say how the primitive was fitted and with what error
    obj, _, notes = mesh_object("box", box_mesh, IDENTITY, tmp_path, support=table)
    assert obj.shape.kind == "box"
    (note,) = [n for n in notes if "collides as a box" in n]
    assert "extruded down" in note and "mm RMS" in note, note


def test_support_plane_in_an_objects_frame() -> None:
    """The scan's table (base frame) seen from an object's frame: a yawed object standing at
    z = 0.03 above a table at z = 0.01 has the plane z = -0.02 below its origin."""
    from twins.from_scan import support_in_object

    yaw = np.radians(30)
    pose = (0.5, -0.2, 0.03, 0.0, 0.0, np.sin(yaw / 2), np.cos(yaw / 2))
    a, b, c, d = support_in_object((0.0, 0.0, 1.0, -0.01), pose)  # type: ignore[misc]
    assert (a, b, c) == pytest.approx((0, 0, 1), abs=1e-12) and d == pytest.approx(0.02)
    tilted = (0.5, -0.2, 0.03, np.sin(np.pi / 4), 0.0, 0.0, np.cos(np.pi / 4))  # 90 deg about x
    a, b, c, d = support_in_object((0.0, 0.0, 1.0, -0.01), tilted)  # type: ignore[misc]
    assert (a, b, c) == pytest.approx((0, 1, 0), abs=1e-12) and d == pytest.approx(0.02)
    assert support_in_object(None, pose) is None


def test_a_side_the_scan_never_saw_is_not_judged() -> None:
    """A scanned box whose +y side the camera never saw: the scan's hole filling closed it
    with a surface caving up to 16 mm in (measured on a lab scan: 10-17 mm), so the median of
    that side's points lies 8 mm in (a box from it came out 42 mm wide, not 50). Without the
    observed points that side is still caught, its points being scattered; given them, the
    closed side is left out, and with it the only evidence of the box's width: no box either
    way. Seen all round, the box comes out at its true size; the U-block, fully observed,
    still does not become one."""
    table = (0.0, 0.0, 1.0, 0.0)
    box = _on_table_with_skirt(_lab("box"))
    v = box.vertices.copy()
    side = v[:, 1] > 0.02  # the +y face (half width 25 mm): a dent, 16 mm deep mid-face
    edge = np.minimum.reduce([v[:, 0] + 0.04, 0.04 - v[:, 0], v[:, 2], 0.05 - v[:, 2]])
    depth = 0.016 * np.clip((v[:, 1] - 0.02) / 0.005, 0, 1) * np.clip(edge / 0.025, 0, 1)
    v[side, 1] -= depth[side]
    caved = trimesh.Trimesh(v, box.faces)
    seen, _ = trimesh.sample.sample_surface(box, 20000, seed=1)
    seen = seen[(seen[:, 1] < 0.0245) & (seen[:, 2] > 1e-3)]  # neither the side nor the bottom
    blind = closest_primitive(caved, support=table)
    assert blind is not None and blind.kind != "box" and blind.rms_m > 2 * PRIMITIVE_TOL_M
    assert fit_primitive(caved, support=table, observed=seen) is None  # nothing sizes +y
    near = closest_primitive(caved, support=table, observed=seen)
    assert near is not None and near.kind != "box" and 0.6 < near.seen < 0.9
    # seen all round but for the bottom, the box comes out at its true size
    around, _ = trimesh.sample.sample_surface(box, 20000, seed=1)
    fit = fit_primitive(box, support=table, observed=around[around[:, 2] > 1e-3])
    assert fit is not None and fit.kind == "box" and fit.on_support, fit
    assert sorted(2 * np.asarray(fit.size)) == pytest.approx([0.05, 0.05, 0.08], abs=0.0015)
    assert fit.seen < 0.95 and "not seen" in fit.describe()
    u = _on_table_with_skirt(_lab("u_block"))
    u_seen, _ = trimesh.sample.sample_surface(u, 20000, seed=1)
    assert fit_primitive(u, support=table, observed=u_seen[u_seen[:, 2] > 1e-3]) is None


def test_a_side_seen_at_grazing_angles_does_not_size_the_box() -> None:
    """A lab scan's side seen only at grazing angles came out scattered and bulging outwards
    (a box 57.8 x 85.6 mm, truth 50 x 80; on two others 3.2 and 5.7 mm too narrow, the top's
    edge bulging with the side on one of them). Nothing places such a side: whether its
    points scatter (a bow up to 6 mm, jittered) or sit tight but offset (4 mm out below the
    rim, off the top's edge), no primitive is made (the twin decomposes the mesh), where a
    median of the side's points had made the box 4-5 mm too long. Nor when every wall was
    fused 4 mm out (a lab scan: all four 3.4 mm, the box 56.8 x 84.8 mm at 2.1 mm Chamfer):
    they stand too far outside the top's edge."""
    table = (0.0, 0.0, 1.0, 0.0)
    rng = np.random.default_rng(3)
    for how in ("scattered bow", "offset slab", "all walls out"):
        box = _on_table_with_skirt(_lab("box"))
        v = box.vertices.copy()
        side = v[:, 0] < -0.038  # the -x face (80 x 50 x 50 mm box: at x = -40 mm)
        if how == "scattered bow":
            bow = np.sin(np.pi * np.clip(v[:, 2] / 0.05, 0, 1)) * np.sin(
                np.pi * np.clip((v[:, 1] + 0.025) / 0.05, 0, 1)
            )
            out = 0.006 * bow + rng.uniform(0, 0.003, len(v))
        else:
            out = np.full(len(v), 0.004) * ((v[:, 2] > 0.006) & (v[:, 2] < 0.044))
        if how == "all walls out":  # every wall fused 4 mm out below the rim, the top not
            walls = (v[:, 2] > 0.006) & (v[:, 2] < 0.044)
            v[walls, :2] += np.sign(v[walls, :2]) * (np.abs(v[walls, :2]) > [0.038, 0.023]) * 0.004
            side = np.zeros(len(v), bool)
        v[side, 0] -= out[side]
        bulged = trimesh.Trimesh(v, box.faces)
        assert fit_primitive(bulged, support=table) is None, how
        near = closest_primitive(bulged, support=table)
        assert near is not None and near.kind != "box" and near.rms_m > PRIMITIVE_TOL_M, how


def test_a_can_lying_on_the_table_is_still_a_cylinder() -> None:
    """Its caps and flanks face four ways like a box's sides, but its flanks stand ~20 mm
    outside its narrow top: not a box with a side out of place, so the whole-mesh cylinder
    (axis along the table) is kept; a box on its side stays an upright box."""
    table = (0.0, 0.0, 1.0, 0.0)
    turn = trimesh.transformations.rotation_matrix(np.pi / 2, [1, 0, 0])
    can = _lab("cylinder").copy()
    can.apply_transform(turn)
    fit = fit_primitive(_on_table_with_skirt(can), support=table)
    assert fit is not None and fit.kind == "cylinder" and not fit.on_support, fit
    assert fit.size == pytest.approx((0.035, 0.09), abs=0.003)
    box = _lab("box").copy()
    box.apply_transform(turn)
    fit = fit_primitive(_on_table_with_skirt(box), support=table)
    assert fit is not None and fit.kind == "box" and fit.on_support, fit
    assert sorted(2 * np.asarray(fit.size)) == pytest.approx([0.05, 0.05, 0.08], abs=0.002)
