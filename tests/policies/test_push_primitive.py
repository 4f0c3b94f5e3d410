"""The `push_ik` pushing primitive: its kinematics are the twin's, its numpy, torch and
ONNX forms agree on stored inputs, and a small CEM training pushes the object to the goal
in the twin it was trained in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from policies import push_primitive as pp
from policies.cem import CemSettings
from policies.evaluate import evaluate
from policies.export import to_onnx, torch_outputs
from policies.motion_primitives import task_chain
from policies.policy import Policy
from policies.randomization import Randomization
from policies.tasks import make_env
from policies.train import TrainSettings, sample_observations, train_steps
from twins.spec import TwinSpec


def _observations(twin: TwinSpec) -> np.ndarray:
    X = sample_observations("push", twin, {}, Randomization(), 24, seed=3)
    rng = np.random.default_rng(0)  # and some far from where episodes go
    Y = X + rng.normal(0.0, 0.05, X.shape).astype(np.float32)
    return np.concatenate([X, Y]).astype(np.float32)


def test_chain_is_the_twins_kinematics(demo_twin: TwinSpec) -> None:
    env = make_env("push", demo_twin, seed=0)
    try:
        chain = task_chain(env)
        assert chain.link == "panda_grasptarget"
        rng = np.random.default_rng(1)
        for _ in range(5):
            q = env.q_home + rng.uniform(-0.5, 0.5, env.q_home.shape)
            np.testing.assert_allclose(chain.pose(q), env._kin.link_pose(chain.link, q), atol=1e-12)
    finally:
        env.close()


def test_numpy_torch_and_onnx_forms_agree(demo_twin: TwinSpec) -> None:
    env = make_env("push", demo_twin, seed=0)
    try:
        chain, spec = task_chain(env), env.policy_spec
    finally:
        env.close()
    X = _observations(demo_twin)
    rng = np.random.default_rng(2)
    for x in (pp.initial_mean(), pp.initial_mean() + rng.normal(0, 0.5, pp.n_params())):
        fast = np.stack([pp.actor(spec, chain, x)(o) for o in X])
        batch = pp.batch_actor(spec, chain, x)(X)
        module = pp.torch_module(spec, chain, x)
        ref = torch_outputs(module, X)
        onnx = Policy(to_onnx(module, spec.obs_dim), spec)
        got = np.stack([onnx.act(o) for o in X])
        # float32 arithmetic against float64 scalars: agree to rounding
        assert np.max(np.abs(fast - ref)) < 1e-4
        assert np.max(np.abs(batch - ref)) < 1e-5
        assert np.max(np.abs(got - ref)) < 1e-5
        assert np.all(np.abs(ref) <= 1.0) and np.max(np.abs(ref)) > 0.1  # it acts


def test_values_round_trip_and_bad_input() -> None:
    vals = pp.to_values(pp.initial_mean())
    for name, _lo, _hi, default in pp.PARAMS:
        assert vals[name] == pytest.approx(default, abs=1e-6)
    with pytest.raises(Exception, match="13 parameters"):
        pp.to_values(np.zeros(3))


@pytest.mark.slow
def test_small_cem_training_pushes_to_the_goal(demo_twin: TwinSpec, tmp_path: Path) -> None:
    """pop 4 x 2 episodes x 2 generations; then 10 fresh seeded episodes (seeds 10000..)
    of the exported ONNX model: at least 8 within the task's 3 cm of the goal."""
    settings = TrainSettings(
        "cem", seed=0, cem=CemSettings(population=4, generations=2, episodes=2)
    )
    gen = train_steps("push", demo_twin, {}, Randomization(), settings, tmp_path / "ck")
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        out = stop.value
    pol = out.policy
    assert pol.record["training"]["primitive"] == "push_ik"
    assert pol.record["onnx_check"]["max_abs_err"] < 1e-5
    got = np.stack([pol.act(x) for x in out.check_inputs])
    np.testing.assert_allclose(got, out.check_outputs, atol=1e-5)
    ev = evaluate(pol, "push", demo_twin, {}, None, episodes=10)
    assert ev["successes"] >= 8, ev


def test_chain_carries_the_urdf_joint_limits(demo_twin: TwinSpec) -> None:
    env = make_env("push", demo_twin, seed=0)
    try:
        chain = task_chain(env)
        np.testing.assert_allclose(chain.lower, env.lower)
        np.testing.assert_allclose(chain.upper, env.upper)
        mid, inv_half = pp.posture(chain)
        np.testing.assert_allclose(mid, (env.lower + env.upper) / 2)
        np.testing.assert_allclose(inv_half * (env.upper - env.lower), 2.0)
    finally:
        env.close()


def test_the_hand_leans_into_the_push_with_its_narrow_side_first(demo_twin: TwinSpec) -> None:
    """The hand-set push in the demo twin: once the tool has reached the pre-push point its
    z axis leans TILT from straight down towards the push, its x axis (the Panda hand's
    narrow side) lies along the push, and no joint has come within 0.05 rad of a limit."""
    env = make_env("push", demo_twin, seed=0)
    try:
        chain, spec = task_chain(env), env.policy_spec
        act = pp.actor(spec, chain, pp.initial_mean())
        sl = spec.slices()
        for seed in (10000, 10001, 10002):
            obs, _ = env.reset(seed=seed)
            margin = np.inf
            for _ in range(int(1.5 * 250)):  # 1.5 s: travelled, not yet pushing
                obs, _, term, trunc, _ = env.step(act(obs))
                margin = min(
                    margin, float(np.min(np.minimum(env.q - env.lower, env.upper - env.q)))
                )
                assert not (term or trunc)
            R = (env._T_world_base @ chain.pose(env.q))[:3, :3]
            goal, o = obs[sl["object_goal"]], obs[sl["object_pose"]][:2]
            u = np.append((goal - o) / np.linalg.norm(goal - o), 0.0)
            z, x = R[:, 2], R[:, 0]
            lean = np.degrees(np.arccos(-z[2]))
            assert lean == pytest.approx(np.degrees(pp.TILT), abs=3.0), (seed, lean)
            assert z[:2] @ u[:2] / np.linalg.norm(z[:2]) > 0.97  # leaning towards the push
            assert abs(x @ u) > 0.9  # the narrow side faces the push
            assert margin > 0.05, (seed, margin)
    finally:
        env.close()
