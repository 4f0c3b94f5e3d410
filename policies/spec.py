"""The observation/action spec a policy is trained with and uploaded with (PROTOCOL.md).

It is the agent's JSON spec (devices/robots/policy_runner.py) plus two object terms a push
policy needs, so a policy trained here carries exactly the dict the robot agent checks:

    {"observation": ["joint_pos", "joint_vel", "target"],   # concatenated in this order
     "target": [n floats],                                   # when "target" is observed
     "object": "cylinder",                                   # when an object term is observed
     "object_goal": [x, y],                                  # m, robot base frame
     "object_max_age_s": 0.2,          # tracked pose older than this stops the policy
     "action": {"mode": "position", "type": "delta", "scale": 0.05},
     "joints": [n joint names], "control_rate_hz": 250.0}

Terms and their sizes: `joint_pos`, `joint_vel`, `target` (n each, rad / rad/s / rad);
`object_pose` (7: position m + quaternion xyzw of the tracked object in the robot base
frame, from the workbench's camera tracker, streamed to the agent as `object_pose`
messages); `object_goal` (2: x, y in m on the table). The agent stops a policy whose
object's newest good tracked pose is older than `object_max_age_s`, and so does the twin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.errors import PolicyError

JOINT_TERMS = ("joint_pos", "joint_vel", "target")
OBJECT_TERMS = {"object_pose": 7, "object_goal": 2}
TERMS = (*JOINT_TERMS, *OBJECT_TERMS)


@dataclass(frozen=True)
class PolicySpec:
    """What a policy observes and what its output means, for `n = len(joints)` joints."""

    observation: tuple[str, ...]
    joints: tuple[str, ...]
    action_mode: str = "position"
    action_type: str = "delta"
    action_scale: float = 0.05
    target: tuple[float, ...] | None = None
    object: str | None = None
    object_goal: tuple[float, float] | None = None
    control_rate_hz: float = 250.0
    object_max_age_s: float = 0.2

    def __post_init__(self) -> None:
        bad = [t for t in self.observation if t not in TERMS]
        if bad or not self.observation:
            raise PolicyError(f"policy spec: unknown observation term(s) {bad} (known: {TERMS})")
        if len(set(self.observation)) != len(self.observation):
            raise PolicyError(f"policy spec: a term is listed twice in {list(self.observation)}")
        if self.action_mode not in ("position", "velocity"):
            raise PolicyError(f"policy spec: action mode '{self.action_mode}' is not supported")
        if self.action_type not in ("absolute", "delta") or (
            self.action_type == "delta" and self.action_mode != "position"
        ):
            raise PolicyError(
                f"policy spec: action type '{self.action_type}' is not valid for mode "
                f"'{self.action_mode}'"
            )
        if not self.action_scale > 0:
            raise PolicyError(f"policy spec: action scale must be > 0, not {self.action_scale}")
        if any(t in OBJECT_TERMS for t in self.observation) and not self.object:
            raise PolicyError("policy spec observes an object term but names no 'object'")
        if not 0.005 <= self.object_max_age_s <= 5.0:
            raise PolicyError(
                f"policy spec: object_max_age_s must be in [0.005, 5] s, not "
                f"{self.object_max_age_s}"
            )

    @property
    def n(self) -> int:
        return len(self.joints)

    def term_size(self, term: str) -> int:
        return OBJECT_TERMS.get(term, self.n)

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
        from dataclasses import replace

        return replace(
            self,
            target=tuple(float(x) for x in target) if target is not None else self.target,
            object_goal=(float(object_goal[0]), float(object_goal[1]))
            if object_goal is not None
            else self.object_goal,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON spec uploaded with the ONNX model (PROTOCOL.md format)."""
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
        if self.object_goal is not None:
            d["object_goal"] = list(self.object_goal)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "policy spec") -> PolicySpec:
        """Parse a spec dict; PolicyError naming `where` and the entry that is wrong."""
        if not isinstance(d, Mapping):
            raise PolicyError(f"{where}: must be a map, not {type(d).__name__}")
        try:
            act = d.get("action", {})
            goal = d.get("object_goal")
            return cls(
                observation=tuple(str(t) for t in d["observation"]),
                joints=tuple(str(j) for j in d["joints"]),
                action_mode=str(act.get("mode", "position")),
                action_type=str(act.get("type", "absolute")),
                action_scale=float(act.get("scale", 1.0)),
                target=tuple(float(x) for x in d["target"]) if d.get("target") else None,
                object=str(d["object"]) if d.get("object") else None,
                object_goal=(float(goal[0]), float(goal[1])) if goal else None,
                control_rate_hz=float(d.get("control_rate_hz", 250.0)),
                object_max_age_s=float(d.get("object_max_age_s", 0.2)),
            )
        except KeyError as exc:
            raise PolicyError(f"{where}: missing entry {exc}") from None
        except (TypeError, ValueError, IndexError) as exc:
            raise PolicyError(f"{where}: malformed ({exc})") from None

    def check_robot(self, joint_names: Sequence[str], control_rate_hz: float) -> None:
        """PolicyError naming the mismatch if a robot with these joints and rate cannot run
        this policy as trained (checked before any upload)."""
        if tuple(joint_names) != self.joints:
            raise PolicyError(
                f"policy was trained for joints {list(self.joints)}, the robot has "
                f"{list(joint_names)}"
            )
        if abs(control_rate_hz - self.control_rate_hz) > 0.05 * self.control_rate_hz:
            raise PolicyError(
                f"policy was trained at {self.control_rate_hz:g} Hz, the robot runs at "
                f"{control_rate_hz:g} Hz"
            )
        if "target" in self.observation and (self.target is None or len(self.target) != self.n):
            raise PolicyError(f"policy observes 'target' but carries no {self.n} target values")
        if "object_goal" in self.observation and self.object_goal is None:
            raise PolicyError("policy observes 'object_goal' but carries no goal")
