"""Handheld tracking on the lab's hand-like camera path (tremor, uneven speed): every frame
tracked and the path within a centimetre of the lab's truth; a frame of noise is skipped
and tracking resumes."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

pytestmark = pytest.mark.slow


def test_lab_hand_path_is_tracked_against_truth() -> None:
    from devices.lab.camera import LabCamera
    from devices.lab.handheld import hand_path, handheld_frames
    from devices.lab.sim import LabSim
    from devices.poses import invert
    from reconstruction.metrics import absolute_trajectory_error
    from reconstruction.pipeline import ScanSession, SegmentSettings
    from reconstruction.tsdf import TSDFSettings

    t, T = hand_path(duration_s=1.5, fps=30.0, seed=3)
    cam = LabCamera(LabSim("panda_table"), "fixed", 424, 240)
    pairs = list(handheld_frames(cam, t, T))
    frames = [f for f, _ in pairs]
    truth = np.stack([x for _, x in pairs])
    rng = np.random.default_rng(0)
    f = frames[20]
    junk = replace(
        f,
        depth=rng.integers(300, 1300, f.depth.shape).astype(np.uint16),
        index=1000,
        timestamp=f.timestamp - 0.01,
    )
    st = TSDFSettings(voxel_size=0.005, depth_min=0.3, depth_max=1.4, table_z=None)
    sess = ScanSession(st, track=True)
    for fr in frames[:20] + [junk] + frames[20:]:
        sess.add(fr, None)
    assert list(sess.skipped) == [1000] and "tracking failed" in sess.skipped[1000]
    res = sess.finish(SegmentSettings(up=None))
    path = res.camera_path
    assert path is not None and int(path.tracked.sum()) == len(frames)
    est = path.poses[path.tracked]
    ate, _ = absolute_trajectory_error(est, truth)
    assert ate < 0.01  # measured 2-3 mm
    # the first camera is the world: the table comes out as the support plane, facing up
    assert res.table_plane is not None
    up_world = invert(truth[0])[:3, :3] @ np.array([0.0, 0.0, 1.0])
    assert float(np.asarray(res.table_plane[:3]) @ up_world) > 0.95
    assert len(res.scene_mesh.faces) > 10000
