"""`python main.py twin build --project P [--scan S] [--robot URDF] [--procedural]`,
`twin info --project P [--twin T]` and `twin set --project P TWIN NAME=VALUE ...`."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.jobs import run_cli
from resources.project import Project
from resources.text import count

HELP = (
    "Build a digital twin from a scan (+ a robot description) into a project, show one, "
    "or set parameter values as a new twin version. Robots: pybullet_data:<path>, "
    "resources:<path> or a URDF file; 'none' for none."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build", help="scan -> twin artifact")
    b.add_argument("--project", type=Path, required=True, help="project folder")
    b.add_argument("--scan", default=None, help="scan artifact id (default: the latest)")
    b.add_argument(
        "--robot",
        default="pybullet_data:franka_panda/panda.urdf",
        help="robot URDF (default: the Panda from pybullet_data; 'none' for none)",
    )
    b.add_argument(
        "--procedural",
        action="store_true",
        help="no scan yet: build from the procedural demo objects",
    )
    b.add_argument("--name", default=None, help="twin display name")
    b.add_argument(
        "--base-pose",
        type=float,
        nargs=7,
        default=None,
        metavar=("X", "Y", "Z", "QX", "QY", "QZ", "QW"),
        help="robot base in the scan frame (default: identity, scans are in the robot base frame)",
    )
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    i = sub.add_parser("info", help="parameters and notes of a twin")
    i.add_argument("--project", type=Path, required=True)
    i.add_argument("--twin", default=None, help="twin artifact id (default: the latest)")
    s = sub.add_parser(
        "set",
        help="parameter values by hand -> a new twin version (parent: TWIN, left unchanged)",
    )
    s.add_argument("--project", type=Path, required=True, help="project folder")
    s.add_argument("twin", metavar="TWIN", help="twin artifact id to start from")
    s.add_argument(
        "assignments",
        metavar="NAME=VALUE",
        nargs="+",
        help="a parameter as `twin info` names it and a number, optionally in the "
        "parameter's unit (robot.joints.panda_joint1.damping=0.5N*m*s/rad)",
    )
    s.add_argument("--name", default=None, help="display name of the new twin (default: TWIN's)")


def run(args: argparse.Namespace) -> int:
    # pybullet + trimesh (0.5 s): `twin --help` and usage errors answer without them (app/cli.py)
    from app.workflows.twin import build_twin, load_twin, set_twin_values, twin_summary

    project = Project.open(args.project)
    if args.action == "set":
        new, changes = set_twin_values(project, args.twin, args.assignments, args.name)
        set_ = count(len(changes), "parameter")
        print(f"twin {new}: {set_} set (parent {project.artifact(new).parent})")
        width = max(len(c.name) for c in changes)
        for c in changes:
            print(f"  {c.name:<{width}} {c.old:g} -> {c.new:g} {c.unit}")
        print(f"  folder: {project.path_of(new)}")
        return 0
    if args.action == "build":
        robot = None if args.robot.lower() == "none" else args.robot
        tid = run_cli(
            build_twin(
                project, args.scan, robot, args.name, args.procedural, base_pose=args.base_pose
            ),
            args.quiet,
        )
        _, spec = load_twin(project, tid)
    else:
        tid, spec = load_twin(project, args.twin)
    s = twin_summary(spec)
    print(
        f"twin {tid}: {s['objects']} objects, {s['params']} parameters"
        + (f", robot {s['robot']} ({s['joints']} joints)" if s["robot"] else ", no robot")
    )
    for n in s["notes"]:
        print(f"  note: {n}")
    if args.action == "info":
        for p in spec.params.values():
            print(
                f"  {p.name:<48} {p.nominal:>12.6g} {p.unit:<10} [{p.low:g}, {p.high:g}] {p.prior}"
            )
    print(f"  folder: {project.path_of(tid)}")
    return 0
