"""Camera frames over the robot protocol into the RealSense SDK (pyrealsense2.software_device)
on the client side, recorded with the SDK's own recorder."""

from __future__ import annotations

import numpy as np

from devices.cameras.software import SoftwareDeviceSource
from devices.robots.client import RobotClient
from tests.devices.robots.conftest import Rig


def test_protocol_frames_feed_the_sdk_software_device(rig: Rig, tmp_path) -> None:
    with RobotClient("127.0.0.1", rig.port, rig.token, subscribe_state=False) as c:
        stream = c.camera_frames("synthetic")
        src = SoftwareDeviceSource(stream, fps=30, name="robot-camera")
        src.record_to(tmp_path / "cam.db3")
        got = []
        with src:
            for f in src.frames():
                got.append(f)
                if len(got) == 5:
                    break
        stream.close()
    assert len(got) == 5
    f = got[-1]
    assert f.depth.shape == (48, 64) and f.color.shape == (48, 64, 3)
    # the SDK hands back exactly the depth we streamed (pixel value = index + pixel number)
    expected = (np.arange(64 * 48).reshape(48, 64) + f.index).astype(np.uint16)
    np.testing.assert_array_equal(f.depth, expected)
    assert f.depth_scale == 0.001
    assert (tmp_path / "cam.db3").stat().st_size > 10_000
