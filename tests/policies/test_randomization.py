"""Domain randomization: hand-set distributions on the ParamSet, posterior rows, and the
sensor model (noise, latency, dropouts) as the policy sees it in a task."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from policies.errors import PolicyError
from policies.randomization import (
    Dist,
    Randomization,
    SensorNoise,
    load_posterior,
    manual,
    posterior,
)
from policies.tasks import make_env
from twins.spec import TwinSpec

FRICTION = "objects.cylinder.friction"  # uniform prior, bounds [0, 2]
MASS = "robot.links.panda_hand.mass"  # lognormal prior, bounds [0.162, 4.05]


def test_manual_distributions_follow_their_law_and_bounds(demo_twin: TwinSpec) -> None:
    ps = demo_twin.params
    rng = np.random.default_rng(0)
    dr = manual([f"{FRICTION}=uniform:0.3:0.8", f"{MASS}=prior"])
    draws = [dr.sample(rng, ps).values for _ in range(4000)]
    f = np.array([d[FRICTION] for d in draws])
    m = np.array([d[MASS] for d in draws])
    assert f.min() >= 0.3 and f.max() <= 0.8
    assert abs(f.mean() - 0.55) < 0.01 and abs(f.std() - 0.5 / np.sqrt(12)) < 0.01
    # the lognormal prior: median at the geometric centre of the bounds, bounds ~ 2 sigma
    p = ps[MASS]
    assert abs(np.median(np.log(m)) - 0.5 * np.log(p.low * p.high)) < 0.05
    assert m.min() >= p.low and m.max() <= p.high
    assert 0.02 < np.mean((m == p.low) | (m == p.high)) < 0.08  # clipped tails ~ 4.6 %
    # a normal draw far outside the bounds is clipped to them
    wide = manual({FRICTION: "normal:5:0.1"})
    assert wide.sample(rng, ps).values[FRICTION] == 2.0


def test_posterior_rows_keep_correlation(tmp_path: Path, demo_twin: TwinSpec) -> None:
    rng = np.random.default_rng(1)
    x = rng.multivariate_normal([0.6, 1.0], [[0.01, 0.0095], [0.0095, 0.01]], size=300)
    path = tmp_path / "samples.npz"
    np.savez(path, names=np.array([FRICTION, MASS]), x=x)
    dr = load_posterior(path)
    assert dr.mode == "posterior" and dr.to_json()["n_samples"] == 300
    draws = np.array(
        [
            [d[FRICTION], d[MASS]]
            for d in (dr.sample(rng, demo_twin.params).values for _ in range(500))
        ]
    )
    rows = {tuple(np.round(r, 12)) for r in x}
    assert all(tuple(np.round(d, 12)) in rows for d in draws)  # whole rows, never mixed
    assert np.corrcoef(draws.T)[0, 1] > 0.9
    # the training distribution as a table, next to the posterior it came from
    names, table = dr.draws(demo_twin.params, 400, seed=2)
    assert names == sorted([FRICTION, MASS]) and table.shape == (400, 2)
    col = names.index(FRICTION)
    assert abs(table[:, col].mean() - x[:, 0].mean()) < 0.02
    assert abs(table[:, col].std() - x[:, 0].std()) < 0.02


def test_bad_randomization_is_refused_with_names(tmp_path: Path, demo_twin: TwinSpec) -> None:
    with pytest.raises(PolicyError, match="high is below low"):
        Dist.parse("uniform:2:1")
    with pytest.raises(PolicyError, match="takes 2 number"):
        Dist.parse("normal:1")
    with pytest.raises(PolicyError, match="expected NAME=DIST"):
        manual(["objects.box.friction"])
    with pytest.raises(PolicyError, match="the twin lacks it"):
        manual({"objects.ghost.friction": "prior"}).check(demo_twin.params)
    with pytest.raises(PolicyError, match="NaN or inf"):
        posterior([FRICTION], np.array([[np.nan]]))
    with pytest.raises(PolicyError, match=r"\(n, 2\)"):
        posterior([FRICTION, MASS], np.ones((4, 3)))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(PolicyError, match="bad.npz"):
        load_posterior(bad)


def test_env_uses_drawn_physics_and_delays_observations(demo_twin: TwinSpec) -> None:
    noise = SensorNoise(latency_ticks_min=3, latency_ticks_max=3)
    dr = manual({"robot.joints.panda_joint1.damping": "uniform:1:2"}, noise)
    env = make_env("reach", demo_twin, {"episode_s": 0.2}, dr, seed=0)
    try:
        seen = []
        for seed in (0, 1):
            obs, _ = env.reset(seed=seed)
            v = env.world.values["robot.joints.panda_joint1.damping"]
            assert v == env.conditions.values["robot.joints.panda_joint1.damping"]
            assert 1.0 <= v <= 2.0
            seen.append(v)
            s = env.policy_spec.slices()["joint_pos"]
            true_q = [env.q.copy()]
            a = np.ones(7, np.float32)
            for _ in range(6):
                obs, *_ = env.step(a)
                true_q.append(env.q.copy())
            # observation after k steps shows the state of step k - 3
            assert np.allclose(obs[s], true_q[-4], atol=1e-6)
            assert not np.allclose(obs[s], true_q[-1], atol=1e-4)
        assert seen[0] != seen[1]  # a new world per draw
    finally:
        env.close()


def test_dropouts_freeze_the_object_and_long_ones_stop_the_policy(demo_twin: TwinSpec) -> None:
    noise = SensorNoise(dropout_rate_hz=1e4, dropout_mean_s=10.0, max_stale_s=0.1)
    env = make_env(
        "push", demo_twin, {"episode_s": 1.0}, Randomization("none", noise=noise), seed=0
    )
    try:
        obs, _ = env.reset(seed=0)
        s = env.policy_spec.slices()["object_pose"]
        first = obs[s].copy()
        steps = 0
        while True:
            obs, r, term, trunc, info = env.step(np.zeros(7, np.float32))
            steps += 1
            assert np.array_equal(obs[s], first)  # frozen while tracking is lost
            if term or trunc:
                break
        assert term and info["stopped"].startswith("object tracking lost")
        assert not info["is_success"]
        assert abs(steps * env.ctrl_dt - 0.1) <= 2 * env.ctrl_dt
    finally:
        env.close()


def test_sensor_noise_has_its_spread(demo_twin: TwinSpec) -> None:
    noise = SensorNoise(joint_pos_std=0.01, object_pos_std=0.005)
    env = make_env(
        "push", demo_twin, {"episode_s": 0.5}, Randomization("none", noise=noise), seed=0
    )
    try:
        env.reset(seed=0)
        s = env.policy_spec.slices()
        dq, dp = [], []
        for _ in range(100):
            obs, *_ = env.step(np.zeros(7, np.float32))
            dq.append(obs[s["joint_pos"]] - env.q)
            dp.append(obs[s["object_pose"]][:3] - env.world.object_pose("cylinder")[:3])
        assert abs(np.std(dq) - 0.01) < 0.001
        assert abs(np.std(dp) - 0.005) < 0.0007
    finally:
        env.close()
