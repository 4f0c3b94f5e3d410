"""Wire format of the robot protocol (see PROTOCOL.md next to this file).

Every message is a msgpack map with a `type` key, sent as one frame: a 4-byte big-endian
unsigned length followed by that many bytes of msgpack. Nothing is ever unpickled. Arrays
travel as lists of floats (joint vectors) or as raw little-endian bytes with dtype and shape
(images, logs). The functions here are pure and shared by the server and the client.
"""

from __future__ import annotations

import math
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
import numpy as np
from numpy.typing import NDArray

from devices.errors import DeviceError
from devices.frames import Intrinsics, RGBDFrame
from devices.robots.wire.robot_types import RobotState

PROTOCOL_NAME = "twinbench-robot"
PROTOCOL_VERSION = 2  # 2: challenge-response handshake (1 sent the token itself)
SUPPORTED_VERSIONS = (2,)
HEADER = struct.Struct(">I")
MAX_HELLO_BYTES = 4096  # before authentication a peer may send only this much
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # after authentication (policy upload, camera frames)
MAX_JOINT_VALUE = 1e6  # |joint value| in a command (rad, rad/s, N*m); NaN/inf pass (-> stop)


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


@dataclass(frozen=True)
class BodyLimits:
    """What one message body may decode to, checked on its bytes before msgpack decodes it
    (`check_body`). msgpack's C decoder holds the GIL for a whole body, so a body of many
    small values (60 MiB of ints decode for seconds, to gigabytes) would hold up the
    agent's control loop and every other client's stop; these bounds keep any decode to a
    few milliseconds and its memory to about the body's size. Legit client messages are
    small: n floats, a pose, a spec map, one `bin` ONNX model."""

    max_elements: int = 20_000  # values inside arrays and maps together (map entry: 2)
    max_depth: int = 16  # containers nested in one another (the message map is level 1)
    max_text_bytes: int = 1 << 20  # all `str` bytes together (UTF-8 decoding is not free)


CLIENT_LIMITS = BodyLimits()  # what the robot server accepts from its clients

# The msgpack type byte -> how many bytes follow it, for values of a fixed size (nil, bools,
# ints, floats, fixext incl. its type byte); -1 for everything else (containers, strings,
# bin, ext, and the never-used 0xc1).
_FIXED = [-1] * 256
for _b in (*range(0x00, 0x80), *range(0xE0, 0x100), 0xC0, 0xC2, 0xC3):
    _FIXED[_b] = 0
for _b, _n in {
    0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4,
    0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,
}.items():  # fmt: skip
    _FIXED[_b] = _n
# variable-size values: type byte -> (kind, bytes of the big-endian length that follows)
_SIZED = {
    0xC4: ("bin", 1), 0xC5: ("bin", 2), 0xC6: ("bin", 4),
    0xC7: ("ext", 1), 0xC8: ("ext", 2), 0xC9: ("ext", 4),
    0xD9: ("str", 1), 0xDA: ("str", 2), 0xDB: ("str", 4),
    0xDC: ("array", 2), 0xDD: ("array", 4), 0xDE: ("map", 2), 0xDF: ("map", 4),
}  # fmt: skip


