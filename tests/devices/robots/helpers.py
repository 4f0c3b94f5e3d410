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
from devices.robots import protocol as P
from devices.robots.auth import client_proof, new_nonce


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
