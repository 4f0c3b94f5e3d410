"""The one policy spec (what a policy observes and what its output means) and the one
observation builder, shared by the twin's task environments (policies/tasks/base.py), the
workbench's policy files (policies/policy.py) and the robot agent (agent/policy_runner.py).

The wire form (`to_dict` / `from_dict`) is the JSON spec uploaded with the ONNX bytes
(PROTOCOL.md "Policies") and stored in a policy artifact's policy.json:

    {"observation": ["joint_pos", "joint_vel"] (+ "target", "object_pose", "object_goal"),
                                         # concatenated in this order; default the first two
     "target": [n floats],               # when "target" is observed (required to run)
     "object": "cylinder",               # when an object term is observed (required)
     "object_goal": [x, y],              # m, robot base frame; with "object_goal" (to run)
     "object_max_age_s": 0.2,            # newest good tracked pose older -> the policy stops
     "object_min_quality": 0.0,          # tracker quality below it counts as lost
     "action": {"mode": "position" | "velocity",
                "type": "absolute" | "delta",   # delta: added to the measured joint_pos
                "scale": 1.0},
     "joints": [n joint names], "control_rate_hz": 250.0}

Terms and their sizes are `TERM_SIZES` (None: one value per joint): `joint_pos`,
`joint_vel`, `target` (rad, rad/s, rad); `object_pose` (7: xyz m + quaternion xyzw of the
tracked object in the robot base frame, the newest good pose the workbench streamed;
agent/object_poses.py); `object_goal` (2: x, y in m on the table). `build_observation`
builds the vector from measured values, for the twin and for the agent alike.

Errors are `PolicySpecError`, a DeviceError: the agent refuses a bad spec with its message
(agent/session.py REFUSALS); the workbench shows it as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from devices.errors import DeviceError

# term -> number of values; None: one per joint. The order is the documented one.
TERM_SIZES: dict[str, int | None] = {
    "joint_pos": None,
    "joint_vel": None,
    "target": None,
    "object_pose": 7,
    "object_goal": 2,
}
TERMS = tuple(TERM_SIZES)
JOINT_TERMS = tuple(t for t, k in TERM_SIZES.items() if k is None)
OBJECT_TERMS = tuple(t for t, k in TERM_SIZES.items() if k is not None)  # need an "object"
DEFAULT_OBSERVATION = ("joint_pos", "joint_vel")
MAX_AGE_RANGE_S = (0.005, 5.0)
MIN_QUALITY_RANGE = (0.0, 1.0)
DEFAULT_MAX_AGE_S = 0.2
DEFAULT_MIN_QUALITY = 0.0


class PolicySpecError(DeviceError):
    """A policy spec that is malformed, or lacks what its terms need; the message names
    the entry. A DeviceError, so the agent refuses the upload with this message."""


@dataclass(frozen=True)
class PolicySpec:
    """What a policy observes and what its output means, for `n = len(joints)` joints.

    Values a term needs for a run (`target`, `object_goal`) may be None in a trained
    policy's spec; `with_goal` sets them for one deployment. Values no observed term uses
    are refused (the wire form would drop them), so `from_dict(to_dict())` is the spec."""

    observation: tuple[str, ...]
    joints: tuple[str, ...]
    action_mode: str = "position"
    action_type: str = "delta"
    action_scale: float = 0.05
    target: tuple[float, ...] | None = None
    object: str | None = None
    object_goal: tuple[float, float] | None = None
    control_rate_hz: float = 250.0
    object_max_age_s: float = DEFAULT_MAX_AGE_S
    object_min_quality: float = DEFAULT_MIN_QUALITY

    def __post_init__(self) -> None:
        obs = self.observation
        bad = [t for t in obs if t not in TERM_SIZES]
        if bad or not obs:
            raise PolicySpecError(
                f"policy spec: unknown observation term(s) {bad} (known: {', '.join(TERMS)})"
            )
        if len(set(obs)) != len(obs):
            raise PolicySpecError(f"policy spec: a term is listed twice in {list(obs)}")
        mode, typ = self.action_mode, self.action_type
        if mode not in ("position", "velocity"):
            raise PolicySpecError(f"policy spec: action mode '{mode}' is not position or velocity")
        if typ not in ("absolute", "delta") or (typ == "delta" and mode != "position"):
            raise PolicySpecError(
                f"policy spec: action type '{typ}' is not valid for mode '{mode}'"
            )
        if not self.action_scale > 0:
            raise PolicySpecError(f"policy spec: action scale must be > 0, not {self.action_scale}")
        tracked = any(t in OBJECT_TERMS for t in obs)
        if tracked and not self.object:
            raise PolicySpecError("policy spec observes an object term but names no 'object'")
        _check_range("object_max_age_s", self.object_max_age_s, *MAX_AGE_RANGE_S)
        _check_range("object_min_quality", self.object_min_quality, *MIN_QUALITY_RANGE)
        if "target" in obs and self.target is not None and len(self.target) != self.n:
            raise PolicySpecError(
                f"policy spec observes 'target' but 'target' is not {self.n} numbers"
            )
        unused = [
            k
            for k, given, used in (
                ("target", self.target is not None, "target" in obs),
                ("object_goal", self.object_goal is not None, "object_goal" in obs),
                ("object", self.object is not None, tracked),
                ("object_max_age_s", self.object_max_age_s != DEFAULT_MAX_AGE_S, tracked),
                ("object_min_quality", self.object_min_quality != DEFAULT_MIN_QUALITY, tracked),
            )
            if given and not used
        ]
        if unused:
            raise PolicySpecError(
                f"policy spec: {unused} given but no observed term uses it (observation "
                f"{list(obs)})"
            )

    @property
    def n(self) -> int:
        return len(self.joints)

    def term_size(self, term: str) -> int:
        k = TERM_SIZES[term]
        return self.n if k is None else k

    @property
    def obs_dim(self) -> int:
        return sum(self.term_size(t) for t in self.observation)

    def slices(self) -> dict[str, slice]:
        """Where each term sits in the concatenated observation."""
        out, i = {}, 0
        for t in self.observation:
            k = self.term_size(t)
            out[t] = slice(i, i + k)
            i += k
        return out

    def with_goal(
        self, target: Sequence[float] | None = None, object_goal: Sequence[float] | None = None
    ) -> PolicySpec:
        """Copy for one deployment: the fixed target / object goal the policy is sent with."""
        return replace(
            self,
            target=tuple(float(x) for x in target) if target is not None else self.target,
            object_goal=(float(object_goal[0]), float(object_goal[1]))
            if object_goal is not None
            else self.object_goal,
        )

    def check_runnable(self) -> None:
        """PolicySpecError unless every value an observed term needs is there (what the
        agent requires of an uploaded spec)."""
        if "target" in self.observation and self.target is None:
            raise PolicySpecError(
                f"policy spec observes 'target' but 'target' is not {self.n} numbers"
            )
        if "object_goal" in self.observation and self.object_goal is None:
            raise PolicySpecError(
                "policy spec observes 'object_goal' but 'object_goal' is not 2 numbers"
            )

    def to_dict(self) -> dict[str, Any]:
        """The wire / policy.json form (PROTOCOL.md); `from_dict` reads it back equal."""
        d: dict[str, Any] = {
            "observation": list(self.observation),
            "action": {
                "mode": self.action_mode,
                "type": self.action_type,
                "scale": self.action_scale,
            },
            "joints": list(self.joints),
            "control_rate_hz": self.control_rate_hz,
        }
        if self.target is not None:
            d["target"] = list(self.target)
        if self.object:
            d["object"] = self.object
            d["object_max_age_s"] = self.object_max_age_s
            if self.object_min_quality != DEFAULT_MIN_QUALITY:
                d["object_min_quality"] = self.object_min_quality
        if self.object_goal is not None:
            d["object_goal"] = list(self.object_goal)
        return d

    @classmethod
    def from_dict(
        cls,
        d: Any,
        where: str = "policy spec",
        robot_joints: Sequence[str] | None = None,
    ) -> PolicySpec:
        """Parse a spec dict; PolicySpecError naming `where` and the entry that is wrong.

        The workbench reads a stored spec (its `joints` entry required). The agent passes
        `robot_joints`: the spec is read for the joints it drives (a `joints` entry is not
        used; the workbench checked it before the upload) and must carry every value its
        terms need to run (`check_runnable`). Entries no observed term uses are ignored."""
        if not isinstance(d, Mapping):
            raise PolicySpecError(
                f"{where}: must be a map (see PROTOCOL.md), not {type(d).__name__}"
            )
        act = d.get("action", {})
        if not isinstance(act, Mapping):
            raise PolicySpecError(f"{where}: 'action' must be a map")
        try:
            obs = tuple(str(t) for t in d.get("observation", DEFAULT_OBSERVATION))
            if robot_joints is not None:
                joints = tuple(str(j) for j in robot_joints)
            else:
                joints = tuple(str(j) for j in d["joints"])
            target = goal = obj = None
            age, qmin = DEFAULT_MAX_AGE_S, DEFAULT_MIN_QUALITY
            if "target" in obs and d.get("target") is not None:
                target = tuple(float(x) for x in d["target"])
            if "object_goal" in obs and d.get("object_goal") is not None:
                goal = _goal(d["object_goal"])
            if any(t in OBJECT_TERMS for t in obs):
                name = d.get("object")
                obj = name if isinstance(name, str) and name else None
                age = _number(d, "object_max_age_s", DEFAULT_MAX_AGE_S, *MAX_AGE_RANGE_S)
                qmin = _number(d, "object_min_quality", DEFAULT_MIN_QUALITY, *MIN_QUALITY_RANGE)
            spec = cls(
                observation=obs,
                joints=joints,
                action_mode=str(act.get("mode", "position")),
                action_type=str(act.get("type", "absolute")),
                action_scale=float(act.get("scale", 1.0)),
                target=target,
                object=obj,
                object_goal=goal,
                control_rate_hz=float(d.get("control_rate_hz", 250.0)),
                object_max_age_s=age,
                object_min_quality=qmin,
            )
        except KeyError as exc:
            raise PolicySpecError(f"{where}: missing entry {exc}") from None
        except (TypeError, ValueError) as exc:
            raise PolicySpecError(f"{where}: malformed ({exc})") from None
        if robot_joints is not None:
            spec.check_runnable()
        return spec


def build_observation(
    spec: PolicySpec,
    joint_pos: ArrayLike,
    joint_vel: ArrayLike,
    *,
    target: ArrayLike | None = None,
    object_pose: ArrayLike | None = None,
    object_goal: ArrayLike | None = None,
    out: NDArray[np.float32] | None = None,
) -> NDArray[np.float32]:
    """The observation vector of `spec` (its terms in order, float32, `spec.obs_dim`
    values) from measured values: joints (n each), the object's tracked pose (7). `target`
    and `object_goal` default to the spec's own (a deployment's). Written into `out` (a
    float32 array of obs_dim elements, any shape) when given, and `out` returned. A term
    observed without a value: PolicySpecError."""
    o = np.empty(spec.obs_dim, np.float32) if out is None else out
    flat = o.reshape(-1)
    i = 0
    for term in spec.observation:
        k = spec.term_size(term)
        if term == "joint_pos":
            v: Any = joint_pos
        elif term == "joint_vel":
            v = joint_vel
        elif term == "target":
            v = spec.target if target is None else target
        elif term == "object_pose":
            v = object_pose
        else:
            v = spec.object_goal if object_goal is None else object_goal
        if v is None:
            raise PolicySpecError(f"observation: no value for the observed term '{term}'")
        flat[i : i + k] = v
        i += k
    return o


def _goal(g: Any) -> tuple[float, float]:
    try:
        goal = (float(g[0]), float(g[1]))
        ok = len(g) == 2 and all(math.isfinite(v) for v in goal)
    except (TypeError, ValueError, IndexError, KeyError):
        ok = False
    if not ok:
        raise PolicySpecError(
            "policy spec observes 'object_goal' but 'object_goal' is not 2 numbers"
        )
    return goal


def _number(d: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PolicySpecError(
            f"policy spec: '{key}' must be a number in [{low:g}, {high:g}], not {v!r:.40}"
        )
    return float(v)


def _check_range(key: str, v: float, low: float, high: float) -> None:
    if not low <= v <= high:
        raise PolicySpecError(
            f"policy spec: '{key}' must be a number in [{low:g}, {high:g}], not {v!r:.40}"
        )
