"""The push task observes the object exactly as the robot agent does: the same observation
vector (names, order, layout) from the same joint state and tracked pose; the tracker's
frame rate and latency delay the pose by whole camera frames; a pose older than the
policy's `object_max_age_s` ends the episode as the agent stops the policy."""

from __future__ import annotations

import numpy as np

from devices.robots.agent.object_poses import ObjectFeed
from devices.robots.agent.policy_runner import OnnxPolicy
from devices.robots.wire.policy_spec import PolicySpec
from devices.robots.wire.robot_types import JointLimits, RobotInfo, RobotState
from policies.randomization import Randomization, SensorNoise
from policies.tasks import make_env
from tests.devices.robots.helpers import linear_policy
from twins.spec import TwinSpec


def test_twin_and_agent_build_the_same_observation(demo_twin: TwinSpec) -> None:
    env = make_env("push", demo_twin, {"episode_s": 0.2}, seed=1)
    try:
        assert demo_twin.robot is not None and tuple(demo_twin.robot.base_pose) == (
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            1.0,
        )  # world = robot base frame: the twin's object pose is what the tracker reports
        obs, _ = env.reset(seed=4)
        spec = env.deploy_spec
        n = spec.n
        lim = JointLimits(-np.ones(n) * 3, np.ones(n) * 3, np.ones(n) * 2, np.ones(n) * 80)
        info = RobotInfo("test", tuple(spec.joints), lim, 250.0)
        aspec = PolicySpec.from_dict(spec.to_dict(), robot_joints=info.joint_names)
        feed = ObjectFeed()
        feed.expect([str(spec.object)], 0.0)
        pose = env.world.object_pose(str(spec.object))
        feed.update(spec.object, pose, 1.0, 0.9, False, now=1.0)
        model = linear_policy(np.zeros((spec.obs_dim, n)), np.zeros(n))
        runner = OnnxPolicy(model, aspec, info, feed)
        state = RobotState(1.0, 0, env.q.copy(), env.qd.copy(), np.zeros(n))
        agent_obs = runner.observe(state).reshape(-1)
        np.testing.assert_allclose(agent_obs, obs, atol=1e-6)
        s = spec.slices()
        assert list(s) == ["joint_pos", "joint_vel", "object_pose", "object_goal"]
        np.testing.assert_allclose(agent_obs[s["object_goal"]], spec.object_goal or (), atol=1e-6)
    finally:
        env.close()


def test_tracker_rate_and_latency_delay_the_object(demo_twin: TwinSpec) -> None:
    noise = SensorNoise(object_rate_hz=25.0, object_latency_s_min=0.06, object_latency_s_max=0.06)
    env = make_env("push", demo_twin, {"episode_s": 1.0}, Randomization("none", noise=noise), 0)
    try:
        obs, _ = env.reset(seed=0)
        name = str(env.policy_spec.object)
        s = env.policy_spec.slices()["object_pose"]
        true: list[tuple[float, np.ndarray]] = [(0.0, env.world.object_pose(name))]
        rng = np.random.default_rng(0)
        seen_x, ages = [], []
        for _ in range(200):  # slide the object every tick, so every tick's pose differs
            x = np.array(env.world.object_pose(name))
            x[0] += 0.0005
            env.world.set_object_pose(name, x)
            obs, *_, info = env.step(rng.uniform(-1, 1, 7).astype(np.float32))
            true.append((env.t, env.world.object_pose(name)))
            assert not info["stopped"]
            # the pose seen is the true pose of one earlier tick: the capture
            hits = [tc for tc, p in true if np.allclose(p[:3], obs[s][:3], atol=1e-6)]
            assert len(hits) == 1
            seen_x.append(float(obs[s][0]))
            ages.append(env.t - hits[0])
        # captured every 40 ms (on the control tick grid), seen 60 ms after the capture
        period, dt = 0.04, env.ctrl_dt
        late = np.array(ages[30:])
        assert late.min() >= 0.06 - 1e-9 and late.max() <= 0.06 + period + dt + 1e-9
        changes = int(np.count_nonzero(np.diff(seen_x)))
        assert abs(changes - 200 * dt / (period + dt)) <= 2
    finally:
        env.close()


def test_a_pose_older_than_the_policys_age_limit_ends_the_episode(demo_twin: TwinSpec) -> None:
    """A tracker slower than the age limit allows: every episode stops, naming the age."""
    noise = SensorNoise(object_rate_hz=4.0)  # a pose every 250 ms, limit 200 ms
    env = make_env("push", demo_twin, {"episode_s": 1.0}, Randomization("none", noise=noise), 0)
    try:
        env.reset(seed=0)
        while True:
            *_, term, trunc, info = env.step(np.zeros(7, np.float32))
            if term or trunc:
                break
        assert (
            term
            and "object tracking lost" in info["stopped"]
            and "limit 200 ms" in (info["stopped"])
        )
        assert 0.2 < env.t <= 0.2 + 2 * env.ctrl_dt
    finally:
        env.close()


def test_drop_spin_keeps_the_axis_and_forgets_the_spin() -> None:
    from scipy.spatial.transform import Rotation as R

    from devices.poses import drop_spin

    rng = np.random.default_rng(0)
    for _ in range(50):
        tilt = R.from_rotvec([*rng.normal(0, 0.3, 2), 0.0])
        a, b = ((tilt * R.from_rotvec([0, 0, s])).as_quat() for s in rng.uniform(-3, 3, 2))
        pa, pb = drop_spin([1, 2, 3, *a]), drop_spin([1, 2, 3, *b])
        np.testing.assert_allclose(pa, pb, atol=1e-9)  # spin forgotten
        z_true = (tilt * R.from_rotvec([0, 0, 1.0])).apply([0, 0, 1])
        np.testing.assert_allclose(R.from_quat(pa[3:]).apply([0, 0, 1]), z_true, atol=1e-9)
        # the pure tilt's quaternion: rotation about an axis in the xy plane
        np.testing.assert_allclose(pa[3:], tilt.as_quat() * np.sign(tilt.as_quat()[3]), atol=1e-9)


def test_a_spinning_cylinder_is_observed_without_its_spin(demo_twin: TwinSpec) -> None:
    env = make_env("push", demo_twin, {"episode_s": 0.2}, seed=0)
    try:
        obs, _ = env.reset(seed=0)
        assert env.spinless  # the pushed object is the cylinder
        name = str(env.policy_spec.object)
        s = env.policy_spec.slices()["object_pose"]
        pose = np.array(env.world.object_pose(name))
        pose[3:] = [0.0, 0.0, np.sin(0.6), np.cos(0.6)]  # spun 1.2 rad about its axis
        env.world.set_object_pose(name, pose)
        obs, *_ = env.step(np.zeros(7, np.float32))
        seen = obs[s]
        np.testing.assert_allclose(seen[3:], [0, 0, 0, 1], atol=1e-3)  # upright, no spin
        np.testing.assert_allclose(seen[:2], env.world.object_pose(name)[:2], atol=1e-3)
    finally:
        env.close()
