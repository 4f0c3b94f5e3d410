"""Closing the loop after a real run (issue 12 part 7): refit the twin with the run
(`refit_request` / `refit_job`: "Send to Real2Sim"), then retrain the policy from the newest
refit's posterior, with the real runs it failed replayed in training.

`retrain_argv(project, policy_id, fit_id)` is the `train` command that does it — the same
task settings, trainer and budget as the policy, on the twin the fit was made on, under the
fit's posterior (`--dr posterior --fit F`), plus the initial conditions of the policy's
failed real deployments (`replay_starts`: its start pose, goal and object start, from each
run's run.json) so those episodes are part of training (a failure-driven curriculum). The
Deploy page runs it as a subprocess job; `train --retrain POLICY [--fit F]` on the CLI.

A refit is honest about failing: recordings with samples the twin cannot replay (a command
that is NaN: an old deploy recording's tail after the policy stopped) are refused before
anything runs, and a fit whose replays mostly failed (more than half of its simulations,
or a final loss at the failure penalty, or every replay of a CMA-ES generation: the same
judgement as every fit, app.workflows.fit.fit_failure) ends as a RefitError naming why
("12 of 12 replays failed: DataFileError: …") and is not saved: no fit artifact, so
nothing retrains from it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from app.workflows.fit import FitFailedError, fit_job, load_recording
from app.workflows.train import fits_of_twin, load_policy, policy_overview
from devices.trajectory import COMMAND_DELAY
from policies.errors import PolicyError
from resources.errors import TwinbenchError
from resources.jobs import Job
from resources.project import Project, ProjectError
from twins.fit import FitConfig

REPLAY_SHARE = 0.3  # share of training episodes that start from a failed real run
# channels every windowed replay reads (twins/fit/objective.py): a NaN in one fails the window
REPLAYED = ("robot/command", COMMAND_DELAY, "robot/joint_pos", "robot/joint_vel")


class RefitError(TwinbenchError):
    """A refit that did not fit: its replays failed (the message says how many, and why)."""


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
    """The newest finished fit made on the twin (a refit), else the one it was made from."""
    made_from, own = fits_of_twin(project, twin_id)
    return (made_from + own)[-1] if made_from or own else None


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


def refit_request(project: Project, trajectory_id: str) -> tuple[str, list[str], dict[str, Any]]:
    """ "Send to Real2Sim": (twin id, recordings, fit config) of a refit that adds the
    real run `trajectory_id` to the recordings of the fit its policy's twin came from."""
    art = project.artifact(trajectory_id)
    if art.kind != "trajectory":
        raise ProjectError(f"artifact '{trajectory_id}' is a {art.kind}, not a trajectory")
    pols = [i for i in art.inputs if project.artifact(i).kind == "policy"]
    if not pols:
        raise ProjectError(f"trajectory '{trajectory_id}' is not a deployed policy's run")
    twin_id = str(load_policy(project, pols[0]).record.get("twin_id"))
    made_from, own = fits_of_twin(project, twin_id)
    fits = made_from + own
    if not fits:
        raise ProjectError(
            f"twin '{twin_id}' was never fitted: fit it once (choose its parameters) before "
            "sending runs to Real2Sim"
        )
    fit = project.artifact(fits[-1])
    recs = [str(t) for t in fit.settings.get("trajectories", []) if t != trajectory_id]
    return twin_id, [*recs, trajectory_id], dict(fit.settings.get("config", {}))


def refit_job(
    project: Project, trajectory_id: str, workers: int = 1, isolated: bool = False
) -> Job[str]:
    """Job: the refit of `refit_request`; returns the new fit artifact id. RefitError when
    a recording cannot be replayed or the fit's replays mostly failed; nothing is saved
    then (see the module docstring). `isolated`: replays in a worker process (`fit_job`)."""

    twin_id, recs, cfg = refit_request(project, trajectory_id)
    check_replayable(project, recs)
    config = FitConfig(
        params=tuple(cfg["params"]),
        channels=dict(cfg.get("channels") or {"robot/joint_pos": 1.0}),
        window_s=cfg.get("window_s", 1.0),
        budget=int(cfg.get("budget", 200)),
        popsize=cfg.get("popsize"),
        sigma0=float(cfg.get("sigma0", 0.25)),
        polish_rounds=int(cfg.get("polish_rounds", 4)),
        validation=float(cfg.get("validation", 0.25)),
        seed=int(cfg.get("seed", 0)),
        bounds={k: (float(v[0]), float(v[1])) for k, v in (cfg.get("bounds") or {}).items()},
        tie={k: tuple(v) for k, v in (cfg.get("tie") or {}).items()},
        stall_generations=cfg.get("stall_generations"),
        posterior=str(cfg.get("posterior", "laplace")),
        particles=int(cfg.get("particles", 64)),
    )
    try:
        fit_id = yield from fit_job(
            project, twin_id, recs, config, workers=workers, isolated=isolated
        )
    except FitFailedError as exc:  # fit_job's own judgement (app/workflows/fit.py)
        raise RefitError(f"refit of {trajectory_id}: {exc.why}; nothing saved") from None
    return fit_id


def check_replayable(project: Project, trajectory_ids: list[str]) -> None:
    """RefitError naming the first recording with samples a twin cannot replay: a NaN/inf
    in a channel every replay reads (`REPLAYED`: a deploy run recorded before runs were cut
    to their commanded part ends with NaN commands)."""

    for tid in trajectory_ids:
        traj = load_recording(project, tid)
        for name in REPLAYED:
            if name not in traj.channels:
                continue
            arr = traj[name]
            bad = ~np.all(np.isfinite(np.asarray(arr, dtype=float)), axis=1)
            if not bad.any():
                continue
            idx = np.flatnonzero(bad)
            where = (
                "at its end"
                if idx[-1] == len(bad) - 1 and np.all(np.diff(idx) == 1)
                else "inside it"
            )
            t0 = float(traj.t[idx[0]] - traj.t[0])
            raise RefitError(
                f"refit: recording {tid} has {idx.size} samples with NaN/inf in '{name}' "
                f"{where} (from t = {t0:.3f} s){_why(name)}; a twin cannot replay them, so "
                "every window holding one would fail. Nothing was fitted; record the run "
                "again (deploy now keeps only the commanded part)"
            )


def _why(channel: str) -> str:
    if channel == "robot/command":
        return ": no command was sent there (before the policy started or after it stopped)"
    return ""