def check_body(
    body: bytes | bytearray | memoryview,
    limits: BodyLimits = CLIENT_LIMITS,
    total: int | None = None,
) -> None:
    """Walk the msgpack type bytes of one body without decoding it: ProtocolError
    'too_large' naming the limit when it holds more values, deeper nesting or more text
    than `limits` allow, 'malformed' when it is not one msgpack map whose lengths fit the
    body. Pure Python on purpose: the interpreter hands the GIL to the control loop every
    switch interval while this runs, which msgpack's C decoder does not. It stops at the
    first container header that announces more values than are left in the budget, so a
    60 MiB array costs one step and any body at most ~`max_elements` steps; strings, bin
    and ext are skipped by their length (O(1) whatever their size).

    `total`: the announced size when `body` is only its first bytes (the first chunk off
    the socket): running out of bytes is then no error, so a body that breaks a limit in
    its first chunk is refused before the rest of it is even received."""
    n = len(body)
    partial = total is not None and total > n
    full = total if total is not None and partial else n
    if n == 0 or not (0x80 <= body[0] <= 0x8F or body[0] in (0xDE, 0xDF)):
        raise ProtocolError("malformed", "message must be a msgpack map with a 'type' field")
    fixed, sized = _FIXED, _SIZED
    budget, max_depth, text_left = limits.max_elements, limits.max_depth, limits.max_text_bytes
    stack: list[int] = []  # values still to read in each enclosing container
    left, pos = 1, 0  # values still to read in the innermost one (first: the message)
    while True:
        while not left:
            if not stack:
                if partial and pos == full:
                    return  # the rest of the body is inside a str/bin/ext seen whole
                if pos != n:
                    raise ProtocolError(
                        "malformed",
                        "message is not valid msgpack (bytes after its end)"
                        if pos < n
                        else "message is not valid msgpack (truncated)",
                    )
                return
            left = stack.pop()
        left -= 1
        if pos >= n:
            if partial:
                return
            raise ProtocolError("malformed", "message is not valid msgpack (truncated)")
        b = body[pos]
        skip = fixed[b]
        if skip >= 0:
            pos += 1 + skip
            continue
        if 0xA0 <= b <= 0xBF:
            kind, length, pos = "str", b & 0x1F, pos + 1
        elif 0x80 <= b <= 0x9F:
            kind, length, pos = ("map" if b < 0x90 else "array"), b & 0x0F, pos + 1
        elif b in sized:
            kind, size = sized[b]
            if pos + 1 + size > n:
                if partial:
                    return
                raise ProtocolError("malformed", "message is not valid msgpack (truncated)")
            length = int.from_bytes(body[pos + 1 : pos + 1 + size], "big")
            pos += 1 + size
        else:
            raise ProtocolError("malformed", f"message is not valid msgpack (type byte {b:#x})")
        if kind == "array" or kind == "map":
            count = 2 * length if kind == "map" else length
            if count > budget:
                raise ProtocolError(
                    "too_large",
                    f"message holds more than {limits.max_elements} values in its arrays and "
                    "maps (limit max_elements; a map entry counts 2)",
                )
            if len(stack) >= max_depth:  # this container is at level len(stack) + 1
                raise ProtocolError(
                    "too_large",
                    f"message nests arrays/maps deeper than {max_depth} levels (limit max_depth)",
                )
            if count > full - pos:
                raise ProtocolError(
                    "malformed", f"message is not valid msgpack ({kind} of {length} past its end)"
                )
            budget -= count
            stack.append(left)
            left = count
            continue
        if kind == "str":
            text_left -= length
            if text_left < 0:
                raise ProtocolError(
                    "too_large",
                    f"message holds more than {limits.max_text_bytes} bytes of strings "
                    "(limit max_text_bytes; large data travels as bin)",
                )
        elif kind == "ext":
            length += 1  # the ext type byte
        pos += length
        if pos > n and not (partial and pos <= full):
            raise ProtocolError(
                "malformed", f"message is not valid msgpack ({kind} length past its end)"
            )


def unpack_body(
    body: bytes | bytearray | memoryview, limits: BodyLimits | None = None
) -> dict[str, Any]:
    """Decode one msgpack body into a message dict; raises ProtocolError('malformed').

    limits: check the body against them first (`check_body`, ProtocolError 'too_large' /
    'malformed') and give msgpack the same bounds (defence in depth). The robot server
    passes them for what clients send; a client reading its server (camera frames, logs)
    passes none."""
    kw: dict[str, int] = {}
    if limits is not None:
        check_body(body, limits)
        kw = {
            "max_str_len": limits.max_text_bytes,
            "max_bin_len": len(body),
            "max_ext_len": len(body),
            "max_array_len": limits.max_elements,
            "max_map_len": limits.max_elements // 2,
        }
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=True, **kw)
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


class Stream(Protocol):
    """What the link reads and writes: a connected socket, or a TLS connection
    (devices/robots/wire/tls.SerialTLS)."""

    def recv(self, bufsize: int, /) -> bytes: ...

    def sendall(self, data: bytes, /) -> None: ...

    def settimeout(self, timeout: float | None, /) -> None: ...

    def shutdown(self, how: int, /) -> None: ...

    def close(self) -> None: ...


