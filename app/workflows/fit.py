"""Import, export and fit workflows (Qt-free; the CLI and the GUI share them).

- `import_recording(project, file, mapping, twin_id=None)`: a CSV/Parquet/NPZ log through a
  column-mapping file into a `trajectory` artifact; with a twin, a recording that does not
  fit it (another robot, joints it lacks, commands its actuators cannot take: a torque
  recording for a position-servo twin) is refused before anything is written
  (twins.fit.objective.check_recording: RecordingMismatch naming the file, twin and mismatch);
  joint positions outside the twin's limits are imported with warnings (the artifact's
  `settings["warnings"]`, printed by the CLI; a fit notes them too).
- `export_recording(project, trajectory_id, out)`: LeRobot-style Parquet.
- `fit_job(project, twin_id, trajectory_ids, config, ...)`: a job (generator of `Progress`)
  around `twins.fit.fit_steps`, writing a `fit` artifact (fit.json with estimate,
  intervals, history, validation error; samples.npz) whose inputs are the twin and the
  recordings. Cancelled (closed) after its first generation, it writes a `fit` artifact
  with status "cancelled" and a checkpoint; `resume_from=` that id continues it. A fit
  whose replays mostly failed is no fit (`fit_failure`: more than half of its simulations
  failed, or its final loss is the failure penalty; or every replay of a whole CMA-ES
  generation failed, which stops it early): FitFailedError naming how many failed and the
  last error, and nothing is saved (no fit artifact, so `--apply` makes no twin). The
  refit of a deployed run (app/workflows/close_loop.py) ends the same way.
- `apply_fit(project, fit_id)`: a new twin version at the fitted values whose parent is the
  fitted twin and whose inputs add the recordings.
- `compare_twins(project, twin_ids, trajectory_ids)`: twin versions side by side on
  (held-out) recordings, windowed-replay RMSE per channel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.workflows.twin import load_twin, save_twin_edit
from devices.mapping import export_lerobot, import_table, load_mapping
from devices.trajectory import Trajectory
from resources import atomic
from resources.errors import TwinbenchError
from resources.jobs import Job, Progress
from resources.project import Project, ProjectError
from twins.errors import TwinError
from twins.executor import make_executor
from twins.fit import (
    FitConfig,
    FitResult,
    check_recording,
    fit_steps,
    limit_excursions,
    replay_rmse,
)
from twins.fit.objective import PENALTY
from twins.rigs import cube_toss_twin, qube_twin, simple_pendulum_twin

RIGS = ("qube_servo2", "simple_pendulum", "cube_toss")
FAILED_SHARE = 0.5  # a fit whose replays failed more often than this is not a fit


class FitFailedError(TwinError):
    """A fit that did not fit: its replays (mostly) failed. `why` says how many and the
    last replay error ("12 of 12 replays failed: TwinError: ..."); nothing was saved."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


def fit_failure(d: Mapping[str, Any]) -> str | None:
    """Why a finished fit (its fit.json as a dict) is no fit, or None: "12 of 12 replays
    failed: <error>" when more than `FAILED_SHARE` of its simulations failed or its final
    loss is the failure penalty. A cancelled fit's checkpoint is not judged."""

    if d.get("status", "done") != "done":
        return None
    failed, evals = int(d.get("failed") or 0), int(d.get("evaluations") or 0)
    loss = d.get("loss_after")
    bad_loss = isinstance(loss, (int, float)) and not float(loss) < PENALTY  # NaN too
    mostly = evals > 0 and failed > FAILED_SHARE * evals
    if not mostly and not bad_loss:
        return None
    last = ""
    for note in d.get("notes") or ():
        if "(last: " in str(note):
            last = str(note).split("(last: ", 1)[1].rstrip(")")
    what = f"{failed} of {evals} replays failed" if evals else "the fit's replays failed"
    if not mostly:
        what = f"the final loss is the failure penalty ({loss}); {failed} of {evals} failed"
    return f"{what}: {last or 'no replay error recorded'}"


def _hopeless(partial: Any) -> str | None:
    """Why to stop now, or None: a CMA-ES generation has passed and every replay so far
    failed (the rest of the budget would fail the same way)."""
    if not isinstance(partial, Mapping) or partial.get("stage") != "cmaes":
        return None
    failed, evals = int(partial.get("failed") or 0), int(partial.get("evals") or 0)
    if not (evals > 0 and failed >= evals):
        return None
    last = str(partial.get("last_error") or "no replay error recorded")
    gen = partial.get("generation")
    return f"{failed} of {evals} replays failed: {last}; stopped after CMA-ES generation {gen}"


