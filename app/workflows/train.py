"""Train and evaluate workflows (Qt-free; the CLI and the GUI share them, docs/ARCHITECTURE.md §5).

- `randomization_for(project, twin_id, mode, ...)`: the training distribution: none, hand-set
  distributions on the twin's ParamSet, or the posterior samples of a fit of this twin (the
  fit the twin was made from, else the newest finished fit of it).
- `train_job(project, request)`: a job (generator of `Progress`) that trains in this process
  and writes a `policy` artifact (policy.onnx, policy.json with spec and training record,
  curve.json, check.npz) whose inputs are the twin (and the fit its posterior came from).
  Checkpoints go to `<project>/.train/<run>/`; a cancel or a crash leaves them there and
  `resume=<run>` continues.
- `train_subprocess_job(project_root, argv)`: the same through `main.py train ... --progress
  jsonl` in a child process (a crash in training cannot take the caller down); closing the
  job interrupts the child, which keeps its checkpoint.
- `evaluate_job(project, policy_id, ...)`: success rate with a Wilson 95 % interval in a
  twin (nominal and/or randomized), written as a `run` artifact (inputs: policy, twin).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.workflows.twin import load_twin
from policies.errors import PolicyError
from policies.evaluate import evaluate
from policies.policy import Policy
from policies.randomization import (
    TYPICAL_NOISE,
    Randomization,
    SensorNoise,
    load_posterior,
    manual,
)
from policies.train import TrainSettings, train_steps
from resources import atomic
from resources.jobs import Job, Progress
from resources.project import Project, ProjectError
from twins.executor import make_executor

DR_MODES = ("none", "manual", "posterior")
NOISE = {"none": SensorNoise(), "typical": TYPICAL_NOISE}
MAIN = Path(__file__).resolve().parents[2] / "main.py"


@dataclass(frozen=True)
class TrainRequest:
    """Everything `train` needs besides the project (the CLI's arguments)."""

    task: str
    twin_id: str | None = None
    dr: str = "none"
    fit_id: str | None = None
    params: tuple[str, ...] = ()  # manual: NAME=DIST
    noise: str = "none"
    overrides: Mapping[str, Any] = field(default_factory=dict)
    settings: TrainSettings = field(default_factory=TrainSettings)
    workers: int = 1
    backend: str = "local"
    address: str | None = None
    resume: str | None = None
    eval_episodes: int = 20


def fits_of_twin(project: Project, twin_id: str) -> tuple[list[str], list[str]]:
    """(the fits the twin was made from, the finished fits made on it), oldest first."""
    twin = project.artifact(twin_id)
    made_from = [i for i in twin.inputs if project.artifact(i).kind == "fit"]
    own = [
        a.id
        for a in project.artifacts("fit")
        if a.settings.get("twin") == twin_id and a.settings.get("status") != "cancelled"
    ]
    return made_from, own


def _fit_for(project: Project, twin_id: str, fit_id: str | None) -> str:
    if fit_id is not None:
        art = project.artifact(fit_id)
        if art.kind != "fit":
            raise ProjectError(f"artifact '{fit_id}' is a {art.kind}, not a fit")
        return fit_id
    made_from, own = fits_of_twin(project, twin_id)
    if made_from:
        return made_from[-1]
    if not own:
        raise PolicyError(
            f"twin '{twin_id}' has no finished fit to take a posterior from "
            "(fit it first, or pass --fit ID)"
        )
    return own[-1]


def randomization_for(
    project: Project,
    twin_id: str,
    mode: str,
    fit_id: str | None = None,
    params: Sequence[str] = (),
    noise: str = "none",
) -> tuple[Randomization, list[str]]:
    """(randomization, extra lineage inputs) for a `--dr` choice."""
    if mode not in DR_MODES:
        raise PolicyError(f"--dr {mode}: choose one of {', '.join(DR_MODES)}")
    if noise not in NOISE:
        raise PolicyError(f"--noise {noise}: choose one of {', '.join(NOISE)}")
    sensors = NOISE[noise]
    if mode == "manual":
        if not params:
            raise PolicyError(
                "--dr manual needs --param NAME=DIST ... (e.g. objects.box.friction=prior)"
            )
        return manual(list(params), sensors), []
    if mode == "posterior":
        fid = _fit_for(project, twin_id, fit_id)
        path = project.path_of(fid) / "samples.npz"
        if not path.is_file():
            raise PolicyError(f"fit '{fid}' has no posterior samples ({path} is missing)")
        return load_posterior(path, sensors), [fid]
    return Randomization("none", noise=sensors), []


def _ckpt_root(project: Project) -> Path:
    return project.root / ".train"


def train_job(project: Project, req: TrainRequest) -> Job[str]:
    """Job: train a policy; returns the policy artifact id."""

    tid, spec = load_twin(project, req.twin_id)
    dr, extra_inputs = randomization_for(project, tid, req.dr, req.fit_id, req.params, req.noise)
    dr.check(spec.params)
    run = req.resume or f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    ckpt = _ckpt_root(project) / run
    if req.resume and not ckpt.is_dir():
        raise ProjectError(f"{project.root}: no training run '{req.resume}' to resume")
    yield Progress(0.0, f"run {run}: {req.task} on twin {tid}, dr {req.dr}", {"run": run})
    executor = make_executor(req.backend, req.workers, req.address)
    try:
        gen = train_steps(
            req.task,
            spec,
            req.overrides,
            dr,
            req.settings,
            ckpt,
            executor,
            resume=req.resume is not None,
        )
        try:
            while True:
                try:
                    p = next(gen)
                except StopIteration as stop:
                    out = stop.value
                    break
                frac = None if p.fraction is None else 0.85 * p.fraction
                yield Progress(frac, p.message, {"run": run, **p.partial})  # names the run
        finally:
            gen.close()
        policy = out.policy
        policy.record.update(
            {"twin_id": tid, "run": run, "fit_id": extra_inputs[0] if extra_inputs else None}
        )
        if req.eval_episodes > 0:
            yield Progress(0.88, f"evaluating {req.eval_episodes} episodes in the nominal twin")
            ev = {
                "nominal": evaluate(
                    policy,
                    req.task,
                    spec,
                    policy.record["task_config"],
                    dr.nominal(),
                    req.eval_episodes,
                    executor=executor,
                )
            }
            if dr.mode != "none":
                yield Progress(
                    0.94, f"evaluating {req.eval_episodes} episodes under {dr.mode} randomization"
                )
                ev[dr.mode] = evaluate(
                    policy,
                    req.task,
                    spec,
                    policy.record["task_config"],
                    dr,
                    req.eval_episodes,
                    executor=executor,
                )
            policy.record["evaluation"] = ev
    finally:
        executor.close()
    succ = policy.record.get("evaluation", {}).get("nominal", {}).get("success_rate")
    summary = f"{req.task} by {req.settings.trainer} on {tid}, dr {req.dr}" + (
        f", twin success {succ:.2f}" if succ is not None else ""
    )
    with project.new_artifact(
        "policy",
        inputs=[tid, *extra_inputs],
        settings={
            "task": req.task,
            "trainer": req.settings.trainer,
            "dr": req.dr,
            "noise": req.noise,
            "run": run,
            **({"resumed": True} if req.resume else {}),
        },
        summary=summary,
    ) as folder:
        policy.save(folder)
        atomic.write_json(folder / "curve.json", out.curve)

        def write_check(p: Path) -> None:
            with open(p, "wb") as fh:
                np.savez(fh, inputs=out.check_inputs, outputs=out.check_outputs)

        atomic.write_with(folder / "check.npz", write_check)
    shutil.rmtree(ckpt, ignore_errors=True)  # the artifact holds everything worth keeping
    return project.artifacts("policy")[-1].id


def load_policy(project: Project, policy_id: str) -> Policy:
    art = project.artifact(policy_id)
    if art.kind != "policy":
        raise ProjectError(f"artifact '{policy_id}' is a {art.kind}, not a policy")
    return Policy.load(project.path_of(policy_id))


def evaluate_job(
    project: Project,
    policy_id: str,
    twin_id: str | None = None,
    dr: str = "none",
    fit_id: str | None = None,
    params: Sequence[str] = (),
    noise: str = "none",
    episodes: int = 50,
    seed: int = 10_000,
    workers: int = 1,
    backend: str = "local",
    address: str | None = None,
) -> Job[str]:
    """Job: evaluate a policy artifact in a twin (default: the twin it was trained in);
    returns the `run` artifact id (eval.json: success rate, Wilson 95 % interval)."""

    policy = load_policy(project, policy_id)
    tid, spec = load_twin(project, twin_id or policy.record.get("twin_id"))
    rand, extra = randomization_for(project, tid, dr, fit_id, params, noise)
    task = str(policy.record.get("task", ""))
    cfg = policy.record.get("task_config", {})
    yield Progress(None, f"evaluating {policy_id} on twin {tid}: {episodes} episodes, dr {dr}")
    executor = make_executor(backend, workers, address)
    try:
        res = evaluate(policy, task, spec, cfg, rand, episodes, seed, executor)
    finally:
        executor.close()
    res.update(
        {
            "policy": policy_id,
            "twin": tid,
            "task": task,
            "seed": seed,
            "randomization": rand.to_json(),
        }
    )
    lo, hi = res["ci95"]
    with project.new_artifact(
        "run",
        inputs=[policy_id, tid, *extra],
        settings={"kind": "twin-evaluation", "dr": dr, "noise": noise, "episodes": episodes},
        summary=f"{policy_id} in twin {tid} ({dr}): success {res['success_rate']:.2f} [{lo:.2f}, {hi:.2f}]",
    ) as folder:
        atomic.write_json(folder / "eval.json", res)
    return project.artifacts("run")[-1].id


def train_subprocess_job(
    project_root: Path, argv: Sequence[str], grace_s: float = 20.0
) -> Job[str]:
    """Job: `main.py train --project ROOT ARGV... --progress jsonl` in a child process.
    Yields its progress; returns the policy id. Closing the job interrupts the child
    (SIGINT: it stops at its next checkpoint), then kills it after `grace_s`. A child that
    fails raises PolicyError with its last error lines and the run to resume."""
    cmd = [
        sys.executable,
        str(MAIN),
        "train",
        "--project",
        str(project_root),
        *argv,
        "--progress",
        "jsonl",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    errlog = tempfile.TemporaryFile(mode="w+")  # a pipe could fill up and stall the child
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=errlog,
        text=True,
        env=env,
        cwd=str(MAIN.parent),
    )
    run = None
    result = None
    finished = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # vendor chatter on stdout is not ours
            if "result" in rec:
                result = str(rec["result"])
                continue
            part = rec.get("partial") or {}
            run = part.get("run", run) if isinstance(part, Mapping) else run
            yield Progress(rec.get("fraction"), str(rec.get("message", "")), part)
        rc = proc.wait()
        finished = True
        if rc != 0 or result is None:
            errlog.seek(0)
            err = errlog.read().strip().splitlines()[-5:]
            hint = f"; resume it with --resume {run}" if run else ""
            raise PolicyError(f"training process failed (exit {rc}): {' | '.join(err)}{hint}")
        return result
    finally:
        if not finished and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        errlog.close()


# -- for the Policies page: interrupted runs and what each policy artifact says -----------
def interrupted_runs(project: Project) -> dict[str, list[str] | None]:
    """Training runs with a checkpoint left behind (cancelled or crashed), newest last:
    run -> the `train` arguments it was started with (None when not remembered)."""
    root = _ckpt_root(project)
    out: dict[str, list[str] | None] = {}
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir(), key=lambda p: p.stat().st_mtime):
        if not d.is_dir() or not any(d.iterdir()):
            continue
        try:
            argv = json.loads((d / "argv.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            argv = None
        out[d.name] = [str(a) for a in argv] if isinstance(argv, list) else None
    return out


def remember_run_argv(project: Project, run: str, argv: Sequence[str]) -> None:
    """Keep a run's `train` arguments next to its checkpoint, so Resume can repeat them."""
    d = _ckpt_root(project) / run
    if d.is_dir():
        atomic.write_json(d / "argv.json", list(argv))


def policy_overview(project: Project, policy_id: str) -> dict[str, Any]:
    """What a policy artifact says without loading its model: its record (policy.json),
    with `evaluation` updated by the newest twin-evaluation runs of it (nominal / dr)."""
    path = project.path_of(policy_id) / "policy.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PolicyError(f"{path}: not readable ({exc})") from None
    rec = dict(meta.get("record", {}))
    ev = dict(rec.get("evaluation", {}))
    for art in project.artifacts("run"):
        if art.settings.get("kind") != "twin-evaluation" or art.inputs[:1] != (policy_id,):
            continue
        try:
            res = json.loads((project.path_of(art.id) / "eval.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        dr = str(art.settings.get("dr", "none"))
        ev["nominal" if dr == "none" else dr] = {**res, "run": art.id}
    rec["evaluation"] = ev
    return rec


def policy_curve(project: Project, policy_id: str) -> list[dict[str, Any]]:
    """A policy's learning curve (curve.json: one row per CEM generation / PPO chunk)."""
    path = project.path_of(policy_id) / "curve.json"
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
