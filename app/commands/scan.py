"""`python main.py scan --source lab|robot|realsense|FILE.db3|DIR --project P`: scan into a
project.

Handheld sources — a live RealSense, a recording without camera poses, a folder of RGB-D
frames in the TUM layout — are tracked frame to model against the growing TSDF
(reconstruction/tracking.py), with the depth range chosen from the data unless
`--depth-range` sets it. A scan that is empty or mostly untracked is an error: the command
names what failed and what to try, exits non-zero and saves nothing. A recording is kept by
reference (path, size, sha256 in scan.json); `--copy-recording` copies it into the scan.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HELP = (
    "Record and reconstruct a workspace from a camera source (the virtual lab, a live "
    "RealSense, a .db3/.bag recording or a folder of RGB-D frames in the TUM layout) into a "
    "scan artifact of a project."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        help="'lab' (virtual lab in-process), 'robot' (connected robot's wrist camera, "
        "guided path; --host/--port/--token-file), 'realsense[:SERIAL]' (live, handheld), "
        "a .db3/.bag recording, or a folder of RGB-D frames in the TUM layout "
        "(associations.txt or rgb.txt + depth.txt)",
    )
    p.add_argument("--project", type=Path, help="project folder")
    p.add_argument(
        "--voxel",
        type=float,
        default=None,
        help="TSDF voxel size, m (default: 0.004, handheld: from the depth range)",
    )
    p.add_argument("--frames", type=int, default=300, help="live camera: frames to scan")
    p.add_argument(
        "--depth-range",
        default="auto",
        metavar="MIN:MAX",
        help="handheld: depth used for tracking and fusion, m (e.g. 0.3:2.5); 'auto' "
        "(default) chooses it from the first frame",
    )
    p.add_argument(
        "--support-plane",
        default="auto",
        help="handheld: the plane the scene stands on: 'auto' (largest plane facing up, "
        "below the camera), 'none', a candidate number listed by an earlier run, or "
        "'a,b,c,d' (a x + b y + c z + d = 0 in the scan's frame)",
    )
    p.add_argument(
        "--copy-recording",
        action="store_true",
        help="copy the recording into the scan artifact (default: keep its path, size and "
        "sha256 only)",
    )
    p.add_argument(
        "--min-tracked",
        type=float,
        default=0.5,
        help="handheld: smallest share of frames that must track for the scan to be saved",
    )
    p.add_argument("--max-frames", type=int, default=None, help="recording: stop after N frames")
    p.add_argument("--stride", type=int, default=1, help="frame folder: use every N-th frame")
    p.add_argument("--lab-config", type=Path, default=None, help="lab truth config (lab only)")
    p.add_argument("--quick", action="store_true", help="lab: fewer views")
    p.add_argument("--list-cameras", action="store_true", help="list RealSense cameras and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--host", default="127.0.0.1", help="robot: agent / lab address")
    p.add_argument("--port", type=int, default=7700, help="robot: agent / lab TCP port")
    p.add_argument("--token-file", type=Path, default=None, help="robot: token file")
    p.add_argument("--views", type=int, default=8, help="robot: orbit views of the guided path")


# --- handheld scans (shared with `bench scan-real`) ------------------------------------------


@dataclass
class HandheldOptions:
    """How a handheld scan is tracked, fused and checked."""

    depth_range: tuple[float, float] | str = "auto"
    voxel_size: float | None = None  # None: depth_max / 300, within 4..12 mm
    support_plane: str = "auto"
    min_tracked_ratio: float = 0.5
    max_frames: int | None = None
    seed: int = 0
    preview_every: int = 10  # frames between progress records


def parse_depth_range(text: str) -> tuple[float, float] | str:
    """'auto' or 'MIN:MAX' (m) -> "auto" or (min, max); TwinbenchError names the problem."""
    from resources.errors import TwinbenchError

    if text.strip().lower() == "auto":
        return "auto"
    try:
        lo_s, hi_s = text.split(":")
        lo, hi = float(lo_s), float(hi_s)
    except ValueError as exc:
        raise TwinbenchError(
            f"--depth-range {text!r}: give MIN:MAX in metres, e.g. 0.3:2.5, or auto"
        ) from exc
    if not 0 <= lo < hi <= 20:
        raise TwinbenchError(f"--depth-range {text!r}: need 0 <= MIN < MAX <= 20 m")
    return lo, hi


def scan_handheld(frames: Iterable[Any], options: HandheldOptions, total: int | None = None) -> Any:
    """Job: track, fuse and segment a handheld frame stream -> ScanResult (not yet checked;
    see `reconstruction.pipeline.require_usable`)."""
    import time

    from app.jobs import Progress
    from devices.errors import DataFileError
    from reconstruction.pipeline import ScanSession, SegmentSettings
    from reconstruction.tsdf import TSDFSettings

    opt = options
    it: Iterator[Any] = iter(frames)
    sess: ScanSession | None = None
    n = 0
    t0 = time.perf_counter()
    warnings: list[str] = []
    while True:
        try:
            f = next(it)
        except StopIteration:
            break
        except DataFileError as exc:
            warnings.append(f"recording ended early: {exc}")
            break
        if sess is None:
            sess = _session(f, opt, ScanSession, TSDFSettings)
        sess.add(f, None)
        n += 1
        if n % opt.preview_every == 0 or n == 1:
            frac = None if not total else min(n / total, 1.0) * 0.9
            tr = sess.tracker
            yield Progress(
                frac,
                f"frame {f.index}: {tr.tracked_ratio():.0%} tracked, "
                f"{len(tr.keyframes)} keyframes, {len(tr.loop_edges)} loop edges, "
                f"{n / max(time.perf_counter() - t0, 1e-9):.1f} fps",
            )
        if opt.max_frames and n >= opt.max_frames:
            break
    if sess is None:
        from reconstruction.errors import ReconstructionError

        raise ReconstructionError("the source gave no frames: nothing to scan")
    yield Progress(0.9, "closing loops, fusing, finding the support plane")
    seg = SegmentSettings(seed=opt.seed, up=None, support_plane=opt.support_plane)
    res = sess.finish(seg)
    res = replace(
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
        warnings=tuple(warnings) + res.warnings,
    )
    yield Progress(1.0, f"{len(res.objects)} objects, {len(res.scene_mesh.faces)} triangles")
    return res


def _session(first: Any, opt: HandheldOptions, session_cls: Any, settings_cls: Any) -> Any:
    from reconstruction.tracking import choose_depth_range

    rng = opt.depth_range
    lo, hi = choose_depth_range([first]) if isinstance(rng, str) else rng
    voxel = opt.voxel_size or round(min(max(hi / 300, 0.004), 0.012), 4)
    st = settings_cls(voxel_size=voxel, depth_min=lo, depth_max=hi, table_z=None, block_count=20000)
    return session_cls(st, track=True)


def open_handheld(spec: str, stride: int = 1, max_frames: int | None = None) -> Any:
    """A handheld source for `spec` (a TUM folder or a recording without poses), opened by
    the caller as a context manager. DataFileError when it is neither."""
    from devices.cameras.tum import TumFolderSource, is_tum_folder
    from devices.errors import DataFileError

    p = Path(spec)
    if p.is_dir():
        if not is_tum_folder(p):
            raise DataFileError(
                f"{p}: a folder source must be in the TUM RGB-D layout (associations.txt, or "
                "rgb.txt and depth.txt, beside the rgb/ and depth/ images)"
            )
        return TumFolderSource(p, stride=stride, max_frames=max_frames)
    from devices.cameras.playback import PlaybackSource

    return PlaybackSource(p)


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


def scan_source(spec: str, options: HandheldOptions, stride: int = 1) -> Any:
    """Job: a handheld scan of a TUM folder or a recording without poses, with the
    recording's reference in `capture["recording"]`."""
    from app.jobs import Progress

    src = open_handheld(spec, stride, options.max_frames)
    with src:
        total = len(src) if hasattr(src, "__len__") else None
        yield Progress(0.0, f"reading {spec}")
        res = yield from scan_handheld(src.frames(), options, total)
        extra = list(getattr(src, "warnings", []))
        if getattr(src, "dropped", None):
            extra.append(f"{len(src.dropped)} frames missing from the recording")
    ref = recording_reference(Path(spec))
    return replace(
        res, capture={**res.capture, "recording": ref}, warnings=tuple(extra) + res.warnings
    )