def import_rig_twin(project: Project, rig: str, urdf: Path | None = None) -> str:
    """A twin of one of the real rigs (twins/rigs.py, the authors' published values) as a
    twin artifact, so their recordings can be fitted in a project. The simple pendulum
    needs its CAD URDF (`urdf`, from ../shared/data/real/simple_pendulum). `cube_toss` is
    the ContactNets cube over its table (twins.rigs.cube_toss_twin: the contact as one pair,
    μ 0.5 and e 0.1 to start from; the table at the height the data puts it, -1 mm)."""

    if rig not in RIGS:
        raise TwinError(f"unknown rig '{rig}' (one of {', '.join(RIGS)})")
    if rig == "simple_pendulum" and urdf is None:
        raise TwinError("rig simple_pendulum needs --urdf (data_urdf_dfki_simple_pendulum.urdf)")
    with project.new_artifact(
        "twin",
        settings={"rig": rig},
        summary=f"rig {rig} at "
        + ("μ 0.5, e 0.1 (to fit)" if rig == "cube_toss" else "its authors' values"),
    ) as folder:
        if rig == "cube_toss":
            spec = cube_toss_twin()
        elif rig == "qube_servo2":
            spec = qube_twin()
        else:
            spec = simple_pendulum_twin(Path(urdf or ""), folder)
        spec.save(folder)
    return project.artifacts("twin")[-1].id


def import_recording(
    project: Project,
    file: Path,
    mapping: Path,
    twin_id: str | None = None,
    name: str | None = None,
) -> str:
    """Import `file` through `mapping` as a trajectory artifact; returns its id."""

    m = load_mapping(Path(mapping))
    traj = import_table(Path(file), m, name)
    inputs: list[str] = []
    warnings: list[str] = []
    if twin_id is not None:
        tid, spec = load_twin(project, twin_id)
        check_recording(spec, traj, f"{Path(file).name}", twin=tid)
        warnings = limit_excursions(spec, traj, f"{Path(file).name}", twin=tid)
        inputs.append(tid)
    settings: dict[str, Any] = {"file": Path(file).name, "mapping": Path(mapping).name}
    if warnings:
        settings["warnings"] = warnings
    more = f"; {len(warnings)} joint(s) outside the twin's limits" if warnings else ""
    with project.new_artifact(
        "trajectory",
        inputs=inputs,
        settings=settings,
        summary=f"imported {Path(file).name} ({len(traj)} samples, {traj.duration:.2f} s{more})",
    ) as folder:
        traj.save(folder)
    return project.artifacts("trajectory")[-1].id


def load_recording(project: Project, trajectory_id: str) -> Trajectory:
    art = project.artifact(trajectory_id)
    if art.kind != "trajectory":
        raise ProjectError(f"artifact '{trajectory_id}' is a {art.kind}, not a trajectory")
    traj = Trajectory.load(project.path_of(trajectory_id))
    return traj.with_channels(meta={"name": trajectory_id, **dict(traj.meta)})


def export_recording(project: Project, trajectory_id: str, out: Path) -> Path:
    """Write a trajectory artifact as one LeRobot-style Parquet episode at `out`."""

    return export_lerobot(load_recording(project, trajectory_id), Path(out))


def load_fit(project: Project, fit_id: str, finished: bool = False) -> dict[str, Any]:
    """fit.json of a fit artifact (the one loader: the fit, its resume and design read it
    here). `finished`: refuse a fit that was cancelled or failed (it has no estimate to
    start from)."""
    art = project.artifact(fit_id)
    if art.kind != "fit":
        raise ProjectError(f"artifact '{fit_id}' is a {art.kind}, not a fit")
    path = project.path_of(fit_id) / "fit.json"
    try:
        d: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProjectError(f"{path}: unreadable fit ({exc})") from exc
    if finished and d.get("status", "done") != "done":
        raise ProjectError(f"fit '{fit_id}' did not finish ({d.get('status')}); resume it first")
    return d


def fit_job(
    project: Project,
    twin_id: str | None,
    trajectory_ids: Sequence[str],
    config: FitConfig,
    validation_ids: Sequence[str] = (),
    backend: str = "local",
    workers: int = 1,
    address: str | None = None,
    resume_from: str | None = None,
    isolated: bool = False,
) -> Job[str]:
    """Job: fit the twin to the recordings; returns the fit artifact id. `isolated`: replay
    in worker processes even with one worker (the desktop app: replays hold the GIL)."""

    tid, spec = load_twin(project, twin_id)
    if not trajectory_ids:
        raise TwinError("fit: choose at least one trajectory (--trajectories ID ...)")
    recs = [load_recording(project, i) for i in trajectory_ids]
    vals = [load_recording(project, i) for i in validation_ids]
    for rid, r in zip([*trajectory_ids, *validation_ids], [*recs, *vals], strict=True):
        check_recording(spec, r, rid, twin=tid)  # refused before anything runs
    resume = None
    if resume_from is not None:
        old = load_fit(project, resume_from)
        resume = old.get("checkpoint")
        if not resume:
            raise ProjectError(f"fit '{resume_from}' has no checkpoint to resume from")
    inputs = [tid, *trajectory_ids, *validation_ids]
    settings = {
        "twin": tid,
        "trajectories": list(trajectory_ids),
        "validation": list(validation_ids),
        "config": config.to_json(),
        "backend": backend,
        "workers": workers,
        **({"resumed_from": resume_from} if resume_from else {}),
    }
    yield Progress(None, f"starting {backend} executor ({workers} workers)")
    executor = make_executor(backend, workers, address, isolated=isolated)
    gen = fit_steps(spec, recs, config, executor, vals, resume)
    checkpoint: Mapping[str, Any] | None = None
    finished = failed = False
    what = f"fit of twin {tid} on {', '.join(trajectory_ids)}"
    try:
        while True:
            try:
                p = next(gen)
            except StopIteration as stop:
                result: FitResult = stop.value
                break
            if isinstance(p.partial, Mapping) and "checkpoint" in p.partial:
                checkpoint = p.partial["checkpoint"]
            hopeless = _hopeless(p.partial)
            if hopeless is not None:  # not a cancel: no checkpoint is kept
                failed = True
                raise FitFailedError(f"{what}: {hopeless}; nothing saved", hopeless)
            yield p
        finished = True
    finally:
        gen.close()
        executor.close()
        if not finished and not failed and checkpoint is not None:
            _save_cancelled(project, inputs, settings, checkpoint)
    d = result.to_json()
    d.update({"status": "done", "twin": tid, "trajectories": list(trajectory_ids)})
    problem = fit_failure(d)
    if problem is not None:  # judged before anything is written
        raise FitFailedError(f"{what}: {problem}; nothing saved", problem)
    with project.new_artifact(
        "fit",
        inputs=inputs,
        settings=settings,
        summary=_summary(result),
    ) as folder:
        atomic.write_json(folder / "fit.json", d)
        result.posterior.save_samples(folder)
    return project.artifacts("fit")[-1].id


