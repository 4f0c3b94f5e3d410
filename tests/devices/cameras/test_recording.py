"""Camera sources with the real SDK: software device -> .db3 recorder -> playback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from devices.cameras.playback import PlaybackSource
from devices.cameras.software import DB3Writer, SoftwareCamera, SoftwareDeviceSource
from devices.cameras.source import CameraError, CaptureInfo, sdk_version, sidecar_path
from devices.errors import DataFileError
from devices.frames import Intrinsics, RGBDFrame

INTR = Intrinsics(424, 240, 307.0, 307.0, 211.5, 119.5)


def _frames(n: int, skip: set[int] = frozenset(), seed: int = 0) -> list[RGBDFrame]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if i in skip:
            continue
        depth = rng.integers(300, 2000, (240, 424)).astype(np.uint16)
        color = rng.integers(0, 255, (240, 424, 3)).astype(np.uint8)
        T = np.eye(4)
        T[0, 3] = 0.01 * i
        out.append(RGBDFrame(color, depth, 0.001, INTR, i / 30.0, i, T))
    return out


def test_software_device_roundtrip_through_db3(tmp_path: Path) -> None:
    frames = _frames(12, skip={5, 6})
    path = tmp_path / "synthetic.db3"
    src = SoftwareDeviceSource(frames)
    src.record_to(path)
    with src:
        passed = list(src.frames())
    assert len(passed) == 10
    assert all(
        (a.depth == b.depth).all() and (a.color == b.color).all()
        for a, b in zip(frames, passed, strict=True)
    )
    info = json.loads(sidecar_path(path).read_text())
    assert info["sdk_version"] == sdk_version()
    assert info["depth_scale"] == pytest.approx(0.001)
    assert info["intrinsics"]["fx"] == pytest.approx(307.0)
    with PlaybackSource(path) as pb:
        got = list(pb.frames())
    # continuity check on load: the recorded gap is found, and nothing else is missing
    assert pb.dropped == [5, 6] and len(got) == 10
    by_index = {f.index: f for f in frames}
    for b in got:
        a = by_index[b.index]
        assert (a.depth == b.depth).all() and (a.color == b.color).all()
        assert b.depth_scale == pytest.approx(0.001, rel=1e-6)
        assert np.allclose(b.T_world_camera, a.T_world_camera)  # poses from the sidecar
    assert got[0].intrinsics.fx == pytest.approx(307.0)


def test_lab_camera_recorded_by_sdk_plays_back(tmp_path: Path, lab_frames: list[RGBDFrame]) -> None:
    path = tmp_path / "lab.db3"
    with DB3Writer(path) as w:
        for f in lab_frames:
            w.write(f)
    with PlaybackSource(path) as pb:
        got = list(pb.frames())
    assert len(got) == len(lab_frames) and pb.dropped == [] and not pb.warnings
    assert (got[-1].depth == lab_frames[-1].depth).all()
    assert got[0].intrinsics.width == 640 and got[0].depth.shape == (480, 640)


def test_truncated_recording_is_refused_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "cut.db3"
    with DB3Writer(path) as w:
        for f in _frames(6):
            w.write(f)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.9)])
    with pytest.raises(DataFileError, match=r"cut\.db3.*truncated"):
        PlaybackSource(path).open()
    assert sidecar_path(path).is_file()  # the capture info is not lost


def test_garbage_file_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.db3"
    bad.write_bytes(b"not a bag at all" * 100)
    with pytest.raises(DataFileError, match="garbage.db3"):
        PlaybackSource(bad).open()
    with pytest.raises(DataFileError, match="no such recording"):
        PlaybackSource(tmp_path / "missing.db3")
    with pytest.raises(DataFileError, match="expected .db3"):
        PlaybackSource(tmp_path / "video.mp4")


def test_corrupt_sidecar_is_named(tmp_path: Path) -> None:
    rec = tmp_path / "x.db3"
    sidecar_path(rec).write_text("{ nope")
    with pytest.raises(DataFileError, match="x.db3.json"):
        CaptureInfo.load(rec)


def test_software_camera_rejects_mismatched_frames(tmp_path: Path) -> None:
    cam = SoftwareCamera(INTR, 0.001)
    try:
        f = _frames(1)[0]
        with pytest.raises(CameraError, match="depth scale"):
            cam.push(RGBDFrame(f.color, f.depth, 0.0001, INTR, 0.0, 1))
        with pytest.raises(CameraError, match="424x240"):
            cam.push(RGBDFrame(f.color[:100], f.depth[:100], 0.001, INTR, 0.0, 2))
    finally:
        cam.close()


def test_no_realsense_connected_is_clear() -> None:
    from devices.cameras.realsense import RealSenseSource, list_devices

    if list_devices():
        pytest.skip("a RealSense is connected")
    with pytest.raises(CameraError, match="no RealSense connected"):
        RealSenseSource().open()
