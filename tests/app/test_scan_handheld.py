"""The Scan page's recording source and the CLI share one handheld path
(app/workflows/scan_handheld.py): a recording without camera poses — a hand-held lab camera
written through the SDK's recorder — is tracked (depth range from the data), its previews
stream, its camera path matches the lab's truth, and a recording with no usable depth is an
error instead of an empty scan."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

pytestmark = pytest.mark.slow


def _record(path: Path, frames: list) -> None:
    from devices.cameras.software import SoftwareCamera

    cam = SoftwareCamera(frames[0].intrinsics, frames[0].depth_scale, record_path=path)
    try:
        for f in frames:
            cam.push(replace(f, T_world_camera=None))  # handheld: no poses recorded
    finally:
        cam.close()


def _lab_hand_frames(n_s: float = 2.0) -> tuple[list, np.ndarray]:
    from devices.lab.camera import LabCamera
    from devices.lab.handheld import hand_path, handheld_frames
    from devices.lab.sim import LabSim

    t, T = hand_path(duration_s=n_s, fps=30.0, seed=5)
    cam = LabCamera(LabSim("panda_table"), "fixed", 424, 240)
    pairs = list(handheld_frames(cam, t, T))
    return [f for f, _ in pairs], np.stack([x for _, x in pairs])


@pytest.fixture(scope="module")
def hand_recording(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, np.ndarray]:
    frames, truth = _lab_hand_frames()
    rec = tmp_path_factory.mktemp("hand") / "hand.db3"
    _record(rec, frames)
    return rec, frames, truth


def _ate_vs_truth(res, frames, truth) -> float:  # type: ignore[no-untyped-def]
    from reconstruction.metrics import absolute_trajectory_error

    path = res.camera_path
    # playback may lose leading frames (SDK 2.59): pair by frame number
    index = [frames[0].index + i for i in range(len(frames))]
    rows = [index.index(int(i)) for i in path.index[path.tracked]]
    ate, _ = absolute_trajectory_error(path.poses[path.tracked], truth[rows])
    return float(ate)


@pytest.mark.gui
def test_scan_page_tracks_a_handheld_recording_in_the_chosen_range(
    qtbot, tmp_path: Path, hand_recording
) -> None:  # type: ignore[no-untyped-def]
    from app.controller import AppController
    from widgets.scan_page import ScanPage

    rec, frames, truth = hand_recording
    c = AppController()
    c.new_project(tmp_path / "proj")
    page = ScanPage(c)
    qtbot.addWidget(page)
    page.depth_range.setCurrentIndex(page.depth_range.findText("tabletop 0.3–1.4 m"))
    assert page.start_scan("file", rec)  # runs synchronously without a window
    res = page.result
    assert res is not None and res.quality["depth_range_m"] == [0.3, 1.4]
    assert res.capture["depth_range_from"] == "user"
    path = res.camera_path
    assert path is not None and path.tracked_ratio >= 0.95
    # the lab's truth. 2026-12-01, 40 runs (up to 2 at once): 3.6-9.4 mm, and 11.8 mm once in
    # a fresh-clone CI run; the spread is the glance away (frames 27-31, 1-5 cm off while
    # each passes the gate; the view is then mostly table plane: docs/TRAPS.md). The
    # 1 cm target is the bench's (`bench scan-real`, 8 s path), this test's bound is looser.
    assert _ate_vs_truth(res, frames, truth) < 0.015
    ref = res.capture["recording"]
    assert ref["sha256"] and ref["bytes"] == rec.stat().st_size
    assert len(res.scene_mesh.faces) > 5000 and res.table_plane is not None


def test_recording_source_streams_previews_with_the_range_from_the_data(hand_recording) -> None:  # type: ignore[no-untyped-def]
    from app.workflows.scan import scan_recording
    from app.workflows.scan_frames import CloudPreview, ScanOptions
    from resources.jobs import Progress

    rec, frames, truth = hand_recording
    job = scan_recording(rec, ScanOptions(preview_hz=1000.0))
    previews = 0
    try:
        while True:
            p = next(job)
            assert isinstance(p, Progress)
            previews += isinstance((p.partial or {}).get("cloud"), CloudPreview)
    except StopIteration as stop:
        res = stop.value
    assert previews >= len(frames) // 2  # the page sees the scan grow
    assert res.capture["depth_range_from"] == "data"
    assert res.camera_path is not None and len(res.scene_mesh.faces) > 5000
    # the far walls' noise (about 2 cm per pixel at 2 m on this camera) is left out: the
    # range ends where the depth's own noise passes 1 cm (reconstruction/depth_range.py)
    lo, hi = res.quality["depth_range_m"]
    assert 0.3 <= lo <= 0.6 and 1.2 <= hi <= 1.6
    ate = _ate_vs_truth(res, frames, truth)
    assert ate < 0.015  # 3.6-7.4 mm over 12 runs (see the test above for the spread)


def test_recording_without_depth_is_an_error_not_an_empty_scan(tmp_path: Path) -> None:
    from app.workflows.scan import scan_recording
    from reconstruction.errors import ReconstructionError
    from resources.jobs import run_to_end

    frames, _ = _lab_hand_frames(0.3)
    blank = [replace(f, depth=np.zeros_like(f.depth)) for f in frames]
    rec = tmp_path / "blank.db3"
    _record(rec, blank)
    with pytest.raises(ReconstructionError, match="Nothing was saved"):
        run_to_end(scan_recording(rec))


def test_the_live_preview_draws_a_spread_subset_of_a_large_fused_surface() -> None:
    """A workspace's fused surface is decimated for the Scan page's 3D view: at most
    PREVIEW_POINTS, colours still matching their points, the whole extent still covered."""
    from reconstruction.pipeline import PREVIEW_POINTS, preview_subset

    rng = np.random.default_rng(0)
    pts = rng.uniform(-1, 1, (250_000, 3)).astype(np.float32)
    cols = (np.abs(pts) * 255).astype(np.uint8)
    p, c = preview_subset(pts, cols)
    assert p is not None and c is not None
    assert PREVIEW_POINTS // 2 < len(p) <= PREVIEW_POINTS and len(c) == len(p)
    assert np.array_equal(c, (np.abs(p) * 255).astype(np.uint8))
    assert np.all(p.min(0) < -0.99) and np.all(p.max(0) > 0.99)
    small = pts[:1000]
    assert preview_subset(small, cols[:1000])[0] is small  # a small cloud is drawn whole
