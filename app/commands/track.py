"""`python main.py track --project P --trajectory ID --scan ID [--camera NAME]
[--robot-description URDF] [--mount-link LINK]`: track the scan's objects in the camera
recording saved with a trajectory (`record --camera`) into a new trajectory artifact with
`objects/<name>/pose` and `objects/<name>/track_quality` channels (app/workflows/track.py;
`--camera-file F.db3` instead: an object-only recording from a camera file,
reconstruction/track_objects.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.jobs import run_cli
from resources.project import Project

HELP = (
    "Object poses from the camera: track the scan's objects in a recording's camera stream "
    "(robot masked by its kinematics) into a new trajectory artifact."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--trajectory", help="recording made with --camera")
    what.add_argument(
        "--camera-file",
        type=Path,
        help="a camera recording (.db3) of objects alone (tossed, slid, dropped; no robot) "
        "seen by the scan's calibrated fixed camera: an object-only recording",
    )
    p.add_argument("--scan", required=True, help="scan artifact: object models, fixed camera")
    p.add_argument("--camera", default=None, help="camera name (default: the recording's)")
    p.add_argument(
        "--robot-description",
        default=None,
        help="robot URDF (e.g. franka_panda/panda.urdf) to mask the robot; default: no mask",
    )
    p.add_argument(
        "--mount-link",
        default=None,
        help="a wrist camera's link (e.g. panda_hand): its pose is FK x the scan's hand-eye",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    # open3d (1.1-1.5 s): `track --help` and usage errors answer without them (app/cli.py)
    from app.workflows.track import track_artifact
    from reconstruction.track_objects import track_camera_file

    project = Project.open(args.project)
    if args.camera_file is not None:
        tid = run_cli(track_camera_file(project, args.camera_file, args.scan), args.quiet)
        print(f"trajectory {tid}: {project.artifact(tid).summary}")
        return 0
    job = track_artifact(project, args.trajectory, args.scan, args.camera, args.robot_description)
    tid = run_cli(job, args.quiet)
    print(f"trajectory {tid}: {project.artifact(tid).summary}")
    return 0
