"""The object part of `bench sim2real`'s fit: pushes of the cylinder recorded through the
robot protocol (`lab serve` subprocess, the fixed camera's frames tracked by the
workbench's tracker), its effective mass and friction fitted with the joints held at
their fitted values (app/workflows/object_fit.py), and the result folded into the
calibrated twin and its posterior randomization.

The camera's pose is the lab's true one (a calibrated camera, as in bench track and
push_deploy) and the tracker's model starts at the scene's pose of the cylinder (a scan);
every later push aims where the tracker last saw it. The last push is held out: the
object-pose RMSE of its replay before (object nominal) and after the fit; the fit is used
only when it predicts that push better (HELDOUT_GAIN), else the object keeps its prior.

What these pushes show (stored pushes, the lab replayed in-process as truth): the tracker
follows the truth within 1-4 mm, and the tilt it reports (0.5-1.4 deg RMS) is noise. The
library push's hand (45 deg yaw, ~9 cm ahead of the tool point) lands on the cylinder's
top rim and drags it, in the lab (5-16 N, chattering) and in the twin (16-24 N); the
fingers barely touch it. PyBullet's cylinder then tips at the lab's friction, which the
lab's does not. The fit's loss is flat within a few % over friction 0.1-1.3, so fits on
the same pushes land anywhere in it (0.10 to 0.63).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.workflows.object_fit import (
    ObjectFitError,
    fit_object,
    last_tracked,
    pose_rmse,
    push_part,
    record_push,
)
from benches.sim2real_lab import OBJECT
from devices.lab.truth import truth_camera_pose
from devices.poses import pose_to_matrix
from devices.robots.agent.launch import start_lab_process
from devices.robots.client import RobotClient
from policies.randomization import posterior
from reconstruction.object_track_types import ObjectModel
from reconstruction.pose_feeder import ObjectSource
from reconstruction.segment import Plane
from resources.errors import TwinbenchError
from resources.jobs import run_to_end
from twins.scan_input import procedural_scan

# (direction deg from the base +x, speed m/s, distance m) of each push; the last is held out.
# None pushes towards the robot (-x): the hand would hide the cylinder from the fixed camera
PUSHES = (
    (0.0, 0.08, 0.12),
    (-90.0, 0.15, 0.12),
    (90.0, 0.12, 0.12),
    (0.0, 0.15, 0.12),
    (-45.0, 0.1, 0.12),
)
# Rolling friction is fitted too: it is the twin's only resistance to tipping. PyBullet's
# cylinder tips 10-20 deg when pushed at the lab's friction 0.6 (the lab's tilts < 2 deg);
# with the tracker's tilt noise those tilt errors ruled the loss (radians weigh like
# metres) and drove friction to its lower bound (0.11)
PARAMS = ("density", "friction", "rolling_friction")
BOUNDS = {
    f"objects.{OBJECT}.density": (100.0, 2500.0),
    f"objects.{OBJECT}.friction": (0.1, 1.5),
    f"objects.{OBJECT}.rolling_friction": (0.0, 0.03),
}

# The fit is used only when it predicts the held-out push this much better than the prior
# (object nominal): these pushes can leave the loss flat within a few % over the whole
# friction range, and a fit landing anywhere in it is worse than the prior
HELDOUT_GAIN = 0.9


def object_source(cfg: Any, description: str) -> Any:
    """The tracker's view of the cylinder: the lab's fixed camera at its (calibrated) pose,
    the scene's model and table (the procedural scan), the robot masked, spin dropped."""

    sc = procedural_scan()
    o = next(o for o in sc.objects if o.name == OBJECT)
    assert sc.table_plane is not None  # the scene's table top, z = 0
    return ObjectSource(
        "fixed",
        (ObjectModel(OBJECT, o.mesh, pose_to_matrix(o.pose)),),
        truth_camera_pose(cfg, "fixed"),
        Plane.from_list(list(sc.table_plane)),
        description,
        spinless=(OBJECT,),
    )


