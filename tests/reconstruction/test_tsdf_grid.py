"""TSDF block grid aligned to the table (fewer blocks, same geometry) and workspace crop."""

from __future__ import annotations

import numpy as np
import pytest
import trimesh
from scipy.spatial import cKDTree

from reconstruction.tsdf import TSDFIntegrator, TSDFSettings
from tests.reconstruction.synth import orbit, render, scene


@pytest.fixture(scope="module")
def frames():  # type: ignore[no-untyped-def]
    sc = scene()
    return [render(sc, T, noise_m=0.001, index=i) for i, T in enumerate(orbit(6, span=2.0))]


def _fuse(frames, settings: TSDFSettings) -> TSDFIntegrator:  # type: ignore[no-untyped-def]
    ig = TSDFIntegrator(settings)
    for f in frames:
        assert ig.integrate(f, f.T_world_camera)
    return ig


def test_grid_shift_puts_the_table_mid_block() -> None:
    s = TSDFSettings(voxel_size=0.004, block_resolution=8, table_z=0.0)
    assert s.grid_shift == pytest.approx(0.016)
    assert TSDFSettings(table_z=0.02).grid_shift == pytest.approx(0.028)  # (16 - 20) mod 32
    assert TSDFSettings(table_z=None).grid_shift == 0.0


def test_aligned_grid_touches_fewer_blocks_same_surface(frames) -> None:  # type: ignore[no-untyped-def]
    plain = _fuse(frames, TSDFSettings(table_z=None))
    aligned = _fuse(frames, TSDFSettings(table_z=0.0))
    n_plain, n_aligned = plain.vbg.hashmap().size(), aligned.vbg.hashmap().size()
    assert n_aligned < 0.85 * n_plain, (n_plain, n_aligned)
    a, b = plain.mesh(), aligned.mesh()
    truth = trimesh.util.concatenate(list(scene().values()))
    tree = cKDTree(truth.sample(200000, seed=0))
    err_plain, err_aligned = (float(np.mean(tree.query(m.vertices)[0])) for m in (a, b))
    assert err_aligned < 0.002 and err_aligned < err_plain + 0.0002, (err_plain, err_aligned)
    assert len(b.faces) > 0.8 * len(a.faces)
    assert abs(np.median(b.vertices[:, 2][np.abs(b.vertices[:, 2]) < 0.005])) < 0.001
    p, _ = aligned.points()
    assert abs(np.median(p[:, 2][np.abs(p[:, 2]) < 0.005])) < 0.001  # previews shifted back


def test_workspace_drops_blocks_outside(frames) -> None:  # type: ignore[no-untyped-def]
    box = ((0.3, -0.25, -0.05), (0.75, 0.25, 0.3))
    ig = _fuse(frames, TSDFSettings(workspace=box))
    m = ig.mesh()
    lo, hi = m.bounds
    bs = ig.settings.block_size
    assert (lo[:2] > np.array(box[0][:2]) - bs).all() and (hi[:2] < np.array(box[1][:2]) + bs).all()
    full = _fuse(frames, TSDFSettings())
    assert ig.vbg.hashmap().size() < 0.7 * full.vbg.hashmap().size()
    # objects inside the box are kept whole
    assert hi[2] == pytest.approx(0.12, abs=0.006)
    f = frames[0]
    far = TSDFIntegrator(TSDFSettings(workspace=((5.0, 5.0, 5.0), (6.0, 6.0, 6.0))))
    assert not far.integrate(f, f.T_world_camera) and far.empty_frames == [f.index]
