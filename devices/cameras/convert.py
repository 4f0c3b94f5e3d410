"""Conversions between pyrealsense2 objects and our value types (pyrealsense2 lives here)."""

from __future__ import annotations

from typing import Any

import numpy as np

from devices.frames import Intrinsics, RGBDFrame


def to_rs_intrinsics(intr: Intrinsics) -> Any:
    import pyrealsense2 as rs

    out = rs.intrinsics()
    out.width, out.height = intr.width, intr.height
    out.fx, out.fy, out.ppx, out.ppy = intr.fx, intr.fy, intr.cx, intr.cy
    out.model = rs.distortion.brown_conrady
    coeffs = list(intr.coeffs) + [0.0] * (5 - len(intr.coeffs))
    out.coeffs = coeffs[:5]
    return out


def from_rs_intrinsics(ri: Any) -> Intrinsics:
    return Intrinsics(
        int(ri.width),
        int(ri.height),
        float(ri.fx),
        float(ri.fy),
        float(ri.ppx),
        float(ri.ppy),
        tuple(float(c) for c in ri.coeffs),
    )


def frameset_to_rgbd(
    fs: Any,
    depth_scale: float,
    index: int | None = None,
    T_world_camera: np.ndarray | None = None,
    aligned: bool = True,
) -> RGBDFrame | None:
    """An rs.composite_frame with depth + colour -> RGBDFrame (None if either is missing).

    Intrinsics are the depth stream's (colour is expected aligned to depth or the same size).
    The timestamp is the SDK's (ms) converted to seconds.
    """
    d = fs.get_depth_frame()
    c = fs.get_color_frame()
    if not d or not c:
        return None
    return frames_to_rgbd(d, c, depth_scale, index, T_world_camera, aligned)


def frames_to_rgbd(
    d: Any,
    c: Any,
    depth_scale: float,
    index: int | None = None,
    T_world_camera: np.ndarray | None = None,
    aligned: bool = True,
) -> RGBDFrame:
    """A depth rs.frame and a colour rs.frame -> RGBDFrame (copies the pixel data)."""
    import pyrealsense2 as rs

    depth = np.asanyarray(d.get_data()).copy()
    color = np.asanyarray(c.get_data()).copy()
    fmt = c.get_profile().format()
    if fmt == rs.format.bgr8:
        color = color[..., ::-1].copy()
    elif fmt in (rs.format.rgba8, rs.format.bgra8):
        color = color[..., :3] if fmt == rs.format.rgba8 else color[..., 2::-1]
        color = np.ascontiguousarray(color)
    intr = from_rs_intrinsics(d.get_profile().as_video_stream_profile().get_intrinsics())
    return RGBDFrame(
        color=color.astype(np.uint8),
        depth=depth.astype(np.uint16),
        depth_scale=depth_scale,
        intrinsics=intr,
        timestamp=float(d.get_timestamp()) / 1000.0,
        index=int(d.get_frame_number()) if index is None else index,
        T_world_camera=T_world_camera,
        meta={"aligned": aligned},
    )
