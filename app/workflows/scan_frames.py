"""Frames -> ScanResult, the one frame loop every scan runs: a recording with camera poses,
a handheld scan (app/workflows/scan_handheld.py) and the guided robot scan
(app/workflows/scan_robot.py).

- `reconstruct_frames(frames, ...)`: any RGBDFrame stream -> ScanResult, yielding live
  previews (colour/depth, growing point cloud) at `preview_hz`; `ScanOptions` its settings.
- `scan_summary(result)`: the artifact's summary line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DataFileError
from devices.frames import RGBDFrame
from reconstruction.pipeline import ScanSession, SegmentSettings
from reconstruction.scan_process import ScanProcess
from reconstruction.scan_result import ScanResult
from reconstruction.tsdf import TSDFSettings
from resources.jobs import Job, Progress
from resources.text import count

log = logging.getLogger(__name__)

PoseFn = Callable[[RGBDFrame], NDArray[np.float64] | None]


@dataclass
class ScanOptions:
    voxel_size: float = 0.004
    depth_max: float = 1.1
    preview_hz: float = 10.0
    triangle_budget: int = 4000
    seed: int = 0
    max_frames: int | None = None
    # handheld sources: "auto" (from the first frame: up to where the depth's own noise
    # passes 1 cm, reconstruction.depth_range) or (min, max) in m
    depth_range: tuple[float, float] | str = "auto"
    loop_closure: bool = False  # handheld: keyframe pose graph at the end
    stop: threading.Event | None = None  # set -> stop acquiring, reconstruct what we have
    exclude: list[tuple[NDArray[np.float64], NDArray[np.float64]]] = field(default_factory=list)


@dataclass
class FramePreview:
    """Partial result: the newest frame (for the colour/depth preview)."""

    color: NDArray[np.uint8]
    depth_m: NDArray[np.float32]
    index: int


@dataclass
class CloudPreview:
    """Partial result: the reconstruction so far (points in the base frame). `points` is the
    fused surface (refreshed as often as its extraction allows); `live` is the newest frame's
    depth in the base frame (every preview)."""

    points: NDArray[np.float32] | None
    colors: NDArray[np.uint8] | None
    frames: int
    camera: NDArray[np.float64] | None
    live: NDArray[np.float32] | None = None


def frame_points(
    f: RGBDFrame, T: NDArray[np.float64] | None, stride: int = 6
) -> NDArray[np.float32] | None:
    """The frame's depth as base-frame points (every `stride`-th pixel), for live previews."""
    if T is None:
        return None
    d = f.depth[::stride, ::stride].astype(np.float32) * np.float32(f.depth_scale)
    v, u = np.nonzero(d > 0)
    z = d[v, u]
    i = f.intrinsics
    p = np.column_stack([(u * stride - i.cx) / i.fx * z, (v * stride - i.cy) / i.fy * z, z])
    return (p @ T[:3, :3].T + T[:3, 3]).astype(np.float32)


class _Throttle:
    def __init__(self, hz: float) -> None:
        self.dt, self.last = 1.0 / hz if hz > 0 else 0.0, -1e9

    def ready(self) -> bool:
        now = time.perf_counter()
        if now - self.last >= self.dt:
            self.last = now
            return True
        return False


def reconstruct_frames(
    frames: Iterable[RGBDFrame],
    pose_of: PoseFn | None = None,
    options: ScanOptions | None = None,
    track: bool = False,
    session: ScanSession | ScanProcess | None = None,
    finish: bool = True,
    T_base_camera: NDArray[np.float64] | None = None,
    calibration: dict[str, Any] | None = None,
    total: int | None = None,
    segment: SegmentSettings | None = None,
    progress_every: int = 0,
) -> Job[ScanResult | None]:
    """Integrate a frame stream; a stream that breaks (truncated file) keeps what it had.
    Live previews at `options.preview_hz` (0: none); `progress_every` N > 0 also reports
    progress text every N frames (for a terminal). `segment` overrides how the result is
    segmented (default: up is +z unless tracking, the options' budget and exclusions).
    Without a `session`, a posed scan fuses in a worker process (reconstruction/scan_process.py:
    Open3D holds the GIL through each call) and a handheld one in this process."""
    opt = options or ScanOptions()
    if session is not None:
        return (
            yield from _reconstruct(
                frames,
                pose_of,
                opt,
                session,
                finish,
                T_base_camera,
                calibration,
                total,
                segment,
                progress_every,
            )
        )
    settings = TSDFSettings(voxel_size=opt.voxel_size, depth_max=opt.depth_max)
    if track:
        return (
            yield from _reconstruct(
                frames,
                pose_of,
                opt,
                ScanSession(settings, track=True),
                finish,
                T_base_camera,
                calibration,
                total,
                segment,
                progress_every,
            )
        )
    with ScanProcess(settings) as sess:
        return (
            yield from _reconstruct(
                frames,
                pose_of,
                opt,
                sess,
                finish,
                T_base_camera,
                calibration,
                total,
                segment,
                progress_every,
            )
        )


