"""The fast trainer of motion primitives: cross-entropy search (CEM) over a primitive
family's parameters (policies/motion_primitives.py).

`cem_steps` is a job (resources/jobs.py): each generation's candidates run through the
executor (`EpisodeJob`s, policies/rollouts.py), then it yields a `Progress` whose partial holds
the learning curve and a checkpoint (mean, std, generation, curve) that `resume` continues
from.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.robots.wire.policy_spec import PolicySpec
from policies.errors import PolicyError
from policies.motion_primitives import initial_mean, n_params
from policies.randomization import Randomization
from policies.rollouts import EpisodeJob, run_episodes
from resources.jobs import Job, Progress
from twins.executor import Executor
from twins.spec import TwinSpec

Steps = Job["CemResult"]


@dataclass(frozen=True)
class CemSettings:
    population: int = 16
    elite_frac: float = 0.25
    generations: int = 10
    episodes: int = 4  # per candidate per generation (common random seeds)
    init_std: float = 1.0
    min_std: float = 0.05

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CemResult:
    params: NDArray[np.float64]
    curve: list[dict[str, Any]]
    evaluations: int
    wall_s: float


def cem_steps(
    family: str,
    task: str,
    spec: TwinSpec,
    config: Mapping[str, Any],
    dr: Randomization,
    policy_spec: PolicySpec,
    settings: CemSettings,
    executor: Executor,
    seed: int = 0,
    resume: Mapping[str, Any] | None = None,
) -> Steps:
    """Cross-entropy search over the primitive's parameters; returns a `CemResult`."""
    d = n_params(family, policy_spec)
    rng = np.random.default_rng(seed)
    if resume:
        mean = np.asarray(resume["mean"], float)
        std = np.asarray(resume["std"], float)
        gen0 = int(resume["generation"])
        curve = list(resume["curve"])
        evals = int(resume.get("evaluations", 0))
        rng = np.random.default_rng([seed, gen0])
        if mean.shape != (d,):
            raise PolicyError(f"checkpoint has {mean.size} parameters, primitive needs {d}")
    else:
        mean = initial_mean(family, policy_spec)
        # push_ik searches logits of bounded parameters: half the spread covers their range
        std = np.full(d, settings.init_std * (0.5 if family == "push_ik" else 1.0))
        gen0, curve, evals = 0, [], 0
    n_elite = max(2, int(round(settings.population * settings.elite_frac)))
    t0 = time.monotonic()
    cfg = dict(config)
    for g in range(gen0, settings.generations):
        seeds = tuple(int(s) for s in rng.integers(0, 2**31 - 1, settings.episodes))
        cands = mean + std * rng.standard_normal((settings.population, d))
        cands[0] = mean  # the current mean is always scored too
        jobs = [EpisodeJob(task, spec, cfg, dr, family, tuple(c), seeds) for c in cands]
        scores, succ = [], []
        for recs in executor.map(run_episodes, jobs):
            scores.append(np.mean([r["return"] for r in recs]))
            succ.append(np.mean([r["success"] for r in recs]))
        evals += len(jobs) * len(seeds)
        order = np.argsort(scores)[::-1]
        elite = cands[order[:n_elite]]
        mean = elite.mean(axis=0)
        std = np.maximum(elite.std(axis=0), settings.min_std)
        row = {
            "generation": g + 1,
            "episodes": evals,
            "mean_return": float(np.mean(scores)),
            "best_return": float(scores[order[0]]),
            "success_mean_params": float(succ[0]),
            "success_best": float(succ[order[0]]),
            "wall_s": round(time.monotonic() - t0, 2),
        }
        curve.append(row)
        ckpt = {
            "mean": mean.tolist(),
            "std": std.tolist(),
            "generation": g + 1,
            "curve": curve,
            "evaluations": evals,
        }
        yield Progress(
            (g + 1) / settings.generations,
            f"CEM generation {g + 1}/{settings.generations}: best return "
            f"{row['best_return']:.1f}, success {row['success_best']:.2f}",
            {"curve": row, "checkpoint": ckpt},
        )
    return CemResult(mean, curve, evals, time.monotonic() - t0)
