"""Handheld scans: one path for the CLI (`scan --source FILE|DIR|realsense`), the Scan page
and `bench scan-real`.

A live RealSense, a recording without camera poses, or a folder of RGB-D frames in the TUM
layout is tracked frame to model against the growing TSDF (reconstruction/tracking.py), with
the depth range chosen from the data unless the user sets it. The frame loop is
`app.workflows.scan_frames.reconstruct_frames` (live previews, stop, broken recordings keep what
they had); this module chooses the session, the segmentation and the bookkeeping of a
handheld scan, and keeps a recording by reference (path, size, sha256).
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.workflows.scan_frames import ScanOptions, reconstruct_frames, scan_summary
from devices.cameras.playback import PlaybackSource
from devices.cameras.source import CaptureInfo, sidecar_path
from devices.cameras.tum import TumFolderSource, is_tum_folder
from devices.errors import DataFileError
from devices.frames import RGBDFrame
from reconstruction.errors import ReconstructionError
from reconstruction.pipeline import ScanSession, SegmentSettings
from reconstruction.scan_result import ScanResult
from reconstruction.stream import read_ahead
from reconstruction.tracking import choose_depth_range
from reconstruction.tsdf import TSDFSettings
from resources.jobs import Job, Progress
from resources.project import Project


@dataclass
class HandheldOptions:
    """How a handheld scan is tracked, fused and checked."""

    depth_range: tuple[float, float] | str = "auto"
    voxel_size: float | None = None  # None: depth_max / 300, within 4..12 mm
    support_plane: str = "auto"
    min_tracked_ratio: float = 0.5
    max_frames: int | None = None
    seed: int = 0
    preview_hz: float = 0.0  # live previews for the Scan page; 0: progress text only
    preview_every: int = 10  # frames between progress records without previews
    # keyframe loop edges + pose graph at the end: for long sequences that come back to
    # where they started (off by default: on the TUM cabinet it costs 5x and changed nothing)
    loop_closure: bool = False


def handheld_session(first: RGBDFrame, opt: HandheldOptions) -> ScanSession:
    """A tracking session sized for the data: depth range from the first frame (or the
    user), voxel from the far limit."""
    rng = opt.depth_range
    lo, hi = choose_depth_range([first]) if isinstance(rng, str) else rng
    voxel = opt.voxel_size or round(min(max(hi / 300, 0.004), 0.012), 4)
    st = TSDFSettings(voxel_size=voxel, depth_min=lo, depth_max=hi, table_z=None, block_count=20000)
    return ScanSession(st, track=True, loop_closure=opt.loop_closure)


def scan_handheld(
    frames: Iterable[RGBDFrame],
    options: HandheldOptions,
    total: int | None = None,
    stop: Any = None,
) -> Job[ScanResult]:
    """Job: track, fuse and segment a handheld frame stream -> ScanResult (not yet checked;
    see `reconstruction.scan_result.require_usable`). `stop` (a threading.Event) ends the
    acquisition early and reconstructs what was seen."""
    opt = options
    it: Iterator[RGBDFrame] = iter(frames)
    t0 = time.perf_counter()
    try:
        first = next(it)
    except StopIteration:
        raise ReconstructionError("the source gave no frames: nothing to scan") from None
    except DataFileError as exc:
        raise ReconstructionError(f"the source broke before its first frame: {exc}") from None
    sess = handheld_session(first, opt)
    loop = ScanOptions(
        voxel_size=sess.tsdf.settings.voxel_size,
        depth_max=sess.tsdf.settings.depth_max,
        preview_hz=opt.preview_hz,
        max_frames=opt.max_frames,
        seed=opt.seed,
        stop=stop,
    )
    seg = SegmentSettings(seed=opt.seed, up=None, support_plane=opt.support_plane)
    res = yield from reconstruct_frames(
        # read and build the tracking views a frame ahead, on a second core
        read_ahead(itertools.chain([first], it), sess.prepare_frame),
        None,
        loop,
        track=True,
        session=sess,
        total=total,
        segment=seg,
        progress_every=0 if opt.preview_hz > 0 else opt.preview_every,
    )
    assert res is not None
    n = len(sess.track_s)
    return replace(
        res,
        capture={
            **res.capture,
            "depth_range_from": "data" if opt.depth_range == "auto" else "user",
        },
        quality={
            **res.quality,
            "frames_seen": n,
            "fps_end_to_end": round(n / max(time.perf_counter() - t0, 1e-9), 2),
        },
    )


def open_handheld(spec: str | Path, stride: int = 1, max_frames: int | None = None) -> Any:
    """A handheld source for `spec` (a TUM folder or a recording without poses), opened by
    the caller as a context manager. DataFileError when it is neither."""

    p = Path(spec)
    if p.is_dir():
        if not is_tum_folder(p):
            raise DataFileError(
                f"{p}: a folder source must be in the TUM RGB-D layout (associations.txt, or "
                "rgb.txt and depth.txt, beside the rgb/ and depth/ images)"
            )
        return TumFolderSource(p, stride=stride, max_frames=max_frames)

    return PlaybackSource(p)


def is_handheld_recording(spec: str | Path) -> bool:
    """A folder, or a .db3/.bag without camera poses in its sidecar."""
    p = Path(spec)
    if p.is_dir():
        return True

    try:
        info = CaptureInfo.load(p)
    except Exception:  # noqa: BLE001 - a corrupt sidecar is reported by the playback path
        return False
    return info is None or not info.poses


def recording_reference(path: Path) -> dict[str, Any]:
    """Path, size and sha256 of a recording file or frame folder (every file, sorted)."""
    p = Path(path).resolve()
    h = hashlib.sha256()
    files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
    size = 0
    for f in files:
        if p.is_dir():
            h.update(str(f.relative_to(p)).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
    return {
        "path": str(p),
        "kind": "folder" if p.is_dir() else p.suffix.lstrip("."),
        "files": len(files),
        "bytes": size,
        "sha256": h.hexdigest(),
    }


def scan_source(
    spec: str | Path, options: HandheldOptions, stride: int = 1, stop: Any = None
) -> Job[ScanResult]:
    """Job: a handheld scan of a TUM folder or a recording without poses, with the
    recording's reference in `capture["recording"]`."""
    src = open_handheld(spec, stride, options.max_frames)
    with src:
        total = len(src) if hasattr(src, "__len__") else None
        yield Progress(0.0, f"reading {spec} (handheld: tracking the camera)")
        res = yield from scan_handheld(src.frames(), options, total, stop)
        extra = list(getattr(src, "warnings", []))
        if getattr(src, "dropped", None):
            extra.append(f"{len(src.dropped)} frames missing from the recording")
    ref = recording_reference(Path(spec))
    return replace(
        res, capture={**res.capture, "recording": ref}, warnings=tuple(extra) + res.warnings
    )


def save_handheld(
    project: Project,
    res: ScanResult,
    recording: Path | None,
    copy: bool,
    settings: dict[str, Any],
) -> str:
    """Write the scan artifact; copy the recording into it only when asked."""

    if recording is not None:
        res = replace(
            res,
            capture={
                **res.capture,
                "recording": {**res.capture.get("recording", {}), "copied": copy},
            },
        )
    with project.new_artifact("scan", settings=settings, summary=scan_summary(res)) as folder:
        res.save(folder)
        if copy and recording is not None:
            if recording.is_dir():
                shutil.copytree(recording, folder / "recording")
            else:
                dst = folder / f"recording{recording.suffix}"
                shutil.copy2(recording, dst)
                if sidecar_path(recording).is_file():
                    shutil.copy2(sidecar_path(recording), sidecar_path(dst))
    return str(project.artifacts("scan")[-1].id)
