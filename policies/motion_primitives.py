"""Parameterised motion primitives: the policy families the CEM trainer searches.

`joint_pd` (tasks observing `target`): a = clip(kp * (target - q) - kd * qd, -1, 1) per
joint, with log-gains as the searched parameters. It is a linear map of the observation,
so it exports to ONNX as one Linear layer and a clip.

`push_ik` (tasks observing `object_pose` and `object_goal`): the closed-loop pushing law of
policies/push_primitive.py (tool forward kinematics, a phase picked from where the tool is
relative to object and goal, damped least squares); 13 parameters in R^13. It needs the
robot's kinematic chain (`chain`, twins.chain.serial_chain; `task_chain(env)`).

Their trainer (CEM over these parameters) is policies/cem.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.robots.wire.policy_spec import PolicySpec
from policies import push_primitive
from policies.errors import PolicyError
from twins.chain import serial_chain

FAMILIES = ("joint_pd", "push_ik")


def default_family(spec: PolicySpec) -> str:
    """The primitive that can drive a task with this spec: `push_ik` when the task observes
    an object and its goal, else `joint_pd`."""
    return "push_ik" if "object_goal" in spec.observation else "joint_pd"


def task_chain(env: Any) -> Any:
    """The serial chain of a task environment's tool point (a grasp/TCP link if the robot
    has one, else the task's end-effector link), for `push_ik`."""
    links = list(env._kin.links)
    tool = next((n for n in links if "grasptarget" in n or n.endswith("tcp")), env._ee)
    robot = env.twin.robot
    return serial_chain(env.twin.resolve(robot.urdf), env.joints, tool)


def n_params(family: str, spec: PolicySpec) -> int:
    if family == "push_ik":
        push_primitive.check_spec(spec)
        return push_primitive.n_params()
    if family == "joint_pd":
        if "target" not in spec.observation or "joint_pos" not in spec.observation:
            raise PolicyError(
                "primitive 'joint_pd' needs a task that observes joint_pos and target "
                f"(this one observes {list(spec.observation)}); push tasks take 'push_ik' "
                "(the default), or train with --trainer ppo"
            )
        return 2 * spec.n
    raise PolicyError(f"unknown motion primitive '{family}' (known: {', '.join(FAMILIES)})")


def initial_mean(family: str, spec: PolicySpec) -> NDArray[np.float64]:
    """joint_pd: log-gains of a gentle start (kp = 8 per unit action per rad, kd = 0.05);
    push_ik: its hand-set defaults."""
    if family == "push_ik":
        return push_primitive.initial_mean()
    n = spec.n
    return np.concatenate([np.full(n, np.log(8.0)), np.full(n, np.log(0.05))])


def linear_weights(
    family: str, spec: PolicySpec, params: Sequence[float] | NDArray[np.float64]
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """(W (n, obs_dim), b (n,)) of the primitive's linear law."""
    n, s = spec.n, spec.slices()
    p = np.asarray(params, float)
    if p.shape != (n_params(family, spec),):
        raise PolicyError(f"primitive '{family}' takes {2 * n} parameters, got {p.size}")
    kp, kd = np.exp(p[:n]), np.exp(p[n:])
    W = np.zeros((n, spec.obs_dim))
    eye = np.eye(n)
    W[:, s["target"]] += eye * kp[:, None]
    W[:, s["joint_pos"]] -= eye * kp[:, None]
    if "joint_vel" in s:
        W[:, s["joint_vel"]] -= eye * kd[:, None]
    return W.astype(np.float32), np.zeros(n, np.float32)


def primitive_actor(
    family: str,
    spec: PolicySpec,
    params: Sequence[float] | NDArray[np.float64],
    chain: Any = None,
) -> Callable[[np.ndarray], np.ndarray]:
    if family == "push_ik":
        return push_primitive.actor(spec, _need(chain), params)  # type: ignore[no-any-return]
    W, b = linear_weights(family, spec, params)

    def act(obs: np.ndarray) -> np.ndarray:
        return np.clip(W @ np.asarray(obs, np.float32) + b, -1.0, 1.0)

    return act


def _need(chain: Any) -> Any:
    if chain is None:
        raise PolicyError("primitive 'push_ik' needs the robot's kinematic chain")
    return chain


def torch_module(
    family: str,
    spec: PolicySpec,
    params: Sequence[float] | NDArray[np.float64],
    chain: Any = None,
) -> Any:
    """The primitive as a torch module (for ONNX export)."""
    import torch

    if family == "push_ik":
        return push_primitive.torch_module(spec, _need(chain), params)

    W, b = linear_weights(family, spec, params)
    lin = torch.nn.Linear(spec.obs_dim, spec.n)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(W))
        lin.bias.copy_(torch.from_numpy(b))

    class Clipped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.clamp(self.lin(x), -1.0, 1.0)

    return Clipped()
