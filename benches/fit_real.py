"""Fit the twins of the two real rigs to some of their recordings, through the import path,
and measure the error on runs the fit did not see.

Data: ../shared/data/real next to the repository (override with TWINBENCH_SHARED_DATA,
the folder that holds simple_pendulum/ and furuta_pendulum/). Recordings are read by
devices.mapping with the mappings in resources/mappings/ (the same path as
`python main.py import`).

Error metric: RMSE of the joint angles (rad) over windowed replays (`WINDOW_S` seconds,
each window replayed open loop from the recorded state, commands as recorded), the
objective the fit minimises; "before" is the twin the fit starts from.

- Simple pendulum: start from the CAD model (URDF mass, no armature, damping, friction or
  offset); fit link mass, armature, damping, Coulomb friction, torque offset and latency on
  the authors' identification run; held out: the energy-shaping swing-up and the
  gravity-compensation run (slices). The authors' identified model (their
  tau = J qdd + m cx g sin q + Fv qd + Fc atan(100 qd) + offset) is shown beside ours in
  their terms, with its held-out error in our twin.
- Qube-Servo 2: start from the published model; fit motor resistance, back-EMF constant,
  arm damping and friction, pendulum damping and latency on a +1.5 V chirp run and a
  swing-up run; held out: two -1.5 V chirp runs and two other swing-ups.
- Cube tosses (ContactNets, 285 real tosses of a 0.1048 m cube onto a table): a free cube
  twin without scan or robot (twins.rigs.cube_toss_twin), the table at the height the
  training tosses come to rest at; fit the cube-table contact's own μ and e (contact-pair
  parameters, twins/contacts.py: PyBullet's product of the two bodies' values hidden) on
  `CUBE_TRAIN` tosses, held out: `CUBE_HELD` others (a seeded permutation of the files, so
  the split is fixed). Each toss is replayed whole, from release to rest, from the state its
  first samples show; the objective is the position residuals (m; orientation is reported,
  not fitted: see `cube_fit_config`) and a coarse global stage (Sobol points over the search
  box) comes before CMA-ES and the polish. Errors are reported apart: position (Euclidean,
  mm) and orientation (angle, deg); the authors' μ 0.18, e 0.125 side by side.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

from devices.mapping import import_table, load_mapping
from resources import path as resource_path
from resources import shared_data
from resources.errors import TwinbenchError
from twins.executor import LocalExecutor
from twins.fit import FitConfig, fit, replay_rmse
from twins.fit.objective import pose_parts
from twins.rigs import (
    _CAD_COM_DIST,
    _CAD_IXX,
    _CAD_MASS,
    CUBE_ID,
    PENDULUM_ID,
    cube_authors_values,
    cube_toss_twin,
    pendulum_values,
    qube_twin,
    simple_pendulum_twin,
    table_height,
)

DESCRIPTION = (
    "fit the real pendulum and Qube twins and the real cube tosses' contact on some "
    "recordings (imported through the mapping path), held-out RMSE before/after, the "
    "authors' pendulum and cube values side by side"
)
WINDOW_S = {"pendulum": 0.25, "qube": 0.5}  # s; the pendulum goes chaotic over the top
# cube tosses: how many are fitted and how many held out (full run / quick), and the seed
# of the permutation that picks them. Held out: the permutation's tosses 25-54 (`CUBE_HELD`
# of them from position 25: the set the first run of this bench held out, kept); fitted:
# the first `CUBE_TRAIN` of the others. 80, not 25: on 40 other tosses (neither set) a
# 25-toss fit came out 1.04x the authors' values' error and an 80-toss fit 0.99x (with a
# start-velocity rule since reverted; after it, 1.05x on another 80: μ is pinned down, e
# is not; docs/BENCHMARKS.md)
CUBE_TRAIN = {False: 80, True: 12}
CUBE_HELD = {False: 30, True: 12}
CUBE_HELD_FROM = 25
CUBE_SEED = 26
CUBE_POSE = "objects/cube/pose"


def data_root() -> Path:
    return shared_data("real")


def _load(path: Path, mapping: str, t0: float = 0.0, t1: float | None = None) -> Any:
    traj = import_table(path, load_mapping(resource_path("mappings", f"{mapping}.json")))
    if t1 is not None or t0 > 0:
        traj = traj.slice_time(t0, t1 if t1 is not None else traj.t[-1])
        traj = traj.with_channels(t=traj.t - traj.t[0])
    return traj


def heldout_rmse(spec: Any, values: dict[str, float], recs: list[Any], window_s: float) -> float:
    """Joint-angle RMSE (rad) over windowed replays of `recs` at `values`."""

    return replay_rmse(spec, recs, window_s, values)["robot/joint_pos"]


def _r(x: float, n: int = 5) -> float | None:
    return None if not math.isfinite(x) else float(f"{x:.{n}g}")


def _fit(
    spec: Any,
    train: list[Any],
    bounds: dict[str, tuple[float, float]],
    window_s: float,
    quick: bool,
    workers: int,
) -> Any:
    cfg = FitConfig(
        params=tuple(bounds),
        bounds=bounds,
        window_s=window_s,
        budget=60 if quick else 120,
        polish_rounds=1 if quick else 2,
        seed=0,
    )
    with LocalExecutor(workers) as ex:
        return fit(spec, train, cfg, ex)


def _authors_terms(values: dict[str, float]) -> dict[str, float]:
    """Our pendulum twin values in the authors' model terms (inverse of pendulum_values)."""

    m = values["robot.links.Link_1.mass"]
    j_link = _CAD_IXX * m / _CAD_MASS + m * _CAD_COM_DIST**2
    return {
        "J": values["robot.joints.Joint_1.armature"] + j_link,
        "m_cx": m * _CAD_COM_DIST,
        "Fv": values["robot.joints.Joint_1.damping"],
        "Fc": values["robot.joints.Joint_1.friction"] * 2 / math.pi,
        "offset": -values["robot.actuators.Joint_1.bias"],
    }


