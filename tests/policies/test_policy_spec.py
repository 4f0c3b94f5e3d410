"""One policy spec and one observation builder (devices/robots/wire/policy_spec.py) for the twin
and the robot agent: the same measured state gives the twin's task environment and the
agent's policy runner the same observation vector, element for element, laid out as
PROTOCOL.md documents; the spec's wire form round-trips; policy files written before the
two spec classes became one still load."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from devices.poses import drop_spin
from devices.robots.agent.object_poses import ObjectFeed
from devices.robots.agent.policy_runner import OnnxPolicy
from devices.robots.wire.policy_spec import TERMS, PolicySpec
from devices.robots.wire.robot_types import JointLimits, RobotInfo, RobotState
from policies.errors import PolicyError
from policies.policy import Policy
from policies.tasks import make_env
from policies.tasks.push import PushConfig, PushEnv
from tests.devices.robots.helpers import linear_policy
from twins.spec import TwinSpec


class EveryTermEnv(PushEnv):
    """The push task observing every term there is (reach's `target` too)."""

    observation_terms = TERMS


def test_twin_and_agent_observe_one_state_alike_for_every_term(demo_twin: TwinSpec) -> None:
    env = EveryTermEnv(demo_twin, PushConfig(episode_s=0.2), seed=1)
    try:
        env.reset(seed=4)
        n = len(env.joints)
        assert env.policy_spec.observation == TERMS and n == 7
        # one measured state; every term's values differ from every other's, so a term
        # out of place (or two swapped) changes the vector
        q = np.linspace(-0.7, 0.6, n)
        qd = np.linspace(0.11, 0.43, n)
        target = np.linspace(1.05, 1.35, n)
        h = 0.5 * 0.4  # a 0.4 rad tilt about x: a pose drop_spin keeps as it is
        pose = np.array([0.61, -0.12, 0.043, np.sin(h), 0.0, 0.0, np.cos(h)])
        goal = np.array([0.72, 0.095])

        # the twin's path: its measured state set to these values, its own _observe
        env._true = deque([(q.copy(), qd.copy(), pose.copy())])
        env.target, env.goal = target.copy(), goal.copy()
        twin_obs = env._observe()
        assert env.stopped == ""
        seen = drop_spin(pose) if env.spinless else pose  # as the deploy feed streams it
        np.testing.assert_allclose(seen, pose, atol=1e-12)

        # the agent's path: the spec as uploaded, read as the agent reads it, the pose
        # from its object feed, the state from its driver
        spec = env.policy_spec.with_goal(target=target, object_goal=goal)
        lim = JointLimits(-np.ones(n) * 3, np.ones(n) * 3, np.ones(n) * 2, np.ones(n) * 80)
        info = RobotInfo("test", env.joints, lim, 250.0)
        aspec = PolicySpec.from_dict(spec.to_dict(), robot_joints=info.joint_names)
        assert aspec == spec
        feed = ObjectFeed()
        feed.expect([str(spec.object)], 0.0)
        feed.update(str(spec.object), seen.tolist(), 1.0, 0.9, False, now=1.0)
        model = linear_policy(np.zeros((spec.obs_dim, n)), np.zeros(n))
        runner = OnnxPolicy(model, aspec, info, feed)
        state = RobotState(1.0, 0, q.copy(), qd.copy(), np.zeros(n))
        agent_obs = runner.observe(state).reshape(-1).copy()

        np.testing.assert_array_equal(twin_obs, agent_obs)
        # ... and both are the documented layout: the terms concatenated in order
        want = np.concatenate([q, qd, target, seen, goal]).astype(np.float32)
        assert twin_obs.dtype == agent_obs.dtype == np.float32
        np.testing.assert_array_equal(agent_obs, want)
    finally:
        env.close()


def _full_spec() -> PolicySpec:
    """A spec with every field set, none at its default."""
    return PolicySpec(
        observation=("object_goal", "joint_vel", "object_pose", "target", "joint_pos"),
        joints=("a", "b", "c"),
        action_mode="velocity",
        action_type="absolute",
        action_scale=0.7,
        target=(0.1, -0.2, 0.3),
        object="puck",
        object_goal=(0.55, -0.125),
        control_rate_hz=500.0,
        object_max_age_s=0.35,
        object_min_quality=0.4,
    )


@pytest.mark.parametrize("task", ["reach", "push"])
def test_wire_round_trip_of_task_specs(task: str, demo_twin: TwinSpec) -> None:
    env = make_env(task, demo_twin, {"episode_s": 0.2}, seed=2)
    try:
        env.reset(seed=3)
        for spec in (env.policy_spec, env.deploy_spec):  # as trained, as deployed
            wire = json.loads(json.dumps(spec.to_dict()))  # JSON-able, as stored and sent
            assert PolicySpec.from_dict(wire) == spec
        wire = json.loads(json.dumps(env.deploy_spec.to_dict()))
        assert PolicySpec.from_dict(wire, robot_joints=env.joints) == env.deploy_spec
    finally:
        env.close()


def test_wire_round_trip_of_every_field() -> None:
    spec = _full_spec()
    wire = json.loads(json.dumps(spec.to_dict()))
    assert PolicySpec.from_dict(wire) == spec
    assert PolicySpec.from_dict(wire, robot_joints=spec.joints) == spec
    assert wire["object_min_quality"] == 0.4 and wire["control_rate_hz"] == 500.0


def test_policy_files_written_by_the_old_spec_still_load(tmp_path: Path) -> None:
    """policy.json as policies/spec.py wrote it (no object_min_quality)."""
    push = {
        "observation": ["joint_pos", "joint_vel", "object_pose", "object_goal"],
        "action": {"mode": "position", "type": "delta", "scale": 0.15},
        "joints": [f"panda_joint{i}" for i in range(1, 8)],
        "control_rate_hz": 250.0,
        "object": "cylinder",
        "object_max_age_s": 0.2,
    }
    reach = {
        "observation": ["joint_pos", "joint_vel", "target"],
        "action": {"mode": "position", "type": "delta", "scale": 0.05},
        "joints": [f"panda_joint{i}" for i in range(1, 8)],
        "control_rate_hz": 250.0,
    }
    for d in (push, reach):
        onnx = b"placeholder model"
        folder = tmp_path / str(len(d))
        folder.mkdir()
        (folder / "policy.onnx").write_bytes(onnx)
        meta = {
            "format": "twinbench-policy",
            "version": 1,
            "spec": d,
            "onnx_sha256": hashlib.sha256(onnx).hexdigest(),
            "record": {"task": "x"},
        }
        (folder / "policy.json").write_text(json.dumps(meta))
        spec = Policy.load(folder).spec
        assert spec.to_dict() == d  # read and written back unchanged
        assert spec.object_min_quality == 0.0 and spec.target is None
    bad = dict(reach, observation=["joint_pos", "gripper"])
    meta["spec"] = bad
    (folder / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(PolicyError, match=r"unknown observation term\(s\) \['gripper'\]"):
        Policy.load(folder)
    del bad["joints"]
    (folder / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(PolicyError, match=r"policy.json: missing entry 'joints'"):
        Policy.load(folder)
