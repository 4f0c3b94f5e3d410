"""Failure-driven curriculum: a task replays recorded initial conditions (a failed real
run's start pose, goal and object start) in the share of episodes the config asks, exactly
as recorded; bad records are refused naming what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

from policies.errors import PolicyError
from policies.tasks import make_env
from policies.tasks.push import PushEnv
from twins.spec import TwinSpec


def test_reach_and_push_start_where_the_real_run_did(demo_twin: TwinSpec) -> None:
    home = make_env("reach", demo_twin, {"episode_s": 0.1}, seed=0)
    q_home = home.q_home.copy()
    home.close()
    start = q_home + np.array([0.1, -0.1, 0.05, 0.1, 0.0, -0.05, 0.1])
    goal = q_home + np.array([-0.2, 0.15, 0.0, -0.1, 0.05, 0.1, 0.0])
    cond = {"start": start.tolist(), "goal": goal.tolist()}
    env = make_env("reach", demo_twin, {"episode_s": 0.1, "replay_starts": [cond],
                                        "replay_share": 1.0}, seed=1)  # fmt: skip
    try:
        for seed in (2, 3):
            env.reset(seed=seed)
            assert env.replayed == 0
            assert np.allclose(env.q, start, atol=1e-6) and np.allclose(env.target, goal)
    finally:
        env.close()
    # at a share of 0.3, about 30 % of the episodes (binomial, 200 draws: 3 sigma is 0.1)
    env = make_env("reach", demo_twin, {"episode_s": 0.1, "replay_starts": [cond],
                                        "replay_share": 0.3}, seed=1)  # fmt: skip
    try:
        hits = 0
        for seed in range(200):
            env.reset(seed=seed)
            hits += env.replayed is not None
        assert abs(hits / 200 - 0.3) < 0.1
    finally:
        env.close()
    probe = make_env("push", demo_twin, seed=0)
    assert isinstance(probe, PushEnv)
    obj = np.array(demo_twin.object(probe._obj).pose, dtype=np.float64)
    obj[:2] += [0.02, -0.03]
    cond = {"start": start.tolist(), "goal": [obj[0] + 0.1, obj[1]], "object_start": obj.tolist()}
    env = make_env("push", demo_twin, {"episode_s": 0.1, "replay_starts": [cond],
                                       "replay_share": 1.0}, seed=1)  # fmt: skip
    assert isinstance(env, PushEnv)
    try:
        env.reset(seed=4)
        assert np.allclose(env.q, start, atol=1e-6)
        assert np.allclose(env.obj_pose[:3], obj[:3], atol=2e-3)  # as placed, settled
        assert np.allclose(env.goal, [obj[0] + 0.1, obj[1]])
    finally:
        env.close()


def test_bad_recorded_conditions_are_refused(demo_twin: TwinSpec) -> None:
    bad = {"start": [0.0, 0.1], "goal": [0.0] * 7}
    env = make_env("reach", demo_twin, {"episode_s": 0.1, "replay_starts": [bad],
                                        "replay_share": 1.0}, seed=1)  # fmt: skip
    try:
        with pytest.raises(PolicyError, match="replayed start has 2 joint values"):
            env.reset(seed=0)
    finally:
        env.close()