def pendulum(quick: bool, workers: int) -> dict[str, Any]:
    root = data_root() / "simple_pendulum"
    pre = "results_control_method_"
    train = [_load(root / f"{pre}pd_system_identification_data_measured.csv", "simple_pendulum")]
    held = [
        _load(
            root / f"{pre}energy_shaping_data_measured.csv", "simple_pendulum", 0, 4 if quick else 8
        ),
        _load(
            root / f"{pre}gravity_compensation_data_measured.csv",
            "simple_pendulum",
            0,
            2 if quick else 5,
        ),
    ]
    # search ranges: the twin's own bounds, narrowed to physically plausible values
    bounds = {
        "robot.links.Link_1.mass": (0.135062, 3.37655),
        "robot.joints.Joint_1.armature": (0.0, 0.1),
        "robot.joints.Joint_1.damping": (0.0, 0.5),
        "robot.joints.Joint_1.friction": (0.0, 0.5),
        "robot.actuators.Joint_1.bias": (-0.5, 0.5),
        "robot.actuators.Joint_1.latency": (0.0, 0.03),
    }
    params = tuple(bounds)
    win = WINDOW_S["pendulum"]
    with tempfile.TemporaryDirectory() as tmp:
        authors = simple_pendulum_twin(root / "data_urdf_dfki_simple_pendulum.urdf", Path(tmp))
        cad = {
            "robot.links.Link_1.mass": _CAD_MASS,
            "robot.joints.Joint_1.armature": 0.0,
            "robot.joints.Joint_1.damping": 0.0,
            "robot.joints.Joint_1.friction": 0.0,
            "robot.actuators.Joint_1.bias": 0.0,
            "robot.actuators.Joint_1.latency": 0.0,
        }
        spec = authors.with_values(cad)
        res = _fit(spec, train, bounds, win, quick, workers)
        start = {n: spec.params[n].nominal for n in params}
        before = heldout_rmse(spec, start, held, win)
        after = heldout_rmse(spec, dict(res.estimate), held, win)
        auth_vals = {**start, **pendulum_values(), "robot.actuators.Joint_1.latency": 0.0}
        auth_err = heldout_rmse(spec, auth_vals, held, win)
        auth_train = heldout_rmse(spec, auth_vals, train, win)
    ours = _authors_terms(dict(res.estimate))
    post = res.posterior
    return {
        "pendulum_heldout_rmse_before": _r(before),
        "pendulum_heldout_rmse_after": _r(after),
        "pendulum_heldout_rmse_authors_params": _r(auth_err),
        "pendulum_train_rmse_before": _r(res.train_rmse_before["robot/joint_pos"]),
        "pendulum_train_rmse_after": _r(res.train_rmse_after["robot/joint_pos"]),
        "pendulum_train_rmse_authors_params": _r(auth_train),
        "pendulum_validation_rmse_after": _r(
            res.validation_rmse_after.get("robot/joint_pos", float("nan"))
        ),
        "pendulum_authors_vs_ours": {
            k: {"authors": PENDULUM_ID[k], "ours": _r(ours[k], 4)} for k in PENDULUM_ID
        },
        "pendulum_params": _param_table(res, post),
        "pendulum_evaluations": res.evaluations,
        "pendulum_failed": res.failed,
        "pendulum_fit_s": res.wall_s,
        "pendulum_heldout": "energy_shaping (first 8 s), gravity_compensation (first 5 s)",
    }


