"""The camera source interface and the capture sidecar every recording carries.

A `CameraSource` is a context manager with a blocking `frames()` iterator of `RGBDFrame`s and
`record_to(path)`, which makes the source also write what it yields to a `.db3` file with the
RealSense SDK's own recorder. Every recording gets a sidecar `<name>.json` beside it
(`CaptureInfo`): SDK version, intrinsics, depth scale, frame count and per-frame camera poses
when the source knows them (a .db3 cannot hold them).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

import numpy as np

from devices.errors import DataFileError, DeviceError
from devices.frames import Intrinsics, RGBDFrame
from resources import atomic

SIDECAR_FORMAT = "twinbench-capture"


class CameraError(DeviceError):
    """A camera could not be found, opened or read (the message names the device or file)."""


class OpenCloseSource(ABC):
    """Context-manager half shared by sources with `open()`/`close()`: entering opens,
    leaving closes (whatever happened inside)."""

    @abstractmethod
    def open(self) -> None:
        """Open the device or file (idempotent)."""

    @abstractmethod
    def close(self) -> None:
        """Release the device or file (idempotent)."""

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class CameraSource(Protocol):
    """Anything that yields RGBD frames: live RealSense, a recording, the lab camera."""

    def __enter__(self) -> CameraSource: ...

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def frames(self) -> Iterator[RGBDFrame]:
        """Yield frames until the source ends (recording) or is closed (live)."""
        ...

    def record_to(self, path: Path) -> None:
        """Also write every frame this source yields to `path` (.db3, SDK recorder)."""
        ...


def sdk_version() -> str:
    """Version string of the installed pyrealsense2 (imported lazily)."""
    import pyrealsense2 as rs

    return str(getattr(rs, "__version__", "unknown"))


def sidecar_path(recording: Path) -> Path:
    """`scan.db3` -> `scan.db3.json` (never clashes with other files in the folder)."""
    recording = Path(recording)
    return recording.with_name(recording.name + ".json")


@dataclass
class CaptureInfo:
    """What we store beside every capture (sidecar JSON)."""

    sdk_version: str
    intrinsics: Intrinsics
    depth_scale: float
    device: str = ""
    frames: int = 0
    first_index: int = 0
    dropped: list[int] = field(default_factory=list)
    poses: dict[int, list[float]] = field(default_factory=dict)  # frame index -> 16 floats
    meta: dict[str, Any] = field(default_factory=dict)

    def add_frame(self, frame: RGBDFrame) -> None:
        if self.frames == 0:
            self.first_index = frame.index
        self.frames += 1
        if frame.T_world_camera is not None:
            self.poses[frame.index] = [float(v) for v in np.asarray(frame.T_world_camera).ravel()]

    def pose(self, index: int) -> np.ndarray | None:
        p = self.poses.get(index)
        return None if p is None else np.asarray(p, dtype=float).reshape(4, 4)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SIDECAR_FORMAT,
            "sdk_version": self.sdk_version,
            "intrinsics": self.intrinsics.to_dict(),
            "depth_scale": self.depth_scale,
            "device": self.device,
            "frames": self.frames,
            "first_index": self.first_index,
            "dropped": self.dropped,
            "poses": {str(k): v for k, v in self.poses.items()},
            "meta": self.meta,
        }

    def save(self, recording: Path) -> None:
        atomic.write_json(sidecar_path(recording), self.to_json())

    @classmethod
    def load(cls, recording: Path) -> CaptureInfo | None:
        """Read the sidecar of `recording`; None if there is none; DataFileError if corrupt."""
        p = sidecar_path(recording)
        if not p.is_file():
            return None
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            if d.get("format") != SIDECAR_FORMAT:
                raise ValueError("format field is not " + SIDECAR_FORMAT)
            return cls(
                str(d["sdk_version"]),
                Intrinsics.from_dict(d["intrinsics"]),
                float(d["depth_scale"]),
                str(d.get("device", "")),
                int(d.get("frames", 0)),
                int(d.get("first_index", 0)),
                [int(i) for i in d.get("dropped", [])],
                {int(k): [float(x) for x in v] for k, v in d.get("poses", {}).items()},
                dict(d.get("meta", {})),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataFileError(f"{p}: corrupt capture sidecar ({exc})") from exc
