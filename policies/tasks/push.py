"""Push an object to a goal on the table.

The twin keeps only the pushed object (default: a cylinder if the twin has one, else its
first movable object). Each episode draws the object's start near its scanned pose, a goal
`goal_distance` away in a direction within `goal_spread_deg` of pushing away from the robot
base, and a start configuration around home. The policy sees joints plus the tracked
object pose (`object_pose`, noisy, with dropouts) and the goal (`object_goal`). Success:
the object's centre within `success_tol` of the goal at the end of the episode. The
object is observed as the robot agent gives it (PROTOCOL.md `object_pose`): the newest
good pose the camera tracker streamed, in the robot base frame (the twin's world), and a
pose older than `object_max_age_s` ends the episode as the agent stops the policy. A
cylinder's spin about its axis is dropped from its observed pose (`spinless`), as the
deploy feed drops it from the tracked one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from devices.robots.wire.policy_spec import PolicySpec
from policies.errors import PolicyError
from policies.tasks.base import TaskConfig, TwinEnv, Vec
from twins.spec import TwinSpec


@dataclass(frozen=True)
class PushConfig(TaskConfig):
    episode_s: float = 4.0
    # rad per unit action: at 0.05 a Panda under the agent's envelope (acceleration and
    # lead limits) cannot travel, lean the hand and finish a push within the episode
    action_scale: float = 0.15
    object: str = ""  # "" = a cylinder if there is one, else the first movable object
    start_range: float = 0.1  # rad around home, per joint
    object_jitter: float = 0.04  # m around the object's scanned position
    goal_distance: tuple[float, float] = (0.08, 0.15)  # m
    goal_spread_deg: float = 45.0
    success_tol: float = 0.03  # m
    object_max_age_s: float = 0.2  # the agent stops the policy on an older tracked pose


def default_config() -> PushConfig:
    return PushConfig()


def pushed_object(spec: TwinSpec, name: str) -> str:
    movable = [o for o in spec.objects if not o.static]
    if name:
        spec.object(name)  # TwinError naming the objects there are
        return name
    if not movable:
        raise PolicyError(f"task push: twin '{spec.name}' has no movable object to push")
    cyl = [o.name for o in movable if o.shape.kind == "cylinder"]
    return cyl[0] if cyl else movable[0].name


class PushEnv(TwinEnv):
    observation_terms = ("joint_pos", "joint_vel", "object_pose", "object_goal")
    task_name = "push"
    config: PushConfig

    def _task_spec(self, spec: TwinSpec) -> TwinSpec:
        self._obj = pushed_object(spec, self.config.object)
        # a cylinder's spin about its axis: the tracker cannot see it, the policy neither
        self.spinless = spec.object(self._obj).shape.kind == "cylinder"
        return dataclasses.replace(spec, objects=(spec.object(self._obj),))

    def _object_name(self) -> str | None:
        return self._obj

    def _place(self, rng: np.random.Generator) -> None:
        c = self.config
        lo, hi = self.lower + 0.05, self.upper - 0.05
        q = np.clip(
            self.q_home + rng.uniform(-c.start_range, c.start_range, self.q_home.shape), lo, hi
        )
        self.world.set_joint_state(q, None, list(self.joints))
        pose = np.array(self.twin.object(self._obj).pose, dtype=np.float64)
        pose[:2] += rng.uniform(-c.object_jitter, c.object_jitter, 2)
        self.world.set_object_pose(self._obj, pose)
        away = math.atan2(pose[1], pose[0])  # from the robot base outwards
        ang = away + math.radians(rng.uniform(-c.goal_spread_deg, c.goal_spread_deg))
        d = rng.uniform(*c.goal_distance)
        self.goal = pose[:2] + d * np.array([math.cos(ang), math.sin(ang)])
        self.target = self.q_home.copy()

    def _place_replayed(self, cond: Mapping[str, Any]) -> None:
        self.world.set_joint_state(self._recorded_q(cond), None, list(self.joints))
        pose = np.asarray(cond.get("object_start", ()), dtype=np.float64)
        goal = np.asarray(cond.get("goal", ()), dtype=np.float64)[:2]
        if pose.shape != (7,) or goal.shape != (2,) or not np.all(np.isfinite(pose)):
            raise PolicyError("task push: a replayed run needs object_start (7) and goal (2+)")
        self.world.set_object_pose(self._obj, pose)
        self.goal = goal.copy()

    def _true_object_pose(self) -> Vec:
        """Read once per control tick (after the physics steps) and kept for the reward."""
        self.obj_pose = self.world.object_pose(self._obj)
        return self.obj_pose

    def _object_goal(self) -> Vec:
        return self.goal

    def distance(self) -> float:
        return float(np.linalg.norm(self.obj_pose[:2] - self.goal))

    def _reward(self, action: Vec) -> float:
        reach = float(np.linalg.norm(self.ee_position() - self.obj_pose[:3]))
        return -5.0 * self.distance() - reach - 0.01 * float(np.sum(action**2))

    def _success(self) -> bool:
        return self.distance() < self.config.success_tol

    def _goal_spec(self) -> PolicySpec:
        return self.policy_spec.with_goal(object_goal=self.goal.tolist())

    def _info(self) -> dict[str, Any]:
        return {**super()._info(), "distance": self.distance()}
