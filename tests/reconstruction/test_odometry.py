"""Handheld scans: RGB-D odometry tracks a smooth camera path; hard frames are skipped."""

from __future__ import annotations

import numpy as np
import pytest

from devices.frames import RGBDFrame
from devices.poses import invert, rotation_angle_deg
from reconstruction.pipeline import ScanSession, SegmentSettings
from tests.reconstruction.synth import orbit, render, scene


@pytest.mark.slow
def test_odometry_tracks_and_skips_bad_frames() -> None:
    sc = scene()
    poses = orbit(8, span=0.35)  # ~6 deg and ~6 cm between frames
    frames = [render(sc, T, noise_m=0.0005, index=i) for i, T in enumerate(poses)]
    rng = np.random.default_rng(0)
    f = frames[4]
    junk = RGBDFrame(
        rng.integers(0, 255, f.color.shape).astype(np.uint8),
        rng.integers(200, 1000, f.depth.shape).astype(np.uint16),
        0.001,
        f.intrinsics,
        f.timestamp,
        100,
    )
    sess = ScanSession(track=True, fuse_max_hz=0)  # fuse every tracked frame (no rate cap)
    for fr in frames[:4] + [junk] + frames[4:]:
        sess.add(
            RGBDFrame(fr.color, fr.depth, fr.depth_scale, fr.intrinsics, fr.timestamp, fr.index),
            None,
        )  # no pose: odometry
    sess.flush()  # the last tracked frame is fused while the next would be registered
    assert list(sess.skipped) == [100] and "tracking failed" in sess.skipped[100]
    assert sess.tsdf.frames_integrated == 8
    T_first_last = invert(poses[0]) @ poses[-1]
    est = sess.last_pose
    path = sum(np.linalg.norm(poses[i + 1][:3, 3] - poses[i][:3, 3]) for i in range(7))
    # frame-to-frame odometry on flat-coloured surfaces drifts: < 10 % of the path
    assert np.linalg.norm(est[:3, 3] - T_first_last[:3, 3]) < 0.1 * path
    assert rotation_angle_deg(est, T_first_last) < 0.1 * rotation_angle_deg(poses[-1], poses[0])
    res = sess.finish(SegmentSettings(up=None))
    assert res.table_plane is not None and len(res.objects) >= 1
    assert any("1 frames skipped" in w for w in res.warnings)
