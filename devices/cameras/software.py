"""RGBD frames -> a `pyrealsense2.software_device`, so downstream code sees real SDK frames.

`SoftwareCamera` builds a software device with a depth and a colour sensor from the first
frame's intrinsics, pushes each `RGBDFrame` through it and gets SDK frames back; with a
`record_path` it wraps the device in `rs.recorder`, which writes a `.db3` the RealSense Viewer
and our `PlaybackSource` open. `SoftwareDeviceSource` is the `CameraSource` over any iterable of
frames (the lab camera, frames streamed by the robot protocol); `DB3Writer` only records.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from devices.cameras.convert import frames_to_rgbd, to_rs_intrinsics
from devices.cameras.source import CameraError, CaptureInfo, sdk_version
from devices.frames import Intrinsics, RGBDFrame

_TIMEOUT_MS = 2000


class SoftwareCamera:
    """One software device (depth z16 + colour rgb8, same size), optionally recording."""

    def __init__(
        self,
        intrinsics: Intrinsics,
        depth_scale: float,
        fps: int = 30,
        record_path: Path | None = None,
        name: str = "Twinbench software camera",
    ) -> None:
        import pyrealsense2 as rs

        self.intrinsics, self.depth_scale, self.fps = intrinsics, depth_scale, fps
        self.record_path = None if record_path is None else Path(record_path)
        w, h = intrinsics.width, intrinsics.height
        self._dev = rs.software_device()
        self._dev.register_info(rs.camera_info.name, name)
        self._dev.register_info(rs.camera_info.serial_number, "software-0")
        ds = self._dev.add_sensor("Stereo Module")
        cs = self._dev.add_sensor("RGB Camera")
        ri = to_rs_intrinsics(intrinsics)
        self._profiles = []
        for sensor, stype, fmt, bpp, uid in (
            (ds, rs.stream.depth, rs.format.z16, 2, 0),
            (cs, rs.stream.color, rs.format.rgb8, 3, 1),
        ):
            vs = rs.video_stream()
            vs.type, vs.index, vs.uid = stype, 0, uid
            vs.width, vs.height, vs.fps, vs.bpp, vs.fmt = w, h, fps, bpp, fmt
            vs.intrinsics = ri
            self._profiles.append(sensor.add_video_stream(vs).as_video_stream_profile())
        ds.add_read_only_option(rs.option.depth_units, float(depth_scale))
        self._dev.create_matcher(rs.matchers.dlr_c)
        self._soft_sensors = (ds, cs)
        self._recorder = None
        target: Any = self._dev
        if self.record_path is not None:
            self.record_path.parent.mkdir(parents=True, exist_ok=True)
            if self.record_path.exists():
                self.record_path.unlink()
            try:
                self._recorder = rs.recorder(str(self.record_path), self._dev)
            except RuntimeError as exc:
                raise CameraError(f"{self.record_path}: cannot record ({exc})") from exc
            target = self._recorder
        self._queues = [rs.frame_queue(8, keep_frames=True), rs.frame_queue(8, keep_frames=True)]
        self._sensors = list(target.query_sensors())
        for sensor, q in zip(self._sensors, self._queues, strict=True):
            sensor.open(sensor.get_stream_profiles()[0])
            sensor.start(q)
        self.info = CaptureInfo(sdk_version(), intrinsics, depth_scale, device=name)
        self._closed = False

    def push(self, frame: RGBDFrame) -> RGBDFrame:
        """Feed one frame through the SDK; returns the frame as the SDK delivered it."""
        import pyrealsense2 as rs

        if self._closed:
            raise CameraError("software camera is closed")
        w, h = self.intrinsics.width, self.intrinsics.height
        if frame.depth.shape != (h, w) or frame.color.shape[:2] != (h, w):
            raise CameraError(
                f"software camera is {w}x{h} but frame {frame.index} has depth "
                f"{frame.depth.shape[::-1]} and colour {frame.color.shape[1::-1]}"
            )
        if abs(frame.depth_scale - self.depth_scale) > 1e-9:
            raise CameraError(
                f"frame {frame.index}: depth scale {frame.depth_scale} differs "
                f"from the stream's {self.depth_scale}"
            )
        t_ms = frame.timestamp * 1000.0
        pixels: tuple[np.ndarray, np.ndarray] = (frame.depth, frame.color)
        for sensor, prof, px, bpp in zip(
            self._soft_sensors, self._profiles, pixels, (2, 3), strict=True
        ):
            f = rs.software_video_frame()
            f.pixels = px if px.flags.c_contiguous else px.copy()
            f.stride, f.bpp = w * bpp, bpp
            f.timestamp, f.domain = t_ms, rs.timestamp_domain.hardware_clock
            f.frame_number, f.profile = frame.index, prof
            sensor.on_video_frame(f)
        got = []
        for q, kind in zip(self._queues, ("depth", "colour"), strict=True):
            ok, f = q.try_wait_for_frame(_TIMEOUT_MS)
            if not ok:
                raise CameraError(
                    f"software camera: no {kind} frame back from the SDK for frame {frame.index}"
                )
            got.append(f)
        self.info.add_frame(frame)
        out = frames_to_rgbd(
            got[0], got[1], self.depth_scale, frame.index, frame.T_world_camera, aligned=True
        )
        return RGBDFrame(
            out.color,
            out.depth,
            out.depth_scale,
            out.intrinsics,
            frame.timestamp,
            out.index,
            out.T_world_camera,
            {**frame.meta, **out.meta},
        )

    def close(self) -> None:
        """Stop the sensors; a recording is finalised and its sidecar written."""
        if self._closed:
            return
        self._closed = True
        for sensor in self._sensors:
            try:
                sensor.stop()
                sensor.close()
            except RuntimeError:
                pass
        self._sensors = []
        self._queues = []
        self._recorder = None  # the SDK writes the file's index when the recorder dies
        gc.collect()
        if self.record_path is not None:
            self.info.save(self.record_path)


class DB3Writer:
    """Write RGBDFrames to a `.db3` with the SDK recorder (plus sidecar JSON)."""

    def __init__(self, path: Path, fps: int = 30) -> None:
        self.path, self.fps = Path(path), fps
        self._cam: SoftwareCamera | None = None

    def write(self, frame: RGBDFrame) -> None:
        if self._cam is None:
            self._cam = SoftwareCamera(frame.intrinsics, frame.depth_scale, self.fps, self.path)
            self._cam.info.meta.update(frame.meta.get("capture", {}))
        self._cam.push(frame)

    def close(self) -> None:
        if self._cam is not None:
            self._cam.close()

    def __enter__(self) -> DB3Writer:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SoftwareDeviceSource:
    """`CameraSource` over an iterable of RGBDFrames, passed through a software device."""

    def __init__(self, frames: Iterable[RGBDFrame], fps: int = 30, name: str = "software") -> None:
        self._frames, self.fps, self.name = frames, fps, name
        self._record: Path | None = None
        self._cam: SoftwareCamera | None = None

    def record_to(self, path: Path) -> None:
        if self._cam is not None:
            raise CameraError(f"{self.name}: call record_to before the first frame")
        self._record = Path(path)

    def __enter__(self) -> SoftwareDeviceSource:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._cam is not None:
            self._cam.close()

    @property
    def info(self) -> CaptureInfo | None:
        return None if self._cam is None else self._cam.info

    def frames(self) -> Iterator[RGBDFrame]:
        for frame in self._frames:
            if self._cam is None:
                self._cam = SoftwareCamera(
                    frame.intrinsics,
                    frame.depth_scale,
                    self.fps,
                    self._record,
                    name=f"Twinbench {self.name}",
                )
            yield self._cam.push(frame)
