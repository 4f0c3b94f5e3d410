"""Lab camera: intrinsics, pose convention, D435 depth noise, missing depth, table plane."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from devices.frames import RGBDFrame
from devices.lab.camera import LabCamera, d435_intrinsics
from devices.lab.config import LabError
from devices.lab.depth_noise import depth_sigma, shadow_mask
from devices.lab.scenes import SCENES
from devices.lab.sim import LabSim
from devices.lab.truth import truth_camera_pose
from devices.poses import invert, matrix_to_pose


def _down_camera_sim(height_m: float = 1.0) -> LabSim:
    """Objects-table scene, no objects, the fixed camera 1 m above the table looking down."""
    T = np.eye(4)
    T[:3, :3] = np.column_stack([(0, -1, 0), (-1, 0, 0), (0, 0, -1)])
    T[:3, 3] = (0.35, 0.0, height_m)
    cfg = SCENES["objects_table"].default_config()
    cam = dataclasses.replace(cfg.cameras[0], pose=tuple(matrix_to_pose(T)))
    return LabSim("objects_table", dataclasses.replace(cfg, objects=(), cameras=(cam,)))


def test_intrinsics_follow_d435() -> None:
    assert d435_intrinsics(640, 480).fx == pytest.approx(613.33, abs=0.01)
    assert d435_intrinsics(424, 240).fx == pytest.approx(306.67, abs=0.01)
    with pytest.raises(LabError, match="not supported"):
        d435_intrinsics(333, 222)


# 424x240 is 16:9 and wider: at 0.85 m it still sees only the table.
@pytest.mark.parametrize(("size", "dist"), [((640, 480), 1.0), ((424, 240), 0.85)])
def test_plane_depth_and_noise_match_model(size: tuple[int, int], dist: float) -> None:
    sim = _down_camera_sim(dist)
    with LabCamera(sim, "fixed", *size) as cam:
        f = cam.grab()
    assert isinstance(f, RGBDFrame) and f.depth.dtype == np.uint16 and f.depth_scale == 0.001
    assert f.color.shape == (size[1], size[0], 3) and f.T_world_camera is None
    d = f.depth_m[f.depth > 0]
    assert d.size > 0.99 * f.depth.size  # a flat plane: nothing missing
    assert np.median(d) == pytest.approx(dist, abs=0.002)
    sigma = depth_sigma(dist, cam.intrinsics.fx)
    assert np.std(d) == pytest.approx(sigma, rel=0.3)


def test_table_plane_from_oblique_camera_within_mm() -> None:
    """Every pixel that sees the table: rendered depth == ray/plane intersection with the
    TRUE camera pose and the reported intrinsics (checks axes, intrinsics, depth units)."""
    sim = LabSim("objects_table")
    with LabCamera(sim, "fixed", 640, 480) as cam:
        _, _, z = cam.render_true()
        noisy = cam.grab().depth_m
    K = cam.intrinsics
    T = truth_camera_pose(sim.config, "fixed")
    np.testing.assert_allclose(T, cam.truth_pose(), atol=1e-9)
    v, u = np.mgrid[0 : K.height, 0 : K.width]
    rays = np.stack([(u - K.cx) / K.fx, (v - K.cy) / K.fy, np.ones_like(u, float)], -1)
    dz = (rays @ T[:3, :3].T)[..., 2]  # world z change per unit depth
    z_plane = -T[2, 3] / dz  # depth where the ray meets z = 0
    hit_world = rays * z[..., None] @ T[:3, :3].T + T[:3, 3]
    on_table = (z > 0) & (np.abs(hit_world[..., 2]) < 1e-3) & (hit_world[..., 0] > 0.0)
    assert on_table.mean() > 0.5
    assert np.median(np.abs(z - z_plane)[on_table]) < 0.5e-3
    ok = on_table & (noisy > 0)
    assert abs(np.mean(noisy[ok] - z_plane[ok])) < 2e-3


def test_handheld_pose_override_is_rendered() -> None:
    sim = LabSim(
        "objects_table", dataclasses.replace(SCENES["objects_table"].default_config(), objects=())
    )
    T = np.eye(4)
    T[:3, :3] = np.column_stack([(0, -1, 0), (-1, 0, 0), (0, 0, -1)])  # looking down
    T[:3, 3] = (0.35, 0.1, 0.6)
    with LabCamera(sim, "fixed", 640, 480) as cam:
        cam.set_pose(T)
        _, _, z = cam.render_true()
        np.testing.assert_allclose(cam.truth_pose(), T, atol=1e-12)
        cam.set_pose(None)
        cam.render_true()
        np.testing.assert_allclose(
            cam.truth_pose(), truth_camera_pose(sim.config, "fixed"), atol=1e-12
        )
    assert np.abs(z - 0.6).max() < 1e-4


def test_missing_depth_at_edges_and_shadows_only() -> None:
    sim = LabSim("objects_table")
    with LabCamera(sim, "fixed", 640, 480) as cam:
        _, _, z = cam.render_true()
        f = cam.grab()
    missing = (f.depth == 0) & (z > 0)
    assert 0.002 < missing.mean() < 0.05  # some, around objects only
    sh = shadow_mask(z, cam.intrinsics.fx, 0.05)
    assert sh.sum() > 100 and np.all(f.depth[sh] == 0)


def test_shadow_mask_on_a_step() -> None:
    z = np.full((1, 100), 1.0, np.float32)
    z[0, 50:60] = 0.5  # a near box
    m = shadow_mask(z, 600.0, 0.05)
    # second view shifts near pixels by 60 px and far ones by 30: 30 far pixels hidden
    assert m[0, 21:50].all() and not m[0, :20].any() and not m[0, 50:].any()


def test_wrist_camera_follows_kinematics() -> None:
    sim = LabSim("panda_table")
    q = np.array(sim.config.initial_joint_pos) + 0.1
    sim.write_command("position", q)
    sim.run_for(1.0)
    with LabCamera(sim, "wrist", 424, 240) as cam:
        f = cam.grab()
    assert f.T_world_camera is None
    T = truth_camera_pose(sim.config, "wrist", sim.truth_joint_pos())
    np.testing.assert_allclose(cam.truth_pose(), T, atol=1e-9)
    # the hand-eye truth differs from the nominal CAD guess by millimetres, not centimetres
    c = sim.config.camera("wrist")
    from devices.poses import pose_to_matrix

    dT = invert(pose_to_matrix(c.nominal_pose)) @ pose_to_matrix(c.pose)
    assert 1e-3 < np.linalg.norm(dT[:3, 3]) < 1e-2
    assert (f.depth > 0).mean() > 0.5
