"""`python main.py record --project P --host H --port N --token-file F --motion NAME
[--amplitude A] [--velocity V] [--duration S] [--joints J...] [--target X Y] [--direction DEG]
[--speed M/S] [--camera NAME] [--preview]`.

Plans an excitation motion from the library (devices/robots/excitation.py; pushes in
twins/pushes.py) from the connected robot's current pose, checks it against the limits the
robot reports, plays it through the robot protocol and saves the recording as a trajectory
artifact. `--preview` prints the plan (per joint range, peak speed) and moves nothing.
`--list` lists the library. Ctrl-C stops the robot and saves nothing."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from app.jobs import run_cli
from devices.errors import DeviceError
from devices.robots.wire.auth import load_token
from resources.project import Project

HELP = "Play an excitation motion on a connected robot and record it into a project."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, default=None, help="project folder")
    p.add_argument("--host", default="127.0.0.1", help="robot agent host")
    p.add_argument("--port", type=int, default=None, help="robot agent port")
    p.add_argument("--token-file", type=Path, default=None, help="robot token file")
    p.add_argument("--motion", default=None, help="library motion (see --list)")
    p.add_argument("--amplitude", type=float, default=None, help="fraction of joint range")
    p.add_argument("--velocity", type=float, default=None, help="fraction of speed limit")
    p.add_argument("--duration", type=float, default=None, help="seconds (chirp, multisine)")
    p.add_argument("--joints", nargs="+", default=None, help="joints to move (default all)")
    p.add_argument(
        "--target",
        type=float,
        nargs=2,
        default=None,
        metavar=("X", "Y"),
        help="push: object centre, m, robot base frame",
    )
    p.add_argument("--direction", type=float, default=None, help="push: direction, deg from +x")
    p.add_argument("--speed", type=float, default=None, help="push: tool speed, m/s")
    p.add_argument("--distance", type=float, default=None, help="push: how far, m")
    p.add_argument(
        "--camera", default=None, help="also record this robot camera (.db3 next to the data)"
    )
    p.add_argument("--preview", action="store_true", help="print the plan; move nothing")
    p.add_argument("--list", action="store_true", help="list the motion library")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _params(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("amplitude", "velocity", "duration", "direction", "speed", "distance"):
        v = getattr(args, key)
        if v is not None:
            out[key] = v
    if args.joints:
        out["joints"] = ",".join(args.joints)
    if args.target is not None:
        out["target_xy"] = tuple(args.target)
    return out


def run(args: argparse.Namespace) -> int:
    # numpy + ssl (40-50 ms each): `record --help` and usage errors answer without them (app/cli.py)
    from app.workflows.record import motion_names, plan_motion, record_job
    from devices.robots.client import RobotClient
    from devices.robots.excitation import EXCITATIONS
    from devices.robots.motion import derivatives

    if args.list:
        for name, ex in EXCITATIONS.items():
            defaults = ", ".join(f"{k}={v}" for k, v in ex.defaults.items())
            print(f"{name:<10} {ex.description}  [{defaults}]")
        print("push       push an object: --target X Y [--direction DEG --speed M/S --distance M]")
        return 0
    if not args.motion:
        raise DeviceError(f"record: choose --motion ({', '.join(motion_names())}; --list)")
    if args.port is None:
        raise DeviceError("record: --port of the robot agent is required (and --token-file)")
    project = None if args.preview else Project.open(args.project) if args.project else None
    if project is None and not args.preview:
        raise DeviceError("record: --project is required (or --preview to move nothing)")
    with RobotClient(
        args.host, args.port, load_token(args.token_file), name="twinbench-record"
    ) as robot:
        motion = plan_motion(robot, args.motion, **_params(args))
        print(f"plan: {motion.summary()}")
        qd, _ = derivatives(motion.t, motion.command)
        assert robot.info is not None
        for j, name in enumerate(motion.joint_names):
            span = np.ptp(motion.command[:, j])
            if span > 0:
                peak = float(np.max(np.abs(qd[:, j])))
                vlim = float(robot.info.limits.velocity[j])
                print(
                    f"  {name:<16} range {span:.3f} {'rad' if motion.mode == 'position' else 'N*m'}"
                    + (
                        f", peak speed {peak:.3f} rad/s ({peak / vlim:.0%} of limit)"
                        if motion.mode == "position"
                        else ""
                    )
                )
        for note in motion.notes:
            print(f"  note: {note}")
        if args.preview:
            return 0
        assert project is not None
        tid = run_cli(record_job(project, robot, motion, camera=args.camera), args.quiet)
    meta = project.artifact(tid)
    print(f"trajectory {tid}: {meta.summary}")
    return 0
