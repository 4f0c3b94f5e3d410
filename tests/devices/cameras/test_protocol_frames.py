"""Lab camera frames streamed over the robot protocol, through the SDK's software device
and recorder, then played back: the path a remote robot's camera takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.cameras.playback import PlaybackSource
from devices.cameras.software import SoftwareDeviceSource

pytestmark = pytest.mark.slow


def test_protocol_frames_recorded_by_sdk(tmp_path: Path) -> None:
    from itertools import islice

    from devices.robots.agent.launch import start_lab_process
    from devices.robots.client import RobotClient

    rec = tmp_path / "remote.db3"
    with start_lab_process("panda_table", camera_size="424x240", camera_fps=15) as lab:
        with RobotClient(lab.host, lab.port, lab.token) as robot:
            src = SoftwareDeviceSource(
                islice(robot.camera_frames("fixed", timeout_s=60.0), 5),
                fps=15,
                name="protocol fixed",
            )
            src.record_to(rec)
            with src:
                got = list(src.frames())
    assert len(got) == 5
    assert got[0].depth.shape == (240, 424) and got[0].depth_scale == pytest.approx(0.001)
    assert (got[0].depth > 0).mean() > 0.5
    with PlaybackSource(rec) as pb:
        back = list(pb.frames())
    assert len(back) == 5 and pb.dropped == [] and not pb.warnings
    assert [f.index for f in back] == [f.index for f in got if f.index not in pb.dropped]
    assert (back[-1].depth == got[-1].depth).all() and (back[-1].color == got[-1].color).all()
    assert pb.info is not None and pb.info.sdk_version and pb.info.device.startswith("Twinbench")
