"""Object-only recordings are first-class: a box tossed and a ball dropped (no robot), made by
the twin at hidden parameter values with tracker-like noise, written as CSV, imported
through a column mapping, replayed from the state their first samples show, and fitted
back (box friction, ball restitution); samples a tracker flagged lost do not count."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from devices.mapping import import_table, load_mapping
from devices.poses import POSE_UNIT
from devices.trajectory import Trajectory
from twins.executor import SerialExecutor
from twins.fit import FitConfig, fit
from twins.fit.objective import replay_rmse
from twins.make import assemble, primitive_object
from twins.object_motion import TWIST_KEY, initial_object_state
from twins.simulate import replay
from twins.spec import TwinSpec

TRUTH = {"objects.box.friction": 0.3, "objects.ball.restitution": 0.7}  # nominal 0.5, 0.1
REST = {"box": (0.3, -0.2, 0.025, 0, 0, 0, 1), "ball": (0.3, 0.3, 0.03, 0, 0, 0, 1)}
NOISE_M = 0.0005
CHANNELS = ("objects/box/pose", "objects/ball/pose")


def _twin() -> TwinSpec:
    box = primitive_object("box", "box", (0.04, 0.025, 0.025), REST["box"], mass=0.25)
    ball = primitive_object("ball", "sphere", (0.03,), REST["ball"], mass=0.1)
    # a springy floor, so that the ball's own restitution shows in its bounces
    return assemble("tabletop", objects=[box, ball]).with_values({"env.ground.restitution": 1.0})


def _made_by_twin(
    spec: TwinSpec, moving: str, start: tuple[float, ...], twist: list[float], seed: int
) -> tuple[Trajectory, dict[str, np.ndarray]]:
    """(noisy 60 Hz recording without any velocity in it, true poses)."""
    t = np.arange(0, 1.2, 1 / 60)
    poses = {
        n: np.repeat(np.asarray(start if n == moving else p, float)[None], len(t), 0)
        for n, p in REST.items()
    }
    ch = {f"objects/{n}/pose": P for n, P in poses.items()}
    units = {k: POSE_UNIT for k in ch}
    true = replay(spec, TRUTH, Trajectory(t, ch, units, meta={TWIST_KEY: {moving: twist}}))
    rng = np.random.default_rng(seed)
    out = {}
    for k in ch:
        P = np.array(true[k])
        P[:, :3] += rng.normal(0, NOISE_M, (len(t), 3))
        out[k] = P
    return Trajectory(t, out, units, "real"), {k: true[k] for k in ch}


def _through_csv(rec: Trajectory, folder: Path, name: str) -> Trajectory:
    """Write `rec` as a lab's CSV log (time in ms, positions in mm) and import it."""
    cols = {"time_ms": rec.t * 1000}
    chans = {}
    for obj in ("box", "ball"):
        P = rec[f"objects/{obj}/pose"]
        names = [f"{obj}_{c}" for c in ("x", "y", "z", "qx", "qy", "qz", "qw")]
        cols.update({n: P[:, k] * (1000 if k < 3 else 1) for k, n in enumerate(names)})
        chans[f"objects/{obj}/pose"] = {"columns": names, "unit": POSE_UNIT, "scale": 0.001}
    csv = folder / f"{name}.csv"
    rows = np.column_stack(list(cols.values()))
    np.savetxt(csv, rows, delimiter=",", header=",".join(cols), comments="", fmt="%.9g")
    mapping = folder / "objects.json"
    mapping.write_text(
        json.dumps(
            {
                "format": "twinbench-mapping",
                "time": {"column": "time_ms", "unit": "ms"},
                "channels": chans,
            }
        )
    )
    return import_table(csv, load_mapping(mapping), name)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    spec = _twin()
    folder = tmp_path_factory.mktemp("logs")
    toss, toss_true = _made_by_twin(
        spec, "box", (0.3, -0.2, 0.12, 0, 0, 0, 1), [1.2, 0.2, 0.3, 0, 0, 0], 0
    )
    drop, drop_true = _made_by_twin(
        spec, "ball", (0.3, 0.3, 0.3, 0, 0, 0, 1), [0.2, 0, 0, 0, 0, 0], 1
    )
    return {
        "spec": spec,
        "toss": _through_csv(toss, folder, "toss"),
        "drop": _through_csv(drop, folder, "drop"),
        "toss_true": toss_true,
    }


