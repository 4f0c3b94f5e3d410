"""Posterior and identifiability against known answers: the Laplace posterior's 90 %
intervals on a linear-Gaussian model hold the truth ~90 % of the time over repeated
noise; a parameter the recording does not excite, and two that only act together, are
flagged; an exploding simulation is a failed column of the Jacobian, not a crash; one
latency tied to several actuators moves them all."""

from __future__ import annotations

import numpy as np
import pytest

from devices.trajectory import Trajectory
from twins.fit.identifiability import from_jacobian, identifiability, jacobian
from twins.fit.objective import Problem, Space, evaluate, residual_size
from twins.fit.posterior import laplace
from twins.fit.steps import FitConfig, _channels, _split
from twins.rigs import qube_twin
from twins.simulate import replay


def test_laplace_intervals_cover_the_truth_90_percent_on_a_linear_gaussian_model() -> None:
    rng = np.random.default_rng(0)
    m, n, sigma = 60, 3, 0.05
    A = rng.normal(size=(m, n))
    theta = np.array([0.3, 0.55, 0.7])  # normalised u in [0, 1], far from the bounds
    hits = np.zeros(n)
    reps = 400
    for _ in range(reps):
        y = A @ theta + sigma * rng.standard_normal(m)
        u_hat, *_ = np.linalg.lstsq(A, y, rcond=None)
        r = A @ u_hat - y
        post = laplace(("a", "b", "c"), u_hat, A, r, lambda u: np.asarray(u), n_samples=0)
        for i, name in enumerate(post.names):
            lo, hi = post.interval90[name]
            hits[i] += lo <= theta[i] <= hi
    cover = hits / reps
    # binomial sd at p = 0.9, 400 draws: 0.015; the residual-variance estimate and the
    # lag-1 inflation (noise here is white) cost a little width either way
    assert np.all(np.abs(cover - 0.9) < 0.05), cover


def test_unexcited_and_inseparable_parameters_are_flagged() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(size=200)
    b = rng.normal(size=200)
    c = a + 0.2 * rng.normal(size=200)  # correlated with a, still told apart
    J = np.stack([a, b, np.zeros(200), 2 * a + 1e-6 * rng.normal(size=200), c], axis=1)
    rep = from_jacobian(("a", "b", "none", "twice_a", "c"), J)
    assert rep.identifiable == {"a": False, "b": True, "none": False, "twice_a": False, "c": True}
    assert "do not excite" in rep.why["none"]
    assert "twice_a" in rep.why["a"] and ("a", "twice_a") in [p[:2] for p in rep.strong_pairs]
    assert "from c " not in rep.why["a"] + " "
    assert rep.sensitivity["none"] == 0.0
    assert rep.sensitivity["b"] == pytest.approx(np.linalg.norm(b) / np.sqrt(200))


def _qube_recording(values: dict[str, float], seconds: float = 1.0) -> Trajectory:
    spec = qube_twin()
    t = np.arange(0, seconds, 0.004)
    V = 2.0 * np.sin(2 * np.pi * (0.5 + 1.0 * t) * t)
    meta = {"joint_names": ["arm", "pendulum"], "command_joints": ["arm"], "name": "chirp"}
    cmd = Trajectory(
        t,
        {"robot/command": V[:, None], "robot/joint_pos": np.zeros((len(t), 2))},
        {"robot/command": "V", "robot/joint_pos": "rad"},
        meta=meta,
    )
    sim = replay(spec, values, cmd)
    rng = np.random.default_rng(3)
    return Trajectory(
        t,
        {
            "robot/joint_pos": sim["robot/joint_pos"] + 0.002 * rng.standard_normal((len(t), 2)),
            "robot/joint_vel": sim["robot/joint_vel"],
            "robot/command": V[:, None],
        },
        {"robot/joint_pos": "rad", "robot/joint_vel": "rad/s", "robot/command": "V"},
        "real",
        meta,
    )


def _problem(spec, rec, params):  # type: ignore[no-untyped-def]
    cfg = FitConfig(params=params, window_s=0.5, validation=0.0)
    train, _ = _split([rec], [], cfg)
    return Problem(spec, Space.of(spec, params), tuple(train), _channels(train, cfg))


def test_a_parameter_the_recording_does_not_excite_is_flagged_in_the_twin() -> None:
    # a 2 V chirp never reaches the 12 V voltage limit: the limit cannot be identified
    spec = qube_twin()
    rec = _qube_recording({})
    params = ("robot.actuators.arm.resistance", "robot.actuators.arm.voltage_limit")
    prob = _problem(spec, rec, params)
    u = prob.space.to_u(np.array([spec.params[p].nominal for p in params]))
    rep = identifiability(prob, u)
    assert rep.identifiable["robot.actuators.arm.resistance"], rep.why
    assert not rep.identifiable["robot.actuators.arm.voltage_limit"]
    assert "do not excite" in rep.why["robot.actuators.arm.voltage_limit"]


