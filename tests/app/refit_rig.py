"""A project ready for "Send to Real2Sim" without a robot: the procedural twin, a joint-PD
reach policy trained in it (as a record), a finished fit of the twin with a tiny budget, and
deploy runs of the policy made up sample by sample (`fake_run`), with or without the NaN
command tail that deploy recordings used to end with. Shared by tests/app/test_honest_refit.py
and tests/widgets/test_deploy_refit_failure.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.workflows.twin import build_twin, load_twin
from devices.trajectory import Trajectory
from policies.export import to_onnx
from policies.motion_primitives import torch_module
from policies.policy import Policy
from policies.tasks import make_env
from resources import atomic
from resources.jobs import run_to_end
from resources.project import Project

FIT_CONFIG = {
    "params": ["robot.joints.panda_joint2.damping"],
    "budget": 4,
    "popsize": 4,
    "polish_rounds": 0,
    "window_s": 0.5,
}


def policy_project(proj: Project) -> tuple[str, str, tuple[str, ...], np.ndarray]:
    """(twin id, policy id, joints, home pose) in `proj`, plus a finished fit of the twin."""
    tid = run_to_end(build_twin(proj, None, procedural=True))
    _, twin = load_twin(proj, tid)
    env = make_env("reach", twin, {"episode_s": 1.5})
    spec, home, cfg = env.policy_spec, env.q_home.copy(), env.config.to_json()
    env.close()
    n = spec.n
    params = np.concatenate([np.full(n, np.log(1.0 / spec.action_scale)), np.full(n, np.log(0.01))])
    pol = Policy(
        to_onnx(torch_module("joint_pd", spec, params), spec.obs_dim),
        spec,
        {
            "task": "reach",
            "twin_id": tid,
            "task_config": cfg,
            "training": {
                "trainer": "cem",
                "seed": 0,
                "cem": {"generations": 1, "population": 4, "episodes": 1},
            },
        },
    )
    with proj.new_artifact(
        "policy", inputs=[tid], settings={"task": "reach"}, summary="reach by cem"
    ) as f:
        pol.save(f)
    pid = proj.artifacts("policy")[-1].id
    with proj.new_artifact("fit", inputs=[tid], settings={"twin": tid, "config": FIT_CONFIG}) as f:
        (f / "fit.json").write_text(json.dumps({"status": "done", "twin": tid}))
    return tid, pid, tuple(spec.joints), home


PANDA_JOINTS = tuple(f"panda_joint{i + 1}" for i in range(7))


def record_only_project(proj: Project) -> tuple[str, str, tuple[str, ...], np.ndarray]:
    """`policy_project` as far as "Send to Real2Sim" reads it before fitting (lineage: twin,
    policy record, the twin's fit), in a fraction of a second: no twin is built and the
    policy's model is a placeholder. For tests that end before a replay."""
    from devices.robots.wire.policy_spec import PolicySpec

    with proj.new_artifact("twin", summary="placeholder twin (never simulated)") as f:
        (f / "README").write_text("placeholder")
    tid = proj.artifacts("twin")[-1].id
    spec = PolicySpec(("joint_pos", "joint_vel", "target"), PANDA_JOINTS)
    pol = Policy(b"placeholder model", spec, {"task": "reach", "twin_id": tid})
    with proj.new_artifact(
        "policy", inputs=[tid], settings={"task": "reach"}, summary="reach by cem"
    ) as f:
        pol.save(f)
    pid = proj.artifacts("policy")[-1].id
    with proj.new_artifact("fit", inputs=[tid], settings={"twin": tid, "config": FIT_CONFIG}) as f:
        (f / "fit.json").write_text(json.dumps({"status": "done", "twin": tid}))
    home = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    return tid, pid, PANDA_JOINTS, home


def fake_run(
    proj: Project,
    pid: str,
    joints: tuple[str, ...],
    home: np.ndarray,
    nan_tail: int = 15,
    seconds: float = 1.2,
    rate_hz: float = 250.0,
) -> tuple[str, str]:
    """A deploy run of `pid` as the old deploy saved it: the arm holding `home` while the
    policy commands it, then `nan_tail` samples without a command (after the policy
    stopped). Returns (trajectory id, run id)."""
    k = int(seconds * rate_hz)
    t = np.arange(k) / rate_hz
    q = np.tile(home, (k, 1))
    cmd = q.copy()
    if nan_tail:
        cmd[-nan_tail:] = np.nan
    traj = Trajectory(
        t,
        {
            "robot/joint_pos": q,
            "robot/joint_vel": np.zeros_like(q),
            "robot/joint_effort": np.zeros_like(q),
            "robot/command": cmd,
        },
        {
            "robot/joint_pos": "rad",
            "robot/joint_vel": "rad/s",
            "robot/joint_effort": "N*m",
            "robot/command": "rad",
        },
        "real",
        {"robot": "ideal", "joint_names": list(joints), "control_rate_hz": rate_hz},
    )
    with proj.new_artifact(
        "trajectory", inputs=[pid], settings={"deploy": pid, "robot": "ideal"}
    ) as f:
        traj.save(f)
    traj_id = proj.artifacts("trajectory")[-1].id
    outcome = {"success": False, "start": home.tolist(), "goal": home.tolist(), "ended": "x"}
    with proj.new_artifact(
        "run", inputs=[pid, traj_id], settings={"kind": "real-deployment", "robot": "ideal"}
    ) as f:
        atomic.write_json(Path(f) / "run.json", outcome)
    return traj_id, proj.artifacts("run")[-1].id


def done_fits(proj: Project) -> list[str]:
    """Fit artifacts other than the starting one (refits), whatever their status."""
    return [a.id for a in proj.artifacts("fit")][1:]