def _is_handheld_recording(spec: str) -> bool:
    """A folder, or a .db3/.bag without camera poses in its sidecar."""
    p = Path(spec)
    if p.is_dir():
        return True
    from devices.cameras.source import CaptureInfo

    try:
        info = CaptureInfo.load(p)
    except Exception:  # noqa: BLE001 - a corrupt sidecar is reported by the playback path
        return False
    return info is None or not info.poses


def save_handheld(
    project: Any, res: Any, recording: Path | None, copy: bool, settings: dict[str, Any]
) -> str:
    """Write the scan artifact; copy the recording into it only when asked."""
    summary = f"{len(res.objects)} objects, {len(res.scene_mesh.faces)} triangles" + (
        f", {len(res.warnings)} warnings" if res.warnings else ""
    )
    if recording is not None:
        res = replace(
            res,
            capture={
                **res.capture,
                "recording": {**res.capture.get("recording", {}), "copied": copy},
            },
        )
    with project.new_artifact("scan", settings=settings, summary=summary) as folder:
        res.save(folder)
        if copy and recording is not None:
            if recording.is_dir():
                shutil.copytree(recording, folder / "recording")
            else:
                from devices.cameras.source import sidecar_path

                dst = folder / f"recording{recording.suffix}"
                shutil.copy2(recording, dst)
                if sidecar_path(recording).is_file():
                    shutil.copy2(sidecar_path(recording), sidecar_path(dst))
    return str(project.artifacts("scan")[-1].id)