def record_pushes(cfg: Any, cfg_path: Path, folder: Path, n: int) -> list[Any]:
    """`n` pushes of PUSHES through a `lab serve` subprocess, each tracked (real time);
    fewer when one fails (the next one would not know where to aim)."""

    pose = np.asarray(next(o.pose for o in cfg.objects if o.name == OBJECT), float)
    out = []
    with (
        start_lab_process(cfg.scene, cfg_path, camera_size="424x240", camera_fps=15) as lab,
        RobotClient(lab.host, lab.port, lab.token, name="bench-sim2real-push") as client,
    ):
        client.latest_state(timeout_s=10.0)
        assert client.info is not None
        src = object_source(cfg, client.info.description)
        for k, (direction, speed, dist) in enumerate(PUSHES[:n]):
            job = record_push(
                client, src, OBJECT, pose, folder / f"push{k}", direction=direction,
                speed=speed, distance=dist,
            )  # fmt: skip
            try:
                traj = run_to_end(job)
                pose = last_tracked(traj, OBJECT)
            except TwinbenchError as exc:  # lost or unreachable: no aim for the next one
                print(f"sim2real: push {k} failed ({exc}); no more pushes", file=sys.stderr)
                break
            out.append(traj)
        client.stop("bench sim2real: pushes done")
    return out


def with_object_posterior(dr: Any, names: list[str], samples: Any, seed: int = 0) -> Any:
    """Posterior randomization `dr` (joints) with the object's posterior samples added as
    independent columns (each side resampled to the larger count); `dr` without posterior
    samples gets the object's alone."""

    s = np.asarray(samples, float)
    if s.size == 0:
        return dr
    if dr.mode != "posterior":
        return posterior(names, s, dr.noise, source="bench sim2real object fit")
    rng = np.random.default_rng(seed)
    j = np.asarray(dr.samples, float)
    n = max(len(j), len(s))
    ji = np.arange(n) % len(j) if len(j) == n else rng.integers(0, len(j), n)
    si = np.arange(n) % len(s) if len(s) == n else rng.integers(0, len(s), n)
    return posterior(
        list(dr.names) + list(names),
        np.hstack([j[ji], s[si]]),
        dr.noise,
        source=f"{dr.source} + object fit",
    )


def fit_object_part(
    fitted: Any, dr: Any, pushes: list[Any], truth: dict[str, float], budget: int, ex: Any
) -> tuple[Any, Any, dict[str, Any]]:
    """(calibrated twin with the object's fitted values, posterior randomization with its
    samples, report keys) from the push recordings (all but the last fitted). A push that
    missed the cylinder or lost it is left out and named; with fewer than two left the
    object keeps its nominal values (`object_fit` None), and so it does when the fit does
    not predict the held-out push better (`object_fit_used` false, HELDOUT_GAIN)."""

    usable, skipped = [], []
    for k, p in enumerate(pushes):
        try:
            push_part(p, OBJECT)
            usable.append(p)
        except ObjectFitError as exc:
            skipped.append(f"push {k}: {exc}")
    if len(usable) < 2:
        return fitted, dr, {"object_fit": None, "object_fit_skipped": skipped}
    fit_on, held = usable[:-1], usable[-1]
    t0 = time.perf_counter()
    res = fit_object(fitted, fit_on, OBJECT, PARAMS, budget, ex, BOUNDS)
    secs = time.perf_counter() - t0
    est = dict(res.estimate)
    names = list(res.posterior.names)
    S = np.asarray(res.posterior.samples, float)
    report: dict[str, Any] = {}
    for n in est:
        tv = truth.get(n)
        iv = res.posterior.interval90.get(n)
        iv = None if iv is None else [round(float(v), 4) for v in iv]
        report[n.split(".")[-1]] = {
            "true": None if tv is None else round(tv, 4),
            "fitted": round(float(est[n]), 4),
            "rel_err": None if not tv else round(abs(est[n] - tv) / abs(tv), 3),
            "interval90": iv,
            "identifiable": bool(res.posterior.identifiable.get(n, False)),
        }
    before = pose_rmse(fitted, None, held, OBJECT)
    after = pose_rmse(fitted, est, held, OBJECT)
    keys = {
        "object_fit": report,
        "object_fit_s": round(secs, 1),
        "object_push_recordings": len(pushes),
        "object_pushes_fitted": len(fit_on),
        "object_heldout_pose_rmse_mm": {
            "before": round(1000 * before, 1) if math.isfinite(before) else None,
            "after": round(1000 * after, 1) if math.isfinite(after) else None,
        },
        "object_fit_loss": [round(res.loss_before, 4), round(res.loss_after, 4)],
        "object_fit_skipped": skipped,
        "object_fit_used": bool(after < HELDOUT_GAIN * before),
    }
    if not keys["object_fit_used"]:  # the held-out push says the fit is no better: prior
        return fitted, dr, keys
    return fitted.with_values(est), with_object_posterior(dr, names, S), keys
