"""`python main.py deploy --project P --policy ID --host H --port N --token-file F
[--target Q...] [--goal-seed K] [--camera NAME] [--camera-pose FILE] [--object-goal X Y]
[--shadow-only] [--duration S] [--ramp S] [--json]`.

A push policy observes its object: the robot's camera (`--camera`, default the scan's
calibrated fixed camera) is tracked on the workbench and the poses are streamed to the
robot during the run; `--camera-pose` gives the camera's pose (a `calibrate --out` JSON
with T_base_camera) when the twin's scan has none.

Checks the policy's spec against the robot (refused before upload, naming what differs),
predicts the run in the policy's twin from the robot's measured state (shadow run), then
uploads and runs it inside the robot's envelope and saves the real run (trajectory + run
artifacts: success by the task's criterion on the measured state, predicted vs real).
Ctrl-C stops the robot; what happened until then is saved. `--refit` afterwards sends the
run to Real2Sim (a refit of the twin with the new recording added); a refit whose replays
failed saves nothing and exits with code 2 and the reason ("12 of 12 replays failed: …")."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.jobs import run_cli
from devices.robots.wire.auth import load_token
from resources.project import Project

HELP = "Deploy a policy to a connected robot: spec check, twin prediction, run, record."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    p.add_argument("--policy", required=True, help="policy artifact id")
    p.add_argument("--host", default="127.0.0.1", help="robot agent host")
    p.add_argument("--port", type=int, required=True, help="robot agent port")
    p.add_argument("--token-file", type=Path, default=None, help="robot token file")
    p.add_argument(
        "--target", type=float, nargs="+", default=None, help="reach goal, joint values (rad)"
    )
    p.add_argument(
        "--goal-seed", type=int, default=0, help="without --target: goal drawn by the task"
    )
    p.add_argument("--camera", default=None, help="push: the robot camera that sees the object")
    p.add_argument(
        "--camera-pose", type=Path, default=None, help="push: JSON with T_base_camera (4x4)"
    )
    p.add_argument(
        "--object-goal", type=float, nargs=2, default=None, help="push: object goal x y (m)"
    )
    p.add_argument("--shadow-only", action="store_true", help="predict only; nothing moves")
    p.add_argument("--duration", type=float, default=None, help="s (default: episode + ramp)")
    p.add_argument("--ramp", type=float, default=0.5, help="start ramp on the robot, s")
    p.add_argument("--refit", action="store_true", help="then send the run to Real2Sim")
    p.add_argument("--json", action="store_true", help="print the outcome as one JSON line")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    # open3d + pybullet (1.1-1.5 s): `deploy --help` and usage errors answer without them (app/cli.py)
    from app.workflows.close_loop import RefitError, refit_job
    from app.workflows.deploy import deploy_job
    from app.workflows.deploy_plan import plan_deploy, policy_object_source
    from devices.robots.client import RobotClient

    project = Project.open(args.project)
    with RobotClient(
        args.host, args.port, load_token(args.token_file), name="twinbench-deploy"
    ) as robot:
        objects = None
        if args.camera or args.camera_pose:
            objects = policy_object_source(
                project, args.policy, robot, args.camera, args.camera_pose
            )
        plan = plan_deploy(
            project, robot, args.policy, args.target, args.goal_seed, objects, args.object_goal
        )
        shadow = {
            "predicted_success": plan.shadow.success,
            "predicted_final_error": plan.shadow.final_error,
            "goal": plan.goal.tolist(),
            "start": plan.start.tolist(),
            **(
                {"object_start": plan.object_start.tolist()}
                if plan.object_start is not None
                else {}
            ),
        }
        if not args.json:
            print(f"spec fits {plan.robot}; {plan.summary()}")
        if args.shadow_only:
            if args.json:
                print(json.dumps({"policy": args.policy, **shadow}))
            return 0
        res = run_cli(
            deploy_job(project, robot, plan, args.duration, args.ramp), args.quiet or args.json
        )
    out = res.outcome
    if not args.json:
        print(
            f"run {res.run_id} (trajectory {res.trajectory_id}): {out['result']} "
            f"({out['ended']}); final error {out['final_error']:.3f} {out.get('unit', 'rad')}, "
            f"twin predicted {out['predicted_final_error']:.3f}"
        )
    fit_id, refit_error = None, None
    if args.refit:
        try:
            fit_id = run_cli(refit_job(project, res.trajectory_id), args.quiet or args.json)
        except RefitError as exc:  # the run is saved; the refit did not fit: nothing saved
            refit_error = str(exc)
    if args.json:
        extra = {"refit": fit_id} if fit_id else {}
        if refit_error:
            extra = {"refit_error": refit_error}
        print(json.dumps({"run": res.run_id, **out, **extra}))
    elif fit_id:
        print(f"refit {fit_id}: the twin fitted again with this run added")
    if refit_error:
        print(f"error: {refit_error}", file=sys.stderr)
        return 2
    return 0 if out["success"] else 1