def _param_table(res: Any, post: Any) -> dict[str, Any]:
    return {
        n: {
            "start": _r(res.start[n], 4),
            "fitted": _r(res.estimate[n], 4),
            "interval90": [_r(v, 4) for v in post.interval90[n]],
            "identifiable": post.identifiable[n],
        }
        for n in post.names
    }


def qube(quick: bool, workers: int) -> dict[str, Any]:
    root = data_root() / "furuta_pendulum"
    seconds = 2.0 if quick else 3.0
    plus = sorted((root / "qq_chrip_10to0Hz_p1.5V_250Hz_10s").glob("*.npz"))
    minus = sorted((root / "qq_chrip_10to0Hz_-1.5V_250Hz_10s").glob("*.npz"))
    swing = sorted((root / "qq-su_ectrl_250Hz_5s").glob("*.npz"))
    # train on both regimes the rig shows (a chirp around hanging, a swing-up), hold out
    # the opposite-sign chirps and the other swing-ups
    train = [_load(plus[0], "furuta_pendulum", 0, seconds)]
    train.append(_load(swing[0], "furuta_pendulum", 0, seconds))
    held = [_load(f, "furuta_pendulum", 0, seconds) for f in minus[:2]]
    held += [_load(f, "furuta_pendulum", 0, seconds) for f in swing[1:3]]
    bounds = {
        "robot.actuators.arm.resistance": (2.1, 33.6),
        "robot.actuators.arm.k_emf": (0.0105, 0.168),
        "robot.joints.arm.damping": (0.0, 0.01),
        "robot.joints.arm.friction": (0.0, 0.02),
        "robot.joints.pendulum.damping": (0.0, 0.001),
        "robot.actuators.arm.latency": (0.0, 0.03),
    }
    params = tuple(bounds)
    win = WINDOW_S["qube"]
    spec = qube_twin()
    res = _fit(spec, train, bounds, win, quick, workers)
    start = {n: spec.params[n].nominal for n in params}
    fitted = dict(res.estimate)

    def err(values: dict[str, float], recs: list[Any]) -> float | None:
        return _r(heldout_rmse(spec, values, recs, win))

    return {
        "qube_heldout_rmse_before": err(start, held),
        "qube_heldout_rmse_after": err(fitted, held),
        "qube_heldout_chirp_rmse_before": err(start, held[:2]),
        "qube_heldout_chirp_rmse_after": err(fitted, held[:2]),
        "qube_heldout_swingup_rmse_before": err(start, held[2:]),
        "qube_heldout_swingup_rmse_after": err(fitted, held[2:]),
        "qube_train_rmse_before": _r(res.train_rmse_before["robot/joint_pos"]),
        "qube_train_rmse_after": _r(res.train_rmse_after["robot/joint_pos"]),
        "qube_params": _param_table(res, res.posterior),
        "qube_evaluations": res.evaluations,
        "qube_failed": res.failed,
        "qube_fit_s": res.wall_s,
        "qube_train": f"1 run of +1.5 V chirp + 1 swing-up, first {seconds:g} s each",
        "qube_heldout": f"2 runs of -1.5 V chirp + 2 other swing-ups, first {seconds:g} s each",
    }


def cube_split(quick: bool) -> tuple[list[Path], list[Path]]:
    """(training, held-out) toss files from a seeded permutation of all of them: CUBE_HELD
    from position CUBE_HELD_FROM held out (never fitted), the first CUBE_TRAIN of the
    others fitted."""
    import numpy as np

    root = data_root() / "cube_tosses"
    files = sorted(root.glob("toss_*.csv"))
    need = max(CUBE_TRAIN[quick] + CUBE_HELD[quick], CUBE_HELD_FROM + CUBE_HELD[quick])
    if len(files) < need:
        raise TwinbenchError(f"{root}: {len(files)} toss_*.csv files, the bench needs {need}")
    order = [int(i) for i in np.random.default_rng(CUBE_SEED).permutation(len(files))]
    a, b = CUBE_HELD_FROM, CUBE_HELD_FROM + CUBE_HELD[quick]
    held = [files[i] for i in order[a:b]]
    train = [files[i] for i in (order[:a] + order[b:])[: CUBE_TRAIN[quick]]]
    return train, held


def cube_errors(spec: Any, values: dict[str, float], recs: list[Any]) -> dict[str, float]:
    """Position (Euclidean, m) and orientation (angle, rad) RMSE of whole-toss replays."""

    r = replay_rmse(spec, recs, None, values, (CUBE_POSE,))
    pos, orn = pose_parts(CUBE_POSE)
    return {"position": r[pos], "orientation": r[orn]}


