"""Episodes of a task under a policy, as picklable jobs for an executor (twins/executor.py):
the CEM trainer and evaluation send `EpisodeJob`s to a local process pool (or Ray), and
each worker keeps its environments and ONNX sessions between jobs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.motion_primitives import primitive_actor, task_chain
from policies.policy import Policy
from policies.randomization import Randomization
from policies.tasks import TwinEnv, make_env
from twins.spec import TwinSpec

Act = Callable[[np.ndarray], np.ndarray]
_ENVS: dict[str, TwinEnv] = {}
_ACTORS: dict[str, Act] = {}
_CHAINS: dict[int, Any] = {}  # id(env) -> its tool chain (push_ik)


@dataclass(frozen=True)
class EpisodeJob:
    """Run `seeds` episodes of `task` with one policy: `kind` "onnx" (payload: model bytes)
    or a primitive family name from policies.motion_primitives (payload: its parameters)."""

    task: str
    spec: TwinSpec
    config: dict[str, Any]
    dr: Randomization
    kind: str
    payload: Any
    seeds: tuple[int, ...]


def _env_key(job: EpisodeJob) -> str:
    h = hashlib.sha256()
    h.update(
        json.dumps(
            [job.task, job.spec.to_json(), job.config, job.dr.to_json()],
            sort_keys=True,
            default=str,
        ).encode()
    )
    h.update(np.ascontiguousarray(job.dr.samples).tobytes())
    return h.hexdigest()


def env_for(job: EpisodeJob) -> TwinEnv:
    key = _env_key(job)
    env = _ENVS.get(key)
    if env is None:
        if len(_ENVS) > 8:  # a worker serves one training run at a time
            for old in _ENVS.values():
                old.close()
            _ENVS.clear()
            _CHAINS.clear()
        env = _ENVS[key] = make_env(job.task, job.spec, job.config, job.dr)
    return env


def actor_for(job: EpisodeJob, env: TwinEnv) -> Act:
    if job.kind == "onnx":
        key = hashlib.sha256(job.payload).hexdigest()
        act = _ACTORS.get(key)
        if act is None:
            act = _ACTORS[key] = Policy(job.payload, env.policy_spec).act
        return act
    chain = None
    if job.kind == "push_ik":
        chain = _CHAINS.get(id(env))
        if chain is None:
            chain = _CHAINS[id(env)] = task_chain(env)
    return primitive_actor(job.kind, env.policy_spec, job.payload, chain)


def run_episodes(job: EpisodeJob) -> list[dict[str, Any]]:
    """One record per seed: return, success, steps, why it stopped (module-level: picklable)."""
    env = env_for(job)
    act = actor_for(job, env)
    out = []
    for seed in job.seeds:
        obs, _ = env.reset(seed=int(seed))
        ret, steps = 0.0, 0
        while True:
            obs, r, term, trunc, info = env.step(act(obs))
            ret += r
            steps += 1
            if term or trunc:
                break
        out.append(
            {
                "seed": int(seed),
                "return": float(ret),
                "success": bool(info.get("is_success", False)),
                "steps": steps,
                "stopped": str(info.get("stopped", "")),
            }
        )
    return out
