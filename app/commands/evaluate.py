"""`python main.py evaluate --project P --policy ID [--twin T] [--episodes N] [--dr none|manual|
posterior] [--fit F] [--param NAME=DIST ...] [--noise none|typical] [--workers N] [--json]`.

Runs the policy's ONNX model for N episodes of its task in a twin (default: the twin it was
trained in), nominal or randomized, and writes a `run` artifact with the success rate and
its Wilson 95 % interval (lineage: policy, twin, fit).

`python main.py evaluate --project P --sim-vs-real [--json]`: the sim-vs-real table — per
policy and twin version, the robot's success over its real runs beside the twin's word on
it, and across policies their correlation and mean gap (app/workflows/sim_real.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.commands.train import add_dr_arguments
from app.jobs import run_cli
from policies.errors import PolicyError
from resources.project import Project

HELP = "Success rate of a policy in a twin (nominal or randomized), with a 95 % interval."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    p.add_argument("--policy", default=None, help="policy artifact id")
    p.add_argument(
        "--sim-vs-real",
        action="store_true",
        help="no new evaluation: the table of twin-predicted vs real success per policy",
    )
    p.add_argument("--twin", default=None, help="twin artifact id (default: the policy's twin)")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed", type=int, default=10_000, help="first episode seed")
    add_dr_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    # pybullet + trimesh (0.59 s): `evaluate --help` and usage errors answer without them (app/cli.py)
    from app.workflows.train import evaluate_job

    project = Project.open(args.project)
    if args.sim_vs_real:
        return _sim_vs_real(project, args.json)
    if not args.policy:
        raise PolicyError("evaluate: choose --policy ID (or --sim-vs-real)")
    rid = run_cli(
        evaluate_job(
            project,
            args.policy,
            args.twin,
            args.dr,
            args.fit,
            args.param,
            args.noise,
            args.episodes,
            args.seed,
            args.workers,
            args.backend,
            args.address,
        ),
        args.quiet or args.json,
    )
    res = json.loads((project.path_of(rid) / "eval.json").read_text(encoding="utf-8"))
    if args.json:
        print(json.dumps({"run": rid, **res}))
        return 0
    lo, hi = res["ci95"]
    print(
        f"run {rid}: {res['policy']} in twin {res['twin']} ({args.dr}): success "
        f"{res['success_rate']:.2f} [{lo:.2f}, {hi:.2f}] ({res['successes']}/{res['episodes']})"
    )
    for why, k in res["stopped"].items():
        print(f"  stopped early ({why}): {k}")
    return 0


def _sim_vs_real(project: object, as_json: bool) -> int:
    # pybullet + trimesh (0.54 s): `evaluate --help` and usage errors answer without them (app/cli.py)
    from app.workflows.sim_real import sim_real_table

    table = sim_real_table(project)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps(table.to_json()))
        return 0
    if not table.rows:
        print("no real deployments yet: `deploy` a policy to a robot first")
        return 0
    print(f"{'policy':<14} {'twin':<12} {'robot':<14} runs  real [95 %]          twin  gap")
    for r in table.rows:
        lo, hi = r.real_ci95
        src = "eval" if r.twin_eval_success is not None else "shadow"
        print(
            f"{r.policy:<14} {r.twin:<12} {r.robot:<14} {r.runs:>4}  {r.real_success:.2f} "
            f"[{lo:.2f}, {hi:.2f}]  {r.twin_success:.2f} ({src})  {r.mean_error_gap:.3f} {r.unit}"
        )
    p = (
        "n/a (fewer than 3 policies or no spread)"
        if table.pearson is None
        else f"{table.pearson:.2f}"
    )
    print(f"twin vs real success across policies: Pearson {p}, mean |gap| {table.abs_gap:.2f}")
    return 0
