"""Every registered task: spaces match its policy spec (and the agent's spec where the agent
knows the terms), episodes run to their length with finite rewards, and the task's
success test means what it says."""

from __future__ import annotations

import numpy as np
import pytest

from devices.errors import DeviceError
from devices.robots.wire.policy_spec import JOINT_TERMS, PolicySpec
from policies.errors import PolicyError
from policies.tasks import TASKS, make_env, task_config
from policies.tasks.push import PushEnv
from policies.tasks.reach import ReachEnv, oracle
from twins.spec import TwinSpec

SHORT = {"episode_s": 0.25}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_spaces_and_steps(name: str, demo_twin: TwinSpec) -> None:
    cfg = TASKS[name].default_config()
    assert cfg.replace({}) == cfg and cfg.to_json()["control_rate_hz"] == 250.0
    env = make_env(name, demo_twin, SHORT, seed=3)
    try:
        spec = env.policy_spec
        assert spec.joints == tuple(f"panda_joint{i}" for i in range(1, 8))
        assert env.observation_space.shape == (spec.obs_dim,)
        assert env.action_space.shape == (spec.n,)
        assert spec.action_type == "delta" and spec.action_mode == "position"
        obs, _ = env.reset(seed=5)
        assert obs.shape == (spec.obs_dim,) and obs.dtype == np.float32
        s = spec.slices()
        # the observation is the measured state (no noise configured)
        assert np.allclose(obs[s["joint_pos"]], env.q, atol=1e-6)
        steps, rewards = 0, []
        while True:
            obs, r, term, trunc, info = env.step(env.action_space.sample())
            steps += 1
            rewards.append(r)
            assert obs.shape == (spec.obs_dim,) and np.all(np.isfinite(obs))
            if term or trunc:
                break
        assert not term and steps == env.n_steps
        assert abs(steps * env.ctrl_dt - 0.25) <= env.ctrl_dt
        assert "is_success" in info and np.all(np.isfinite(rewards))
        # the deploy spec is the JSON the agent gets; it round-trips
        d = env.deploy_spec.to_dict()
        assert PolicySpec.from_dict(d) == env.deploy_spec
        # the agent reads the same spec into the same observation layout
        agent = PolicySpec.from_dict(d, robot_joints=spec.joints)
        assert agent == env.deploy_spec and agent.obs_dim == spec.obs_dim
        assert agent.observation == spec.observation
        assert agent.action_type == "delta" and agent.action_scale == spec.action_scale
        if not set(spec.observation) <= set(JOINT_TERMS):
            assert agent.object == spec.object
            assert agent.object_goal == env.deploy_spec.object_goal
            assert agent.object_max_age_s == spec.object_max_age_s
            bad = {k: v for k, v in d.items() if k != "object"}
            with pytest.raises(DeviceError, match="names no 'object'"):
                PolicySpec.from_dict(bad, robot_joints=spec.joints)
    finally:
        env.close()


def test_reach_oracle_succeeds_and_idle_fails(demo_twin: TwinSpec) -> None:
    env = make_env("reach", demo_twin, seed=0)
    assert isinstance(env, ReachEnv)
    try:
        for seed in (1, 2, 3):
            obs, _ = env.reset(seed=seed)
            start_err = env.error()
            assert start_err > 0.1  # start and goal are drawn apart
            goal_ee = env.ee_position(env.target)
            assert goal_ee[2] >= task_config("reach").min_ee_height  # type: ignore[attr-defined]
            while True:
                obs, _, term, trunc, info = env.step(oracle(env.policy_spec, obs))
                if term or trunc:
                    break
            assert info["is_success"] and info["error"] < 0.01
            # doing nothing from the same start does not count as success
            obs, _ = env.reset(seed=seed)
            while True:
                obs, _, term, trunc, info = env.step(np.zeros(7, np.float32))
                if term or trunc:
                    break
            assert not info["is_success"] and abs(info["error"] - start_err) < 0.05
    finally:
        env.close()


