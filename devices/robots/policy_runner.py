"""Running an uploaded ONNX policy on the robot side (onnxruntime).

The observation/action spec (a JSON-able dict sent with the ONNX bytes, see PROTOCOL.md):

    {"observation": ["joint_pos", "joint_vel"] (+ "target", "object_pose", "object_goal"),
     "target": [..n floats..],          # required when "target" is observed
     "object": "cylinder",              # required when an object term is observed
     "object_goal": [x, y],             # m, robot base frame; required with "object_goal"
     "object_max_age_s": 0.2,           # newest good tracked pose older -> the policy stops
     "object_min_quality": 0.0,         # tracker quality below it counts as lost
     "action": {"mode": "position" | "velocity",
                "type": "absolute" | "delta",   # delta: added to the measured joint_pos
                "scale": 1.0}}

The model takes one float32 input of shape (obs_dim,) or (1, obs_dim) and its first output
holds n joint values (any shape with n elements). Terms are n values each, except
`object_pose` (7: the newest good pose the workbench streamed, xyz m + quaternion xyzw in
the robot base frame; devices/robots/object_feed.py) and `object_goal` (2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.driver import RobotInfo, RobotState
from devices.robots.object_feed import ObjectFeed

OBS_TERMS = ("joint_pos", "joint_vel", "target", "object_pose", "object_goal")
OBJECT_TERM_SIZES = {"object_pose": 7, "object_goal": 2}
MAX_AGE_RANGE_S = (0.005, 5.0)


@dataclass(frozen=True)
class PolicySpec:
    """What a policy observes and what its output means."""

    observation: tuple[str, ...]
    action_mode: str
    action_type: str
    action_scale: float
    target: tuple[float, ...] | None
    object: str | None = None
    object_goal: tuple[float, float] | None = None
    object_max_age_s: float = 0.2
    object_min_quality: float = 0.0

    @classmethod
    def from_dict(cls, d: Any, n_joints: int) -> PolicySpec:
        if not isinstance(d, dict):
            raise DeviceError("policy spec must be a map (see PROTOCOL.md)")
        obs = tuple(d.get("observation", ("joint_pos", "joint_vel")))
        bad = [o for o in obs if o not in OBS_TERMS]
        if bad or not obs:
            raise DeviceError(
                f"policy spec: unknown observation term(s) {bad} (known: {', '.join(OBS_TERMS)})"
            )
        act = d.get("action", {})
        if not isinstance(act, dict):
            raise DeviceError("policy spec: 'action' must be a map")
        mode, typ = str(act.get("mode", "position")), str(act.get("type", "absolute"))
        if mode not in ("position", "velocity"):
            raise DeviceError(f"policy spec: action mode '{mode}' is not position or velocity")
        if typ not in ("absolute", "delta") or (typ == "delta" and mode != "position"):
            raise DeviceError(f"policy spec: action type '{typ}' is not valid for mode '{mode}'")
        target = d.get("target")
        if "target" in obs:
            if target is None or len(target) != n_joints:
                raise DeviceError(
                    f"policy spec observes 'target' but 'target' is not {n_joints} numbers"
                )
            target = tuple(float(x) for x in target)
        obj, goal, age, qmin = None, None, 0.2, 0.0
        if any(o in OBJECT_TERM_SIZES for o in obs):
            obj = d.get("object")
            if not isinstance(obj, str) or not obj:
                raise DeviceError("policy spec observes an object term but names no 'object'")
            age = _spec_number(d, "object_max_age_s", 0.2, *MAX_AGE_RANGE_S)
            qmin = _spec_number(d, "object_min_quality", 0.0, 0.0, 1.0)
        if "object_goal" in obs:
            g = d.get("object_goal")
            try:
                goal = (float(g[0]), float(g[1]))  # type: ignore[index]
                ok = len(g) == 2 and all(math.isfinite(v) for v in goal)  # type: ignore[arg-type]
            except (TypeError, ValueError, IndexError, KeyError):
                ok = False
            if not ok:
                raise DeviceError(
                    "policy spec observes 'object_goal' but 'object_goal' is not 2 numbers"
                )
        return cls(obs, mode, typ, float(act.get("scale", 1.0)), target, obj, goal, age, qmin)

    def term_size(self, term: str, n: int) -> int:
        return OBJECT_TERM_SIZES.get(term, n)

    def obs_dim(self, n: int) -> int:
        return sum(self.term_size(t, n) for t in self.observation)


@dataclass(frozen=True)
class ModelIO:
    """The inputs (name, shape; None for a symbolic dimension) and output names of a loaded
    model: what the process that holds the onnxruntime session tells the one that builds
    observations (policy_worker.OnnxProcessWorker), so the model is checked against the spec
    without being loaded twice."""

    inputs: tuple[tuple[str, tuple[int | None, ...]], ...]
    outputs: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(
            {"inputs": [[n, list(s)] for n, s in self.inputs], "outputs": self.outputs}
        )

    @classmethod
    def from_json(cls, text: str) -> ModelIO:
        d = json.loads(text)
        return cls(
            tuple(
                (str(n), tuple(x if isinstance(x, int) else None for x in s))
                for n, s in d["inputs"]
            ),
            tuple(str(o) for o in d["outputs"]),
        )

    @classmethod
    def of_session(cls, session: Any) -> ModelIO:
        return cls(
            tuple(
                (i.name, tuple(x if isinstance(x, int) else None for x in (i.shape or ())))
                for i in session.get_inputs()
            ),
            tuple(o.name for o in session.get_outputs()),
        )


def load_session(onnx_bytes: bytes, log_severity: int = 3) -> Any:
    """An onnxruntime session on one CPU thread (intra and inter op): the control loop's
    machine has few cores and the model must not compete for all of them. DeviceError if
    the bytes are not a model onnxruntime loads."""
    import onnxruntime as ort  # heavy import, only when a policy is uploaded

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = log_severity
    try:
        return ort.InferenceSession(
            onnx_bytes, sess_options=opts, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise DeviceError(f"uploaded policy is not a loadable ONNX model ({exc})") from None


def obs_shape(input_shape: tuple[int | None, ...], dim: int) -> tuple[int, ...]:
    """The array shape fed to a model whose input has `input_shape`: (1, dim) for a batched
    (rank 2) input, else (dim,). The policy process reshapes what it receives the same way."""
    return (1, dim) if len(input_shape) == 2 else (dim,)


def output_values(out: Any, n: int) -> NDArray[np.float64]:
    """A model's first output as n float64 joint values; DeviceError if it has another size."""
    arr = np.asarray(out, dtype=np.float64).reshape(-1)
    if arr.size != n:
        raise DeviceError(f"policy output has {arr.size} values, the robot has {n} joints")
    return arr


