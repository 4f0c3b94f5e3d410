"""A posed scan fused in a worker process (reconstruction/scan_process.py) gives the scan an
in-process session gives; failures in the worker, and its death, come back as messages."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from scipy.spatial import cKDTree

from devices.frames import RGBDFrame
from reconstruction.errors import ReconstructionError
from reconstruction.metrics import chamfer_fscore, match_objects
from reconstruction.pipeline import PREVIEW_POINTS, ScanSession, SegmentSettings
from reconstruction.scan_process import ScanProcess
from tests.reconstruction.synth import orbit, render, scene


@pytest.fixture(scope="module")
def frames() -> list[RGBDFrame]:
    sc = scene()
    return [render(sc, T, noise_m=0.001, index=i) for i, T in enumerate(orbit(16, span=3.0))]


def test_the_worker_scans_what_an_in_process_session_scans(frames: list[RGBDFrame]) -> None:
    here = ScanSession()
    steps: list[tuple[float, str]] = []
    with ScanProcess() as there:
        for f in frames:
            assert here.add(f, f.T_world_camera) == there.add(f, f.T_world_camera)
        assert there.frames_integrated == here.frames_integrated == len(frames)
        assert np.array_equal(there.last_pose, frames[-1].T_world_camera)
        pv, pv_here = there.preview(), here.preview()
        assert 0 < len(pv.points) <= PREVIEW_POINTS
        # as many points (Open3D's point extraction places them differently on each call,
        # also within one process; the meshes below are the same to the last vertex)
        assert len(pv.points) == len(pv_here.points)
        plane, clusters = there.table_objects(seed=0)
        assert abs(plane.normal[2]) > 0.999 and abs(plane.d) < 0.002
        assert len(clusters) == 2
        res = there.finish(SegmentSettings(), progress=lambda f, t: steps.append((f, t)))
    mine = here.finish(SegmentSettings())
    assert "clustering objects" in [t for _, t in steps]  # the worker's progress came back
    assert len(res.scene_mesh.faces) == len(mine.scene_mesh.faces) > 10000
    gap, _ = cKDTree(mine.scene_mesh.vertices).query(res.scene_mesh.vertices)
    assert gap.max() < 1e-9
    assert np.allclose(res.table_plane, mine.table_plane, atol=1e-4)
    truth = {k: v for k, v in scene().items() if k != "table"}
    found = [o.mesh_in_base() for o in res.objects]
    pairs = match_objects(found, truth)
    assert len(pairs) == 2
    for i, name in pairs:
        ch, fs = chamfer_fscore(found[i], truth[name])
        assert ch < 0.002 and fs > 0.95, (name, ch, fs)


def test_a_failure_in_the_worker_comes_back_with_its_message(frames: list[RGBDFrame]) -> None:
    bad = np.full((4, 4), np.nan)
    with ScanProcess() as there:
        with pytest.raises(ReconstructionError, match="frame 0: camera pose has NaN/inf"):
            there.add(frames[0], bad)
        assert there.add(frames[1], frames[1].T_world_camera)  # the worker is still there
        zero = RGBDFrame(frames[2].color, np.zeros_like(frames[2].depth), 0.001,
                         frames[2].intrinsics, 0.0, 7)  # fmt: skip
        assert not there.add(zero, frames[2].T_world_camera)
        assert there.skipped == {7: "all-zero depth"}


def test_a_worker_that_dies_ends_the_scan_with_a_message(frames: list[RGBDFrame]) -> None:
    there = ScanProcess()
    assert there.add(frames[0], frames[0].T_world_camera)
    assert there._proc.pid is not None
    os.kill(there._proc.pid, signal.SIGKILL)
    with pytest.raises(ReconstructionError, match="killed by signal 9 during add"):
        there.add(frames[1], frames[1].T_world_camera)
    there.close()  # closing a dead worker is quiet


def test_the_drawn_copy_of_a_scanned_scene_keeps_its_shape_in_fewer_triangles() -> None:
    """A scene of 200k+ triangles is drawn from a copy of at most ~DISPLAY_FACES that stays
    within two grid cells of the surface; a small mesh is drawn as it is."""
    import trimesh

    from reconstruction.scan_result import DISPLAY_FACES, display_copy

    sc = scene()
    full = trimesh.util.concatenate([m.subdivide().subdivide() for m in sc.values()])
    full = trimesh.util.concatenate([full.subdivide_to_size(0.004)])
    assert len(full.faces) > 200_000
    d = display_copy(full)
    assert 0.5 * DISPLAY_FACES < len(d.faces) <= DISPLAY_FACES
    cell = np.sqrt(2 * full.area / DISPLAY_FACES)
    # every drawn vertex near the true surface, and the true surface covered by the drawn one
    near, _ = cKDTree(full.vertices).query(d.vertices)
    assert near.max() < 2 * cell, (near.max(), cell)
    cover, _ = cKDTree(d.vertices).query(full.sample(20_000, seed=0))
    assert np.percentile(cover, 99) < 2 * cell
    assert abs(d.area - full.area) < 0.15 * full.area
    small = sc["table"]
    assert display_copy(small) is small