def test_push_success_means_object_at_goal(demo_twin: TwinSpec) -> None:
    env = make_env("push", demo_twin, SHORT, seed=0)
    assert isinstance(env, PushEnv)
    try:
        obs, _ = env.reset(seed=4)
        s = env.policy_spec.slices()
        assert env.twin.objects[0].name == "cylinder" == env.policy_spec.object
        start = env.world.object_pose("cylinder")
        assert np.allclose(obs[s["object_pose"]], start, atol=1e-5)
        assert np.allclose(obs[s["object_goal"]], env.goal)
        assert 0.08 - 1e-9 <= np.linalg.norm(env.goal - start[:2]) <= 0.15 + 1e-9
        far = env.distance()
        hold = np.zeros(7, np.float32)
        _, r_far, *_ = env.step(hold)
        pose = start.copy()
        pose[:2] = env.goal
        env.world.set_object_pose("cylinder", pose)
        _, r_near, *_ = env.step(hold)
        assert env.distance() < 0.005 < far and env._success()
        assert r_near > r_far + 4.0 * far  # reward falls with distance to the goal
    finally:
        env.close()


def test_bad_settings_are_named(demo_twin: TwinSpec) -> None:
    with pytest.raises(PolicyError, match="no setting 'episode'"):
        task_config("reach", {"episode": 3})
    with pytest.raises(PolicyError, match="unknown task 'fly'"):
        make_env("fly", demo_twin)
    with pytest.raises(PolicyError, match="has no actuator|no joint"):
        make_env("reach", demo_twin, {"joints": ["nope"]})
    env = make_env("reach", demo_twin, SHORT)
    try:
        env.reset(seed=0)
        with pytest.raises(PolicyError, match="7 joints"):
            env.step(np.zeros(3, np.float32))
        _, r, term, _, info = env.step(np.full(7, np.nan, np.float32))
        assert term and info["stopped"] == "non-finite action" and r < 0
    finally:
        env.close()


def test_commands_pass_the_agents_ramp_and_envelope(demo_twin: TwinSpec) -> None:
    """A full-scale action from rest: the start ramp holds the first command at the start
    pose, and the agent's envelope lets the targets speed up no faster than its
    acceleration limit and never past the URDF's joint speeds (the old speed-only model let
    a target jump 0.05 rad on the first tick)."""
    from devices.robots.agent.safety_config import SafetyConfig

    ramp, episode = 0.2, 0.3
    env = make_env("reach", demo_twin, {"start_ramp_s": ramp, "episode_s": episode}, seed=0)
    try:
        env.reset(seed=0)
        dt, q0 = env.ctrl_dt, env.cmd.copy()
        assert env.n_steps == round((ramp + episode) / dt)
        vmax = env._envelope.vmax
        np.testing.assert_allclose(vmax[:4], 2.175)  # the Panda URDF's, not max_joint_speed
        cmds, done = [], False
        while not done:
            _, _, term, trunc, _ = env.step(np.ones(len(env.joints), np.float32))
            cmds.append(env.cmd.copy())
            done = term or trunc
        assert len(cmds) == env.n_steps and not env.stopped
        np.testing.assert_allclose(cmds[0], q0, atol=1e-12)  # ramp weight 0 on the first tick
        steps = np.diff(np.vstack([q0, *cmds]), axis=0)
        assert np.all(np.abs(steps) <= vmax * dt + 1e-12)
        amax = SafetyConfig().max_accel
        for k in range(1, 6):  # k ticks in: at most amax dt^2 (1 + 2 + ... + k) from the start
            assert np.all(np.abs(cmds[k] - q0) <= amax * dt * dt * k * (k + 1) / 2 + 1e-12)
        assert np.max(np.abs(cmds[-1] - q0)) > 0.1  # and it does move
    finally:
        env.close()
