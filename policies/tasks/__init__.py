"""Registry of tasks over a twin (explicit dict, MuJoCo-Playground style, like
devices/lab/scenes.py). Each `Task` has `default_config()` and `make(spec, config, dr,
seed)` -> a Gymnasium environment whose observation/action spec is the robot agent's.

    from policies.tasks import TASKS, make_env
    env = make_env("reach", twin_spec)            # default config, no randomization
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.errors import PolicyError
from policies.randomization import Randomization
from policies.tasks import push, reach
from policies.tasks.base import TaskConfig, TwinEnv
from twins.spec import TwinSpec


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    default_config: Callable[[], TaskConfig]
    env: type[TwinEnv]


TASKS: dict[str, Task] = {
    "reach": Task(
        "reach",
        "reach a random joint-space pose from a random start (target observed)",
        reach.default_config,
        reach.ReachEnv,
    ),
    "push": Task(
        "push",
        "push a table object to a random goal (object pose and goal observed)",
        push.default_config,
        push.PushEnv,
    ),
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise PolicyError(f"unknown task '{name}' (tasks: {', '.join(TASKS)})") from None


def task_config(name: str, overrides: Mapping[str, Any] | None = None) -> TaskConfig:
    """The task's default config with `overrides` applied (checked)."""
    return get_task(name).default_config().replace(overrides or {})


def make_env(
    name: str,
    spec: TwinSpec,
    config: TaskConfig | Mapping[str, Any] | None = None,
    randomization: Randomization | None = None,
    seed: int | None = None,
) -> TwinEnv:
    """A Gymnasium environment of task `name` over twin `spec`."""
    task = get_task(name)
    if config is None or isinstance(config, Mapping):
        config = task_config(name, config)
    return task.env(spec, config, randomization, seed)


__all__ = ["TASKS", "Task", "TaskConfig", "TwinEnv", "get_task", "make_env", "task_config"]