def _recv_exact(
    sock: Stream,
    n: int,
    deadline: float | None = None,
    budget: ByteBudget | None = None,
    first_check: Callable[[bytes], None] | None = None,
) -> bytes | bytearray:
    """Exactly n bytes. Memory grows with what has arrived (chunks of at most READ_CHUNK),
    not with what the peer announced; `deadline` (time.monotonic) bounds the whole read;
    `budget` is charged per chunk and refunded when the read ends. A body of several
    chunks is appended to one bytearray as they come (each append a short copy), never
    joined at the end: joining 64 MiB is one ~70 ms copy that holds the GIL, and needs
    the body twice in memory. `first_check(chunk)` sees the first chunk before the rest
    is read (and may raise to refuse the message)."""
    buf: bytes | bytearray = b""
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
            if not got:
                buf = chunk  # most messages arrive in one chunk: no copy at all
                if first_check is not None and len(chunk) < n:
                    first_check(chunk)
            else:
                if isinstance(buf, bytes):
                    buf = bytearray(buf)
                buf += chunk
            got += len(chunk)
            if budget is not None:
                budget.give(want - len(chunk))
                charged -= want - len(chunk)
    finally:
        if budget is not None and charged:
            budget.give(charged)
    return buf


def recv_message(
    sock: Stream,
    max_bytes: int = MAX_MESSAGE_BYTES,
    deadline: float | None = None,
    body_rate: float | None = None,
    budget: ByteBudget | None = None,
    limits: BodyLimits | None = None,
) -> dict[str, Any]:
    """Read one framed message. Raises ProtocolError('too_large'/'malformed'),
    ConnectionClosed, or TimeoutError / OSError from the socket.

    deadline: time.monotonic() by which the header must be in (and the body too, unless
    `body_rate` is given: then the body gets `deadline + N / body_rate` seconds, so a large
    upload has time but a trickling peer does not).
    limits: bounds on what the body decodes to, checked before decoding (`check_body`);
    the server passes CLIENT_LIMITS, a client reading its server none.
    """
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline))
    if n > max_bytes:
        raise ProtocolError(
            "too_large", f"message of {n} bytes exceeds the limit of {max_bytes} bytes"
        )
    body_deadline = deadline
    if deadline is not None and body_rate:
        body_deadline = max(deadline, time.monotonic() + 1.0) + n / body_rate
    first = None
    if limits is not None:

        def first(chunk: bytes) -> None:  # a 60 MiB array is refused on its first bytes
            check_body(chunk, limits, total=n)

    return unpack_body(_recv_exact(sock, n, body_deadline, budget, first), limits)


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


def is_number(v: Any) -> bool:
    """A msgpack int or float: not a bool (a Python int), a string or None, which numpy
    would happily turn into 1.0, 1.5 or NaN."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def joint_vector(
    values: Any, n: int, name: str, max_abs: float = MAX_JOINT_VALUE
) -> NDArray[np.float64]:
    """A list of n numbers -> float64 array. Each must be an int or a float (not a bool,
    string or None) with |x| <= max_abs; NaN/inf pass through (the safety envelope turns
    them into a stop). Raises ProtocolError('bad_request') naming the field."""
    if not isinstance(values, (list, tuple)):
        raise ProtocolError("bad_request", f"'{name}' must be a list of {n} numbers")
    if len(values) != n:
        raise ProtocolError(
            "bad_request", f"'{name}' must have {n} values (one per joint), got {len(values)}"
        )
    for i, v in enumerate(values):
        if not is_number(v):
            raise ProtocolError(
                "bad_request", f"'{name}'[{i}] must be a number, not {type(v).__name__} {v!r:.40}"
            )
        if abs(v) > max_abs and v not in (math.inf, -math.inf):  # NaN compares False
            shown = f"{float(v):.3g}" if abs(v) < 1e300 else "a huge int"
            raise ProtocolError("bad_request", f"'{name}'[{i}] = {shown} is beyond +-{max_abs:g}")
    return np.array(values, dtype=np.float64)


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
