"""`python main.py fit --project P --twin T --trajectories ID... --params NAME...
[--validation ID...] [--channels NAME=W...] [--bounds NAME=LO:HI...] [--window S] [--budget N] [--workers N]
[--posterior laplace|smc] [--particles N] [--pose-rotation rad|gyration|position] [--global N] [--backend local|ray] [--address A] [--resume FIT] [--apply]`.

Fits twin parameters to recorded trajectories (CMA-ES + least-squares polish; posterior by
Laplace or sampled by SMC; twins/fit/steps.py, twins/fit/posterior_stage.py) and writes a `fit` artifact;
`--apply` then makes a new twin version at the estimate (parent: the fitted twin). `fit apply --project P --fit F` applies
an earlier fit. Ctrl-C leaves a resumable cancelled fit (`--resume` its id).
`fit --compare T1 T2 --trajectories ID...` compares twin versions on (held-out) recordings."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from app.jobs import run_cli
from resources.project import Project
from twins.errors import TwinError

HELP = "Fit twin parameters to recorded trajectories; --apply makes a new twin version."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    p.add_argument("--twin", default=None, help="twin artifact id (default: the latest)")
    p.add_argument("--trajectories", nargs="+", default=[], help="trajectory ids to fit on")
    p.add_argument("--validation", nargs="*", default=[], help="held-out trajectory ids")
    p.add_argument("--params", nargs="+", default=[], help="dotted parameter names to fit")
    p.add_argument(
        "--channels",
        nargs="+",
        default=["robot/joint_pos=1"],
        help="channels and weights, NAME=W (default robot/joint_pos=1; an object-only "
        "recording: objects/NAME/pose=1 per tracked object)",
    )
    p.add_argument(
        "--bounds",
        nargs="+",
        default=[],
        metavar="NAME=LO:HI",
        help="narrow a parameter's search range (within its own bounds)",
    )
    p.add_argument("--window", type=float, default=1.0, help="replay window, s (0 = whole)")
    p.add_argument("--budget", type=int, default=200, help="CMA-ES evaluations")
    p.add_argument("--polish", type=int, default=4, help="least-squares rounds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--posterior",
        choices=("laplace", "smc"),
        default="laplace",
        help="uncertainty: Laplace at the optimum (no extra replays) or sampled by SMC "
        "(kernel ABC on the residuals; --particles replays per move, several moves)",
    )
    p.add_argument("--particles", type=int, default=64, help="SMC particles (--posterior smc)")
    p.add_argument(
        "--pose-rotation",
        choices=("rad", "gyration", "position"),
        default="rad",
        help="object pose channels: add rotation residuals as radians (rad), as metres of "
        "the object's displacement, times its radius of gyration (gyration), or fit the "
        "positions only (position; orientation errors still reported)",
    )
    p.add_argument(
        "--global",
        dest="global_samples",
        type=int,
        default=0,
        metavar="N",
        help="a coarse global stage first: N Sobol points over the search box (0: none)",
    )
    p.add_argument("--workers", type=int, default=1, help="parallel rollouts")
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--address", default=None, help="Ray cluster address (--backend ray)")
    p.add_argument("--resume", default=None, help="continue a cancelled fit artifact")
    p.add_argument("--apply", action="store_true", help="make a new twin version at the fit")
    p.add_argument("--fit", default=None, help="apply this earlier fit (no new fit)")
    p.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="TWIN",
        help="no fit: compare these twin versions on --trajectories (windowed replay RMSE)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _channels(items: list[str]) -> dict[str, float]:
    out = {}
    for it in items:
        name, _, w = it.partition("=")
        try:
            out[name] = float(w) if w else 1.0
        except ValueError:
            raise TwinError(f"--channels {it}: weight must be a number") from None
    return out


def _bounds(items: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for it in items:
        name, _, rng = it.partition("=")
        lo, _, hi = rng.partition(":")
        try:
            out[name] = (float(lo), float(hi))
        except ValueError:
            raise TwinError(f"--bounds {it}: expected NAME=LO:HI with numbers") from None
    return out


def _num(v: float | None) -> str:
    return "failed" if v is None or not math.isfinite(v) else f"{v:.5g}"


def _compare_table(rows: list[dict], keys: list[str]) -> str:
    """Twin versions as rows, windowed-replay RMSE per recording (and over all) as columns,
    one column per recording and channel."""
    chans = list(rows[0][keys[0]]) if rows else []
    head = ["twin", "parent"] + [f"{k}:{c}" for k in keys for c in chans]
    body = [
        [r["twin"], r["parent"] or "-"] + [_num(r[k].get(c)) for k in keys for c in chans]
        for r in rows
    ]
    width = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(x[i].ljust(width[i]) for i in range(len(head))) for x in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in width))
    return "\n".join(["rmse (channel units) on held-out recordings, windowed replay", *lines])


def run(args: argparse.Namespace) -> int:
    # pybullet + trimesh (0.6 s): `fit --help` and usage errors answer without them (app/cli.py)
    from app.workflows.fit import apply_fit, compare_twins, fit_job, fit_summary
    from twins.fit import FitConfig

    project = Project.open(args.project)
    if args.compare:
        rows = compare_twins(
            project,
            args.compare,
            args.trajectories,
            args.window if args.window > 0 else None,
            list(_channels(args.channels)),
        )
        print(_compare_table(rows, [*args.trajectories, "all"]))
        return 0
    if args.fit:
        new = apply_fit(project, args.fit)
        print(f"twin {new}: fit {args.fit} applied (parent {project.artifact(new).parent})")
        return 0
    if not args.params and not args.resume:
        raise TwinError("fit: choose --params NAME ... (see `python main.py twin info`)")
    params = tuple(args.params)
    if args.resume and not params:
        params = tuple(fit_summary(project, args.resume)["settings"]["config"]["params"])
    config = FitConfig(
        params=params,
        channels=_channels(args.channels),
        bounds=_bounds(args.bounds),
        window_s=args.window if args.window > 0 else None,
        budget=args.budget,
        polish_rounds=args.polish,
        seed=args.seed,
        posterior=args.posterior,
        particles=args.particles,
        pose_rotation=args.pose_rotation,
        global_samples=args.global_samples,
    )
    fid = run_cli(
        fit_job(
            project,
            args.twin,
            args.trajectories,
            config,
            args.validation,
            args.backend,
            args.workers,
            args.address,
            args.resume,
        ),
        args.quiet,
    )
    d = fit_summary(project, fid)
    print(f"fit {fid}: {d['evaluations']} evaluations, {d['failed']} failed, {d['wall_s']} s")
    post = d["posterior"]["params"]
    for name, est in d["estimate"].items():
        lo, hi = post[name]["interval90"]
        flag = "" if post[name]["identifiable"] else f"  NOT IDENTIFIABLE: {post[name]['why']}"
        print(
            f"  {name:<44} {d['start'][name]:>10.5g} -> {est:<10.5g} 90% [{lo:.5g}, {hi:.5g}]{flag}"
        )
    for which in ("train", "validation"):
        before, after = d[f"{which}_rmse_before"], d[f"{which}_rmse_after"]
        for ch in after:
            b, a = before.get(ch), after[ch]
            print(f"  {which} rmse {ch}: {_num(b)} -> {_num(a)}")
    for n in d["notes"]:
        print(f"  note: {n}")
    if args.apply:
        new = apply_fit(project, fid)
        print(f"twin {new}: fit applied (parent {project.artifact(new).parent})")
    return 0