def test_an_exploding_simulation_is_a_failed_column_not_a_crash() -> None:
    # at a 10 ms step, pendulum damping near its upper bound makes the integration diverge
    spec = qube_twin().with_values({"sim.time_step": 0.01})
    rec = _qube_recording({"sim.time_step": 0.01})
    params = ("robot.joints.pendulum.damping", "robot.actuators.arm.resistance")
    prob = _problem(spec, rec, params)
    u = np.array([0.995, prob.space.to_u(np.array([0.0, 8.4]))[1]])
    assert evaluate((prob, u)).residuals is None  # the premise: it does explode there
    J = jacobian(prob, u)  # every probe keeps damping near 0.995: all of them explode
    assert J.shape == (residual_size(prob), 2) and J.shape[0] > 0
    assert np.all(np.isnan(J))
    rep = from_jacobian(params, J)
    for p in params:
        assert not rep.identifiable[p] and "failed" in rep.why[p]
    # at zero damping only the damping probe one step up explodes: that column fails, the
    # resistance column is measured and the report says which is which
    J = jacobian(prob, np.array([0.0, u[1]]))
    assert np.all(np.isnan(J[:, 0])) and np.all(np.isfinite(J[:, 1]))
    rep = from_jacobian(params, J)
    assert "failed" in rep.why[params[0]]
    assert rep.identifiable[params[1]], rep.why[params[1]]


def test_a_tied_latency_moves_every_actuator() -> None:
    spec = qube_twin()
    names = ("robot.actuators.arm.latency",)
    with pytest.raises(Exception, match="not being fitted"):
        Space.of(spec, names, tie={"robot.joints.arm.damping": names})
    space = Space.of(spec, ("robot.joints.arm.damping",), tie={})
    assert space.all_values(np.array([0.5])) == space.values(np.array([0.5]))
    space = Space.of(
        spec,
        ("robot.joints.arm.damping",),
        tie={"robot.joints.arm.damping": ("robot.joints.pendulum.damping",)},
    )
    v = space.all_values(np.array([0.5]))
    assert v["robot.joints.pendulum.damping"] == v["robot.joints.arm.damping"] > 0


@pytest.mark.slow
def test_cmaes_stops_early_when_it_stalls_and_the_polish_finishes() -> None:
    from twins.fit import fit

    truth = {"robot.actuators.arm.resistance": 11.0}
    rec = _qube_recording(truth, seconds=1.0)
    cfg = FitConfig(
        params=tuple(truth),
        window_s=0.5,
        budget=400,
        polish_rounds=2,
        validation=0.0,
        stall_generations=3,
    )
    res = fit(qube_twin(), [rec], cfg)
    assert any("CMA-ES stopped after generation" in n for n in res.notes), res.notes
    assert res.evaluations < 200
    assert res.estimate["robot.actuators.arm.resistance"] == pytest.approx(11.0, rel=0.02)


def test_what_the_data_cannot_see_keeps_the_prior_width_and_saves_as_json() -> None:
    """A parameter with no effect on the residuals gets an interval spanning most of its
    bounds (not the zero width a truncated pseudo-inverse gave it) and is flagged; a failed
    column keeps the whole prior; the posterior round-trips through JSON (no inf/nan)."""
    import json

    from twins.fit.posterior import ParamPosterior

    rng = np.random.default_rng(4)
    m = 300
    a = rng.normal(size=m)
    J = np.stack([a, 1e-13 * rng.normal(size=m), np.full(m, np.nan)], axis=1)
    r = 0.01 * rng.standard_normal(m)
    u = np.array([0.4, 0.5, 0.6])

    def to_x(v):  # type: ignore[no-untyped-def]
        return 2.0 + 4.0 * np.asarray(v)  # bounds 2..6

    post = laplace(("seen", "unseen", "failed"), u, J, r, to_x, n_samples=200)
    lo, hi = post.interval90["seen"]
    assert hi - lo < 0.01 and post.identifiable["seen"]  # sd ~ 0.01/sqrt(300) in u
    lo, hi = post.interval90["unseen"]
    assert hi - lo > 0.8 * 4.0 * 2 * 1.645 / np.sqrt(12) * 0.9 and not post.identifiable["unseen"]
    assert post.interval90["failed"] == (2.0, 6.0) and not post.identifiable["failed"]
    assert post.samples.shape == (200, 3) and np.all(np.isfinite(post.samples))
    text = json.dumps(post.to_json(), allow_nan=False)  # what fit.json's writer does
    back = ParamPosterior.from_json(json.loads(text))
    for n in post.names:
        assert back.interval90[n] == pytest.approx(post.interval90[n])
        assert back.identifiable[n] == post.identifiable[n]
