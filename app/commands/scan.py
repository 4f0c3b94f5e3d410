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
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.jobs import run_cli
from app.workflows.scan import save_scan, scan_recording
from app.workflows.scan_frames import ScanOptions

# the handheld path is shared with the Scan page and `bench scan-real`
from app.workflows.scan_handheld import (
    HandheldOptions,
    is_handheld_recording,
    recording_reference,
    save_handheld,
    scan_handheld,
    scan_source,
)
from app.workflows.scan_robot import RobotScanPlan, scan_lab, scan_robot
from devices.cameras.realsense import RealSenseSource, list_devices
from devices.robots.client import RobotClient
from devices.robots.wire.auth import load_token
from reconstruction.scan_result import require_usable
from resources.errors import TwinbenchError
from resources.project import Project

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
        "(default) chooses it from the first frame, up to where its depth noise passes 1 cm",
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
        "--loop-closure",
        action="store_true",
        help="handheld: register keyframes to older ones nearby and correct the path with a "
        "pose graph at the end (long sequences that return to where they started; slower)",
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


def parse_depth_range(text: str) -> tuple[float, float] | str:
    """'auto' or 'MIN:MAX' (m) -> "auto" or (min, max); TwinbenchError names the problem."""

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


def run(args: argparse.Namespace) -> int:
    if args.list_cameras:
        devs = list_devices()
        if not devs:
            print("no RealSense connected")
        for d in devs:
            print(f"{d.name}  serial {d.serial}  firmware {d.firmware}  USB {d.usb}")
        return 0
    if not args.source or not args.project:
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
        loop_closure=args.loop_closure,
    )
    settings: dict[str, Any] = {"source": args.source, "voxel_size": args.voxel}
    with tempfile.TemporaryDirectory(prefix="twinbench-scan-") as tmp:
        rec: Path | None = Path(tmp) / "recording.db3"
        if args.source in ("lab", "robot"):
            opt = ScanOptions(voxel_size=args.voxel or 0.004)
            if args.source == "lab":
                res = run_cli(_scan_lab(opt, args.lab_config, rec, args.quick), args.quiet)
            else:
                with RobotClient(args.host, args.port, load_token(args.token_file)) as robot:
                    res = run_cli(
                        scan_robot(robot, opt, rec, RobotScanPlan(views=args.views)), args.quiet
                    )
            require_usable(res, 0.0)
            aid = save_scan(project, res, rec, settings=settings)
        elif args.source.startswith("realsense"):
            cam = RealSenseSource(serial=args.source.partition(":")[2] or None)
            assert rec is not None
            cam.record_to(rec)
            hand.max_frames = args.frames
            with cam:
                job = scan_handheld(cam.frames(), hand, args.frames)
                res = run_cli(job, args.quiet)
            require_usable(res, hand.min_tracked_ratio)
            aid = save_handheld(project, res, rec, True, settings)
        elif is_handheld_recording(args.source):
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
    """The guided lab scan: the lab in its own process, reached through the protocol."""

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
