"""Running an uploaded ONNX policy on the robot side (onnxruntime).

The spec sent with the ONNX bytes (wire/PROTOCOL.md) is a `policy_spec.PolicySpec`, read by the
agent with `PolicySpec.from_dict(spec, robot_joints=...)`; the observation is built by
`policy_spec.build_observation`, the same function the twin's task environments use.

The model takes one float32 input of shape (obs_dim,) or (1, obs_dim) and its first output
holds n joint values (any shape with n elements).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.agent.object_poses import ObjectFeed
from devices.robots.wire.policy_spec import PolicySpec, build_observation
from devices.robots.wire.robot_types import RobotInfo, RobotState

PROBE_POSE = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)  # the object pose a probe inference sees


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
        if spec.n != self.n:  # PolicySpec.from_dict(..., robot_joints=info.joint_names)
            raise DeviceError(f"policy spec is for {spec.n} joints, robot {info.name} has {self.n}")
        dim = spec.obs_dim
        if input_shape and input_shape[-1] not in (None, dim):
            raise DeviceError(
                f"policy input '{self.input_name}' expects {input_shape[-1]} values but "
                f"the spec's observation {list(spec.observation)} has {dim}"
            )
        self.batched = len(input_shape) == 2
        self.obs = np.zeros(obs_shape(input_shape, dim), dtype=np.float32)
        self.flat_obs = self.obs.reshape(-1)
        self.target = np.asarray(spec.target, dtype=np.float32) if spec.target is not None else None
        self.goal = (
            np.asarray(spec.object_goal, dtype=np.float32) if spec.object_goal is not None else None
        )
        self.output_name = model.outputs[0]

    def observe(self, state: RobotState, probe: bool = False) -> NDArray[np.float32]:
        """Fill the (preallocated) observation vector from `state` and the newest good
        object pose (`probe`: a placeholder pose, to check the model before any arrives)."""
        pose: Any = None
        if "object_pose" in self.spec.observation:
            # the control loop checked its age before this inference was started
            rep = self.feed.good(str(self.spec.object))
            if rep is not None:
                pose = rep.pose
            elif probe:
                pose = PROBE_POSE
            else:
                raise DeviceError(f"no tracked pose of object '{self.spec.object}' yet")
        return build_observation(
            self.spec,
            state.joint_pos,
            state.joint_vel,
            target=self.target,
            object_pose=pose,
            object_goal=self.goal,
            out=self.obs,
        )

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
