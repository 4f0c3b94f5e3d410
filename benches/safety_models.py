"""The ONNX models `bench safety` uploads (benches/safety_attacks.py): built here with
onnx.helper, tiny and without torch: a constant policy, a slow or never-ending one (an ONNX
Loop whose trip count comes from the observation) and one that fails at its first inference.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benches.safety_probe import Vec


def _model(nodes: list[Any], inits: list[Any], obs_dim: int, n: int) -> bytes:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "bench_safety",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, obs_dim])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, [1, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def constant_model(value: Vec, obs_dim: int) -> bytes:
    """Outputs `value` whatever it observes (obs @ 0 + value)."""
    from onnx import helper, numpy_helper

    n = len(value)
    nodes = [
        helper.make_node("MatMul", ["obs", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["action"]),
    ]
    inits = [
        numpy_helper.from_array(np.zeros((obs_dim, n), np.float32), "W"),
        numpy_helper.from_array(np.asarray(value, np.float32).reshape(1, n), "b"),
    ]
    return _model(nodes, inits, obs_dim, n)


def slow_model(
    value: Vec, obs_dim: int, trips: int, gate_at: Vec | None = None, gate_rad: float = 0.01
) -> bytes:
    """Outputs `value` after a Loop of `trips` Sin steps over the observation (~2 us each).
    With `gate_at` (a joint position), the Loop runs only once the observed joints are more
    than `gate_rad` (summed) away from it: fast at the upload's probe, with the arm resting
    there, and slow once the policy has moved it (the issue's model)."""
    from onnx import TensorProto, helper, numpy_helper

    n = len(value)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Sin", ["x_in"], ["x_out"]),
        ],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [1, obs_dim]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [1, obs_dim]),
        ],
    )
    gate: list[Any] = []
    count = "trips"
    inits = [
        numpy_helper.from_array(np.array(int(trips), np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(np.zeros((1, 1), np.float32), "zero"),
        numpy_helper.from_array(np.asarray(value, np.float32).reshape(1, n), "b"),
    ]
    if gate_at is not None:
        count = "gated"
        at = np.zeros((1, obs_dim), np.float32)
        at[0, :n] = gate_at
        mask = np.zeros((1, obs_dim), np.float32)
        mask[0, :n] = 1.0
        inits += [
            numpy_helper.from_array(at, "at"),
            numpy_helper.from_array(mask, "mask"),
            numpy_helper.from_array(np.array(gate_rad, np.float32), "gate"),
        ]
        gate = [
            helper.make_node("Sub", ["obs", "at"], ["off"]),
            helper.make_node("Abs", ["off"], ["aoff"]),
            helper.make_node("Mul", ["aoff", "mask"], ["qoff"]),
            helper.make_node("ReduceSum", ["qoff"], ["dist"], keepdims=0),
            helper.make_node("Greater", ["dist", "gate"], ["moved"]),
            helper.make_node("Cast", ["moved"], ["moved_i"], to=TensorProto.INT64),
            helper.make_node("Mul", ["moved_i", "trips"], ["gated"]),
        ]
    nodes = [
        *gate,
        helper.make_node("Loop", [count, "cond", "obs"], ["x"], body=body),
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1),
        helper.make_node("Mul", ["s", "zero"], ["z"]),  # the output depends on the loop
        helper.make_node("Add", ["b", "z"], ["action"]),
    ]
    return _model(nodes, inits, obs_dim, n)


def failing_model(n: int, obs_dim: int) -> bytes:
    """Loads fine, fails at every inference: a Gather past the end of the observation."""
    from onnx import helper, numpy_helper

    nodes = [helper.make_node("Gather", ["obs", "idx"], ["action"], axis=1)]
    idx = numpy_helper.from_array(np.full(n, obs_dim + 100, np.int64), "idx")
    return _model(nodes, [idx], obs_dim, n)


def seconds_per_trip(obs_dim: int) -> float:
    """Time of one Loop step of `slow_model` here, as the agent runs it (1 thread)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    trips = 20_000
    sess = ort.InferenceSession(
        slow_model(np.zeros(obs_dim // 2), obs_dim, trips),
        sess_options=opts,
        providers=["CPUExecutionProvider"],
    )
    x = np.zeros((1, obs_dim), np.float32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        sess.run(None, {"obs": x})
        best = min(best, time.perf_counter() - t0)
    return best / trips
