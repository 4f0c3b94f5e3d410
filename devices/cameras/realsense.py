"""Live RealSense cameras through the pyrealsense2 pipeline.

`list_devices()` discovers what is connected; `RealSenseSource` streams depth + colour with
depth aligned to colour, a chosen resolution/fps and visual preset, and records with the
SDK's own recorder (`config.enable_record_to_file`, .db3 in SDK 2.59).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.cameras.convert import frameset_to_rgbd, from_rs_intrinsics
from devices.cameras.source import CameraError, CaptureInfo, OpenCloseSource, sdk_version
from devices.frames import RGBDFrame

PRESETS = {"default": 1, "hand": 2, "high_accuracy": 3, "high_density": 4, "medium_density": 5}


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    serial: str
    firmware: str
    usb: str


def list_devices() -> list[DeviceInfo]:
    """RealSense devices connected now (empty list when none)."""
    import pyrealsense2 as rs

    out = []
    for dev in rs.context().query_devices():

        def get(key: Any, dev: Any = dev) -> str:
            return str(dev.get_info(key)) if dev.supports(key) else ""

        out.append(
            DeviceInfo(
                get(rs.camera_info.name),
                get(rs.camera_info.serial_number),
                get(rs.camera_info.firmware_version),
                get(rs.camera_info.usb_type_descriptor),
            )
        )
    return out


class RealSenseSource(OpenCloseSource):
    """A connected RealSense camera (D400 family) as a `CameraSource`."""

    def __init__(
        self,
        serial: str | None = None,
        width: int = 640,
        height: int = 480,
        fps: int = 30,
        preset: str = "default",
    ) -> None:
        if preset not in PRESETS:
            raise CameraError(f"unknown RealSense preset '{preset}' (one of {', '.join(PRESETS)})")
        self.serial, self.width, self.height, self.fps, self.preset = (
            serial,
            width,
            height,
            fps,
            preset,
        )
        self._record: Path | None = None
        self._pipe: Any = None
        self.info: CaptureInfo | None = None

    def record_to(self, path: Path) -> None:
        if self._pipe is not None:
            raise CameraError("record_to must be called before the camera is opened")
        self._record = Path(path)

    def open(self) -> None:
        import pyrealsense2 as rs

        devices = list_devices()
        if not devices:
            raise CameraError(
                "no RealSense connected (check the USB 3 cable and that no other "
                "program holds the camera), or scan from a recording/the lab"
            )
        if self.serial and self.serial not in {d.serial for d in devices}:
            raise CameraError(
                f"RealSense {self.serial} not connected; connected: "
                f"{', '.join(d.serial for d in devices)}"
            )
        cfg = rs.config()
        if self.serial:
            cfg.enable_device(self.serial)
        cfg.enable_stream(rs.stream.depth, self.width, self.height, rs.format.z16, self.fps)
        cfg.enable_stream(rs.stream.color, self.width, self.height, rs.format.rgb8, self.fps)
        if self._record is not None:
            self._record.parent.mkdir(parents=True, exist_ok=True)
            cfg.enable_record_to_file(str(self._record))
        pipe = rs.pipeline()
        try:
            profile = pipe.start(cfg)
        except RuntimeError as exc:
            raise CameraError(
                f"RealSense {self.serial or devices[0].serial}: cannot stream "
                f"{self.width}x{self.height}@{self.fps} ({exc})"
            ) from exc
        self._pipe = pipe
        dev = profile.get_device()
        depth_sensor = dev.first_depth_sensor()
        if depth_sensor.supports(rs.option.visual_preset):
            depth_sensor.set_option(rs.option.visual_preset, PRESETS[self.preset])
        self.depth_scale = float(depth_sensor.get_depth_scale())
        self._align = rs.align(rs.stream.color)
        color = profile.get_stream(rs.stream.color).as_video_stream_profile()
        self.info = CaptureInfo(
            sdk_version(),
            from_rs_intrinsics(color.get_intrinsics()),
            self.depth_scale,
            device=str(dev.get_info(rs.camera_info.name)),
            meta={
                "serial": str(dev.get_info(rs.camera_info.serial_number)),
                "preset": self.preset,
                "fps": self.fps,
            },
        )

    def close(self) -> None:
        if self._pipe is not None:
            try:
                self._pipe.stop()
            except RuntimeError:
                pass
            self._pipe = None
            gc.collect()
            if self._record is not None and self.info is not None:
                self.info.save(self._record)

    def frames(self) -> Iterator[RGBDFrame]:
        self.open()
        while self._pipe is not None:
            try:
                fs = self._pipe.wait_for_frames(5000)
            except RuntimeError as exc:
                raise CameraError(f"RealSense: no frames for 5 s ({exc})") from exc
            frame = frameset_to_rgbd(self._align.process(fs), self.depth_scale)
            if frame is None:
                continue
            assert self.info is not None
            self.info.add_frame(frame)
            yield frame
