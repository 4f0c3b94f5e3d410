"""Scan page: a hand-held recording scanned with the "Loop closure" box ticked goes through
the keyframe pose graph (the lab camera walks over the table and back, no poses recorded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.controller import AppController
from devices.cameras.software import DB3Writer
from reconstruction.metrics import absolute_trajectory_error

# Run on its own (with the wall-clock tests): beside another xdist worker on 2 cores its loop
# registrations came out different (Open3D's threaded ICP is not repeatable, docs/TRAPS.md) and
# the path's ATE was 3.7 and 9.0 cm in two runs; alone it holds 1.2 cm (5 of 5).
pytestmark = [pytest.mark.gui, pytest.mark.slow, pytest.mark.realtime]


def test_loop_closure_box_reaches_the_handheld_scan(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from devices.lab.camera import LabCamera
    from devices.lab.handheld import hand_path, handheld_frames
    from devices.lab.sim import LabSim
    from widgets.scan_page import ScanPage

    _, T = hand_path(duration_s=4.0, fps=3.0, look_away_deg=0.0)
    T = np.concatenate([T, T[::-1][1:]])
    cam = LabCamera(LabSim("panda_table"), "fixed", 424, 240)
    rec = tmp_path / "handheld.db3"
    pairs = list(handheld_frames(cam, np.arange(len(T)) / 3.0, T))
    with DB3Writer(rec) as w:
        for f, _ in pairs:
            w.write(f)
    c = AppController()
    c.new_project(tmp_path / "proj")
    page = ScanPage(c)
    qtbot.addWidget(page)
    page.depth_range.setCurrentIndex(1)  # tabletop 0.3-1.4 m
    assert tuple(page.depth_range.currentData()) == (0.3, 1.4)
    page.loop_closure.setChecked(True)
    assert page.start_scan("file", rec)  # runs synchronously without a window
    res = page.result
    assert res is not None and res.camera_path is not None
    assert res.camera_path.tracked.all()
    pg = res.quality["pose_graph"]
    assert pg["loop_edges"] > 0, pg  # off (the default), no edges are registered
    # the tracked path is already within a few mm: the graph's solution is applied only when
    # the loops say it is off (here they close within ~6 mm of it, inside their noise) and the
    # keyframes agree clearly better; applied anyway (before those checks) it made the path
    # 7-8 mm off, once 9 cm on a CI machine. A rejection is said in the warnings; either way
    # the path stays within 2 cm of the lab's truth
    if pg["optimised"]:
        assert pg["max_correction_m"] < 0.03, pg
    else:
        assert any(w.startswith("loop closure not applied") for w in res.warnings)
    path = res.camera_path
    # SDK 2.59 playback can lose the first frame(s) on a loaded machine: compare by frame number
    assert len(path.index) >= len(pairs) - 3, path.index
    truth = np.stack([pairs[int(i)][1] for i in path.index])
    ate, _ = absolute_trajectory_error(path.poses, truth)
    # 4.0-4.4 mm in 13 of 13 runs on the development machine, 12.2 mm once on a fresh CI
    # machine (its thread count differs: Open3D's ICP is not repeatable and hand-held tracking
    # amplifies that, docs/TRAPS.md); the failures this guards against were 37-90 mm off (a
    # graph solution applied when the loops did not call for it; registrations raced)
    assert ate < 0.02, (ate, pg, res.warnings)
