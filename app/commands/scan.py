"""`python main.py scan --source lab|realsense|FILE.db3 --project P`: scan into a project."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

HELP = (
    "Record and reconstruct a workspace from a camera source (the virtual lab, a live "
    "RealSense, or a .db3/.bag recording) into a scan artifact of a project."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        help="'lab' (virtual lab, own process), 'robot' (connected robot's wrist camera, "
        "guided path; --host/--port/--token-file), 'realsense[:SERIAL]' (live, handheld), "
        "or a .db3/.bag recording",
    )
    p.add_argument("--project", type=Path, help="project folder")
    p.add_argument("--voxel", type=float, default=0.004, help="TSDF voxel size, m")
    p.add_argument("--frames", type=int, default=300, help="live camera: frames to scan")
    p.add_argument("--lab-config", type=Path, default=None, help="lab truth config (lab only)")
    p.add_argument("--quick", action="store_true", help="lab: fewer views")
    p.add_argument("--list-cameras", action="store_true", help="list RealSense cameras and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--host", default="127.0.0.1", help="robot: agent / lab address")
    p.add_argument("--port", type=int, default=7700, help="robot: agent / lab TCP port")
    p.add_argument("--token-file", type=Path, default=None, help="robot: token file")
    p.add_argument("--views", type=int, default=8, help="robot: orbit views of the guided path")


def run(args: argparse.Namespace) -> int:
    from app.jobs import run_cli
    from app.project import Project
    from app.workflows.scan import (
        ScanOptions,
        save_scan,
        scan_realsense,
        scan_recording,
    )

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
            "scan needs --source (lab, realsense or a .db3/.bag file) and "
            "--project (a project folder; create one with `project new`)"
        )
    project = Project.open(args.project)
    opt = ScanOptions(voxel_size=args.voxel)
    with tempfile.TemporaryDirectory(prefix="twinbench-scan-") as tmp:
        rec: Path | None = Path(tmp) / "recording.db3"
        if args.source == "lab":
            from app.workflows.scan_robot import scan_lab

            res = run_cli(scan_lab(opt, args.lab_config, rec, args.quick), args.quiet)
        elif args.source == "robot":
            from app.workflows.scan_robot import RobotScanPlan, scan_robot
            from devices.robots.auth import load_token
            from devices.robots.client import RobotClient

            with RobotClient(args.host, args.port, load_token(args.token_file)) as robot:
                res = run_cli(
                    scan_robot(robot, opt, rec, RobotScanPlan(views=args.views)), args.quiet
                )
        elif args.source.startswith("realsense"):
            res = run_cli(scan_realsense(opt, rec, args.frames), args.quiet)
        else:
            rec = Path(args.source)
            res = run_cli(scan_recording(rec, opt), args.quiet)
        aid = save_scan(
            project, res, rec, settings={"source": args.source, "voxel_size": args.voxel}
        )
    print(f"scan {aid}: {len(res.objects)} objects, {len(res.scene_mesh.faces)} triangles")
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
    return 0