def run(args: argparse.Namespace) -> int:
    from app.jobs import run_cli
    from app.project import Project
    from app.workflows.scan import ScanOptions, save_scan, scan_recording
    from reconstruction.pipeline import require_usable

    if args.list_cameras:
        from devices.cameras.realsense import list_devices

        devs = list_devices()
        if not devs:
            print("no RealSense connected")
        for d in devs:
            print(f"{d.name}  serial {d.serial}  firmware {d.firmware}  USB {d.usb}")
        return 0
    if not args.source or not args.project:
        from resources.errors import TwinbenchError

        raise TwinbenchError(
            "scan needs --source (lab, robot, realsense, a .db3/.bag file or a TUM frame "
            "folder) and --project (a project folder; create one with `project new`)"
        )
    project = Project.open(args.project)
    hand = HandheldOptions(
        depth_range=parse_depth_range(args.depth_range),
        voxel_size=args.voxel,
        support_plane=args.support_plane,
        min_tracked_ratio=args.min_tracked,
        max_frames=args.max_frames,
    )
    settings: dict[str, Any] = {"source": args.source, "voxel_size": args.voxel}
    with tempfile.TemporaryDirectory(prefix="twinbench-scan-") as tmp:
        rec: Path | None = Path(tmp) / "recording.db3"
        if args.source in ("lab", "robot"):
            opt = ScanOptions(voxel_size=args.voxel or 0.004)
            if args.source == "lab":
                res = run_cli(_scan_lab(opt, args.lab_config, rec, args.quick), args.quiet)
            else:
                from app.workflows.scan_robot import RobotScanPlan, scan_robot
                from devices.robots.auth import load_token
                from devices.robots.client import RobotClient

                with RobotClient(args.host, args.port, load_token(args.token_file)) as robot:
                    res = run_cli(
                        scan_robot(robot, opt, rec, RobotScanPlan(views=args.views)), args.quiet
                    )
            require_usable(res, 0.0)
            aid = save_scan(project, res, rec, settings=settings)
        elif args.source.startswith("realsense"):
            from devices.cameras.realsense import RealSenseSource

            cam = RealSenseSource(serial=args.source.partition(":")[2] or None)
            assert rec is not None
            cam.record_to(rec)
            hand.max_frames = args.frames
            with cam:
                res = run_cli(scan_handheld(cam.frames(), hand, args.frames), args.quiet)
            require_usable(res, hand.min_tracked_ratio)
            aid = save_handheld(project, res, rec, True, settings)
        elif _is_handheld_recording(args.source):
            src = Path(args.source)
            settings.update({"depth_range": args.depth_range, "support_plane": args.support_plane})
            res = run_cli(scan_source(args.source, hand, args.stride), args.quiet)
            require_usable(res, hand.min_tracked_ratio)
            aid = save_handheld(project, res, src, args.copy_recording, settings)
        else:
            src = Path(args.source)
            res = run_cli(
                scan_recording(src, ScanOptions(voxel_size=args.voxel or 0.004)), args.quiet
            )
            require_usable(res, 0.0)
            ref = {**recording_reference(src), "copied": bool(args.copy_recording)}
            res = replace(res, capture={**res.capture, "recording": ref})
            if args.copy_recording:
                aid = save_scan(project, res, src, settings=settings)
            else:
                aid = save_scan(project, res, None, settings=settings)
    _report(aid, res)
    return 0


def _scan_lab(opt: Any, config: Path | None, rec: Path | None, quick: bool) -> Any:
    """The guided lab scan, wherever the workflows keep it (it is moving to the protocol)."""
    try:
        from app.workflows.scan_robot import scan_lab
    except ImportError:
        from app.workflows.scan import scan_lab  # type: ignore[attr-defined,no-redef]
    return scan_lab(opt, config, rec, quick)


def _report(aid: str, res: Any) -> None:
    print(f"scan {aid}: {len(res.objects)} objects, {len(res.scene_mesh.faces)} triangles")
    path = res.camera_path
    if path is not None:
        tr = res.quality.get("tracking", {})
        print(
            f"  tracked {int(path.tracked.sum())}/{len(path.tracked)} frames "
            f"({path.tracked_ratio:.0%}), {tr.get('keyframes', 0)} keyframes, "
            f"{tr.get('loop_edges', 0)} loop edges; camera path in camera_path.txt (TUM)"
        )
    sp = res.quality.get("support_plane")
    if sp and res.table_plane is not None:
        print(f"  support plane {[round(float(v), 4) for v in res.table_plane]} ({sp['rule']})")
    for o in res.objects:
        ext = " x ".join(f"{e * 100:.1f}" for e in o.mesh.extents)
        print(f"  {o.name:<12} {ext} cm  watertight={o.watertight}")
    for w in res.warnings:
        print(f"  warning: {w}")
    if res.calibration.get("hand_eye"):
        he = res.calibration["hand_eye"]
        print(
            f"  hand-eye: {len(he['views'])} views, mean residual "
            f"{he['mean_residual_mm']:.2f} mm, max reprojection {he['max_reproj_px']:.2f} px"
        )
