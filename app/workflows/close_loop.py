"""Closing the loop after a real run (issue 12 part 7): retrain a policy from the newest
refit's posterior, with the real runs it failed replayed in training.

`retrain_argv(project, policy_id, fit_id)` is the `train` command that does it — the same
task settings, trainer and budget as the policy, on the twin the fit was made on, under the
fit's posterior (`--dr posterior --fit F`), plus the initial conditions of the policy's
failed real deployments (`replay_starts`: its start pose, goal and object start, from each
run's run.json) so those episodes are part of training (a failure-driven curriculum). The
Deploy page runs it as a subprocess job; `train --retrain POLICY [--fit F]` on the CLI."""

from __future__ import annotations

import json
from typing import Any

from app.project import Project
from app.workflows.train import policy_overview
from policies.errors import PolicyError

REPLAY_SHARE = 0.3  # share of training episodes that start from a failed real run


def failed_starts(project: Project, policy_id: str) -> list[dict[str, Any]]:
    """The initial conditions of `policy_id`'s failed real deployments, oldest first."""
    out = []
    for art in project.artifacts("run"):
        if art.settings.get("kind") != "real-deployment" or art.inputs[:1] != (policy_id,):
            continue
        try:
            run = json.loads((project.path_of(art.id) / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if run.get("success") or run.get("start") is None or run.get("goal") is None:
            continue
        cond = {"start": run["start"], "goal": run["goal"], "run": art.id}
        if run.get("object_start") is not None:
            cond["object_start"] = run["object_start"]
        out.append(cond)
    return out


def newest_fit(project: Project, twin_id: str) -> str | None:
    fits = [a.id for a in project.artifacts("fit") if a.inputs[:1] == (twin_id,)]
    return fits[-1] if fits else None


def retrain_argv(project: Project, policy_id: str, fit_id: str | None = None) -> list[str]:
    """`main.py train` arguments that retrain `policy_id` (see the module docstring).
    PolicyError naming what is missing: a policy without a record, a twin with no fit."""
    rec = policy_overview(project, policy_id)
    task = rec.get("task")
    twin = rec.get("twin_id")
    if not task or not twin:
        raise PolicyError(f"policy {policy_id}: its record names no task or twin to retrain in")
    fit = fit_id or newest_fit(project, str(twin))
    if fit is None:
        raise PolicyError(
            f"policy {policy_id}: twin {twin} has no fit to retrain from (send a real run "
            "to Real2Sim first)"
        )
    training = rec.get("training", {})
    trainer = str(training.get("trainer", "cem"))
    argv = ["train", "--project", str(project.root), "--twin", str(twin), "--task", str(task)]
    argv += ["--dr", "posterior", "--fit", fit, "--trainer", trainer]
    argv += ["--seed", str(int(training.get("seed", 0)) + 1)]
    if trainer == "cem":
        cem = training.get("cem", {})
        if "generations" in cem:
            argv += ["--budget", str(int(cem["generations"]))]
        if "population" in cem:
            argv += ["--population", str(int(cem["population"]))]
        if "episodes" in cem:
            argv += ["--episodes", str(int(cem["episodes"]))]
    else:
        ppo = training.get("ppo", {})
        if "timesteps" in ppo:
            argv += ["--budget", str(int(ppo["timesteps"]))]
    if project.artifact(policy_id).settings.get("noise") == "typical":
        argv += ["--noise", "typical"]
    settings = {
        k: v
        for k, v in (rec.get("task_config") or {}).items()
        if k not in ("replay_starts", "replay_share")
    }
    starts = failed_starts(project, policy_id)
    if starts:
        settings["replay_starts"] = [{k: v for k, v in s.items() if k != "run"} for s in starts]
        settings["replay_share"] = REPLAY_SHARE
    if settings:
        argv += ["--set", *(f"{k}={json.dumps(v)}" for k, v in settings.items())]
    return argv
