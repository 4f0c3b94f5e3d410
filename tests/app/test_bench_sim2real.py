"""Pieces of `bench sim2real`: lab episodes in-process are judged by the lab's true object
pose, starts follow the push task's distribution, the oracle twin gets the lab's
truth in twin names, and a push traced in the twin and in the lab from the same start."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benches.sim2real_lab import (
    LabStart,
    draw_starts,
    lab_episode,
    push_twin,
    trace_summary,
    true_values,
    twin_episode,
)
from devices.lab.scenes import get_scene
from devices.robots.wire.policy_spec import PolicySpec
from policies.export import to_onnx
from policies.tasks import task_config
from policies.tasks.push import PushConfig


def _hold_policy(spec: PolicySpec) -> bytes:
    """An ONNX policy that outputs zero deltas: the arm holds, nothing is pushed."""
    import torch

    class Hold(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return x[:, : spec.n] * 0.0

    return to_onnx(Hold(), spec.obs_dim)


def _spec(cfg: Any) -> PolicySpec:
    from benches.fit_lab import joint_names

    return PolicySpec(
        observation=("joint_pos", "joint_vel", "object_pose", "object_goal"),
        joints=tuple(joint_names(cfg)),
        action_scale=0.15,
        object="cylinder",
    )


@pytest.mark.slow
def test_lab_episode_is_judged_by_the_true_object_pose() -> None:
    cfg = get_scene("panda_table").default_config()
    spec = _spec(cfg)
    onnx = _hold_policy(spec)
    pose = np.asarray(next(o.pose for o in cfg.objects if o.name == "cylinder"), float)
    pose[:2] += (0.01, -0.02)
    far = LabStart(tuple(pose), (pose[0] + 0.1, pose[1]), 3)
    near = LabStart(tuple(pose), (pose[0] + 0.02, pose[1]), 4)
    r_far = lab_episode(cfg, onnx, spec, far, episode_s=0.5, success_tol=0.03)
    r_near = lab_episode(cfg, onnx, spec, near, episode_s=0.5, success_tol=0.03)
    # the object rests where it was put: the distance is start -> goal (settling < 2 mm)
    assert r_far["distance"] == pytest.approx(0.1, abs=0.002)
    assert r_near["distance"] == pytest.approx(0.02, abs=0.002)
    assert not r_far["success"] and r_near["success"]
    assert r_far["stopped"] == r_near["stopped"] == ""  # the feed kept the pose fresh


def test_starts_follow_the_push_task() -> None:
    cfg = get_scene("panda_table").default_config()
    task = task_config("push")
    assert isinstance(task, PushConfig)
    base = np.asarray(next(o.pose for o in cfg.objects if o.name == "cylinder"), float)
    starts = draw_starts(cfg, 200, 5, task)
    assert len({s.seed for s in starts}) == 200
    for s in starts:
        p, g = np.asarray(s.object_start), np.asarray(s.goal)
        assert np.all(np.abs(p[:2] - base[:2]) <= task.object_jitter + 1e-12)
        d = g - p[:2]
        assert task.goal_distance[0] - 1e-9 <= np.hypot(*d) <= task.goal_distance[1] + 1e-9
        off = math.degrees(math.atan2(d[1], d[0]) - math.atan2(p[1], p[0]))
        assert abs((off + 180) % 360 - 180) <= task.goal_spread_deg + 1e-6


@pytest.mark.slow
def test_oracle_values_are_the_labs_truth(tmp_path: Path) -> None:
    cfg = get_scene("panda_table").default_config()
    assert cfg.joints is not None and cfg.actuators is not None
    twin = push_twin(tmp_path / "twin", cfg)
    truth = true_values(cfg, twin)
    cyl = next(o for o in cfg.objects if o.name == "cylinder")
    r, h = twin.object("cylinder").shape.size
    assert truth["objects.cylinder.density"] * math.pi * r * r * h == pytest.approx(cyl.mass)
    # PyBullet multiplies the two bodies' friction; the lab's contact takes the object's
    assert truth["objects.cylinder.friction"] * truth["env.table.friction"] == cyl.friction
    assert truth["robot.actuators.panda_joint2.latency"] == cfg.latency_s
    assert truth["robot.joints.panda_joint3.damping"] == cfg.joints.damping[2]
    # the lab twin knows the controller the user set
    assert twin.params["robot.actuators.panda_joint1.kp"].nominal == cfg.actuators.kp[0]
    oracle = twin.with_values(truth)
    assert oracle.params["objects.cylinder.friction"].nominal == cyl.friction


@pytest.mark.slow
def test_one_push_traced_in_the_twin_and_the_lab(tmp_path: Path) -> None:
    """The primitive's hand-set push from one lab start, in the oracle twin and in the lab:
    both traces start with the object where the start put it and say what touched it."""
    from benches.sim2real import TASK_SET
    from policies import push_primitive as pp
    from policies.motion_primitives import task_chain
    from policies.tasks import make_env

    cfg = get_scene("panda_table").default_config()
    twin = push_twin(tmp_path / "twin", cfg)
    oracle = twin.with_values(true_values(cfg, twin))
    task = task_config("push", {**TASK_SET, "episode_s": 1.0})
    start = draw_starts(cfg, 1, 7, task)[0]
    x = pp.initial_mean()
    env = make_env("push", oracle, task.to_json())
    try:
        spec, chain = env.policy_spec, task_chain(env)
    finally:
        env.close()
    onnx = to_onnx(pp.torch_module(spec, chain, x), spec.obs_dim)
    tw: list[dict[str, Any]] = []
    lab: list[dict[str, Any]] = []
    q0 = cfg.initial_joint_pos
    r_tw = twin_episode(oracle, task, x, start, q0, trace=tw)
    r_lab = lab_episode(cfg, onnx, spec, start, task.episode_s, task.success_tol, trace=lab)
    # 1 s at 250 Hz after the agent's 0.5 s start ramp, which the twin models too
    assert task.start_ramp_s == 0.5
    assert len(tw) == len(lab) == 375
    for rows, res in ((tw, r_tw), (lab, r_lab)):
        assert np.allclose(rows[0]["object"][:2], start.object_start[:2], atol=0.002)
        assert res["distance"] == pytest.approx(
            math.dist(rows[-1]["object"][:2], start.goal), abs=1e-6
        )
        assert set(trace_summary(rows)) == {"max_tilt_deg", "links", "contact_z", "first_contact_s"}
    # both arms start at the same tool point (the twin's kinematics are the lab's) and,
    # with the agent's ramp and envelope shaping the twin's commands as they shape the
    # lab's, travel the same path: within 5 mm (the twin without them lagged 6 cm at 1.4 s)
    assert np.allclose(tw[0]["tool"], lab[0]["tool"], atol=0.01)
    gap = [math.dist(a["tool"], b["tool"]) for a, b in zip(tw, lab, strict=True)]
    travelled = math.dist(lab[0]["tool"], lab[-1]["tool"])
    assert max(gap) < 0.005 and travelled > 0.1, (max(gap), travelled)
