"""`python main.py design --project P [--twin T] [--fit F] [--params NAME...]
[--trajectories ID...] [--amplitude A] [--duration S] [--sigma CH=S...] [--pushes]
[--candidates KEY...] [--top N] [--workers N] [--json]`.

The next recording to make: ranks the excitation library's motions (a chirp and a multisine
on all joints, a chirp and a step series on each joint, with `--pushes` pushes of each
object) by expected information gain about the parameters at the current estimate
(D-optimal; twins/fit/design.py). With `--fit` the estimate, parameters and recordings are the
fit's. Prints the ranking and the `record` command for the best motion."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.jobs import run_cli
from resources.project import Project
from twins.errors import TwinError

HELP = "Rank library motions by expected information gain: which recording to make next."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    p.add_argument("--twin", default=None, help="twin artifact id (default: the fit's / latest)")
    p.add_argument("--fit", default=None, help="fit artifact: its estimate, params, recordings")
    p.add_argument("--params", nargs="+", default=[], help="dotted parameter names")
    p.add_argument("--trajectories", nargs="*", default=None, help="recordings already made")
    p.add_argument("--amplitude", type=float, default=0.1, help="fraction of joint range")
    p.add_argument("--duration", type=float, default=6.0, help="candidate length, s")
    p.add_argument(
        "--sigma",
        nargs="+",
        default=[],
        metavar="CH=S",
        help="measurement noise per channel (default robot/joint_pos=0.001 rad)",
    )
    p.add_argument("--pushes", action="store_true", help="also consider pushes of each object")
    p.add_argument(
        "--candidates",
        nargs="+",
        default=[],
        metavar="KEY",
        help="score only these (e.g. chirp multisine chirp:panda_joint4 steps:panda_joint1)",
    )
    p.add_argument("--top", type=int, default=8, help="how many to list")
    p.add_argument("--workers", type=int, default=1, help="parallel rollouts")
    p.add_argument("--json", action="store_true", help="print the ranking as JSON (last line)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _sigma(items: list[str]) -> dict[str, float] | None:
    if not items:
        return None
    out = {}
    for it in items:
        name, _, v = it.partition("=")
        try:
            out[name] = float(v)
        except ValueError:
            raise TwinError(f"--sigma {it}: expected CHANNEL=NUMBER") from None
    return out


def run(args: argparse.Namespace) -> int:
    # pybullet + trimesh (0.54 s): `design --help` and usage errors answer without them (app/cli.py)
    from app.workflows.design import record_command, suggest_job

    project = Project.open(args.project)
    ranked = run_cli(
        suggest_job(
            project,
            args.twin,
            args.params,
            args.fit,
            args.trajectories,
            args.amplitude,
            args.duration,
            _sigma(args.sigma),
            args.pushes,
            args.workers,
            args.candidates,
        ),
        args.quiet,
    )
    print(f"{'rank':<5}{'motion':<36}{'gain (nats)':>12}  std shrink per parameter")
    for i, s in enumerate(ranked[: args.top]):
        shrink = ", ".join(f"{k.split('.', 1)[-1]} {v:.0%}" for k, v in s.shrink.items())
        print(f"{i + 1:<5}{s.name:<36}{s.gain:>12.3f}  {shrink}")
    if ranked:
        print(
            f"next: {record_command(ranked[0])} --project {args.project} --port PORT "
            "--token-file FILE"
        )
    if args.json:
        print(json.dumps({"ranking": [s.to_json() for s in ranked]}))
    return 0
