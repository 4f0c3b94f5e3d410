"""`RGBDFrame` and `Intrinsics`: what every camera source yields.

Depth is uint16 in sensor units; metres = depth * depth_scale (a D435 uses 0.001). Zero
depth means "no measurement". Colour is RGB (not BGR), aligned to the depth image when the
source says so (`aligned=True`), in which case both share `intrinsics`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DataFileError


@dataclass(frozen=True)
class Intrinsics:
    """Pinhole intrinsics in pixels (Brown-Conrady distortion coefficients optional)."""

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    coeffs: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)

    @property
    def K(self) -> NDArray[np.float64]:
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    def scaled(self, width: int, height: int) -> Intrinsics:
        """The same camera at another resolution."""
        sx, sy = width / self.width, height / self.height
        return Intrinsics(
            width, height, self.fx * sx, self.fy * sy, self.cx * sx, self.cy * sy, self.coeffs
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "height": self.height,
            "fx": self.fx,
            "fy": self.fy,
            "cx": self.cx,
            "cy": self.cy,
            "coeffs": list(self.coeffs),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Intrinsics:
        return cls(
            int(d["width"]),
            int(d["height"]),
            float(d["fx"]),
            float(d["fy"]),
            float(d["cx"]),
            float(d["cy"]),
            tuple(float(c) for c in d.get("coeffs", ())),
        )


@dataclass(frozen=True)
class RGBDFrame:
    """One colour + depth frame with its timestamp (s) and, if known, camera pose.

    `T_world_camera` (4x4) is the camera pose in the frame the source reports (robot base for
    a calibrated or wrist camera), or None. `index` is the source's frame number, used to
    detect dropped frames.
    """

    color: NDArray[np.uint8]  # (H, W, 3) RGB
    depth: NDArray[np.uint16]  # (H, W) sensor units
    depth_scale: float  # metres per depth unit
    intrinsics: Intrinsics
    timestamp: float  # seconds
    index: int = 0
    T_world_camera: NDArray[np.float64] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.depth.ndim != 2:
            raise DataFileError(f"RGBDFrame: depth must be HxW, got shape {self.depth.shape}")
        if self.color.ndim != 3 or self.color.shape[2] != 3:
            raise DataFileError(f"RGBDFrame: colour must be HxWx3, got shape {self.color.shape}")
        if not (0 < self.depth_scale < 1):
            raise DataFileError(
                f"RGBDFrame: depth scale {self.depth_scale} m/unit is implausible "
                "(a RealSense uses 0.001; did you pass millimetres?)"
            )

    @property
    def depth_m(self) -> NDArray[np.float32]:
        """Depth in metres as float32 (0 where there is no measurement)."""
        return self.depth.astype(np.float32) * np.float32(self.depth_scale)

    def save_npz(self, path: Path) -> None:
        """Save as a compressed .npz (for fixtures and debugging; recordings use .db3)."""
        np.savez_compressed(
            path,
            color=self.color,
            depth=self.depth,
            depth_scale=self.depth_scale,
            intrinsics=np.array(
                [
                    self.intrinsics.width,
                    self.intrinsics.height,
                    self.intrinsics.fx,
                    self.intrinsics.fy,
                    self.intrinsics.cx,
                    self.intrinsics.cy,
                ]
            ),
            timestamp=self.timestamp,
            index=self.index,
            T_world_camera=(
                self.T_world_camera if self.T_world_camera is not None else np.full((4, 4), np.nan)
            ),
        )

    @classmethod
    def load_npz(cls, path: Path) -> RGBDFrame:
        try:
            z = np.load(path)
            w, h, fx, fy, cx, cy = z["intrinsics"]
            T = z["T_world_camera"]
            return cls(
                z["color"],
                z["depth"],
                float(z["depth_scale"]),
                Intrinsics(int(w), int(h), fx, fy, cx, cy),
                float(z["timestamp"]),
                int(z["index"]),
                None if np.isnan(T).any() else T,
            )
        except (OSError, KeyError, ValueError) as exc:
            raise DataFileError(f"{path}: not a readable RGBD frame file ({exc})") from exc
