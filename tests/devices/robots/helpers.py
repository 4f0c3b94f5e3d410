"""Shared pieces for the robot tests: tiny ONNX policies and a raw protocol socket."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from devices.frames import Intrinsics, RGBDFrame
from devices.robots.wire import protocol as P
from devices.robots.wire.auth import client_proof, new_nonce


def linear_policy(W: np.ndarray, b: np.ndarray, batched: bool = True) -> bytes:
    """ONNX model computing obs @ W + b (float32), input 'obs', output 'action'."""
    obs_dim, n = W.shape
    shape = [1, obs_dim] if batched else [obs_dim]
    out_shape = [1, n] if batched else [n]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["obs", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["action"]),
        ],
        "linear_policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, out_shape)],
        [
            numpy_helper.from_array(W.astype(np.float32), "W"),
            numpy_helper.from_array(b.astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def constant_policy(n: int, value: np.ndarray | float, obs_terms: int = 2) -> bytes:
    """A policy whose output ignores the observation: always `value` (may be NaN/inf)."""
    b = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()
    return linear_policy(np.zeros((n * obs_terms, n)), b)


def raw_connect(
    port: int,
    hello: dict[str, Any] | None = None,
    token: str | None = None,
    read_challenge: bool = True,
) -> socket.socket:
    """A plain socket to the server on loopback. Reads the server's challenge (unless
    read_challenge=False) and sends `hello` as given, or a valid one proving `token`."""
    s = socket.create_connection(("127.0.0.1", port), timeout=3.0)
    nonce = b""
    if read_challenge and (hello is not None or token is not None):
        msg = P.recv_message(s, P.MAX_HELLO_BYTES)
        assert msg["type"] == "challenge", msg
        nonce = msg["nonce"]
    if hello is None and token is not None:
        hello = valid_hello(token, nonce)
    if hello is not None:
        s.sendall(P.pack(hello))
    return s


def valid_hello(token: str, nonce: bytes, version: int = P.PROTOCOL_VERSION) -> dict[str, Any]:
    """The hello a correct client sends for the server's `nonce`."""
    cnonce = new_nonce()
    return {
        "type": "hello",
        "protocol": P.PROTOCOL_NAME,
        "version": version,
        "nonce": cnonce,
        "proof": client_proof(token, nonce, cnonce, version),
        "client": "raw-test",
    }


def read_until_closed(s: socket.socket, timeout_s: float = 3.0) -> list[dict[str, Any]]:
    """All messages until the server closes the connection."""
    s.settimeout(timeout_s)
    msgs = []
    try:
        while True:
            msgs.append(P.recv_message(s))
    except P.ConnectionClosed:
        return msgs
    except OSError:
        return msgs


def synthetic_frames(width: int = 64, height: int = 48, fps: float = 60.0) -> Iterator[RGBDFrame]:
    """A paced stream of frames whose pixels encode the frame index (a test data source)."""
    intr = Intrinsics(width, height, 50.0, 50.0, width / 2, height / 2)
    k = 0
    while True:
        k += 1
        color = np.full((height, width, 3), k % 256, dtype=np.uint8)
        color[..., 1] = np.arange(width, dtype=np.uint8)[None, :]
        depth = (np.arange(width * height, dtype=np.uint32).reshape(height, width) + k).astype(
            np.uint16
        )
        T = np.eye(4)
        T[0, 3] = 0.01 * k
        yield RGBDFrame(color, depth, 0.001, intr, timestamp=k / fps, index=k, T_world_camera=T)
        time.sleep(1.0 / fps)


def wait_for(pred: Any, timeout_s: float = 2.0, every_s: float = 0.005) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(every_s)
    return bool(pred())


# -- ONNX policies that misbehave at inference (policy process tests) ------------------------
NEVER_ENDS = 2**62  # Loop trip count: hours of work at any plausible speed


def loop_policy(
    n: int,
    obs_dim: int,
    iters: int | None,
    hidden: int = 128,
    iters_per_unit: float = 1000.0,
    seed: int = 0,
) -> bytes:
    """A valid policy (input 'obs' (1, obs_dim), output 'action' (1, n)) whose run time grows
    with an ONNX Loop: `iters` tanh(h @ A) steps on a (1, hidden) state, NEVER_ENDS for one
    that never finishes. `iters=None` takes the trip count from the observation instead
    (round(obs[0] * iters_per_unit), at least 0): fast on one state, slow on another, as a
    model that passed the upload probe and stalls later. Load-time checks cannot tell."""
    rng = np.random.default_rng(seed)
    w_in = rng.normal(0, 0.3, (obs_dim, hidden)).astype(np.float32)
    a = rng.normal(0, 1.0 / np.sqrt(hidden), (hidden, hidden)).astype(np.float32)
    w_out = rng.normal(0, 0.3, (hidden, n)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "A"], ["ha"]),
            helper.make_node("Tanh", ["ha"], ["h_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "loop_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, hidden]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, hidden]),
        ],
    )
    nodes = [helper.make_node("MatMul", ["obs", "W_in"], ["h0"])]
    inits = [
        numpy_helper.from_array(w_in, "W_in"),
        numpy_helper.from_array(a, "A"),
        numpy_helper.from_array(w_out, "W_out"),
        numpy_helper.from_array(np.array(True), "cond"),
    ]
    if iters is None:
        inits += [
            numpy_helper.from_array(np.array([0], dtype=np.int64), "first"),
            numpy_helper.from_array(np.array(iters_per_unit, dtype=np.float32), "per_unit"),
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
        ]
        nodes += [
            helper.make_node("Gather", ["obs", "first"], ["o0"], axis=1),  # (1, 1)
            helper.make_node("Mul", ["o0", "per_unit"], ["scaled"]),
            helper.make_node("Max", ["scaled", "zero"], ["clipped"]),
            helper.make_node("Round", ["clipped"], ["rounded"]),
            helper.make_node("Cast", ["rounded"], ["m11"], to=TensorProto.INT64),
            helper.make_node("ReduceMax", ["m11"], ["M"], keepdims=0),  # scalar
        ]
    else:
        inits.append(numpy_helper.from_array(np.array(iters, dtype=np.int64), "M"))
    nodes += [
        helper.make_node("Loop", ["M", "cond", "h0"], ["h"], body=body),
        helper.make_node("MatMul", ["h", "W_out"], ["action"]),
    ]
    graph = helper.make_graph(
        nodes,
        "loop_policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, obs_dim])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, [1, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def failing_policy(n: int, obs_dim: int) -> bytes:
    """A policy that loads (shapes and types check out) and fails at every inference: it
    gathers element 1000 of its (1, obs_dim) input, which only the run can find out of range.
    onnxruntime's message names the Gather node 'bad_gather'."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["obs", "W"], ["xw"]),
            helper.make_node("Gather", ["obs", "idx"], ["g"], axis=1, name="bad_gather"),
            helper.make_node("Add", ["xw", "g"], ["action"]),
        ],
        "failing_policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, obs_dim])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, [1, n])],
        [
            numpy_helper.from_array(np.zeros((obs_dim, n), dtype=np.float32), "W"),
            numpy_helper.from_array(np.array([1000], dtype=np.int64), "idx"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()