def cube_fit_config(quick: bool) -> Any:
    """How the cube's contact is fitted (the bench's and the test's settings)."""

    bounds = {
        "contacts.cube.ground.friction": (0.05, 0.8),
        "contacts.cube.ground.restitution": (0.0, 0.8),
    }
    return FitConfig(
        params=tuple(bounds),
        bounds=bounds,
        channels={CUBE_POSE: 1.0},
        window_s=None,  # each toss whole, from release to rest
        budget=40 if quick else 80,
        polish_rounds=1 if quick else 2,
        validation=0,  # the held-out tosses are judged outside the fit
        seed=0,
        # position residuals only (orientation reported apart): on 40 tosses neither fitted
        # nor held out, fits that also weighed the orientation (as metres of the cube's
        # displacement) matched their training tosses' orientation far better (33 -> 24 deg)
        # and generalised worse (position 1.08x the authors' values' error, orientation the same)
        pose_rotation="position",
        global_samples=16 if quick else 32,
    )


def cube(quick: bool, workers: int) -> dict[str, Any]:
    train_files, held_files = cube_split(quick)
    train = [_load(f, "cube_tosses") for f in train_files]
    held = [_load(f, "cube_tosses") for f in held_files]
    table_z = table_height(train)
    spec = cube_toss_twin(table_z=table_z)
    cfg = cube_fit_config(quick)
    with LocalExecutor(workers) as ex:
        res = fit(spec, train, cfg, ex)
    start = {n: spec.params[n].nominal for n in cfg.params}
    fitted = dict(res.estimate)
    authors = cube_authors_values()
    before, after = cube_errors(spec, start, held), cube_errors(spec, fitted, held)
    auth = cube_errors(spec, authors, held)
    train_after, train_auth = cube_errors(spec, fitted, train), cube_errors(spec, authors, train)

    target = {  # issue 26
        "heldout_position_le_20mm": bool(after["position"] <= 0.020),
        "after_below_before": bool(after["position"] < before["position"]),
        "within_1.05x_authors": bool(after["position"] <= 1.05 * auth["position"]),
    }

    def mm(x: float) -> float | None:
        return _r(1000 * x, 4)

    def deg(x: float) -> float | None:
        return _r(math.degrees(x), 4)

    return {
        "cube_heldout_rmse_before": _r(before["position"]),
        "cube_heldout_rmse_after": _r(after["position"]),
        "cube_heldout_rmse_authors_params": _r(auth["position"]),
        "cube_heldout_position_mm_before": mm(before["position"]),
        "cube_heldout_position_mm_after": mm(after["position"]),
        "cube_heldout_position_mm_authors_params": mm(auth["position"]),
        "cube_heldout_orientation_deg_before": deg(before["orientation"]),
        "cube_heldout_orientation_deg_after": deg(after["orientation"]),
        "cube_heldout_orientation_deg_authors_params": deg(auth["orientation"]),
        "cube_train_position_mm_after": mm(train_after["position"]),
        "cube_train_position_mm_authors_params": mm(train_auth["position"]),
        "cube_train_orientation_deg_after": deg(train_after["orientation"]),
        "cube_target": target,
        "cube_fitted": {k.rsplit(".", 1)[1]: _r(v, 4) for k, v in fitted.items()},
        "cube_authors": dict(CUBE_ID),
        "cube_params": _param_table(res, res.posterior),
        "cube_table_z_m": _r(table_z, 4),
        "cube_evaluations": res.evaluations,
        "cube_failed": res.failed,
        "cube_fit_wall_s": res.wall_s,
        "cube_train": [f.stem for f in train_files],
        "cube_heldout": [f.stem for f in held_files],
        "cube_unit": "m (position: Euclidean distance), deg (orientation: rotation angle)",
    }


def run(quick: bool = False) -> dict[str, Any]:
    root = data_root()
    if not (root / "simple_pendulum").is_dir():
        raise TwinbenchError(
            f"{root}: no shared real data here (set TWINBENCH_SHARED_DATA to the folder "
            "holding simple_pendulum/ and furuta_pendulum/)"
        )
    workers = min(2, os.cpu_count() or 1)
    out: dict[str, Any] = {"window_s": dict(WINDOW_S), "workers": workers, "unit": "rad"}
    p = pendulum(quick, workers)
    q = qube(quick, workers)
    out.update(p)
    out.update(q)
    out.update(cube(quick, workers))
    # headline: both data sets, mean of the two held-out errors
    out["heldout_rmse_before"] = _r(
        (p["pendulum_heldout_rmse_before"] + q["qube_heldout_rmse_before"]) / 2
    )
    out["heldout_rmse_after"] = _r(
        (p["pendulum_heldout_rmse_after"] + q["qube_heldout_rmse_after"]) / 2
    )
    return out
