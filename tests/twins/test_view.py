"""What a 3D view gets from a twin: every object drawn, and an unreadable mesh file named in
a warning with the object drawn from its collision shape instead (never silently dropped)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from twins.builder import TwinWorld
from twins.spec import TwinSpec
from twins.view import drawables, poses


def test_every_object_and_link_is_drawn(demo_twin: TwinSpec) -> None:
    world = TwinWorld(demo_twin)
    try:
        ds = drawables(world)
        ps = poses(world)
    finally:
        world.close()
    names = {d.name for d in ds}
    for o in demo_twin.objects:
        assert f"{o.name}/visual" in names
    assert all(d.body in ps for d in ds)
    assert sum(n.startswith("robot/") for n in names) >= 8


def test_corrupt_visual_mesh_is_named_and_drawn_from_hulls(
    demo_twin: TwinSpec, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "twin"
    shutil.copytree(demo_twin.base_dir, folder)
    spec = TwinSpec.load(folder)
    u = spec.object("u_block")
    assert u.shape.kind == "mesh" and u.shape.mesh
    bad = spec.resolve(u.shape.mesh)
    bad.write_bytes(b"solid garbage\x00\xff not a mesh")
    world = TwinWorld(spec)
    try:
        with caplog.at_level(logging.WARNING, logger="twins.view"):
            ds = {d.name: d for d in drawables(world)}
    finally:
        world.close()
    assert "u_block/visual" in ds  # drawn from its convex hulls
    hull_faces = sum(len(d.faces) for n, d in ds.items() if n.startswith("u_block/hull"))
    assert len(ds["u_block/visual"].faces) == hull_faces
    text = caplog.text
    assert str(bad) in text and "u_block" in text
    extent = np.ptp(ds["u_block/visual"].vertices, axis=0)
    assert np.all(extent > 0.02)  # a real shape, not a degenerate stand-in


def test_display_meshes_keep_shape_within_budget(demo_twin: TwinSpec) -> None:
    from reconstruction.display import display_mesh
    from twins.view import DISPLAY_MAX_FACES

    world = TwinWorld(demo_twin)
    try:
        ds = [d for d in drawables(world) if d.name.startswith("robot/")]
    finally:
        world.close()
    assert ds and all(len(d.faces) <= DISPLAY_MAX_FACES for d in ds)
    # a detailed mesh keeps its size and place to within a few mm
    import trimesh

    sphere = trimesh.creation.icosphere(5, radius=0.06)  # 20 k triangles
    small = display_mesh(sphere, 1500)
    assert len(small.faces) <= 1500
    assert np.allclose(small.bounds, sphere.bounds, atol=0.004)
    r = np.linalg.norm(small.vertices, axis=1)
    assert np.all(np.abs(r - 0.06) < 0.004)
    # winding kept: normals still point outwards
    centers = small.triangles_center
    assert np.mean(np.sum(small.face_normals * centers, axis=1) > 0) > 0.95


def test_meshes_read_by_the_worker_process_are_the_files_meshes(tmp_path: Path) -> None:
    """`preload` reads mesh files in a worker process (trimesh holds the GIL while it parses):
    what it keeps is each file's mesh, and a broken file is kept as the reason."""
    import trimesh

    from twins import view

    good = tmp_path / "box.obj"
    trimesh.creation.box((0.1, 0.2, 0.3)).export(good)
    bad = tmp_path / "bad.obj"
    bad.write_bytes(b"v 1 2\nf 9 9 9\x00\xff")
    view.preload([str(good), str(bad), str(good)])
    v, f = view._RAW[str(good)]  # type: ignore[misc]
    here = trimesh.load(good, force="mesh", process=False)
    assert np.allclose(v, here.vertices) and np.array_equal(f, here.faces)
    assert isinstance(view._RAW[str(bad)], str)
    m = view._load(str(good), (2.0, 1.0, 1.0))
    assert m is not None and np.allclose(m.extents, (0.2, 0.2, 0.3))
