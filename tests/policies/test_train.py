"""Trainers end to end on tiny budgets: CEM over the reach primitive learns a policy that
reaches, PPO checkpoints/cancels/resumes, and both export ONNX models whose onnxruntime
outputs equal the trainer's on the stored inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from policies.cem import CemSettings
from policies.errors import PolicyError
from policies.evaluate import evaluate, wilson
from policies.motion_primitives import initial_mean, linear_weights
from policies.policy import Policy
from policies.ppo import PpoSettings
from policies.randomization import Randomization
from policies.tasks import make_env
from policies.train import TrainOutcome, TrainSettings, train_steps
from twins.spec import TwinSpec

pytestmark = pytest.mark.slow


def _drive(gen, stop_after: int | None = None):  # type: ignore[no-untyped-def]
    recs = []
    try:
        while True:
            recs.append(next(gen))
            if stop_after is not None and len(recs) >= stop_after:
                gen.close()
                return recs, None
    except StopIteration as stop:
        return recs, stop.value


def _check_export(out: TrainOutcome, tmp: Path) -> Policy:
    out.policy.save(tmp)
    pol = Policy.load(tmp)
    got = np.stack([pol.act(x) for x in out.check_inputs])
    assert got.shape == out.check_outputs.shape == (64, 7)
    assert np.max(np.abs(got - out.check_outputs)) < 1e-5
    assert np.all(np.abs(got) <= 1.0) and np.ptp(got) > 0.05  # not a constant model
    assert out.policy.record["onnx_check"]["max_abs_err"] < 1e-5
    return pol


def test_wilson_interval_matches_known_values() -> None:
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(50, 50)[1] == 1.0 and wilson(50, 50)[0] == pytest.approx(0.9287, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_cem_primitive_learns_to_reach_and_exports(tmp_path: Path, demo_twin: TwinSpec) -> None:
    cfg = {"episode_s": 1.0}
    settings = TrainSettings(
        "cem", seed=0, cem=CemSettings(population=6, generations=2, episodes=2)
    )
    recs, out = _drive(
        train_steps("reach", demo_twin, cfg, Randomization(), settings, tmp_path / "ck")
    )
    assert out is not None and len(out.curve) == 2
    assert json.loads((tmp_path / "ck" / "cem.json").read_text())["generation"] == 2
    fracs = [r.fraction for r in recs]
    assert fracs == sorted(fracs) and fracs[-1] < 1.0
    pol = _check_export(out, tmp_path / "policy")
    assert pol.spec.to_dict()["observation"] == ["joint_pos", "joint_vel", "target"]
    # the exported law is the primitive's: kp * (target - q) - kd * qd, clipped
    W, _ = linear_weights("joint_pd", pol.spec, out.policy.record["params"])
    x = out.check_inputs[5]
    assert np.allclose(pol.act(x), np.clip(W @ x, -1, 1), atol=1e-5)
    ev = evaluate(pol, "reach", demo_twin, cfg, episodes=6)
    assert ev["success_rate"] >= 5 / 6, ev
    # a twenty times gentler law does not reach within 1 s: the evaluation tells them apart
    from policies.export import to_onnx
    from policies.motion_primitives import torch_module

    start = Policy(
        to_onnx(
            torch_module("joint_pd", pol.spec, initial_mean("joint_pd", pol.spec) - 3.0),
            pol.spec.obs_dim,
        ),
        pol.spec,
    )
    assert evaluate(start, "reach", demo_twin, cfg, episodes=6)["success_rate"] == 0.0


def test_cem_refuses_a_task_without_target(tmp_path: Path, demo_twin: TwinSpec) -> None:
    """joint_pd needs a target; push tasks get push_ik (tests/policies/test_push_primitive.py)."""
    settings = TrainSettings("cem", primitive="joint_pd")
    gen = train_steps("push", demo_twin, {"episode_s": 0.2}, Randomization(), settings, tmp_path)
    with pytest.raises(PolicyError, match="--trainer ppo"):
        _drive(gen)


def test_ppo_checkpoints_cancels_resumes_and_exports(tmp_path: Path, demo_twin: TwinSpec) -> None:
    cfg = {"episode_s": 0.2}
    ppo = PpoSettings(
        timesteps=256, n_envs=2, n_steps=64, batch_size=64, chunk_steps=128, hidden=(16, 16)
    )
    settings = TrainSettings("ppo", seed=1, ppo=ppo)
    ck = tmp_path / "ck"
    recs, out = _drive(
        train_steps("reach", demo_twin, cfg, Randomization(), settings, ck), stop_after=2
    )
    assert out is None  # cancelled after the first chunk
    meta = json.loads((ck / "ppo.json").read_text())
    assert meta["timesteps"] == 128 and len(meta["curve"]) == 1 and (ck / "ppo.zip").is_file()
    recs, out = _drive(
        train_steps("reach", demo_twin, cfg, Randomization(), settings, ck, resume=True)
    )
    assert out is not None
    assert [r["timesteps"] for r in out.curve] == [128, 256]
    assert out.policy.record["timesteps"] == 256
    pol = _check_export(out, tmp_path / "policy")
    env = make_env("reach", demo_twin, cfg)
    try:
        assert pol.spec == env.policy_spec
    finally:
        env.close()
    with pytest.raises(PolicyError, match="no PPO checkpoint"):
        _drive(
            train_steps(
                "reach", demo_twin, cfg, Randomization(), settings, tmp_path / "none", resume=True
            )
        )


def test_tampered_policy_file_is_refused(tmp_path: Path, demo_twin: TwinSpec) -> None:
    from policies.export import to_onnx
    from policies.motion_primitives import torch_module

    env = make_env("reach", demo_twin)
    spec = env.policy_spec
    env.close()
    pol = Policy(
        to_onnx(torch_module("joint_pd", spec, initial_mean("joint_pd", spec)), spec.obs_dim), spec
    )
    pol.save(tmp_path)
    (tmp_path / "policy.onnx").write_bytes(b"garbage")
    with pytest.raises(PolicyError, match="does not match the sha256"):
        Policy.load(tmp_path)
    with pytest.raises(PolicyError, match="missing policy.json"):
        Policy.load(tmp_path / "nothing")
