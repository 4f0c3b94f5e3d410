"""Wire format of the robot protocol (see PROTOCOL.md next to this file).

Every message is a msgpack map with a `type` key, sent as one frame: a 4-byte big-endian
unsigned length followed by that many bytes of msgpack. Nothing is ever unpickled. Arrays
travel as lists of floats (joint vectors) or as raw little-endian bytes with dtype and shape
(images, logs). The functions here are pure and shared by the server and the client.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import msgpack
import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.frames import Intrinsics, RGBDFrame
from devices.robots.driver import RobotState

PROTOCOL_NAME = "twinbench-robot"
PROTOCOL_VERSION = 2  # 2: challenge-response handshake (1 sent the token itself)
SUPPORTED_VERSIONS = (2,)
HEADER = struct.Struct(">I")
MAX_HELLO_BYTES = 4096  # before authentication a peer may send only this much
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # after authentication (policy upload, camera frames)


class ProtocolError(DeviceError):
    """A peer broke the protocol. `code` is the machine-readable error code sent on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConnectionClosed(DeviceError):
    """The peer closed the connection (or it broke) while a message was expected."""


# -- framing ----------------------------------------------------------------------------


def pack(msg: dict[str, Any]) -> bytes:
    """One framed message: length header + msgpack body."""
    body: bytes = msgpack.packb(msg, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def unpack_body(body: bytes) -> dict[str, Any]:
    """Decode one msgpack body into a message dict; raises ProtocolError('malformed')."""
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except (
        ValueError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
        UnicodeDecodeError,
        TypeError,
    ) as exc:
        raise ProtocolError("malformed", f"message is not valid msgpack ({exc})") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("malformed", "message must be a map with a string 'type' field")
    return msg


READ_CHUNK = 1 << 18  # bodies are read in chunks as they arrive, never preallocated


class ByteBudget:
    """Bytes that partly received messages may hold, shared by all the connections of a
    server, so peers that announce large messages and then trickle cannot pin memory."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


def _recv_exact(
    sock: socket.socket,
    n: int,
    deadline: float | None = None,
    budget: ByteBudget | None = None,
) -> bytes:
    """Exactly n bytes. Memory grows with what has arrived (chunks of at most READ_CHUNK),
    not with what the peer announced; `deadline` (time.monotonic) bounds the whole read;
    `budget` is charged per chunk and refunded when the read ends."""
    parts: list[bytes] = []
    got = charged = 0
    try:
        while got < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("message not complete before its deadline")
                sock.settimeout(left)
            want = min(n - got, READ_CHUNK)
            if budget is not None:
                if not budget.take(want):
                    raise ProtocolError(
                        "too_large",
                        f"server is receiving too much at once ({budget.limit} bytes in "
                        "unfinished messages); send large messages one at a time",
                    )
                charged += want
            chunk = sock.recv(want)
            if not chunk:
                raise ConnectionClosed("connection closed by peer")
            parts.append(chunk)
            got += len(chunk)
            if budget is not None:
                budget.give(want - len(chunk))
                charged -= want - len(chunk)
    finally:
        if budget is not None and charged:
            budget.give(charged)
    return b"".join(parts)


def recv_message(
    sock: socket.socket,
    max_bytes: int = MAX_MESSAGE_BYTES,
    deadline: float | None = None,
    body_rate: float | None = None,
    budget: ByteBudget | None = None,
) -> dict[str, Any]:
    """Read one framed message. Raises ProtocolError('too_large'/'malformed'),
    ConnectionClosed, or TimeoutError / OSError from the socket.

    deadline: time.monotonic() by which the header must be in (and the body too, unless
    `body_rate` is given: then the body gets `deadline + N / body_rate` seconds, so a large
    upload has time but a trickling peer does not).
    """
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline))
    if n > max_bytes:
        raise ProtocolError(
            "too_large", f"message of {n} bytes exceeds the limit of {max_bytes} bytes"
        )
    body_deadline = deadline
    if deadline is not None and body_rate:
        body_deadline = max(deadline, time.monotonic() + 1.0) + n / body_rate
    return unpack_body(_recv_exact(sock, n, body_deadline, budget))


def error_message(
    code: str, message: str, fatal: bool, req_id: int | None = None
) -> dict[str, Any]:
    """An `error` message (fatal ones are followed by a disconnect)."""
    return {"type": "error", "code": code, "message": message, "fatal": fatal, "id": req_id}


# -- arrays -----------------------------------------------------------------------------


def array_to_wire(a: NDArray[Any]) -> dict[str, Any]:
    """Raw little-endian bytes + dtype + shape (for images and logs, not joint vectors)."""
    arr = np.ascontiguousarray(a)
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    return {"dtype": dt.str, "shape": list(arr.shape), "data": arr.astype(dt, copy=False).tobytes()}


_WIRE_DTYPES = {"<f8", "<f4", "<u2", "|u1", "<i8", "<i4", "|b1"}


def array_from_wire(d: Any, name: str) -> NDArray[Any]:
    """Inverse of `array_to_wire`; validates dtype and size (ProtocolError('malformed'))."""
    try:
        dtype, shape, data = str(d["dtype"]), tuple(int(s) for s in d["shape"]), d["data"]
    except (KeyError, TypeError, ValueError):
        raise ProtocolError("malformed", f"field '{name}' is not an encoded array") from None
    if dtype not in _WIRE_DTYPES or not isinstance(data, bytes) or any(s < 0 for s in shape):
        raise ProtocolError("malformed", f"field '{name}': unsupported array encoding {dtype}")
    dt = np.dtype(dtype)
    if len(data) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
        raise ProtocolError(
            "malformed", f"field '{name}': {len(data)} bytes do not match shape {shape} of {dtype}"
        )
    return np.frombuffer(data, dtype=dt).reshape(shape).astype(dt.newbyteorder("="))


def joint_vector(values: Any, n: int, name: str) -> NDArray[np.float64]:
    """A list of n numbers -> float64 array (NaN/inf pass through; the safety envelope
    decides about them). Raises ProtocolError('bad_request') on wrong shape/type."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ProtocolError("bad_request", f"'{name}' must be a list of {n} numbers") from None
    if arr.shape != (n,):
        raise ProtocolError(
            "bad_request", f"'{name}' must have {n} values (one per joint), got shape {arr.shape}"
        )
    return arr


# -- robot state ------------------------------------------------------------------------


def state_message(
    state: RobotState, command: NDArray[np.float64] | None, mode: str, status: dict[str, Any]
) -> dict[str, Any]:
    """The `state` message the server streams at the robot's control rate."""
    return {
        "type": "state",
        "seq": state.seq,
        "t": state.t,
        "joint_pos": state.joint_pos.tolist(),
        "joint_vel": state.joint_vel.tolist(),
        "joint_effort": state.joint_effort.tolist(),
        "ee_pos": None if state.ee_pos is None else np.asarray(state.ee_pos).tolist(),
        "command": None if command is None else command.tolist(),
        "command_time": state.command_time,
        "mode": mode,
        **status,
    }


def state_from_message(msg: dict[str, Any]) -> RobotState:
    ee, ct = msg.get("ee_pos"), msg.get("command_time")
    return RobotState(
        t=float(msg["t"]),
        seq=int(msg["seq"]),
        joint_pos=np.asarray(msg["joint_pos"], dtype=float),
        joint_vel=np.asarray(msg["joint_vel"], dtype=float),
        joint_effort=np.asarray(msg["joint_effort"], dtype=float),
        ee_pos=None if ee is None else np.asarray(ee, dtype=float),
        command_time=None if ct is None else float(ct),
    )


def command_delay(msgs: list[dict[str, Any]]) -> NDArray[np.float64] | None:
    """Per state message, `command_time - t` (s): how long after the state the robot's
    controller received the command sent with it (PROTOCOL.md); NaN where no command was
    sent. None when a message with a command lacks `command_time` (robot cannot say)."""
    out = np.full((len(msgs), 1), np.nan)
    for i, m in enumerate(msgs):
        if m.get("command") is None:
            continue
        ct = m.get("command_time")
        if ct is None:
            return None
        out[i, 0] = float(ct) - float(m["t"])
    return out


# -- camera frames ----------------------------------------------------------------------


def frame_to_message(frame: RGBDFrame, camera: str) -> dict[str, Any]:
    """An RGBDFrame as a `frame` message: RGB8 colour and Z16 depth as raw bytes, the
    intrinsics, depth scale (m/unit), timestamp (s), index and optional 4x4 camera pose."""
    color = np.ascontiguousarray(frame.color, dtype=np.uint8)
    depth = np.ascontiguousarray(frame.depth, dtype="<u2")
    return {
        "type": "frame",
        "camera": camera,
        "index": int(frame.index),
        "timestamp": float(frame.timestamp),
        "width": int(depth.shape[1]),
        "height": int(depth.shape[0]),
        "color_width": int(color.shape[1]),
        "color_height": int(color.shape[0]),
        "color_rgb8": color.tobytes(),
        "depth_z16": depth.tobytes(),
        "depth_scale": float(frame.depth_scale),
        "intrinsics": frame.intrinsics.to_dict(),
        "T_world_camera": (
            None
            if frame.T_world_camera is None
            else np.asarray(frame.T_world_camera, dtype=float).reshape(16).tolist()
        ),
        "meta": {k: v for k, v in frame.meta.items() if isinstance(v, (str, int, float, bool))},
    }


def frame_from_message(msg: dict[str, Any]) -> RGBDFrame:
    """Inverse of `frame_to_message`. Raises ProtocolError('malformed') on size mismatch."""
    try:
        w, h = int(msg["width"]), int(msg["height"])
        cw, ch = int(msg.get("color_width", w)), int(msg.get("color_height", h))
        color_b, depth_b = msg["color_rgb8"], msg["depth_z16"]
        intr = Intrinsics.from_dict(msg["intrinsics"])
        pose = msg.get("T_world_camera")
        scale, ts, idx = float(msg["depth_scale"]), float(msg["timestamp"]), int(msg["index"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError("malformed", f"frame message is incomplete ({exc})") from None
    if not isinstance(color_b, bytes) or len(color_b) != cw * ch * 3:
        raise ProtocolError("malformed", f"frame colour is not {cw}x{ch} RGB8")
    if not isinstance(depth_b, bytes) or len(depth_b) != w * h * 2:
        raise ProtocolError("malformed", f"frame depth is not {w}x{h} Z16")
    color = np.frombuffer(color_b, dtype=np.uint8).reshape(ch, cw, 3)
    depth = np.frombuffer(depth_b, dtype="<u2").reshape(h, w).astype(np.uint16)
    T = None if pose is None else np.asarray(pose, dtype=float).reshape(4, 4)
    return RGBDFrame(
        color=color,
        depth=depth,
        depth_scale=scale,
        intrinsics=intr,
        timestamp=ts,
        index=idx,
        T_world_camera=T,
        meta={"camera": str(msg.get("camera", "")), **dict(msg.get("meta") or {})},
    )
