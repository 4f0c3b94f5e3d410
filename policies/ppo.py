"""Closed-loop neural policies: PPO from stable-baselines3 on CPU torch.

`ppo_steps` trains in chunks of `chunk_steps` environment steps and yields between them
(cancel = close the generator there); after every chunk it writes a checkpoint
(`ppo.zip` + `ppo.json` with steps done and the learning curve) into `ckpt_dir`, which
`resume=True` continues from. Environments are this process's vectorised copies of the
task (SB3's DummyVecEnv): PPO's updates need the rollouts in the learner's process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies.errors import PolicyError
from policies.randomization import Randomization
from policies.tasks import make_env
from resources import atomic
from resources.jobs import Job, Progress
from twins.spec import TwinSpec


@dataclass(frozen=True)
class PpoSettings:
    timesteps: int = 200_000
    n_envs: int = 2
    n_steps: int = 1024  # per env per update
    batch_size: int = 256
    learning_rate: float = 3e-4
    gamma: float = 0.99
    hidden: tuple[int, ...] = (64, 64)
    chunk_steps: int = 8192
    log_std_init: float = -1.0

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class PpoResult:
    module: Any  # torch module obs (1, d) -> action (1, n), clipped to [-1, 1]
    curve: list[dict[str, Any]]
    timesteps: int
    wall_s: float


def actor_module(model: Any) -> Any:
    """The deterministic actor of an SB3 PPO model as a plain torch module."""
    import torch

    pol = model.policy

    class Actor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = pol.pi_features_extractor
            self.mlp = pol.mlp_extractor.policy_net
            self.head = pol.action_net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.clamp(self.head(self.mlp(self.features(x))), -1.0, 1.0)

    return Actor().eval()


def ppo_steps(
    task: str,
    spec: TwinSpec,
    config: Mapping[str, Any],
    dr: Randomization,
    settings: PpoSettings,
    ckpt_dir: Path,
    seed: int = 0,
    resume: bool = False,
) -> Job[PpoResult]:
    """Train PPO; yields Progress after each chunk; returns PpoResult."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(1)
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    zip_path, meta_path = ckpt_dir / "ppo.zip", ckpt_dir / "ppo.json"

    def factory(i: int) -> Any:
        return lambda: Monitor(make_env(task, spec, dict(config), dr, seed=seed * 1000 + i))

    raw = DummyVecEnv([factory(i) for i in range(settings.n_envs)])
    norm_path = ckpt_dir / "reward_norm.pkl"
    if resume and norm_path.is_file():
        venv = VecNormalize.load(str(norm_path), raw)
    else:  # returns scaled to about unit size; observations stay raw (the agent feeds raw)
        venv = VecNormalize(raw, norm_obs=False, norm_reward=True, gamma=settings.gamma)
    episodes: list[tuple[float, bool]] = []

    class Collect(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                ep = info.get("episode")
                if ep is not None:
                    episodes.append((float(ep["r"]), bool(info.get("is_success", False))))
            return True

    curve: list[dict[str, Any]] = []
    done = 0
    if resume:
        if not (zip_path.is_file() and meta_path.is_file()):
            raise PolicyError(f"{ckpt_dir}: no PPO checkpoint to resume from")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        curve, done = list(meta["curve"]), int(meta["timesteps"])
        model = PPO.load(str(zip_path), env=venv, device="cpu")
    else:
        model = PPO(
            "MlpPolicy",
            venv,
            learning_rate=settings.learning_rate,
            n_steps=settings.n_steps,
            batch_size=settings.batch_size,
            gamma=settings.gamma,
            policy_kwargs={
                "net_arch": list(settings.hidden),
                "log_std_init": settings.log_std_init,
            },
            seed=seed,
            device="cpu",
            verbose=0,
        )
    t0 = time.monotonic()
    cb = Collect()
    try:
        while done < settings.timesteps:
            chunk = min(settings.chunk_steps, settings.timesteps - done)
            episodes.clear()
            model.learn(total_timesteps=chunk, reset_num_timesteps=False, callback=cb)
            done = int(model.num_timesteps)
            row = {
                "timesteps": done,
                "episodes": len(episodes),
                "mean_return": float(np.mean([e[0] for e in episodes])) if episodes else None,
                "success": float(np.mean([e[1] for e in episodes])) if episodes else None,
                "wall_s": round(time.monotonic() - t0, 2),
            }
            curve.append(row)
            tmp = ckpt_dir / ".ppo.tmp.zip"
            model.save(str(tmp))
            tmp.replace(zip_path)
            atomic.write_with(norm_path, lambda p: venv.save(str(p)))
            atomic.write_json(
                meta_path, {"timesteps": done, "curve": curve, "settings": settings.to_json()}
            )
            succ = "n/a" if row["success"] is None else f"{row['success']:.2f}"
            yield Progress(
                min(1.0, done / settings.timesteps),
                f"PPO {done}/{settings.timesteps} steps: success {succ}",
                {"curve": row, "checkpoint": str(ckpt_dir)},
            )
    finally:
        venv.close()
    return PpoResult(actor_module(model), curve, done, time.monotonic() - t0)