class OnnxPolicy:
    """An ONNX policy's spec, observation builder (`observe`) and action mapping
    (`to_command`).

    With `model=None` the onnxruntime session lives here (`raw_output` runs it in this
    process: benches, offline checks). The robot agent instead passes the `model`
    description its policy process reported (policy_worker.OnnxProcessWorker): the
    session then lives in that process, and this object only builds observations
    (`observe`, which needs the agent's object feed) and turns outputs into commands."""

    def __init__(
        self,
        onnx_bytes: bytes,
        spec: PolicySpec,
        info: RobotInfo,
        feed: ObjectFeed | None = None,
        model: ModelIO | None = None,
    ) -> None:
        self.spec = spec
        self.n = len(info.joint_names)
        self.feed = feed or ObjectFeed()
        self.session: Any = None
        if model is None:
            self.session = load_session(onnx_bytes)
            model = ModelIO.of_session(self.session)
        self.model = model
        if len(model.inputs) != 1:
            raise DeviceError(f"policy must have exactly one input, it has {len(model.inputs)}")
        if not model.outputs:
            raise DeviceError("policy has no output")
        self.input_name, input_shape = model.inputs[0]
        dim = spec.obs_dim(self.n)
        if input_shape and input_shape[-1] not in (None, dim):
            raise DeviceError(
                f"policy input '{self.input_name}' expects {input_shape[-1]} values but "
                f"the spec's observation {list(spec.observation)} has {dim}"
            )
        self.batched = len(input_shape) == 2
        self.obs = np.zeros(obs_shape(input_shape, dim), dtype=np.float32)
        self.flat_obs = self.obs.reshape(-1)
        self.target = np.asarray(spec.target, dtype=np.float32) if spec.target is not None else None
        self.goal = np.asarray(spec.object_goal or (0.0, 0.0), dtype=np.float32)
        self.output_name = model.outputs[0]

    def observe(self, state: RobotState, probe: bool = False) -> NDArray[np.float32]:
        """Fill the (preallocated) observation vector from `state` and the newest good
        object pose (`probe`: a placeholder pose, to check the model before any arrives)."""
        n, o, i = self.n, self.flat_obs, 0
        for term in self.spec.observation:
            k = self.spec.term_size(term, n)
            if term == "joint_pos":
                o[i : i + k] = state.joint_pos
            elif term == "joint_vel":
                o[i : i + k] = state.joint_vel
            elif term == "target":
                o[i : i + k] = self.target  # type: ignore[assignment]
            elif term == "object_goal":
                o[i : i + k] = self.goal
            else:  # the control loop checked its age before this inference was started
                rep = self.feed.good(str(self.spec.object))
                if rep is not None:
                    o[i : i + k] = rep.pose
                elif probe:
                    o[i : i + k] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
                else:
                    raise DeviceError(f"no tracked pose of object '{self.spec.object}' yet")
            i += k
        return self.obs

    def raw_output(self, state: RobotState, probe: bool = False) -> NDArray[np.float64]:
        """Run the model in this process; returns its n output values as float64 (unchecked
        against the envelope). Only for a policy built with its own session (model=None)."""
        if self.session is None:
            raise DeviceError("this policy's model runs in its policy process (OnnxProcessWorker)")
        obs = self.observe(state, probe)
        try:
            out = self.session.run([self.output_name], {self.input_name: obs})[0]
        except Exception as exc:  # onnxruntime's own untyped errors name the failing node
            raise DeviceError(f"policy inference failed: {exc}") from None
        return output_values(out, self.n)

    def to_command(self, raw: NDArray[np.float64], state: RobotState) -> NDArray[np.float64]:
        """Raw output -> joint command of `spec.action_mode` (before the safety envelope)."""
        cmd = raw * self.spec.action_scale
        if self.spec.action_type == "delta":
            cmd = cmd + state.joint_pos
        return cmd


def _spec_number(d: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise DeviceError(
            f"policy spec: '{key}' must be a number in [{low:g}, {high:g}], not {v!r:.40}"
        )
    return float(v)
