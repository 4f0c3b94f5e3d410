"""`python main.py train --project P --twin T --task NAME [--dr none|manual|posterior]
[--fit F] [--param NAME=DIST ...] [--noise none|typical] [--trainer cem|ppo] [--budget N]
[--set KEY=VALUE ...] [--workers N] [--backend local|ray] [--resume RUN] [--eval-episodes N]
[--progress bar|jsonl]`; `train --project P --retrain POLICY [--fit F]`.

Trains a policy in the (randomized) twin and writes a `policy` artifact (ONNX + spec +
training record, lineage to the twin and the fit). `--budget`: CEM generations (cem) or
environment steps (ppo). Ctrl-C keeps the run's checkpoint; `--resume RUN` continues it.
`--progress jsonl` prints one JSON progress record per line (the GUI's subprocess runs
read it: app.workflows.train.train_subprocess_job). `--retrain POLICY` retrains a policy
from its twin's newest fit (app/workflows/close_loop.py): same task settings, trainer and
budget, the fit's posterior as randomization, its failed real runs replayed in training.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from app.cli import main
from app.jobs import run_cli
from policies.errors import PolicyError
from resources.jobs import run_to_end
from resources.project import Project

HELP = "Train a policy in the (randomized) twin into a policy artifact (ONNX + spec)."


def add_dr_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dr", choices=("none", "manual", "posterior"), default="none")
    p.add_argument("--fit", default=None, help="fit artifact whose posterior --dr posterior uses")
    p.add_argument(
        "--param",
        nargs="+",
        default=[],
        metavar="NAME=DIST",
        help="--dr manual: uniform:LO:HI, loguniform:LO:HI, normal:MEAN:STD, "
        "lognormal:MEDIAN:SIGMA, fixed:V or prior",
    )
    p.add_argument(
        "--noise",
        choices=("none", "typical"),
        default="none",
        help="sensor noise, latency and tracking dropouts (typical: lab-like)",
    )
    p.add_argument("--workers", type=int, default=1, help="parallel rollouts")
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--address", default=None, help="Ray cluster address (--backend ray)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", type=Path, required=True, help="project folder")
    p.add_argument("--twin", default=None, help="twin artifact id (default: the latest)")
    p.add_argument("--task", default=None, help="task name (reach, push)")
    p.add_argument(
        "--retrain",
        default=None,
        metavar="POLICY",
        help="retrain this policy from the newest fit of its twin (or --fit): same task, "
        "trainer and budget, --dr posterior, its failed real runs replayed in training",
    )
    add_dr_arguments(p)
    p.add_argument("--trainer", choices=("cem", "ppo"), default="cem")
    p.add_argument(
        "--budget", type=int, default=None, help="CEM generations / PPO steps (default 10 / 200000)"
    )
    p.add_argument("--population", type=int, default=16, help="CEM candidates per generation")
    p.add_argument("--episodes", type=int, default=4, help="CEM episodes per candidate")
    p.add_argument("--n-envs", type=int, default=2, help="PPO environments")
    p.add_argument("--chunk", type=int, default=8192, help="PPO steps between checkpoints")
    p.add_argument(
        "--set", nargs="+", default=[], metavar="KEY=VALUE", help="task settings (JSON values)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", default=None, help="continue training run RUN from its checkpoint")
    p.add_argument("--eval-episodes", type=int, default=20, help="twin episodes after training")
    p.add_argument("--progress", choices=("bar", "jsonl"), default="bar")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items:
        key, sep, val = it.partition("=")
        if not sep:
            raise PolicyError(f"--set {it}: expected KEY=VALUE")
        try:
            out[key] = json.loads(val)
        except ValueError:
            out[key] = val
    return out


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def run(args: argparse.Namespace) -> int:
    # pybullet + trimesh (0.6 s): `train --help` and usage errors answer without them (app/cli.py)
    from app.workflows.train import TrainRequest, load_policy, train_job
    from policies.cem import CemSettings
    from policies.ppo import PpoSettings
    from policies.train import TrainSettings

    project = Project.open(args.project)
    if args.retrain:
        # pybullet + trimesh (0.6 s): `train --help` and usage errors answer without them (app/cli.py)
        from app.workflows.close_loop import retrain_argv

        argv = retrain_argv(project, args.retrain, args.fit)
        if args.progress == "bar" and not args.quiet:
            print("retraining: main.py " + " ".join(argv[:12]) + (" …" if len(argv) > 12 else ""))
        argv += ["--progress", args.progress, "--eval-episodes", str(args.eval_episodes)]
        return main(argv + (["--quiet"] if args.quiet else []))
    if not args.task:
        raise PolicyError("train: choose --task NAME (reach, push) or --retrain POLICY")
    settings = TrainSettings(
        trainer=args.trainer,
        seed=args.seed,
        cem=CemSettings(
            population=args.population,
            episodes=args.episodes,
            generations=args.budget or 10,
        ),
        ppo=PpoSettings(
            timesteps=args.budget or 200_000, n_envs=args.n_envs, chunk_steps=args.chunk
        ),
    )
    req = TrainRequest(
        task=args.task,
        twin_id=args.twin,
        dr=args.dr,
        fit_id=args.fit,
        params=tuple(args.param),
        noise=args.noise,
        overrides=overrides(args.set),
        settings=settings,
        workers=args.workers,
        backend=args.backend,
        address=args.address,
        resume=args.resume,
        eval_episodes=args.eval_episodes,
    )
    job = train_job(project, req)
    if args.progress == "jsonl":
        run_id: list[str] = []

        def emit(rec: Any) -> None:
            part = rec.partial if isinstance(rec.partial, dict) else {}
            if "run" in part and not run_id:
                run_id.append(part["run"])
            line = {"fraction": rec.fraction, "message": rec.message, "partial": part}
            print(json.dumps(_jsonable(line)), flush=True)

        try:
            pid = run_to_end(job, emit)
        except KeyboardInterrupt:
            job.close()
            print(json.dumps({"cancelled": run_id[0] if run_id else None}), flush=True)
            raise
        print(json.dumps({"result": pid}), flush=True)
        return 0
    pid = run_cli(job, args.quiet)
    pol = load_policy(project, pid)
    rec = pol.record
    print(f"policy {pid}: {rec['task']} by {rec['training']['trainer']}, {rec['wall_s']} s")
    print(
        f"  onnx check: {rec['onnx_check']['inputs']} inputs, max |ort - torch| {rec['onnx_check']['max_abs_err']:.2g}"
    )
    for which, ev in rec.get("evaluation", {}).items():
        lo, hi = ev["ci95"]
        print(
            f"  twin success ({which}): {ev['success_rate']:.2f} [{lo:.2f}, {hi:.2f}] over {ev['episodes']} episodes"
        )
    return 0
