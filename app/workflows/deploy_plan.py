"""Before a policy reaches the robot (app/workflows/deploy.py runs it): its spec checked
against the robot (`check_robot`), and the twin's prediction from the robot's measured state
(`shadow_run`, `plan_deploy` -> DeployPlan), for reach and for push (the object tracked in
the robot's camera now, the goal drawn around it). A push policy's object source
(`policy_object_source`) and the robot's surface masked out of the camera's depth
(`robot_surface`) are put together here; the tracking itself is
reconstruction/pose_feeder.py."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from app.workflows.train import load_policy
from app.workflows.twin import load_twin
from devices.errors import DeviceError
from devices.robots.client import RobotClient
from devices.robots.wire.policy_spec import TERMS as AGENT_TERMS
from devices.robots.wire.policy_spec import PolicySpec
from devices.robots.wire.robot_types import RobotInfo
from policies.errors import PolicyError
from policies.policy import Policy
from policies.tasks import get_task, task_config
from policies.tasks.base import TaskConfig
from reconstruction.pose_feeder import (
    ObjectSource,
    object_source,
    read_camera_pose,
    track_now,
)
from resources.project import Project
from twins.robot_surface import RobotSurface
from twins.spec import TwinSpec

log = logging.getLogger(__name__)

SETTLE_VEL = 0.01  # rad/s: the robot counts as stopped below this on every joint
SETTLE_S = 1.5  # longest wait for the robot to come to rest after a stop
R = TypeVar("R")
_IN_WORKER = False


def predict_in_worker(on: bool = True) -> None:
    """Run a plan's twin work (drawing the goal, the shadow run) in a spawned worker process
    from now on (the desktop app): PyBullet keeps the GIL through building the twin and
    through each step, and the window waited 120-245 ms for it in bench loop's deploy step
    on a loaded laptop. Off by default: a command line pays no process start."""
    global _IN_WORKER
    _IN_WORKER = on


@contextmanager
def _twin_calls() -> Iterator[Callable[..., Any]]:
    """`call(fn, *args)` for one plan: here, or in one worker process for the whole plan."""
    if not _IN_WORKER:
        yield lambda fn, *args: fn(*args)
        return
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no Qt, no threads
    with ProcessPoolExecutor(1, mp_context=ctx) as ex:

        def call(fn: Callable[..., R], *args: Any) -> R:
            try:
                return ex.submit(fn, *args).result()
            except BrokenProcessPool as exc:
                raise PolicyError(
                    f"deploy: the twin's prediction process ended without an answer ({exc})"
                ) from None

        yield call


def policy_object_source(
    project: Any,
    policy_id: str,
    client: RobotClient,
    camera: str | None = None,
    camera_pose: Path | None = None,
) -> ObjectSource:
    """The object a push policy observes, seen by `camera` (default: the scan's fixed
    camera, or the robot's only camera) at the pose in `camera_pose` (default: the scan's
    calibration): what `deploy --camera/--camera-pose` and the Deploy page give."""
    pol = load_policy(project, policy_id)
    T = None if camera_pose is None else read_camera_pose(camera_pose)
    info = client.info
    if camera is None and info is not None and len(info.cameras) == 1 and T is not None:
        camera = info.cameras[0]
    return object_source(
        project,
        str(pol.record.get("twin_id")),
        [str(pol.spec.object)],
        camera,
        T,
        info.description if info is not None else "",
    )


def robot_surface(source: ObjectSource, client: RobotClient) -> RobotSurface | None:
    """The robot's surface to mask out of the camera's depth while tracking `source`'s
    objects (its `robot_description` at the robot's joints), or None without one."""
    if source.robot_description and client.info is not None:
        return RobotSurface(source.robot_description, list(client.info.joint_names))
    return None


def check_robot(spec: PolicySpec, info: RobotInfo) -> None:
    """PolicyError naming every way this robot cannot run this policy as trained."""
    problems = []
    if tuple(info.joint_names) != spec.joints:
        problems.append(
            f"joints: policy {list(spec.joints)}, robot {info.name} {list(info.joint_names)}"
        )
    if abs(info.control_rate_hz - spec.control_rate_hz) > 0.05 * spec.control_rate_hz:
        problems.append(
            f"control rate: policy trained at {spec.control_rate_hz:g} Hz, robot runs at "
            f"{info.control_rate_hz:g} Hz (train it for this robot with "
            f"`train … --set control_rate_hz={info.control_rate_hz:g}`)"
        )
    if spec.action_mode not in info.command_modes:
        problems.append(
            f"command mode: policy commands {spec.action_mode}, robot takes "
            f"{list(info.command_modes)}"
        )
    supported = tuple(info.meta.get("policy_observations", AGENT_TERMS))
    missing = [t for t in spec.observation if t not in supported]
    if missing:
        problems.append(
            f"observations: the robot's agent does not provide {missing} (it provides "
            f"{list(supported)})"
        )
    if "target" in spec.observation and (spec.target is None or len(spec.target) != spec.n):
        problems.append(f"target: the policy observes 'target' but carries no {spec.n} values")
    if problems:
        raise PolicyError(
            f"policy does not fit robot {info.name}; nothing was uploaded: " + "; ".join(problems)
        )


@dataclass
class Shadow:
    """The twin's prediction of one deployment (from the robot's measured state)."""

    t: NDArray[np.float64]  # s since the policy started
    joint_pos: NDArray[np.float64]  # (len(t), n) predicted measured joints
    command: NDArray[np.float64]  # (len(t), n) predicted commands
    success: bool
    final_error: float
    stopped: str = ""
    unit: str = "rad"  # of final_error: rad (reach, largest joint error), m (push, object)


@dataclass
class DeployPlan:
    """Everything checked and predicted before the robot moves."""

    policy_id: str
    policy: Policy
    spec: PolicySpec  # with this deployment's goal
    task: str
    config: TaskConfig
    twin_id: str
    start: NDArray[np.float64]
    goal: NDArray[np.float64]
    shadow: Shadow
    robot: str = ""
    objects: ObjectSource | None = None  # where the object poses come from (push)
    object_start: NDArray[np.float64] | None = None  # tracked pose at planning (7,)

    def summary(self) -> str:
        s = self.shadow
        return (
            f"twin {self.twin_id} predicts {'success' if s.success else 'FAILURE'}: final "
            f"error {s.final_error:.3f} {s.unit} after "
            f"{float(s.t[-1]) if len(s.t) else 0.0:.1f} s"
        )


def final_error(
    task: str,
    goal: NDArray[np.float64],
    q: NDArray[np.float64],
    object_pose: NDArray[np.float64] | None = None,
) -> float:
    """The task's success measure: reach, the largest joint error (rad) of joint state `q`;
    push, the object's distance (m) from the goal (x, y), from its tracked pose."""
    if task == "reach":
        return float(np.max(np.abs(np.asarray(q, float) - goal)))
    if task == "push":
        if object_pose is None:
            raise PolicyError("deploy: a push is judged on the object's pose; none was tracked")
        return float(np.linalg.norm(np.asarray(object_pose, float)[:2] - goal[:2]))
    raise PolicyError(f"deploy: task '{task}' has no success measure for real runs")


def _drawn_goal(
    task: str, twin: TwinSpec, config: TaskConfig, seed: int, obj: str | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """The task's goal for `seed`: (joint target, None), or for a push (the object's goal
    x, y, where the object was placed x, y) in the twin."""
    env = get_task(task).env(twin, config, None, seed)
    try:
        env.reset(seed=seed)
        if obj is None:
            return np.asarray(env.target, float).copy(), None
        drawn = np.asarray(env.deploy_spec.object_goal, float)
        return drawn, np.asarray(env.world.object_pose(obj), float)[:2]
    finally:
        env.close()


def shadow_run(
    task: str,
    twin: TwinSpec,
    config: TaskConfig,
    policy: Policy,
    start: NDArray[np.float64],
    goal: NDArray[np.float64],
    object_start: NDArray[np.float64] | None = None,
) -> Shadow:
    """The policy in the nominal twin from joint state `start` (and, for a push, the
    object at its tracked pose `object_start`) to goal `goal` (joints, or object x, y)."""
    base = get_task(task).env
    start, goal = np.asarray(start, float), np.asarray(goal, float)

    class FromRobot(base):  # type: ignore[valid-type,misc]
        def _place(self, rng: np.random.Generator) -> None:
            super()._place(rng)
            if object_start is not None:
                self.world.set_object_pose(self._obj, np.asarray(object_start, float))
                self.goal = goal.copy()
            else:
                self.target = goal.copy()
            self.world.set_joint_state(start, None, list(self.joints))

    env = FromRobot(twin, config, None, 0)
    try:
        obs, _ = env.reset(seed=0)
        ts, qs, cs = [0.0], [env.q.copy()], [env.q.copy()]
        info: dict[str, Any] = {}
        while True:
            obs, _, term, trunc, info = env.step(policy.act(obs))
            ts.append(env.t)
            qs.append(env.q.copy())
            cs.append(env.cmd.copy())
            if term or trunc:
                break
        obj = env.world.object_pose(env._obj) if object_start is not None else None
        return Shadow(
            np.array(ts),
            np.array(qs),
            np.array(cs),
            bool(info.get("is_success", False)),
            final_error(task, goal, env.q, obj),
            str(info.get("stopped", "")),
            "m" if object_start is not None else "rad",
        )
    finally:
        env.close()


def plan_deploy(
    project: Project,
    client: RobotClient,
    policy_id: str,
    target: Sequence[float] | None = None,
    goal_seed: int = 0,
    objects: ObjectSource | None = None,
    object_goal: Sequence[float] | None = None,
) -> DeployPlan:
    """Check the policy against the robot and predict the run in its twin. The goal is
    `target` (joint values, rad) or one drawn from the task's goal distribution; for a
    push, `object_goal` (x, y in m) or one drawn around the object's tracked pose, which
    `objects` (the camera through the tracker) gives."""
    info = client.info
    if info is None:
        raise DeviceError(f"robot at {client.address}: not connected")
    policy = load_policy(project, policy_id)
    task = str(policy.record.get("task", ""))
    twin_id, twin = load_twin(project, policy.record.get("twin_id"))
    config = task_config(task, policy.record.get("task_config", {}))
    spec = policy.spec
    if "object_pose" in spec.observation:
        with _twin_calls() as call:
            return _plan_push(project, client, call, policy_id, policy, task, twin_id, twin,
                              config, goal_seed, objects, object_goal)  # fmt: skip
    with _twin_calls() as call:
        return _plan_reach(
            call, client, policy_id, policy, task, twin_id, twin, config, target, goal_seed
        )


def _plan_reach(
    call: Callable[..., Any],
    client: RobotClient,
    policy_id: str,
    policy: Policy,
    task: str,
    twin_id: str,
    twin: TwinSpec,
    config: TaskConfig,
    target: Sequence[float] | None,
    goal_seed: int,
) -> DeployPlan:
    info = client.info
    assert info is not None
    spec = policy.spec
    if target is not None:
        goal = np.asarray(target, float)
        if goal.shape != (spec.n,):
            raise PolicyError(
                f"deploy: --target has {goal.size} values, policy {policy_id} drives {spec.n} "
                f"joints {list(spec.joints)}"
            )
    elif "target" in spec.observation:
        goal = call(_drawn_goal, task, twin, config, goal_seed)[0]
    else:
        goal = np.zeros(spec.n)
    spec = spec.with_goal(target=goal.tolist()) if "target" in spec.observation else spec
    check_robot(spec, info)
    lo, hi = info.limits.lower, info.limits.upper
    if np.any(goal < lo) or np.any(goal > hi):
        j = int(np.argmax(np.maximum(lo - goal, goal - hi)))
        raise PolicyError(
            f"deploy: goal {goal[j]:.3f} rad for {info.joint_names[j]} is outside robot "
            f"{info.name}'s limits [{lo[j]:.3f}, {hi[j]:.3f}]"
        )
    start = client.latest_state().joint_pos.copy()
    shadow = call(shadow_run, task, twin, config, policy, start, goal)
    return DeployPlan(
        policy_id, policy, spec, task, config, twin_id, start, goal, shadow, info.name
    )


def _plan_push(
    project: Project,
    client: RobotClient,
    call: Callable[..., Any],
    policy_id: str,
    policy: Policy,
    task: str,
    twin_id: str,
    twin: TwinSpec,
    config: TaskConfig,
    goal_seed: int,
    objects: ObjectSource | None,
    object_goal: Sequence[float] | None,
) -> DeployPlan:
    info = client.info
    assert info is not None
    spec = policy.spec
    name = str(spec.object)
    if objects is None:  # the calibrated fixed camera of the scan the twin came from
        try:
            objects = object_source(project, twin_id, [name], robot_description=info.description)
        except DeviceError as exc:
            raise PolicyError(
                f"deploy: policy {policy_id} observes object '{name}' and no camera is known "
                f"to see it ({exc})"
            ) from None
    if name not in {m.name for m in objects.models}:
        raise PolicyError(
            f"deploy: policy {policy_id} pushes '{name}', the object source tracks "
            f"{[m.name for m in objects.models]}"
        )
    check_robot(spec, info)  # before the camera is even opened
    if twin.object(name).shape.kind == "cylinder":  # as the twin observed it in training
        objects = dataclasses.replace(objects, spinless=(*objects.spinless, name))
    obj0 = track_now(client, objects, name, surface=robot_surface(objects, client))
    if object_goal is not None:
        goal = np.asarray(object_goal, float).reshape(-1)[:2]
        if goal.shape != (2,) or not np.all(np.isfinite(goal)):
            raise PolicyError("deploy: the object goal must be two finite numbers (x, y in m)")
    else:  # the task's goal distribution, drawn around where the object is now
        drawn, placed = call(_drawn_goal, task, twin, config, goal_seed, name)
        goal = obj0[:2] + (drawn - placed)
    spec = spec.with_goal(object_goal=goal.tolist())
    check_robot(spec, info)
    start = client.latest_state().joint_pos.copy()
    shadow = call(shadow_run, task, twin, config, policy, start, goal, obj0)
    return DeployPlan(
        policy_id, policy, spec, task, config, twin_id, start, goal, shadow, info.name,
        objects, obj0,
    )  # fmt: skip
