"""Loop closure on the lab: the free camera walks an arc over the table and back, so the way
back sees what the way out saw. Keyframe poses carrying a growing drift (8.8 cm, 4 deg at the
end) are pulled back to the lab's truth by the pose graph; exact poses, and a path tracked
within a few mm, are left alone."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from devices.lab.camera import LabCamera
from devices.lab.handheld import hand_path, handheld_frames
from devices.lab.sim import LabSim
from devices.poses import invert
from reconstruction import pose_graph
from reconstruction.metrics import absolute_trajectory_error
from reconstruction.pipeline import ScanSession, SegmentSettings
from reconstruction.pose_graph import Keyframe
from reconstruction.tracking import FrameTrack, HandheldTracker, TrackingSettings
from reconstruction.tsdf import TSDFSettings

FPS = 3.0  # keyframes on the way out and back: 12 + 11


def _drift(a: float) -> np.ndarray:
    D = np.eye(4)
    D[:3, :3] = Rotation.from_euler("z", 4.0 * a, degrees=True).as_matrix()
    D[:3, 3] = a * np.array([0.06, -0.04, 0.05])
    return D


def _errors(tracks: list[FrameTrack], G: np.ndarray) -> list[float]:
    out = []
    for f in tracks:
        assert f.pose is not None
        out.append(float(np.linalg.norm(f.pose[:3, 3] - G[f.index][:3, 3])))
    return out


# Run alone (with the wall-clock tests), as tests/widgets/test_scan_loop_closure.py: beside
# another xdist worker on 2 cores the tracked path came out 24.9 mm off once (Open3D's ICP is
# not repeatable, docs/TRAPS.md, and its threads race differently under load)
@pytest.mark.slow
@pytest.mark.realtime
def test_pose_graph_pulls_a_drifted_path_back_and_leaves_an_exact_one() -> None:
    t, T = hand_path(duration_s=4.0, fps=FPS, look_away_deg=0.0)
    T = np.concatenate([T, T[::-1][1:]])
    cam = LabCamera(LabSim("panda_table"), "fixed", 424, 240)
    pairs = list(handheld_frames(cam, np.arange(len(T)) / FPS, T))
    G = np.stack([x for _, x in pairs])
    G = np.stack([invert(G[0]) @ g for g in G])  # world = first camera, as tracking has it
    s = TrackingSettings(voxel=0.005, depth_min=0.3, depth_max=1.4, loop_closure=True)
    tr = HandheldTracker(s)
    views = [tr.view_of_frame(f) for f, _ in pairs]
    n = len(views)
    for amount in (1.0, 0.0):
        keyframes: list[Keyframe] = []
        tracks: list[FrameTrack] = []
        edges: list[pose_graph.LoopEdge] = []
        for i, view in enumerate(views):
            P = G[i] @ _drift(amount * i / (n - 1))
            keyframes.append(Keyframe(i, i, P.copy(), view))
            tracks.append(FrameTrack(i, i / FPS, P.copy(), 1.0, "model", "", i, np.eye(4)))
            if i > 2:
                edges += pose_graph.loop_edges_for(s, keyframes, keyframes[-1])
        assert any(a - b >= 10 for a, b, _, _ in edges)  # the way back closes loops
        before = max(_errors(tracks, G))
        out = pose_graph.optimise(s, keyframes, tracks, edges)
        after = _errors(tracks, G)
        if amount:
            assert before > 0.08 and out["optimised"], out
            assert max(after) < 0.035 and np.mean(after) < 0.02, (max(after), np.mean(after))
        else:
            assert max(after) < 0.005, (out, max(after))
    # the same frames tracked with loop closure on: the tracked path is already within a few
    # mm, which loop edges between frames 10 deg apart (~1 cm noisy) cannot improve: the
    # loops close within their noise of it, so the path stays as tracked
    st = TSDFSettings(voxel_size=0.005, depth_min=0.3, depth_max=1.4, table_z=None)
    sess = ScanSession(st, track=True, loop_closure=True)
    for f, _ in pairs:
        sess.add(f, None)
    res = sess.finish(SegmentSettings(up=None))
    pg = res.quality["pose_graph"]
    assert pg["loop_edges"] > 0 and not pg["optimised"] and "no drift to correct" in pg["rejected"]
    assert pg["loop_offset_m"] < 0.01, pg
    assert any(w.startswith("loop closure not applied") for w in res.warnings)
    path = res.camera_path
    assert path is not None and path.tracked.all()
    ate, _ = absolute_trajectory_error(path.poses, G)
    assert ate < 0.007, ate