def _reconstruct(
    frames: Iterable[RGBDFrame],
    pose_of: PoseFn | None,
    opt: ScanOptions,
    sess: ScanSession | ScanProcess,
    finish: bool,
    T_base_camera: NDArray[np.float64] | None,
    calibration: dict[str, Any] | None,
    total: int | None,
    segment: SegmentSettings | None,
    progress_every: int,
) -> Job[ScanResult | None]:
    t0 = time.perf_counter()
    track = sess.track
    thr = _Throttle(opt.preview_hz)
    fused_cost, last_fused = 0.0, -1e9
    warnings: list[str] = []
    n = 0
    it: Iterator[RGBDFrame] = iter(frames)
    while True:
        try:
            f = next(it)
        except StopIteration:
            break
        except DataFileError as exc:
            warnings.append(f"recording ended early: {exc}")
            yield Progress(None, f"recording broken after {n} frames; keeping them")
            break
        pose = pose_of(f) if pose_of is not None else f.T_world_camera
        sess.add(f, pose)
        n += 1
        if progress_every and (n == 1 or n % progress_every == 0):
            frac = None if not total else min(n / total, 1.0) * 0.9
            yield Progress(frac, _progress_text(sess, f.index, n, t0))
        if opt.preview_hz > 0 and thr.ready():
            pts = cols = None
            now = time.perf_counter()
            if now - last_fused >= 5 * fused_cost:  # fused surface: <= 20 % of the time
                pv = sess.preview()
                pts, cols = pv.points, pv.colors
                fused_cost, last_fused = time.perf_counter() - now, time.perf_counter()
            frac = None if not total else min(n / total, 1.0) * 0.9
            yield Progress(
                frac,
                _progress_text(sess, f.index, n, t0),
                {
                    "frame": FramePreview(f.color, f.depth_m, f.index),
                    "cloud": CloudPreview(
                        pts,
                        cols,
                        sess.frames_integrated,
                        sess.last_pose,
                        frame_points(f, sess.last_pose),
                    ),
                },
            )
        if opt.max_frames and n >= opt.max_frames:
            break
        if opt.stop is not None and opt.stop.is_set():
            warnings.append(f"stopped by the user after {n} frames")
            break
    if not finish:
        return None
    yield Progress(
        0.9, "closing loops, fusing, finding the support plane" if track else "segmenting"
    )
    seg = segment or SegmentSettings(
        seed=opt.seed,
        up=None if track else (0.0, 0.0, 1.0),
        triangle_budget=opt.triangle_budget,
        exclude=opt.exclude,
    )
    res = sess.finish(seg, T_base_camera, calibration)
    if warnings:
        from dataclasses import replace

        res = replace(res, warnings=tuple(warnings) + res.warnings)
    yield Progress(1.0, scan_summary(res))
    return res


def _progress_text(sess: ScanSession | ScanProcess, index: int, n: int, t0: float) -> str:
    fps = n / max(time.perf_counter() - t0, 1e-9)
    if isinstance(sess, ScanSession) and sess.track:
        tr = sess.tracker
        return (
            f"frame {index}: {tr.tracked_ratio():.0%} tracked, {len(tr.keyframes)} keyframes, "
            f"{len(tr.loop_edges)} loop edges, {fps:.1f} fps"
        )
    return (
        f"frame {index}: {sess.frames_integrated} integrated, "
        f"{len(sess.skipped)} skipped, {fps:.1f} fps"
    )


def scan_summary(result: ScanResult) -> str:
    """'3 objects, 12,000 triangles, 1 warning' (the artifact's summary line)."""
    return (
        f"{count(len(result.objects), 'object')}, "
        f"{count(len(result.scene_mesh.faces), 'triangle')}"
        + (f", {count(len(result.warnings), 'warning')}" if result.warnings else "")
    )
