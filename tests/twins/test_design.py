"""D-optimal choice of the next recording on the Panda twin: a motion that never moves a
joint teaches nothing about that joint's actuator (exactly zero information), the ranking
prefers the motion that excites what is still unknown, and fitting with the suggested
recording really shrinks the posterior far more than with the poor one."""

from __future__ import annotations

import numpy as np
import pytest

from devices.robots.excitation import plan
from devices.trajectory import Trajectory
from twins.fit import FitConfig, fit
from twins.fit.design import (
    PRIOR_INFO,
    default_candidates,
    information,
    rank,
    robot_info_for,
    simulate_motion,
    start_pose,
)
from twins.spec import TwinSpec

LAT = ("robot.actuators.panda_joint1.latency", "robot.actuators.panda_joint4.latency")
BW = ("robot.actuators.panda_joint1.bandwidth", "robot.actuators.panda_joint4.bandwidth")


def _chirp(spec: TwinSpec, joint: str, f1: float = 1.5) -> object:
    info = robot_info_for(spec)
    return plan(
        "chirp", info, start_pose(spec, info), amplitude=0.1, duration=2.0, joints=joint, f1=f1
    )


def test_a_motion_that_never_moves_a_joint_gains_nothing_about_it(demo_twin: TwinSpec) -> None:
    spec = demo_twin
    values = {LAT[0]: 0.01, LAT[1]: 0.01}
    m1, m4 = _chirp(spec, "panda_joint1"), _chirp(spec, "panda_joint4")
    F1 = information(spec, values, LAT, [simulate_motion(spec, values, m1)])  # type: ignore[arg-type]
    # joint 4's command never changes, so its latency changes nothing: zero, not small
    assert F1[1, 1] == 0.0 and F1[0, 1] == 0.0 and F1[1, 0] == 0.0
    assert F1[0, 0] > 100 * PRIOR_INFO
    # the information scales as 1 / sigma^2 (residuals are divided by the noise)
    F1b = information(
        spec,
        values,
        LAT[:1],
        [simulate_motion(spec, values, m1)],  # type: ignore[arg-type]
        sigma={"robot/joint_pos": 2e-3},
    )
    assert F1b[0, 0] == pytest.approx(F1[0, 0] / 4, rel=1e-9)
    ranked = rank(spec, values, LAT, {"again joint 1": m1, "joint 4": m4}, current=F1)  # type: ignore[dict-item]
    best, poor = ranked
    assert best.name == "joint 4"
    assert poor.shrink[LAT[1]] == pytest.approx(0.0, abs=1e-12)  # exactly nothing on joint 4
    assert best.shrink[LAT[1]] > 0.5 and best.shrink[LAT[0]] < 0.05
    assert best.gain > poor.gain + 1.0  # nats


def _recording(spec: TwinSpec, truth: dict[str, float], motion: object, seed: int) -> Trajectory:
    sim = simulate_motion(spec, truth, motion)  # type: ignore[arg-type]
    rng = np.random.default_rng(seed)
    q = sim["robot/joint_pos"] + 1e-3 * rng.standard_normal(sim["robot/joint_pos"].shape)
    return sim.with_channels(
        channels={**dict(sim.channels), "robot/joint_pos": q},
        source="real",
        meta={**dict(sim.meta), "name": f"rec{seed}"},
    )


def _cov_det(post: object, names: tuple[str, ...]) -> float:
    std = np.array([post.std[n] for n in names])  # type: ignore[attr-defined]
    return float(np.linalg.det(post.correlation * np.outer(std, std)))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_suggested_recording_shrinks_the_posterior_more_than_a_poor_one(
    demo_twin: TwinSpec,
) -> None:
    spec = demo_twin
    truth = {BW[0]: 30.0, BW[1]: 45.0}
    estimate = {BW[0]: 22.0, BW[1]: 22.0}
    have = _recording(spec, truth, _chirp(spec, "panda_joint1"), seed=1)
    current = information(spec, estimate, BW, [have])
    cands = {
        "chirp joint 1 again": _chirp(spec, "panda_joint1", f1=1.2),
        "chirp joint 4": _chirp(spec, "panda_joint4"),
    }
    ranked = rank(spec, estimate, BW, cands, current=current)  # type: ignore[arg-type]
    assert [s.name for s in ranked] == ["chirp joint 4", "chirp joint 1 again"]
    cfg = FitConfig(params=BW, window_s=1.0, budget=0, polish_rounds=2, validation=0.0)
    at = spec.with_values(estimate)
    results = {}
    for i, s in enumerate(ranked):
        new = _recording(spec, truth, cands[s.name], seed=10 + i)
        results[s.name] = fit(at, [have, new], cfg)
    good, poor = results["chirp joint 4"], results["chirp joint 1 again"]
    det_good, det_poor = _cov_det(good.posterior, BW), _cov_det(poor.posterior, BW)
    # (each posterior's variances carry its own residuals' correlation time, so the ratio of
    # the two determinants is a little less extreme than the information alone says)
    assert det_good < det_poor / 10, (det_good, det_poor)
    # and the suggested recording pins joint 4's bandwidth down where the poor one cannot
    assert good.estimate[BW[1]] == pytest.approx(45.0, rel=0.05)
    assert good.posterior.identifiable[BW[1]] and not poor.posterior.identifiable[BW[1]]
    lo, hi = poor.posterior.interval90[BW[1]]
    assert hi - lo > 5 * (good.posterior.interval90[BW[1]][1] - good.posterior.interval90[BW[1]][0])


def test_default_candidates_fit_the_robot_and_cover_each_joint(demo_twin: TwinSpec) -> None:
    info = robot_info_for(demo_twin)
    cands = default_candidates(info, start_pose(demo_twin, info), duration=3.0)
    assert {"chirp", "multisine"} <= set(cands)
    for j in info.joint_names:
        assert cands[f"chirp:{j}"].moved_joints() == [j]
        assert cands[f"steps:{j}"].moved_joints() == [j]
