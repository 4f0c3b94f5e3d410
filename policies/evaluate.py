"""Success rate of a policy in a twin, with a Wilson 95 % interval, through an executor.

Every episode runs the exported ONNX model (what the robot agent runs), with seeds
`seed, seed + 1, ...`, so two evaluations with the same seed see the same starts, goals
and randomization draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from policies.policy import Policy
from policies.randomization import Randomization
from policies.rollouts import EpisodeJob, run_episodes
from twins.executor import Executor, SerialExecutor
from twins.spec import TwinSpec

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (low, high) of a binomial proportion; (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    den = 1.0 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def evaluate(
    policy: Policy,
    task: str,
    spec: TwinSpec,
    config: Mapping[str, Any],
    dr: Randomization | None = None,
    episodes: int = 50,
    seed: int = 10_000,
    executor: Executor | None = None,
) -> dict[str, Any]:
    """{"success_rate", "ci95": [lo, hi], "episodes", "successes", "mean_return",
    "stopped": {reason: count}} over `episodes` episodes."""
    dr = dr or Randomization()
    ex = executor or SerialExecutor()
    per = max(1, math.ceil(episodes / max(1, 2 * ex.workers)))
    seeds = list(range(seed, seed + episodes))
    jobs = [
        EpisodeJob(task, spec, dict(config), dr, "onnx", policy.onnx, tuple(seeds[i : i + per]))
        for i in range(0, episodes, per)
    ]
    recs = [r for batch in ex.map(run_episodes, jobs) for r in batch]
    k = sum(r["success"] for r in recs)
    lo, hi = wilson(k, len(recs))
    stopped: dict[str, int] = {}
    for r in recs:
        if r["stopped"]:
            stopped[r["stopped"]] = stopped.get(r["stopped"], 0) + 1
    return {
        "success_rate": k / len(recs) if recs else 0.0,
        "ci95": [lo, hi],
        "episodes": len(recs),
        "successes": int(k),
        "mean_return": sum(r["return"] for r in recs) / max(1, len(recs)),
        "stopped": stopped,
        "randomization": dr.mode,
    }
