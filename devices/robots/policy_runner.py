"""Running an uploaded ONNX policy on the robot side (onnxruntime).

The observation/action spec (a JSON-able dict sent with the ONNX bytes, see PROTOCOL.md):

    {"observation": ["joint_pos", "joint_vel"] (+ "target"),   # concatenated in this order
     "target": [..n floats..],          # required when "target" is observed
     "action": {"mode": "position" | "velocity",
                "type": "absolute" | "delta",   # delta: added to the measured joint_pos
                "scale": 1.0}}

The model takes one float32 input of shape (obs_dim,) or (1, obs_dim) and its first output
holds n joint values (any shape with n elements).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.robots.driver import RobotInfo, RobotState

OBS_TERMS = ("joint_pos", "joint_vel", "target")


@dataclass(frozen=True)
class PolicySpec:
    """What a policy observes and what its output means."""

    observation: tuple[str, ...]
    action_mode: str
    action_type: str
    action_scale: float
    target: tuple[float, ...] | None

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
        return cls(obs, mode, typ, float(act.get("scale", 1.0)), target)

    def obs_dim(self, n: int) -> int:
        return n * len(self.observation)


class OnnxPolicy:
    """An onnxruntime session plus the spec; `act(state)` returns the raw joint command."""

    def __init__(self, onnx_bytes: bytes, spec: PolicySpec, info: RobotInfo) -> None:
        import onnxruntime as ort  # heavy import, only when a policy is uploaded

        self.spec = spec
        self.n = len(info.joint_names)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(
                onnx_bytes, sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise DeviceError(f"uploaded policy is not a loadable ONNX model ({exc})") from None
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise DeviceError(f"policy must have exactly one input, it has {len(inputs)}")
        self.input_name = inputs[0].name
        dim = spec.obs_dim(self.n)
        shape = [s if isinstance(s, int) else None for s in inputs[0].shape]
        if shape and shape[-1] not in (None, dim):
            raise DeviceError(
                f"policy input '{self.input_name}' expects {shape[-1]} values but "
                f"the spec's observation {list(spec.observation)} has {dim}"
            )
        self.batched = len(shape) == 2
        self.obs = np.zeros((1, dim) if self.batched else (dim,), dtype=np.float32)
        self.flat_obs = self.obs.reshape(-1)
        self.target = np.asarray(spec.target, dtype=np.float32) if spec.target is not None else None
        self.output_name = self.session.get_outputs()[0].name

    def observe(self, state: RobotState) -> NDArray[np.float32]:
        """Fill the (preallocated) observation vector from `state`."""
        n, o = self.n, self.flat_obs
        for i, term in enumerate(self.spec.observation):
            if term == "joint_pos":
                o[i * n : (i + 1) * n] = state.joint_pos
            elif term == "joint_vel":
                o[i * n : (i + 1) * n] = state.joint_vel
            else:
                o[i * n : (i + 1) * n] = self.target  # type: ignore[assignment]
        return self.obs

    def raw_output(self, state: RobotState) -> NDArray[np.float64]:
        """Run the model; returns its n output values as float64 (unchecked)."""
        out = self.session.run([self.output_name], {self.input_name: self.observe(state)})[0]
        arr = np.asarray(out, dtype=np.float64).reshape(-1)
        if arr.size != self.n:
            raise DeviceError(f"policy output has {arr.size} values, the robot has {self.n} joints")
        return arr

    def to_command(self, raw: NDArray[np.float64], state: RobotState) -> NDArray[np.float64]:
        """Raw output -> joint command of `spec.action_mode` (before the safety envelope)."""
        cmd = raw * self.spec.action_scale
        if self.spec.action_type == "delta":
            cmd = cmd + state.joint_pos
        return cmd
