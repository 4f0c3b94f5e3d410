"""Camera sources (pyrealsense2 lives here): live RealSense, recording playback, software
device over RGBD frames (the lab camera, frames from the robot protocol), .db3 recording."""

from devices.cameras.playback import PlaybackSource
from devices.cameras.realsense import RealSenseSource
from devices.cameras.source import CameraError, CameraSource, CaptureInfo, sdk_version, sidecar_path

__all__ = [
    "CameraError",
    "CameraSource",
    "CaptureInfo",
    "sdk_version",
    "sidecar_path",
    "open_source",
]


def open_source(spec: str) -> CameraSource:
    """`realsense`, `realsense:SERIAL` or a recording path -> a CameraSource (not yet opened)."""
    from pathlib import Path

    if spec == "realsense" or spec.startswith("realsense:"):
        return RealSenseSource(serial=spec.partition(":")[2] or None)

    return PlaybackSource(Path(spec))
