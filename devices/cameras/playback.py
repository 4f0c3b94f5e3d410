"""Playback of RealSense recordings (.db3 as pyrealsense2 2.59 writes them; legacy .bag).

Non-real-time (`set_real_time(False)`) so no frame is dropped because we are slow; frame
numbers are checked for continuity and gaps are reported in `dropped`. The capture sidecar
(`CaptureInfo`), when present, supplies camera poses and the recording SDK version.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from devices.cameras.convert import frameset_to_rgbd
from devices.cameras.software import DB3Writer
from devices.cameras.source import CaptureInfo, OpenCloseSource, sdk_version
from devices.errors import DataFileError
from devices.frames import RGBDFrame

SUFFIXES = (".db3", ".bag")


class PlaybackSource(OpenCloseSource):
    """`CameraSource` reading a recording file frame by frame, as fast as it is consumed."""

    def __init__(self, path: Path, align_to_color: bool = True) -> None:
        self.path = Path(path)
        self.align_to_color = align_to_color
        if self.path.suffix.lower() not in SUFFIXES:
            raise DataFileError(f"{self.path}: not a RealSense recording (expected .db3 or .bag)")
        if not self.path.is_file():
            raise DataFileError(f"{self.path}: no such recording")
        self.info: CaptureInfo | None = CaptureInfo.load(self.path)
        self.dropped: list[int] = []  # frame numbers missing from the recording
        self.frames_read = 0
        self.depth_scale = 0.0
        self.duration_s = 0.0
        self._pipe: Any = None
        self._record: Path | None = None
        self._first: Any = None  # the first frameset, read by open()
        self.warnings: list[str] = []

    def record_to(self, path: Path) -> None:
        """Re-record what is played (through a software device) to another .db3."""
        self._record = Path(path)

    def open(self) -> None:
        import pyrealsense2 as rs

        if self._pipe is not None:
            return
        cfg = rs.config()
        try:
            cfg.enable_device_from_file(str(self.path), repeat_playback=False)
            pipe, profile = self._start(rs, cfg)
            # Even so, the pipeline's syncer now and then drops the file's first frame or two
            # on a loaded machine (1 of 75 opens under 3 busy processes; 2 frames in a CI
            # run). Where the capture sidecar says which frame comes first, a late start is
            # played again from the beginning (nothing has been handed out yet).
            for attempt in range(4):
                first = self._first_frameset(pipe)
                want = self.info.first_index if self.info is not None else None
                if first is None or want is None or first[0] <= want or attempt == 3:
                    break
                pipe.stop()
                pipe, profile = self._start(rs, cfg)
        except RuntimeError as exc:
            raise DataFileError(
                f"{self.path}: the RealSense SDK cannot open this recording "
                f"({exc}); is it truncated or not a RealSense .db3/.bag?"
            ) from exc
        self._pipe = pipe
        self._first = None if first is None else first[1]
        dev = profile.get_device()
        pb = dev.as_playback()
        self._playback = pb
        self.duration_s = pb.get_duration().total_seconds()
        streams = {s.stream_type(): s for s in profile.get_streams()}
        if rs.stream.depth not in streams or rs.stream.color not in streams:
            self.close()
            raise DataFileError(
                f"{self.path}: recording needs a depth and a colour stream, has "
                f"{', '.join(str(s) for s in streams) or 'none'}"
            )
        try:
            self.depth_scale = float(dev.first_depth_sensor().get_depth_scale())
        except RuntimeError:
            self.depth_scale = self.info.depth_scale if self.info else 0.001
        if not 0 < self.depth_scale < 1:
            self.close()
            raise DataFileError(f"{self.path}: implausible depth scale {self.depth_scale} m/unit")
        if self.info is not None and abs(self.info.depth_scale - self.depth_scale) > 1e-6:
            self.warnings.append(
                f"sidecar depth scale {self.info.depth_scale} differs from the "
                f"recording's {self.depth_scale}; using the recording's"
            )
        if self.info is not None and self.info.sdk_version != sdk_version():
            self.warnings.append(
                f"recorded with SDK {self.info.sdk_version}, reading with {sdk_version()}"
            )
        d = streams[rs.stream.depth].as_video_stream_profile()
        c = streams[rs.stream.color].as_video_stream_profile()
        same = (d.width(), d.height()) == (
            c.width(),
            c.height(),
        ) and d.get_intrinsics().fx == c.get_intrinsics().fx
        self._align = rs.align(rs.stream.color) if (self.align_to_color and not same) else None

    @staticmethod
    def _start(rs: Any, cfg: Any) -> tuple[Any, Any]:
        """Start a pipeline on the file with its device switched to non-real-time first
        (resolving opens the device the pipeline then plays): started in real time, the
        pipeline's one-frame queue overwrote the first frames before anyone read them (6 of
        a 10-frame file lost on a loaded CI machine). An SDK whose playback still starts in
        real time is paused, drained, switched and rewound."""
        pipe = rs.pipeline()
        cfg.resolve(rs.pipeline_wrapper(pipe)).get_device().as_playback().set_real_time(False)
        profile = pipe.start(cfg)
        pb = profile.get_device().as_playback()
        if pb.is_real_time():
            pb.pause()
            while pipe.try_wait_for_frames(30)[0]:
                pass
            pb.set_real_time(False)
            pb.seek(datetime.timedelta(0))
            pb.resume()
        return pipe, profile

    @staticmethod
    def _first_frameset(pipe: Any) -> tuple[int, Any] | None:
        """The first frameset played (kept) and its depth frame number (-1 without depth)."""
        ok, fs = pipe.try_wait_for_frames(2000)
        if not ok:
            return None
        fs.keep()
        d = fs.get_depth_frame()
        return (int(d.get_frame_number()) if d else -1), fs

    def close(self) -> None:
        if self._pipe is not None:
            try:
                self._pipe.stop()
            except RuntimeError:
                pass
            self._pipe = None
            self._playback = None
            self._first = None

    def frames(self) -> Iterator[RGBDFrame]:
        """Yield every frame; raises DataFileError (after the good frames) if the file breaks."""
        import pyrealsense2 as rs

        self.open()
        writer = None
        if self._record is not None:
            writer = DB3Writer(self._record)
        last: int | None = None
        first: int | None = None
        idle_ms = 0
        # SDK 2.59's playback syncer can hand depth N together with colour N-1 (both streams
        # carry frame numbers and equal timestamps); colour N then arrives with a repeated
        # depth. Frames whose colour lags wait here until their own colour shows up.
        colours: dict[int, np.ndarray] = {}
        waiting: dict[int, RGBDFrame] = {}

        def matched(frame: RGBDFrame) -> RGBDFrame:
            return replace(frame, color=colours[frame.index])

        try:
            while True:
                try:
                    if self._first is not None:  # read by open()
                        ok, fs, self._first = True, self._first, None
                    else:
                        ok, fs = self._pipe.try_wait_for_frames(50)
                except RuntimeError as exc:
                    raise DataFileError(
                        f"{self.path}: read error after {self.frames_read} frames ({exc})"
                    ) from exc
                if not ok:
                    if self._playback.current_status() == rs.playback_status.stopped:
                        break
                    idle_ms += 50
                    if idle_ms >= 2000:
                        pos = self._playback.get_position() / 1e9
                        raise DataFileError(
                            f"{self.path}: no frame for 2 s at {pos:.3f} s of "
                            f"{self.duration_s:.3f} s; the recording looks truncated"
                        )
                    continue
                idle_ms = 0
                if self._align is not None:
                    fs = self._align.process(fs)
                c = fs.get_color_frame()
                if c:
                    colours[int(c.get_frame_number())] = np.asanyarray(c.get_data()).copy()
                for n in [n for n in waiting if n in colours]:
                    self.frames_read += 1
                    out = matched(waiting.pop(n))
                    if writer is not None:
                        writer.write(out)
                    yield out
                d = fs.get_depth_frame()
                if not d:
                    continue
                num = int(d.get_frame_number())
                if last is not None and num <= last:
                    continue  # the SDK can repeat a frame when colour and depth interleave
                if last is not None and num > last + 1:
                    self.dropped.extend(range(last + 1, num))
                last = num
                first = num if first is None else first
                pose = self.info.pose(num) if self.info is not None else None
                frame = frameset_to_rgbd(fs, self.depth_scale, num, pose, aligned=True)
                if frame is None:
                    continue
                if c and int(c.get_frame_number()) < num and num not in colours:
                    waiting[num] = frame  # its colour comes with a later frameset
                    continue
                if num in colours:
                    frame = matched(frame)
                for old in [n for n in colours if n < num - 2]:
                    del colours[old]
                self.frames_read += 1
                if writer is not None:
                    writer.write(frame)
                yield frame
            for n in sorted(waiting):  # colour never came: keep the nearest earlier one
                self.frames_read += 1
                self.warnings.append(
                    f"frame {n}: its colour image is missing; the previous one is used"
                )
                yield waiting.pop(n)
        finally:
            if writer is not None:
                writer.close()
        if self.frames_read == 0:
            raise DataFileError(f"{self.path}: the recording holds no depth + colour frames")
        if self.info is not None and first is not None and first > self.info.first_index:
            # SDK 2.59 playback sometimes loses the first frame(s) at start: report them
            self.dropped[:0] = list(range(self.info.first_index, first))
        if self.info is not None and self.frames_read + len(self.dropped) < self.info.frames:
            self.warnings.append(
                f"read {self.frames_read} frames but the capture sidecar "
                f"lists {self.info.frames}; the recording may be truncated"
            )