def test_the_start_velocity_comes_from_the_first_samples(recordings: dict) -> None:
    spec, toss = recordings["spec"], recordings["toss"]
    assert toss.meta["name"] == "toss" and toss.source == "real"
    est = initial_object_state(toss.t, toss["objects/box/pose"])
    assert est is not None
    pose, twist, falling = est
    assert falling  # tossed: in the air at the first sample
    assert twist[:3] == pytest.approx(
        [1.2, 0.2, 0.3 - 9.81 / 480], abs=0.01
    )  # PyBullet's half step
    assert np.abs(pose[:3] - [0.3, -0.2, 0.12]).max() < 0.001
    # replayed at the true values from that state, the toss lands where it was recorded ...
    true = recordings["toss_true"]["objects/box/pose"]
    sim = replay(spec, TRUTH, toss)["objects/box/pose"]
    assert np.sqrt(np.mean((sim[:, :3] - true[:, :3]) ** 2)) < 0.002
    # ... and started at rest instead (what replay did before), it would not
    still = toss.with_channels(meta={TWIST_KEY: {}})
    sim0 = replay(spec, TRUTH, still)["objects/box/pose"]
    assert np.sqrt(np.mean((sim0[:, :3] - true[:, :3]) ** 2)) > 0.05
    # the ball at rest in the same recording stays at rest (no velocity invented from noise)
    ball = initial_object_state(toss.t, toss["objects/ball/pose"])
    assert ball is not None and np.all(ball[1] == 0.0) and not ball[2]


@pytest.mark.slow
def test_friction_and_restitution_are_fitted_back_from_object_only_recordings(
    recordings: dict,
) -> None:
    spec = recordings["spec"]
    cfg = FitConfig(
        params=tuple(TRUTH),
        channels={c: 1.0 for c in CHANNELS},
        window_s=None,
        budget=40,
        polish_rounds=2,
        validation=0,
    )
    res = fit(spec, [recordings["toss"], recordings["drop"]], cfg, SerialExecutor())
    for name, true in TRUTH.items():
        # within 3 %; the 90 % intervals are not asserted: the Laplace posterior does not
        # know that the start state is itself estimated from noisy samples, and comes out
        # a few times too narrow here (friction 0.3006-0.3013 around 0.3009, truth 0.3)
        assert res.estimate[name] == pytest.approx(true, rel=0.03), (name, res.estimate)
        assert res.posterior.identifiable[name]
    assert res.train_rmse_before["objects/box/pose"] > 0.05
    assert res.train_rmse_after["objects/box/pose"] < 0.005  # noise: 0.5 mm + rotation
    assert res.failed == 0


def test_samples_a_tracker_flagged_lost_are_not_evidence(recordings: dict) -> None:
    spec, toss = recordings["spec"], recordings["toss"]
    P = np.array(toss["objects/box/pose"])
    P[30:45, :3] += 0.05  # the tracker jumped to something else for a quarter second
    flags = np.zeros((len(toss), 2))
    flags[:, 0] = 0.8
    flags[30:45] = (0.1, 1.0)
    units = {**dict(toss.units), "objects/box/track_quality": "1"}
    bad = toss.with_channels(channels={**dict(toss.channels), "objects/box/pose": P})
    flagged = bad.with_channels(
        channels={**dict(bad.channels), "objects/box/track_quality": flags}, units=units
    )
    ch = ("objects/box/pose",)
    clean = replay_rmse(spec, [toss], None, TRUTH, ch)["objects/box/pose"]
    wrong = replay_rmse(spec, [bad], None, TRUTH, ch)["objects/box/pose"]
    excluded = replay_rmse(spec, [flagged], None, TRUTH, ch)["objects/box/pose"]
    assert wrong > 5 * clean
    assert excluded <= clean * 1.05


def test_a_start_the_tracker_lost_is_read_back_from_the_curve(recordings: dict) -> None:
    spec, toss = recordings["spec"], recordings["toss"]
    P = np.array(toss["objects/box/pose"])
    P[:4, :3] += 0.05  # the first 4 samples (50 ms) were something else ...
    flags = np.zeros((len(toss), 2))
    flags[:4, 1] = 1.0  # ... and the tracker said so
    lost_start = toss.with_channels(
        channels={
            **dict(toss.channels),
            "objects/box/pose": P,
            "objects/box/track_quality": flags,
        },
        units={**dict(toss.units), "objects/box/track_quality": "1"},
    )
    true = recordings["toss_true"]["objects/box/pose"]
    sim = replay(spec, TRUTH, lost_start)["objects/box/pose"]
    assert np.sqrt(np.mean((sim[:, :3] - true[:, :3]) ** 2)) < 0.003
    assert np.linalg.norm(sim[0, :3] - true[0, :3]) < 0.002
