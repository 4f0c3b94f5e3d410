"""Reach a pose: drive the arm from a random start to a random joint-space goal.

The goal is a joint configuration (the agent's `target` term: the workbench turns a
Cartesian goal into joints before upload); start and goal are drawn around the twin's home
configuration, both with the end effector above the table. Success: every joint within
`success_tol` of the goal at the end of the episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from devices.robots.wire.policy_spec import PolicySpec
from policies.errors import PolicyError
from policies.tasks.base import TaskConfig, TwinEnv, Vec


@dataclass(frozen=True)
class ReachConfig(TaskConfig):
    episode_s: float = 2.0
    start_range: float = 0.25  # rad around home, per joint
    goal_range: float = 0.5  # rad around home, per joint
    success_tol: float = 0.05  # rad, max over joints
    min_ee_height: float = 0.08  # m above the table top (z = 0) for start and goal


def default_config() -> ReachConfig:
    return ReachConfig()


class ReachEnv(TwinEnv):
    observation_terms = ("joint_pos", "joint_vel", "target")
    task_name = "reach"
    config: ReachConfig

    def _draw(self, rng: np.random.Generator, spread: float) -> Vec:
        """A configuration within `spread` of home whose end effector is above the table."""
        c = self.config
        lo, hi = self.lower + 0.05, self.upper - 0.05
        for _ in range(50):
            q = np.clip(self.q_home + rng.uniform(-spread, spread, self.q_home.shape), lo, hi)
            if self.ee_position(q)[2] >= c.min_ee_height:
                return q
        return np.clip(self.q_home, lo, hi)

    def _place(self, rng: np.random.Generator) -> None:
        c = self.config
        start = self._draw(rng, c.start_range)
        self.target = self._draw(rng, c.goal_range)
        self.world.set_joint_state(start, None, list(self.joints))
        self._prev_err = float(np.linalg.norm(self.target - start))

    def _place_replayed(self, cond: Mapping[str, Any]) -> None:
        start = self._recorded_q(cond)
        goal = np.asarray(cond.get("goal", ()), dtype=np.float64)
        if goal.shape != start.shape or not np.all(np.isfinite(goal)):
            raise PolicyError(f"task reach: a replayed goal has {goal.size} joint values")
        self.target = np.clip(goal, self.lower, self.upper)
        self.world.set_joint_state(start, None, list(self.joints))
        self._prev_err = float(np.linalg.norm(self.target - start))

    def error(self) -> float:
        return float(np.max(np.abs(self.target - self.q)))

    def _reward(self, action: Vec) -> float:
        """Progress towards the goal (potential-based shaping: 10 per rad of distance
        closed), a small distance cost, a bonus inside the tolerance."""
        err = float(np.linalg.norm(self.target - self.q))
        prev, self._prev_err = self._prev_err, err
        inside = 0.5 if self.error() < self.config.success_tol else 0.0
        return 10.0 * (prev - err) - 0.1 * err - 0.01 * float(np.sum(action**2)) + inside

    def _success(self) -> bool:
        return self.error() < self.config.success_tol

    def _goal_spec(self) -> PolicySpec:
        return self.policy_spec.with_goal(target=self.target.tolist())

    def _info(self) -> dict[str, Any]:
        return {**super()._info(), "error": self.error()}


def oracle(spec: PolicySpec, obs: np.ndarray) -> np.ndarray:
    """A scripted policy from the observation alone: step straight to the target at full
    action (saturating proportional law). Reaches the goal in the nominal twin."""
    s = spec.slices()
    err = obs[s["target"]] - obs[s["joint_pos"]]
    return np.clip(err / spec.action_scale, -1.0, 1.0).astype(np.float32)
