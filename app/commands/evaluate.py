"""`python main.py evaluate --project P --policy ID [--twin T] [--episodes N] [--dr none|manual|
posterior] [--fit F] [--param NAME=DIST ...] [--noise none|typical] [--workers N] [--json]`.

Runs the policy's ONNX model for N episodes of its task in a twin (default: the twin it was
trained in), nominal or randomized, and writes a `run` artifact with the success rate and
its Wilson 95 % interval (lineage: policy, twin, fit)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.commands.train import add_dr_arguments

HELP = "Success rate of a policy in a twin (nominal or randomized), with a 95 % interval."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    p.add_argument("--policy", required=True, help="policy artifact id")
    p.add_argument("--twin", default=None, help="twin artifact id (default: the policy's twin)")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--seed", type=int, default=10_000, help="first episode seed")
    add_dr_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from app.jobs import run_cli
    from app.project import Project
    from app.workflows.train import evaluate_job

    project = Project.open(args.project)
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
