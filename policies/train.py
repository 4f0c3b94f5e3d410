"""One training run, trainer-agnostic: task + twin + randomization -> `Policy` (ONNX).

`train_steps` is a job (resources/jobs.py: it yields `Progress`): it trains with the
motion-primitive trainer (`cem`, policies/motion_primitives.py: `joint_pd` for reach, the
closed-loop `push_ik` law for push, picked by the task's observation unless `primitive`
names one) or PPO (`ppo`, policies/ppo.py),
checkpointing into `ckpt_dir` as it goes (a crash or a cancel leaves the last checkpoint;
`resume=True` continues it), exports the actor to ONNX and checks onnxruntime against the
trainer's own outputs on observations it stores (`check.npz`: inputs and outputs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from policies.cem import CemSettings, cem_steps
from policies.errors import PolicyError
from policies.export import to_onnx, torch_outputs, verify
from policies.motion_primitives import default_family, n_params, task_chain, torch_module
from policies.policy import Policy
from policies.ppo import PpoSettings, ppo_steps
from policies.randomization import Randomization
from policies.tasks import make_env, task_config
from resources import atomic
from resources.jobs import Job, Progress
from twins.executor import Executor, SerialExecutor
from twins.spec import TwinSpec

TRAINERS = ("cem", "ppo")
Steps = Job["TrainOutcome"]


@dataclass(frozen=True)
class TrainSettings:
    trainer: str = "cem"
    seed: int = 0
    primitive: str = "auto"  # "auto": primitives.default_family of the task's spec
    cem: CemSettings = field(default_factory=CemSettings)
    ppo: PpoSettings = field(default_factory=PpoSettings)

    def __post_init__(self) -> None:
        if self.trainer not in TRAINERS:
            raise PolicyError(f"trainer '{self.trainer}' is not one of {TRAINERS}")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"trainer": self.trainer, "seed": self.seed}
        if self.trainer == "cem":
            d.update(primitive=self.primitive, cem=self.cem.to_json())
        else:
            d["ppo"] = self.ppo.to_json()
        return d


@dataclass(frozen=True)
class TrainOutcome:
    policy: Policy
    check_inputs: NDArray[np.float32]
    check_outputs: NDArray[np.float32]
    curve: list[dict[str, Any]]


def sample_observations(
    task: str, spec: TwinSpec, config: Mapping[str, Any], dr: Randomization, k: int, seed: int
) -> NDArray[np.float32]:
    """`k` observations the policy meets (starts and random-action states, randomized)."""
    env = make_env(task, spec, dict(config), dr, seed=seed)
    rng = np.random.default_rng(seed)
    out: list[NDArray[np.float32]] = []
    try:
        while len(out) < k:
            obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
            out.append(obs)
            for _ in range(7):
                obs, *_ = env.step(env.action_space.sample())
                out.append(obs)
    finally:
        env.close()
    return np.stack(out[:k]).astype(np.float32)


def train_steps(
    task: str,
    spec: TwinSpec,
    overrides: Mapping[str, Any] | None,
    dr: Randomization,
    settings: TrainSettings,
    ckpt_dir: Path,
    executor: Executor | None = None,
    resume: bool = False,
) -> Steps:
    """Train, export and verify; returns a `TrainOutcome` (see the module docstring)."""
    t0 = time.monotonic()
    cfg = task_config(task, overrides)
    cfg_json = cfg.to_json()
    probe = make_env(task, spec, cfg, dr)
    pspec = probe.policy_spec
    family = settings.primitive
    if family == "auto":
        family = default_family(pspec)
    chain = task_chain(probe) if settings.trainer == "cem" and family == "push_ik" else None
    probe.close()
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    yield Progress(
        0.0, f"training {task} with {settings.trainer} (checkpoints in {ckpt_dir.name})", {}
    )
    if settings.trainer == "cem":
        n_params(family, pspec)  # refuse a task the primitive cannot drive, now
        ckpt_path = ckpt_dir / "cem.json"
        state = None
        if resume:
            if not ckpt_path.is_file():
                raise PolicyError(f"{ckpt_dir}: no CEM checkpoint to resume from")
            state = json.loads(ckpt_path.read_text(encoding="utf-8"))
        gen = cem_steps(
            family,
            task,
            spec,
            cfg_json,
            dr,
            pspec,
            settings.cem,
            executor or SerialExecutor(),
            settings.seed,
            state,
        )
        try:
            while True:
                try:
                    p = next(gen)
                except StopIteration as stop:
                    res = stop.value
                    break
                atomic.write_json(ckpt_path, p.partial["checkpoint"])
                yield Progress(0.9 * (p.fraction or 0.0), p.message, {"curve": p.partial["curve"]})
        finally:
            gen.close()
        module = torch_module(family, pspec, res.params, chain)
        curve = res.curve
        extra: dict[str, Any] = {"params": res.params.tolist(), "episodes": res.evaluations}
    else:
        pgen = ppo_steps(task, spec, cfg_json, dr, settings.ppo, ckpt_dir, settings.seed, resume)
        try:
            while True:
                try:
                    p = next(pgen)
                except StopIteration as stop:
                    pres = stop.value
                    break
                yield Progress(0.9 * (p.fraction or 0.0), p.message, {"curve": p.partial["curve"]})
        finally:
            pgen.close()
        module, curve = pres.module, pres.curve
        extra = {"timesteps": pres.timesteps}
    yield Progress(0.92, "exporting to ONNX and checking it against the trainer", {})
    onnx = to_onnx(module, pspec.obs_dim)
    X = sample_observations(task, spec, cfg_json, dr, 64, settings.seed + 7)
    err = verify(onnx, module, X)
    training = settings.to_json()
    if settings.trainer == "cem":
        training["primitive"] = family
    record = {
        "task": task,
        "task_config": cfg_json,
        "training": training,
        "randomization": dr.to_json(),
        "twin": spec.name,
        "curve": curve,
        "onnx_check": {"inputs": len(X), "max_abs_err": err},
        "wall_s": round(time.monotonic() - t0, 2),
        **extra,
    }
    return TrainOutcome(Policy(onnx, pspec, record), X, torch_outputs(module, X), curve)
