"""Scan workflows (Qt-free jobs shared by the CLI and the Scan page).

- The frame loop itself (`reconstruct_frames`, `ScanOptions`, previews) is
  `app/workflows/scan_frames.py`, shared with the handheld and robot scans.
- `scan_recording(path)`: a .db3/.bag; poses from the capture sidecar, else RGB-D odometry.
- `scan_realsense()`: a live camera, handheld (odometry).
- The guided scan of a connected robot or the virtual lab (calibration, wrist-camera path,
  fixed camera) is `app/workflows/scan_robot.py`, through the robot protocol only.
- `save_scan(project, result)`: the ScanResult as a project artifact.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from app.workflows.scan_frames import ScanOptions, reconstruct_frames, scan_summary
from app.workflows.scan_handheld import (
    HandheldOptions,
    is_handheld_recording,
    scan_handheld,
    scan_source,
)
from devices.cameras.playback import PlaybackSource
from devices.cameras.realsense import RealSenseSource
from devices.cameras.source import sidecar_path
from reconstruction.scan_result import ScanResult, require_usable
from resources.jobs import Job, Progress
from resources.project import Project

log = logging.getLogger(__name__)


def scan_recording(path: Path, options: ScanOptions | None = None) -> Job[ScanResult]:
    """Reconstruct a RealSense recording: with the capture sidecar's camera poses (lab and
    robot scans), else as a handheld scan (app/workflows/scan_handheld.py: tracked, depth
    range from the data, an empty or mostly untracked scan is an error)."""

    opt = options or ScanOptions()

    if is_handheld_recording(path):
        hand = HandheldOptions(
            depth_range=opt.depth_range,
            max_frames=opt.max_frames,
            seed=opt.seed,
            preview_hz=opt.preview_hz,
            loop_closure=opt.loop_closure,
        )
        tracked = yield from scan_source(path, hand, stop=opt.stop)
        require_usable(tracked, hand.min_tracked_ratio)
        return tracked
    src = PlaybackSource(Path(path))
    if src.info is not None and src.info.meta.get("exclude") and not opt.exclude:
        opt.exclude = [(np.asarray(lo), np.asarray(hi)) for lo, hi in src.info.meta["exclude"]]
    with src:
        yield Progress(0.0, f"playing {path} ({src.duration_s:.1f} s, recorded poses)")
        total = src.info.frames if src.info is not None else None
        res = yield from reconstruct_frames(src.frames(), None, opt, total=total)
        assert res is not None
        extra = [*src.warnings]
        if src.dropped:
            extra.append(
                f"{len(src.dropped)} frames missing from the recording (first: {src.dropped[:5]})"
            )
        from dataclasses import replace

        capture = {
            **res.capture,
            "recording": str(path),
            "sdk_version_recorded": src.info.sdk_version if src.info else None,
            "frames_read": src.frames_read,
            "dropped": src.dropped,
        }
        calib = src.info.meta.get("calibration", {}) if src.info else {}
        T = src.info.meta.get("T_base_camera") if src.info else None
        return replace(
            res,
            warnings=tuple(extra) + res.warnings,
            capture=capture,
            calibration=calib or res.calibration,
            T_base_camera=np.asarray(T) if T is not None else res.T_base_camera,
        )


def scan_realsense(
    options: ScanOptions | None = None, record: Path | None = None, frames: int = 300
) -> Job[ScanResult]:
    """Handheld scan with a live RealSense (tracked like any handheld source)."""

    opt = options or ScanOptions()
    hand = HandheldOptions(
        depth_range=opt.depth_range,
        max_frames=frames,
        seed=opt.seed,
        preview_hz=opt.preview_hz,
        loop_closure=opt.loop_closure,
    )
    cam = RealSenseSource()
    if record is not None:
        cam.record_to(record)
    with cam:
        res = yield from scan_handheld(cam.frames(), hand, frames, opt.stop)
    require_usable(res, hand.min_tracked_ratio)
    return res


def rename_object(result: ScanResult, old: str, new: str) -> ScanResult:
    """The scan with object `old` called `new` (names must stay unique and file-safe)."""
    return result.renamed(old, new)


def drop_object(result: ScanResult, name: str) -> ScanResult:
    return result.without(name)


def recolor_object(result: ScanResult, name: str, rgb: tuple[int, int, int]) -> ScanResult:
    return result.recolored(name, rgb)


def save_scan(
    project: Project,
    result: ScanResult,
    recording: Path | None = None,
    inputs: tuple[str, ...] = (),
    settings: dict[str, Any] | None = None,
    parent: str | None = None,
) -> str:
    """Write `result` (and its recording + sidecar) as a new scan artifact; returns its id."""
    with project.new_artifact(
        "scan",
        inputs=inputs,
        settings=settings or {},
        summary=scan_summary(result),
        parent=parent,
    ) as folder:
        result.save(folder)
        if recording is not None and Path(recording).is_file():
            shutil.copy2(recording, folder / "recording.db3")
            if sidecar_path(recording).is_file():
                shutil.copy2(sidecar_path(recording), sidecar_path(folder / "recording.db3"))
    art = project.artifacts("scan")[-1]
    return art.id


def save_scan_job(
    project: Project,
    result: ScanResult,
    recording: Path | None = None,
    settings: dict[str, Any] | None = None,
    parent: str | None = None,
) -> Job[str]:
    """Job: `save_scan` off the GUI thread (meshes and recordings are written to disk)."""
    yield Progress(None, "saving the scan to the project")
    aid = save_scan(project, result, recording, settings=settings, parent=parent)
    log.info("saved scan %s (%s)", aid, project.artifact(aid).summary)
    return aid


def load_scan_job(project: Project, scan_id: str) -> Job[ScanResult]:
    """Job: read a saved scan artifact (meshes, objects, calibration) for viewing."""
    yield Progress(None, f"reading scan {scan_id}")
    return ScanResult.load(project.path_of(scan_id))