def _save_cancelled(
    project: Project, inputs: list[str], settings: dict[str, Any], checkpoint: Mapping[str, Any]
) -> None:
    with project.new_artifact(
        "fit",
        inputs=inputs,
        settings={**settings, "status": "cancelled"},
        summary=f"cancelled after {checkpoint.get('evals', 0)} evaluations (resumable)",
    ) as folder:
        atomic.write_json(
            folder / "fit.json",
            {"status": "cancelled", "checkpoint": dict(checkpoint), "settings": settings},
        )


def _summary(res: FitResult) -> str:
    val = res.validation_rmse_after or res.train_rmse_after
    errs = ", ".join(f"{k} {v:.4g}" for k, v in val.items())
    which = "validation" if res.validation_rmse_after else "train"
    return f"{len(res.estimate)} params, {res.evaluations} evals, {which} rmse {errs}"


def fit_summary(project: Project, fit_id: str) -> dict[str, Any]:
    """fit.json of a fit artifact."""
    return load_fit(project, fit_id)


def compare_twins(
    project: Project,
    twin_ids: Sequence[str],
    trajectory_ids: Sequence[str],
    window_s: float | None = 1.0,
    channels: Sequence[str] = ("robot/joint_pos",),
) -> list[dict[str, Any]]:
    """One row per twin version: its windowed-replay RMSE per channel on each recording
    and over all of them (use recordings no fit saw)."""

    recs = {i: load_recording(project, i) for i in trajectory_ids}
    rows = []
    for tid in twin_ids:
        _, spec = load_twin(project, tid)
        row: dict[str, Any] = {"twin": tid, "parent": project.artifact(tid).parent}
        for rid, rec in recs.items():
            row[rid] = replay_rmse(spec, [rec], window_s, None, channels)
        row["all"] = replay_rmse(spec, list(recs.values()), window_s, None, channels)
        rows.append(row)
    return rows


def apply_fit(project: Project, fit_id: str) -> str:
    """A new twin version at the fit's estimate: parent = the fitted twin, inputs = the
    parent's inputs plus the fit and its recordings. Returns the new twin id."""
    d = load_fit(project, fit_id)
    if d.get("status") != "done":
        raise ProjectError(f"fit '{fit_id}' did not finish ({d.get('status')}); resume it first")
    art = project.artifact(fit_id)
    tid = str(d["twin"])
    _, spec = load_twin(project, tid)
    estimate = {str(k): float(v) for k, v in d["estimate"].items()}
    tie = (d.get("config") or {}).get("tie") or {}  # one fitted latency for every actuator
    estimate.update({str(o): estimate[str(s)] for s, others in tie.items() for o in others})
    extra = tuple(i for i in (fit_id, *art.inputs) if i != tid)
    return save_twin_edit(
        project, tid, spec, estimate, summary=f"fit {fit_id} applied to {tid}", extra_inputs=extra
    )


def fit_samples(project: Any, fit_id: str) -> tuple[list[str], NDArray[np.float64], dict[str, Any]]:
    """(parameter names, posterior samples (N, n), fit.json) of a finished fit artifact;
    no samples (N = 0) when the fit has none."""
    d = fit_summary(project, fit_id)
    path = project.path_of(fit_id) / "samples.npz"
    if not path.is_file():
        return list(d.get("estimate", {})), np.zeros((0, len(d.get("estimate", {})))), d
    try:
        with np.load(path) as z:
            names = [str(n) for n in z["names"]]
            x = np.asarray(z["x"], dtype=float)
    except (OSError, ValueError, KeyError) as exc:
        raise TwinbenchError(f"{path}: unreadable posterior samples ({exc})") from exc
    return names, x.reshape(-1, len(names)) if names else np.zeros((0, 0)), d
